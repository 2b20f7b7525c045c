//! The web chat page: a person on the QA platform, in a browser. The page writes into a
//! conversation (an inbound platform event, like any other) and shows what the platform holds,
//! each agent message marked `streaming` (a live preview) or `final` (its reply intent is sent).
//!
//! Served on loopback without a token: it can do nothing a QA platform user could not. The
//! answers are the control API's QA views (`QaConversation`, `QaMessage`).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clawgate_channel_qa::{InboundRequest, PlatformMessage};
use serde::Deserialize;

use crate::control::ApiError;
use crate::gateway::{Channel, Gateway};
use crate::views::{self, QaSendBody};

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

/// The page talks to the first channel (the QA account of the default configuration).
async fn messages(
    State(gateway): State<Arc<Gateway>>,
    Query(query): Query<ConversationQuery>,
) -> Response {
    let answer = async {
        let channel = views::pick_channel(&gateway.channels, None)?;
        views::qa_messages(&*gateway.store, channel, &query.conversation).await
    };
    match answer.await {
        Ok(conversation) => Json(conversation).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn send(State(gateway): State<Arc<Gateway>>, Json(body): Json<SendBody>) -> Response {
    let answer = async {
        let channel = views::pick_channel(&gateway.channels, None)?;
        let body = QaSendBody {
            conversation: body.conversation,
            text: body.text,
            author: Some(WEB_AUTHOR.to_owned()),
            channel: None,
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
    channel
        .adapter
        .write_as(conversation, &request)
        .await
        .map_err(|e| format!("QA platform: {}", e.message))
}
