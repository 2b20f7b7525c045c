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

use super::views::{self, QaSendBody};
use crate::control::ApiError;
use crate::gateway::Gateway;

const PAGE: &str = include_str!("chat.html");
/// The author id of messages written on the page.
pub const WEB_AUTHOR: &str = "web-user";

pub(super) fn routes() -> Router<Arc<Gateway>> {
    Router::new()
        .route("/", get(|| async { Html(PAGE) }))
        .route("/chat/api/messages", get(super::api::messages))
        .route("/chat/api/send", post(send))
}

/// As `POST /v1/qa/send`, always as the page's person.
async fn send(
    State(gateway): State<Arc<Gateway>>,
    body: crate::control::BodyOf<QaSendBody>,
) -> Response {
    // Refused as the control API refuses: JSON, 400 (or 413), never a plain-text 422.
    let body = match body {
        Ok(Json(body)) => body,
        Err(rejection) => return crate::control::body_rejected(rejection).into_response(),
    };
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
