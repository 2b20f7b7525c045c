//! Receipts: what the platform said it created. The bridge between a durable intent and later
//! edits, deletes, preview finalization, duplicate suppression and recovery.

use serde::{Deserialize, Serialize};

use crate::{MessagePartKind, UnixMillis};

/// One platform message of a (possibly multi-part) delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageReceiptPart {
    pub platform_message_id: String,
    pub kind: MessagePartKind,
    /// Index of the rendered unit this part delivered.
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<serde_json::Value>,
}

impl MessageReceiptPart {
    /// The part delivering unit `index` as platform message `platform_message_id`.
    pub fn new(
        platform_message_id: impl Into<String>,
        kind: MessagePartKind,
        index: u32,
    ) -> MessageReceiptPart {
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
}

/// Everything a delivery created on the platform: every platform id plus one primary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageReceipt {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_platform_message_id: Option<String>,
    pub platform_message_ids: Vec<String>,
    pub parts: Vec<MessageReceiptPart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub sent_at: UnixMillis,
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
