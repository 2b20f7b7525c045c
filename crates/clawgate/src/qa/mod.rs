//! Everything of the QA platform beyond its channel: the web chat page, the `/v1/qa/*` routes
//! of the control API and `clawgate qa` — the only code of the binary that knows the QA
//! platform (`QaAdapter`, `QaPlatform`), reached through the QA channel's plugin extension.
//!
//! This module depends on the rest of the crate and nothing in the crate depends on it but
//! `serve`, which mounts [`routes`] only when a QA channel is configured (and the binary's
//! `main`, which adds the `qa` commands). `cargo xtask tidy` refuses an import circle between the crate's modules.

use std::sync::Arc;

use axum::Router;

use crate::gateway::Gateway;

mod api;
mod chat;
pub mod cli;
mod delivery;
mod views;

pub use api::ROUTES;
pub use chat::WEB_AUTHOR;
pub use delivery::{has_qa_channel, inject, qa_handle};
pub use views::{
    QaConversation, QaMessage, QaMessageState, QaMessagesParams, QaSendBody, pick_channel,
    qa_messages, qa_send,
};

/// The chat page (no token: it can do nothing a QA platform user could not) and the `/v1/qa/*`
/// control routes, which `token` guards.
pub fn routes(token: Arc<String>) -> Router<Arc<Gateway>> {
    chat::routes().merge(api::routes(token))
}
