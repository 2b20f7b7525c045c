//! Live previews, edits, progress and native streams of an outbound message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{MessageAttachment, MessageReceipt, MessageReceiptPart, UnixMillis};

/// How a live message is being shown while the final is produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
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

/// Durable-enough state of a live message: enough to finalize, clean up or suppress a duplicate
/// after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LiveMessageState {
    pub mode: LiveMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<MessageReceipt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible_since: Option<UnixMillis>,
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
pub enum LiveMessageUpdate {
    /// The whole text so far (replaces the preview).
    Partial { text: String },
    /// One completed block, appended.
    Block { index: u32, text: String },
    /// A progress line, optionally with a completed fraction in `0.0..=1.0`.
    Progress {
        label: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fraction: Option<f64>,
    },
    /// A platform-native stream chunk, opaque to the core.
    Native { payload: serde_json::Value },
}

/// Why a live preview is cancelled (and cleaned up) instead of finalized in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
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
