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
pub use delivery::{embedded_platform_token, has_qa_channel, inject, qa_handle};
pub use views::{
    QaConversation, QaMessage, QaMessageState, QaMessagesParams, QaSendBody, pick_channel,
    qa_messages, qa_send,
};

/// The chat page (no token: it can do nothing a QA platform user could not) and the `/v1/qa/*`
/// control routes, which `token` guards.
pub fn routes(token: Arc<String>) -> Router<Arc<Gateway>> {
    chat::routes().merge(api::routes(token))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use clawgate_channel_sdk::{ChannelFactory as _, ChannelSetup};

    use crate::channels::Channel;

    #[tokio::test]
    async fn a_channel_never_prints_its_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = std::sync::Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
        let plugin = clawgate_channel_qa::QaFactory::keeping_platforms_in(dir.path())
            .build(ChannelSetup::new(
                0,
                "qa",
                "default",
                serde_json::Value::Null,
                clawgate_channel_sdk::ChannelState::with_system_clock(
                    store,
                    clawgate_store::ChannelScope::new("qa", "default"),
                ),
            ))
            .await
            .expect("an embedded QA channel");
        let token = plugin
            .extension::<clawgate_channel_qa::QaHandle>()
            .and_then(|h| h.platform.as_ref().map(|p| p.token().to_owned()))
            .expect("embedded platform");
        let channel = Channel::new("qa", "qa", "default", "main", plugin, 1);
        let printed = format!("{channel:?}");
        assert!(!printed.contains(&token), "{printed}");
        let channels = [Arc::new(channel)];
        assert!(
            super::has_qa_channel(&channels),
            "the QA wiring finds its channel"
        );
    }
}
