//! Everything of the QA platform beyond its channel: the web chat page, the `/v1/qa/*` routes
//! of the control API, `clawgate qa`, and the delivery of `sessions_send` by writing into a QA
//! conversation as a person.
//!
//! This module depends on the rest of the crate and nothing in the crate depends on it but
//! `serve`, which mounts [`routes`] and plugs in [`ConversationDelivery`] in one place (and the
//! binary's `main`, which adds the `qa` commands), so a gateway without a QA channel can leave
//! it out. `cargo xtask tidy` refuses an import circle between the crate's modules.

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
pub use delivery::{ConversationDelivery, inject};
pub use views::{
    QaConversation, QaMessage, QaMessageState, QaMessagesParams, QaSendBody, pick_channel,
    qa_messages, qa_send,
};

/// The chat page (no token: it can do nothing a QA platform user could not) and the `/v1/qa/*`
/// control routes, which `token` guards.
pub fn routes(token: Arc<String>) -> Router<Arc<Gateway>> {
    chat::routes().merge(api::routes(token))
}
