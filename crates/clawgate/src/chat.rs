//! The web chat page: a person on the QA platform, in a browser. The page writes into a
//! conversation (an inbound platform event, like any other) and shows what the platform holds,
//! each agent message marked `streaming` (a live preview) or `final` (its reply intent is sent).
//!
//! Served on loopback without a token: it can do nothing a QA platform user could not.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clawgate_channel_qa::{InboundRequest, MessagesAnswer, PlatformMessage};
use clawgate_store::IntentStore;
use clawgate_types::IntentStatus;
use serde::{Deserialize, Serialize};

use crate::gateway::{Channel, Gateway};

const PAGE: &str = include_str!("../assets/chat.html");
/// The author id of messages written on the page.
pub const WEB_AUTHOR: &str = "web-user";

pub fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/chat/api/messages", get(messages))
        .route("/chat/api/send", post(send))
}

#[derive(Debug, Deserialize)]
struct ConversationQuery {
    conversation: String,
}

#[derive(Debug, Deserialize)]
struct SendBody {
    conversation: String,
    text: String,
}

/// One message as the page shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ChatMessage {
    id: String,
    text: String,
    from_agent: bool,
    /// `sent` for a person's message; `streaming` or `final` for the agent's.
    state: &'static str,
    edits: u32,
}

fn failure(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

fn valid_conversation(conversation: &str) -> bool {
    !conversation.is_empty()
        && conversation.len() <= 128
        && conversation
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The page talks to the first channel (the QA account of the default configuration).
fn channel(gateway: &Gateway) -> Option<&Arc<Channel>> {
    gateway.channels.first()
}

async fn messages(
    State(gateway): State<Arc<Gateway>>,
    Query(query): Query<ConversationQuery>,
) -> Response {
    if !valid_conversation(&query.conversation) {
        return failure(
            StatusCode::BAD_REQUEST,
            "conversation: letters, digits, - and _ only",
        );
    }
    let Some(channel) = channel(&gateway) else {
        return failure(StatusCode::NOT_FOUND, "no channel configured");
    };
    let url = format!(
        "{}/api/conversations/{}/messages",
        channel.base_url, query.conversation
    );
    let answer = reqwest::Client::new()
        .get(url)
        .bearer_auth(&channel.token)
        .send()
        .await;
    let listed = match answer {
        Ok(response) if response.status().is_success() => response
            .json::<MessagesAnswer>()
            .await
            .map_err(|e| e.to_string()),
        Ok(response) => Err(format!("platform answered {}", response.status())),
        Err(e) => Err(e.to_string()),
    };
    let platform_messages = match listed {
        Ok(answer) => answer.messages,
        Err(e) => return failure(StatusCode::BAD_GATEWAY, format!("QA platform: {e}")),
    };
    let mut out = Vec::with_capacity(platform_messages.len());
    for message in platform_messages {
        let state = state_of(&gateway, &message).await;
        out.push(ChatMessage {
            from_agent: message.author_is_bot || message.author_id.is_none(),
            id: message.id,
            text: message.text,
            state,
            edits: message.edits,
        });
    }
    Json(serde_json::json!({ "conversation": query.conversation, "messages": out })).into_response()
}

/// `final` once the reply intent behind an agent message is sent; `streaming` before.
async fn state_of(gateway: &Gateway, message: &PlatformMessage) -> &'static str {
    if !(message.author_is_bot || message.author_id.is_none()) {
        return "sent";
    }
    // Unit keys are `<intent key>#<unit index>`.
    let Some(intent_key) = message
        .idempotency_key
        .as_deref()
        .and_then(|k| k.rsplit_once('#'))
        .map(|(key, _)| key)
    else {
        return "final";
    };
    match gateway.store.find_intent_by_key(intent_key).await {
        Ok(Some(intent)) if intent.status == IntentStatus::Sent => "final",
        Ok(Some(_)) => "streaming",
        _ => "final",
    }
}

async fn send(State(gateway): State<Arc<Gateway>>, Json(body): Json<SendBody>) -> Response {
    if !valid_conversation(&body.conversation) {
        return failure(
            StatusCode::BAD_REQUEST,
            "conversation: letters, digits, - and _ only",
        );
    }
    if body.text.trim().is_empty() {
        return failure(StatusCode::BAD_REQUEST, "empty message");
    }
    let Some(channel) = channel(&gateway) else {
        return failure(StatusCode::NOT_FOUND, "no channel configured");
    };
    match inject(channel, &body.conversation, WEB_AUTHOR, &body.text).await {
        Ok(message) => (StatusCode::CREATED, Json(message)).into_response(),
        Err(e) => failure(StatusCode::BAD_GATEWAY, e),
    }
}

/// Writes into a QA conversation as a person (the platform's inbound injection).
pub async fn inject(
    channel: &Channel,
    conversation: &str,
    author: &str,
    text: &str,
) -> Result<PlatformMessage, String> {
    let request = InboundRequest {
        text: text.to_owned(),
        author_id: author.to_owned(),
        author_is_bot: false,
        thread_id: None,
        reply_to_id: None,
        metadata: None,
    };
    let response = reqwest::Client::new()
        .post(format!(
            "{}/control/conversations/{conversation}/inbound",
            channel.base_url
        ))
        .bearer_auth(&channel.token)
        .json(&request)
        .send()
        .await
        .map_err(|e| format!("QA platform unreachable: {e}"))?;
    if !response.status().is_success() {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        return Err(format!(
            "QA platform refused the message ({status}): {body}"
        ));
    }
    #[derive(Deserialize)]
    struct Answer {
        message: PlatformMessage,
    }
    response
        .json::<Answer>()
        .await
        .map(|a| a.message)
        .map_err(|e| format!("QA platform answer unreadable: {e}"))
}
