//! Receipts: what the platform said it created. The bridge between a durable intent and later
//! edits, deletes, preview finalization, duplicate suppression and recovery.

use serde::{Deserialize, Serialize};

use crate::{MessagePartKind, UnixMillis};

/// One platform message of a (possibly multi-part) delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageReceiptPart {
    /// The id the platform gave the message it created.
    pub platform_message_id: String,
    /// What the created message is.
    pub kind: MessagePartKind,
    /// Index of the rendered unit this part delivered.
    pub index: u32,
    /// The thread the platform put the message in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The message the platform shows it answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    /// What the platform needs, beyond the id, to edit the message later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_token: Option<String>,
    /// What the platform needs, beyond the id, to delete the message later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_token: Option<String>,
    /// A link to the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The platform's own response, kept opaque for the adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<serde_json::Value>,
}

impl MessageReceiptPart {
    /// The receipt of the platform message that delivered rendered unit `index`.
    pub fn new(platform_message_id: impl Into<String>, kind: MessagePartKind, index: u32) -> Self {
        MessageReceiptPart {
            platform_message_id: platform_message_id.into(),
            kind,
            index,
            thread_id: None,
            reply_to_id: None,
            edit_token: None,
            delete_token: None,
            url: None,
            raw: None,
        }
    }

    setters! { opt into
        /// Sets the thread the platform put the message in.
        with_thread_id => thread_id: String;
        /// Sets the message the platform shows it answering.
        with_reply_to_id => reply_to_id: String;
        /// Sets the platform's edit token.
        with_edit_token => edit_token: String;
        /// Sets the platform's delete token.
        with_delete_token => delete_token: String;
        /// Sets the link to the message.
        with_url => url: String;
    }

    setters! { opt
        /// Sets the platform's own response.
        with_raw => raw: serde_json::Value;
    }
}

/// Everything a delivery created on the platform: every platform id plus one primary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageReceipt {
    /// The platform message that stands for the whole delivery (edits and replies target it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_platform_message_id: Option<String>,
    /// Every platform message the delivery created, in part order.
    pub platform_message_ids: Vec<String>,
    /// One receipt per delivered unit.
    pub parts: Vec<MessageReceiptPart>,
    /// The thread the delivery landed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The message the delivery answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    /// The platform's edit token for the primary message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_token: Option<String>,
    /// The platform's delete token for the primary message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_token: Option<String>,
    /// A link to the primary message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// When the delivery completed.
    pub sent_at: UnixMillis,
    /// The platform's own response, kept opaque for the adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<serde_json::Value>,
}

impl MessageReceipt {
    /// Builds a receipt from its parts: ids in part order, the first part primary.
    pub fn from_parts(parts: Vec<MessageReceiptPart>, sent_at: UnixMillis) -> Self {
        let platform_message_ids: Vec<String> = parts
            .iter()
            .map(|p| p.platform_message_id.clone())
            .collect();
        MessageReceipt {
            primary_platform_message_id: platform_message_ids.first().cloned(),
            thread_id: parts.first().and_then(|p| p.thread_id.clone()),
            reply_to_id: parts.first().and_then(|p| p.reply_to_id.clone()),
            platform_message_ids,
            parts,
            edit_token: None,
            delete_token: None,
            url: None,
            sent_at,
            raw: None,
        }
    }

    setters! { opt into
        /// Sets the primary platform message (by default the first part's).
        with_primary_platform_message_id => primary_platform_message_id: String;
        /// Sets the thread the delivery landed in.
        with_thread_id => thread_id: String;
        /// Sets the message the delivery answers.
        with_reply_to_id => reply_to_id: String;
        /// Sets the edit token of the primary message.
        with_edit_token => edit_token: String;
        /// Sets the delete token of the primary message.
        with_delete_token => delete_token: String;
        /// Sets the link to the primary message.
        with_url => url: String;
    }

    setters! { opt
        /// Sets the platform's own response.
        with_raw => raw: serde_json::Value;
    }

    /// Indices of the rendered units that this receipt proves were delivered.
    pub fn delivered_indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.parts.iter().map(|p| p.index)
    }

    /// Merges another receipt's parts into this one (partial batches completing on retry).
    /// Parts already present for an index are kept; the result is ordered by unit index.
    pub fn merge(&mut self, other: MessageReceipt) {
        for part in other.parts {
            if !self.parts.iter().any(|p| p.index == part.index) {
                self.parts.push(part);
            }
        }
        self.parts.sort_by_key(|p| p.index);
        self.platform_message_ids = self
            .parts
            .iter()
            .map(|p| p.platform_message_id.clone())
            .collect();
        self.primary_platform_message_id = self.platform_message_ids.first().cloned();
        self.sent_at = self.sent_at.max(other.sent_at);
    }
}
