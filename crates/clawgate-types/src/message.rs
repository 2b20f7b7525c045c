//! Platform-neutral messages: target, actor, body, attachments and relation.

use serde::{Deserialize, Serialize};

use crate::{MessageOrigin, UnixMillis};

/// Whether a message came from a platform or is going to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MessageDirection {
    Inbound,
    Outbound,
}

/// A normalized message, neutral with respect to the platform it lives on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChannelMessage {
    pub id: String,
    /// The channel (platform plugin) name, e.g. `qa`, `telegram`.
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    pub direction: MessageDirection,
    pub target: MessageTarget,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<MessageActor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<MessageBody>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<MessageAttachment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relation: Option<MessageRelation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<MessageOrigin>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<UnixMillis>,
    /// The platform's own payload, kept opaque for adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<serde_json::Value>,
}

/// The shape of the place a message lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    Direct,
    Group,
    Channel,
    Thread,
}

impl TargetKind {
    /// Rooms shared by several participants ("room-like"): where bot echoes can loop.
    pub fn is_roomish(self) -> bool {
        !matches!(self, TargetKind::Direct)
    }
}

/// Where a message lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageTarget {
    pub kind: TargetKind,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_channel_id: Option<String>,
}

/// Who wrote a message, as far as the platform tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageActor {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Set when the platform says the author is a bot account.
    #[serde(default)]
    pub is_bot: bool,
}

/// The visible content of a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageBody {
    pub text: String,
    /// Formatting the text is written in (`plain`, `markdown`, `html`, …); adapters render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

/// A file, image, voice note or card carried with a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageAttachment {
    pub kind: crate::MessagePartKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

/// A quoted excerpt of the message being replied to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageQuote {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_id: Option<String>,
}

/// Why the gateway itself is sending a message that is not a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SystemReason {
    Approval,
    Task,
    Hook,
    Cron,
    Subagent,
    MessageTool,
    Cli,
    ControlUi,
    Automation,
    Error,
}

/// How an outbound message relates to what came before. A reply is a relation, not an API root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
pub enum MessageRelation {
    Reply {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inbound_message_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quote: Option<MessageQuote>,
    },
    Followup {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_message_id: Option<String>,
    },
    Broadcast {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    System {
        reason: SystemReason,
    },
}

impl MessageRelation {
    /// The platform message this one answers, if any (used for reply-target checks).
    pub fn reply_to_id(&self) -> Option<&str> {
        match self {
            MessageRelation::Reply { reply_to_id, .. } => reply_to_id.as_deref(),
            _ => None,
        }
    }

    /// The thread the message belongs in, when the relation pins one.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            MessageRelation::Reply { thread_id, .. } => thread_id.as_deref(),
            _ => None,
        }
    }
}
