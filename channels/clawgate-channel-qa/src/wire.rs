//! The QA platform's JSON shapes, shared by the server and the adapter.

use clawgate_types::MessagePartKind;
use serde::{Deserialize, Serialize};

/// A file or image a message carries, by reference (the QA platform takes remote URLs, as
/// chat APIs do when they fetch the file themselves). Mirrors `clawgate_types::MessageAttachment`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlatformAttachment {
    pub kind: MessagePartKind,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
}

/// A message as the platform stores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlatformMessage {
    pub id: String,
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    /// The text, or the caption of a media message (may be empty when it carries attachments).
    pub text: String,
    /// Media the message carries; a media message is its own message with its own id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<PlatformAttachment>,
    /// Structured metadata (the origin marker travels here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub edits: u32,
    /// Platform sequence number of the creation.
    pub seq: u64,
    /// Who wrote it: the gateway's bot for API sends, the injected author for inbound messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_id: Option<String>,
    #[serde(default)]
    pub author_is_bot: bool,
}

/// `POST /control/conversations/{conv}/inbound`: a message written by someone on the platform
/// (a person, or another bot), as the gateway would receive it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundRequest {
    pub text: String,
    pub author_id: String,
    #[serde(default)]
    pub author_is_bot: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// `POST /api/conversations/{conv}/messages`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendRequest {
    /// The text, or the caption when `attachments` is not empty (then it may be empty).
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<PlatformAttachment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// `PATCH …/messages/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EditRequest {
    pub text: String,
}

/// Successful answers carrying one message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageAnswer {
    pub ok: bool,
    pub message: PlatformMessage,
}

/// Successful answers carrying a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagesAnswer {
    pub ok: bool,
    pub messages: Vec<PlatformMessage>,
}

/// The error of an error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiError {
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
}

/// `{"ok": false, "error": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub ok: bool,
    pub error: ApiError,
}

/// How an injected fault behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultMode {
    /// Answer with `status` (and `code`) without doing anything.
    Status,
    /// Do the work (the message lands), then drop the connection before a complete answer: a
    /// true unknown outcome for the client.
    DropAfterAccept,
    /// Do the work, then wait `delayMs` before answering (client timeouts).
    DelayAfterAccept,
    /// Wait `delayMs`, then proceed normally.
    DelayBefore,
}

/// One fault, applied to the next `count` API calls that touch messages. Unknown fields are
/// refused: a misspelt field would otherwise make a fault test pass without its fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fault {
    pub count: u32,
    pub mode: FaultMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// Let this many calls through untouched before the fault starts applying.
    #[serde(default)]
    pub pass_first: u32,
}

impl Fault {
    /// Applies the fault only after `calls` calls went through untouched.
    pub fn after(mut self, calls: u32) -> Fault {
        self.pass_first = calls;
        self
    }

    /// Fail the next `count` calls with an HTTP status.
    pub fn status(count: u32, status: u16, code: &str) -> Fault {
        Fault {
            count,
            mode: FaultMode::Status,
            status: Some(status),
            code: Some(code.into()),
            retry_after_secs: None,
            delay_ms: None,
            pass_first: 0,
        }
    }

    /// 429 with `Retry-After`.
    pub fn rate_limited(count: u32, retry_after_secs: u64) -> Fault {
        Fault {
            retry_after_secs: Some(retry_after_secs),
            ..Fault::status(count, 429, "rate_limited")
        }
    }

    /// Land the message, then drop the connection.
    pub fn drop_after_accept(count: u32) -> Fault {
        Fault {
            count,
            mode: FaultMode::DropAfterAccept,
            status: None,
            code: None,
            retry_after_secs: None,
            delay_ms: None,
            pass_first: 0,
        }
    }

    /// Land the message, then answer late.
    pub fn delay_after_accept(count: u32, delay_ms: u64) -> Fault {
        Fault {
            delay_ms: Some(delay_ms),
            mode: FaultMode::DelayAfterAccept,
            ..Fault::drop_after_accept(count)
        }
    }
}

/// What happened on the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogEvent {
    Sent,
    Edited,
    Deleted,
    /// A repeated idempotency key answered with the first message (nothing new landed).
    Replayed,
    /// Someone on the platform wrote a message (inbound for the gateway).
    Inbound,
}

/// One line of the platform's durable log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    pub seq: u64,
    pub event: LogEvent,
    pub message_id: String,
    pub conversation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<PlatformAttachment>,
}

/// One entry of the inbound update feed (`GET /api/updates`), in the style of Telegram's
/// getUpdates: ids increase; asking with `offset` confirms every update below it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Update {
    pub update_id: i64,
    pub message: PlatformMessage,
}

/// `GET /api/updates` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdatesAnswer {
    pub ok: bool,
    pub result: Vec<Update>,
}
