//! The QA channel's routes of the control API (`/v1/qa/*`), behind the same bearer token.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};

use super::views::{self, QaConversation, QaMessage, QaMessagesParams, QaSendBody};
use crate::control::{self, Answer, BodyOf, QueryOf, RouteDoc, bad_request};
use crate::gateway::Gateway;

/// The QA routes of the control API, in the order [`super::routes`] mounts them.
pub const ROUTES: &[RouteDoc] = &[
    RouteDoc {
        method: "GET",
        path: "/v1/qa/messages",
        input: Some("QaMessagesParams"),
        output: "QaConversation",
        about: "What a QA conversation shows, agent messages marked `streaming` or `final`.",
    },
    RouteDoc {
        method: "POST",
        path: "/v1/qa/send",
        input: Some("QaSendBody"),
        output: "QaMessage",
        about: "Writes into a QA conversation as a person (the agent answers as usual).",
    },
];

/// The `/v1/qa/*` routes; `token` guards them.
pub(super) fn routes(token: Arc<String>) -> Router<Arc<Gateway>> {
    let router = Router::new()
        .route("/v1/qa/messages", get(messages))
        .route("/v1/qa/send", post(send));
    control::require_token(router, token)
}

/// Also the chat page's view of its conversation (served there without a token).
pub(super) async fn messages(
    State(gateway): State<Arc<Gateway>>,
    query: QueryOf<QaMessagesParams>,
) -> Answer<QaConversation> {
    let Query(params) = query.map_err(bad_request)?;
    let channel = views::pick_channel(&gateway.channels, params.channel.as_deref())?;
    Ok(Json(
        views::qa_messages(&*gateway.store, channel, &params.conversation).await?,
    ))
}

async fn send(State(gateway): State<Arc<Gateway>>, body: BodyOf<QaSendBody>) -> Answer<QaMessage> {
    let Json(body) = body.map_err(control::body_rejected)?;
    let channel = views::pick_channel(&gateway.channels, body.channel.as_deref())?;
    Ok(Json(views::qa_send(channel, &body).await?))
}
