//! The Mattermost objects the channel reads: a post, the error body, a WebSocket event.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A post (`/api/v4/posts`, and `data.post` of the WebSocket's post events).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Post {
    /// 26-character id.
    pub id: String,
    /// Milliseconds.
    pub create_at: i64,
    /// Milliseconds.
    pub update_at: i64,
    /// Milliseconds; 0 when not deleted.
    pub delete_at: i64,
    /// The author.
    pub user_id: String,
    /// The channel.
    pub channel_id: String,
    /// The thread root; empty for a root post.
    pub root_id: String,
    /// The text.
    pub message: String,
    /// `""` for a normal post, `system_…` for system messages.
    #[serde(rename = "type")]
    pub kind: String,
    /// Properties (a bot account's posts carry `from_bot: "true"`).
    pub props: Value,
    /// The client's dedupe id, when it sent one.
    pub pending_post_id: String,
}

impl Post {
    /// A string prop.
    pub fn prop(&self, key: &str) -> Option<&str> {
        self.props.get(key).and_then(Value::as_str)
    }

    /// Whether a bot account wrote it.
    pub fn from_bot(&self) -> bool {
        match self.props.get("from_bot") {
            Some(Value::String(s)) => s == "true",
            Some(Value::Bool(b)) => *b,
            _ => false,
        }
    }
}

/// `{"order": [...], "posts": {...}}` of a channel's posts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct PostList {
    /// Ids, newest first.
    pub order: Vec<String>,
    /// The posts by id.
    pub posts: std::collections::HashMap<String, Post>,
}

/// An error answer: `{id, message, detailed_error, request_id, status_code, is_oauth}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ErrorBody {
    /// The error id (`api.post.create_post.root_id.app_error`).
    pub id: String,
    /// Its text.
    pub message: String,
    /// More detail, often empty.
    pub detailed_error: String,
    /// The server's request id.
    pub request_id: String,
    /// The HTTP status, repeated.
    pub status_code: u16,
}

/// One WebSocket event.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Event {
    /// `posted`, `post_edited`, `hello`…
    pub event: String,
    /// Its data (`post` is a JSON string).
    pub data: Value,
    /// Who it was sent to.
    pub broadcast: Value,
    /// The connection's sequence number.
    pub seq: Option<i64>,
}

impl Event {
    /// The post an event carries (`data.post`, a JSON string).
    pub fn post(&self) -> Option<Post> {
        serde_json::from_str(self.data.get("post")?.as_str()?).ok()
    }
}
