//! The web chat page: a person on the QA platform, in a browser. The page writes into a
//! conversation (an inbound platform event, like any other) and shows what the platform holds,
//! each agent message marked `streaming` (a live preview) or `final` (its reply intent is sent).
//!
//! Served on loopback without a token: it can do nothing a QA platform user could not. The
//! answers are the control API's QA views (`QaConversation`, `QaMessage`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clawgate_channel_qa::{InboundRequest, PlatformMessage, QaHandle};

use crate::control::ApiError;
use crate::gateway::{Channel, Gateway};
use crate::views::{self, QaSendBody};

const PAGE: &str = include_str!("../assets/chat.html");
/// The author id of messages written on the page.
pub const WEB_AUTHOR: &str = "web-user";

pub fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/chat/api/messages", get(crate::control::qa_messages))
        .route("/chat/api/send", post(send))
}

/// As `POST /v1/qa/send`, always as the page's person.
async fn send(State(gateway): State<Arc<Gateway>>, Json(body): Json<QaSendBody>) -> Response {
    let answer = async {
        let channel = views::pick_channel(&gateway.channels, body.channel.as_deref())?;
        let body = QaSendBody {
            author: Some(WEB_AUTHOR.to_owned()),
            ..body
        };
        views::qa_send(channel, &body).await
    };
    match answer.await {
        Ok(message) => (StatusCode::CREATED, Json(message)).into_response(),
        Err(e) => ApiError::from(e).into_response(),
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
    qa_handle(channel)?
        .adapter
        .write_as(conversation, &request)
        .await
        .map_err(|e| format!("QA platform: {}", e.message))
}

/// The QA side of a channel: its adapter and platform, when the channel is of kind `qa`.
pub fn qa_handle(channel: &Channel) -> Result<Arc<QaHandle>, String> {
    channel.plugin.extension::<QaHandle>().ok_or_else(|| {
        format!(
            "channel {} is not a QA channel (kind {}): the QA views and the chat page need one",
            channel.name, channel.kind
        )
    })
}

/// Whether any configured channel is a QA channel (the chat page and `/v1/qa` are mounted
/// only then).
pub fn has_qa_channel(channels: &[Arc<Channel>]) -> bool {
    channels.iter().any(|c| qa_handle(c).is_ok())
}
