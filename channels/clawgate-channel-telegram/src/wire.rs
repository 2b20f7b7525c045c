//! The Bot API objects this channel reads, as Telegram sends them.
//!
//! Written here rather than taken from a Bot API crate: the channel reads about a dozen fields
//! of five objects, parses them tolerantly (unknown fields and update kinds are normal: the API
//! grows every few months), and the maintained type crates either carry a licence outside the
//! project's policy (frankenstein: WTFPL) or a whole bot framework (teloxide).

use serde::{Deserialize, Serialize};

/// Every Bot API answer: `{"ok":true,"result":…}` or `{"ok":false,"error_code":…,…}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Envelope {
    pub ok: bool,
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    #[serde(default)]
    pub error_code: Option<u16>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<ResponseParameters>,
}

/// `ResponseParameters` of a failed call.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ResponseParameters {
    #[serde(default)]
    pub migrate_to_chat_id: Option<i64>,
    #[serde(default)]
    pub retry_after: Option<u64>,
}

/// A chat as a message carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Chat {
    /// The chat id (negative for groups, `-100…` for supergroups and channels).
    pub id: i64,
    /// `private`, `group`, `supergroup` or `channel`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The group's title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// `@username` of a private chat's user or a public chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// A supergroup with topics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_forum: Option<bool>,
}

/// A user or bot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct User {
    /// The user id.
    pub id: i64,
    /// Whether it is a bot.
    pub is_bot: bool,
    /// First name.
    #[serde(default)]
    pub first_name: String,
    /// `@username`, without the `@`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
}

/// The fields of a `Message` the channel reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Unique inside its chat.
    pub message_id: i64,
    /// Unix seconds.
    #[serde(default)]
    pub date: i64,
    /// Where it was written.
    pub chat: Chat,
    /// Who wrote it (absent in channels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<User>,
    /// The chat that wrote it (channel posts, anonymous admins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_chat: Option<Chat>,
    /// The forum topic or reply thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<i64>,
    /// Sent into a forum topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_topic_message: Option<bool>,
    /// The message this one answers (same chat and thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_message: Option<Box<Message>>,
    /// Set once edited (unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edit_date: Option<i64>,
    /// The text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The caption of a media message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    /// The quoted part of the replied message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quote: Option<TextQuote>,
}

/// The quoted part of a replied message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextQuote {
    /// The quoted text.
    pub text: String,
}

/// `getMe`'s answer.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct BotUser {
    pub id: i64,
    #[serde(default)]
    pub username: Option<String>,
}

/// The update kinds this channel asks for (`allowed_updates`): messages, and edits of them.
pub const ALLOWED_UPDATES: &[&str] = &["message", "edited_message", "channel_post"];
