//! Live previews, edits, progress and native streams of an outbound message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{MessageAttachment, MessageReceipt, MessageReceiptPart, UnixMillis};

/// How a live message is being shown while the final is produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LiveMode {
    /// A draft edited in place with partial text.
    Partial,
    /// Completed blocks delivered as they finish.
    Block,
    /// A progress indicator.
    Progress,
    /// The platform's own streaming primitive.
    Native,
}

known_variants!(LiveMode {
    Partial,
    Block,
    Progress,
    Native
});

/// Durable-enough state of a live message: enough to finalize, clean up or suppress a duplicate
/// after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct LiveMessageState {
    /// How the message is shown while it is produced.
    pub mode: LiveMode,
    /// The receipt of the preview on the platform, once one is visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<MessageReceipt>,
    /// When the preview first became visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible_since: Option<UnixMillis>,
    /// Whether the final may replace the preview by an edit (else the preview is cleaned up
    /// and a fresh final sent).
    pub can_finalize_in_place: bool,
    /// Hash of the last text shown, so an identical update is not sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rendered_hash: Option<String>,
    /// After this age the preview is not finalized in place: a fresh final is sent instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after_ms: Option<u64>,
    /// Attachments already delivered as messages of their own while the reply streamed, by
    /// identity (the URL, else the file name; see [`LiveMessageState::media_identity`]), with
    /// the platform message carrying each. They are content, not a preview: the final never
    /// sends them again and cleaning up a preview never removes them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub streamed_media: BTreeMap<String, MessageReceiptPart>,
}

impl LiveMessageState {
    /// A live message in `mode` with nothing shown or streamed yet.
    pub fn empty(mode: LiveMode) -> LiveMessageState {
        LiveMessageState {
            mode,
            receipt: None,
            visible_since: None,
            can_finalize_in_place: false,
            last_rendered_hash: None,
            stale_after_ms: None,
            streamed_media: BTreeMap::new(),
        }
    }

    setters! {
        /// Sets whether the final may replace the preview by an edit.
        with_can_finalize_in_place => can_finalize_in_place: bool;
        /// Replaces the attachments already streamed, by identity.
        with_streamed_media => streamed_media: BTreeMap<String, MessageReceiptPart>;
    }

    setters! { opt into
        /// Sets the hash of the last text shown.
        with_last_rendered_hash => last_rendered_hash: String;
    }

    setters! { opt
        /// Sets the receipt of the visible preview.
        with_receipt => receipt: MessageReceipt;
        /// Sets when the preview became visible.
        with_visible_since => visible_since: UnixMillis;
        /// Sets the age after which the preview is not finalized in place.
        with_stale_after_ms => stale_after_ms: u64;
    }

    /// Whether the preview is too old to be finalized in place at `now`.
    pub fn is_stale(&self, now: UnixMillis) -> bool {
        match (self.visible_since, self.stale_after_ms) {
            (Some(since), Some(limit)) => {
                now.saturating_sub(since) > i64::try_from(limit).unwrap_or(i64::MAX)
            }
            _ => false,
        }
    }

    /// What an attachment is recognised by when the final carries it again: its URL, else its
    /// file name. `None` when it has neither (it cannot be streamed ahead of the final).
    pub fn media_identity(attachment: &MessageAttachment) -> Option<&str> {
        [attachment.url.as_deref(), attachment.file_name.as_deref()]
            .into_iter()
            .flatten()
            .find(|identity| !identity.is_empty())
    }

    /// Whether this attachment was already delivered while streaming.
    pub fn has_streamed(&self, attachment: &MessageAttachment) -> bool {
        Self::media_identity(attachment).is_some_and(|id| self.streamed_media.contains_key(id))
    }
}

/// One update pushed into a live message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(
    tag = "mode",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
#[non_exhaustive]
pub enum LiveMessageUpdate {
    /// The whole text so far (replaces the preview).
    Partial {
        /// The text so far.
        text: String,
    },
    /// One completed block, appended.
    Block {
        /// The block's position in the message.
        index: u32,
        /// The block's text.
        text: String,
    },
    /// A progress line, optionally with a completed fraction in `0.0..=1.0`.
    Progress {
        /// What is in progress.
        label: String,
        /// How much is done, in `0.0..=1.0`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fraction: Option<f64>,
    },
    /// A platform-native stream chunk, opaque to the core.
    Native {
        /// The chunk, as the adapter's platform takes it.
        payload: serde_json::Value,
    },
}

impl LiveMessageUpdate {
    /// The whole text so far.
    pub fn partial(text: impl Into<String>) -> Self {
        LiveMessageUpdate::Partial { text: text.into() }
    }

    /// Completed block `index`.
    pub fn block(index: u32, text: impl Into<String>) -> Self {
        LiveMessageUpdate::Block {
            index,
            text: text.into(),
        }
    }

    /// A progress line, with the completed fraction when known.
    pub fn progress(label: impl Into<String>, fraction: Option<f64>) -> Self {
        LiveMessageUpdate::Progress {
            label: label.into(),
            fraction,
        }
    }

    /// A platform-native stream chunk.
    pub fn native(payload: serde_json::Value) -> Self {
        LiveMessageUpdate::Native { payload }
    }
}

/// Why a live preview is cancelled (and cleaned up) instead of finalized in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LiveCancelReason {
    /// The final carries media the preview cannot become.
    Media,
    /// The run failed; the error is delivered normally.
    Error,
    /// The final must answer a different message than the preview does.
    ReplyTargetMismatch,
    /// The preview is older than `staleAfterMs`.
    Stale,
    /// The turn was aborted.
    Aborted,
}

known_variants!(LiveCancelReason {
    Media,
    Error,
    ReplyTargetMismatch,
    Stale,
    Aborted
});
