//! The slice of Discord's wire format this channel reads and writes (platform-apis §3): the
//! Message object, the error body, rate-limit answers and Gateway payloads. Unknown fields are
//! ignored, so a richer answer from Discord still parses.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Discord's epoch (2015-01-01T00:00:00Z) in Unix milliseconds: snowflakes count from it.
pub const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;

/// The Unix time in milliseconds a snowflake was made at.
pub fn snowflake_ms(id: &str) -> Option<u64> {
    id.parse::<u64>().ok().map(|s| (s >> 22) + DISCORD_EPOCH_MS)
}

/// A user (`author`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// Snowflake.
    pub id: String,
    /// The user name.
    pub username: String,
    /// Bots and apps.
    #[serde(default)]
    pub bot: bool,
}

/// `message_reference` of a reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageReference {
    /// The answered message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Its channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_id: Option<String>,
    /// Its guild.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guild_id: Option<String>,
}

/// A message as REST answers and `MESSAGE_CREATE` dispatches carry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Snowflake.
    pub id: String,
    /// The channel (or thread) it is in.
    pub channel_id: String,
    /// Set in guild channels (gateway events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guild_id: Option<String>,
    /// Who wrote it.
    pub author: User,
    /// The text (empty without the MESSAGE_CONTENT intent).
    #[serde(default)]
    pub content: String,
    /// The sender's nonce (int or string).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<Value>,
    /// What it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_reference: Option<MessageReference>,
    /// Set for messages a webhook posted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_id: Option<String>,
    /// Attachments (only counted).
    #[serde(default)]
    pub attachments: Vec<Value>,
}

impl Message {
    /// The nonce as text (Discord echoes what was sent: a string or an integer).
    pub fn nonce_text(&self) -> Option<String> {
        match self.nonce.as_ref()? {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }
}

/// An error answer: `{code, message, errors?}`; a 429 adds `retry_after` and `global`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ErrorBody {
    /// The JSON error code (0: general).
    #[serde(default)]
    pub code: i64,
    /// The text.
    #[serde(default)]
    pub message: String,
    /// The form-error tree of a 50035.
    #[serde(default)]
    pub errors: Option<Value>,
    /// Seconds to wait (429).
    #[serde(default)]
    pub retry_after: Option<f64>,
    /// Whether the global limit was hit (429).
    #[serde(default)]
    pub global: Option<bool>,
}

impl ErrorBody {
    /// The first `_errors[].code` in the form-error tree, depth first.
    pub fn first_form_error(&self) -> Option<String> {
        fn walk(value: &Value) -> Option<String> {
            let map = value.as_object()?;
            if let Some(list) = map.get("_errors").and_then(Value::as_array) {
                return list
                    .iter()
                    .find_map(|e| e.get("code").and_then(Value::as_str).map(str::to_owned));
            }
            map.values().find_map(walk)
        }
        walk(self.errors.as_ref()?)
    }
}

/// `GET /gateway/bot`.
#[derive(Debug, Clone, Deserialize)]
pub struct GatewayBot {
    /// The `wss://` URL to connect to.
    pub url: String,
}

/// One Gateway payload `{op, d, s, t}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GatewayPayload {
    /// Opcode.
    pub op: u8,
    /// Data.
    #[serde(default)]
    pub d: Value,
    /// Sequence number (dispatches only).
    #[serde(default)]
    pub s: Option<u64>,
    /// Event name (dispatches only).
    #[serde(default)]
    pub t: Option<String>,
}

/// Gateway opcodes.
pub mod op {
    /// An event.
    pub const DISPATCH: u8 = 0;
    /// Keep-alive, both ways.
    pub const HEARTBEAT: u8 = 1;
    /// Start a session.
    pub const IDENTIFY: u8 = 2;
    /// Continue a session.
    pub const RESUME: u8 = 6;
    /// The server asks for a reconnect and resume.
    pub const RECONNECT: u8 = 7;
    /// The session is gone (`d`: whether it may be resumed).
    pub const INVALID_SESSION: u8 = 9;
    /// First message: `heartbeat_interval`.
    pub const HELLO: u8 = 10;
    /// The heartbeat was received.
    pub const HEARTBEAT_ACK: u8 = 11;
}

/// Gateway intents this channel uses.
pub mod intents {
    /// Messages in guild channels.
    pub const GUILD_MESSAGES: u64 = 1 << 9;
    /// Direct messages.
    pub const DIRECT_MESSAGES: u64 = 1 << 12;
    /// Message text (privileged).
    pub const MESSAGE_CONTENT: u64 = 1 << 15;
    /// Guilds (needed for threads and channel events).
    pub const GUILDS: u64 = 1;
}
