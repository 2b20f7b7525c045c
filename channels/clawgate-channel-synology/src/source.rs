//! Where events come from: Synology Chat POSTing to the channel's webhook URL — the bot's
//! events (a person's DM) and the channels' outgoing webhooks (a post starting with a trigger
//! word) alike, form-encoded.
//!
//! The `token` field is the only proof of origin (no signature exists): it is compared, in
//! constant time over SHA-256 digests, with the bot's token and every channel's outgoing-webhook
//! token before anything else of the request is looked at (the form is scanned for that field
//! alone). A channel token is accepted only with its own `channel_id`. A mismatch of either
//! gets the gateway's one 401 (`listener::refused`, which does not say which); nothing else is
//! read. The event is handed to the engine (the token left out) and answered 204 with no body
//! only once the engine has recorded it durably (an empty answer posts nothing back into Chat);
//! otherwise 500. Synology is not known to send an event again, so a failure here is a prompt
//! lost; the engine's durable dedupe by post id drops a copy that does arrive twice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::listener::{self, Limits, refused};
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, Secret, SourceError,
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tracing::warn;

/// Whose token an event carried.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Bot,
    Channel(String),
}

/// The tokens events may carry.
#[derive(Clone, Default)]
pub struct InboundTokens {
    bot: Option<Secret>,
    channels: Vec<(String, Secret)>,
}

impl std::fmt::Debug for InboundTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InboundTokens")
            .field("bot", &self.bot.is_some())
            .field(
                "channels",
                &self.channels.iter().map(|(c, _)| c).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl InboundTokens {
    /// The bot's token (DM events), if the channel has a bot.
    pub fn with_bot(mut self, token: Secret) -> Self {
        self.bot = Some(token);
        self
    }

    /// The outgoing-webhook token of Chat channel `channel_id`.
    pub fn with_channel(mut self, channel_id: &str, token: Secret) -> Self {
        self.channels.push((channel_id.to_owned(), token));
        self
    }

    /// Whose token `given` is; every known token is compared, so the time taken does not
    /// tell which (or how much of one) matched.
    fn origin(&self, given: &str) -> Option<Origin> {
        let digest = |s: &str| Sha256::digest(s.as_bytes());
        let given = digest(given);
        let mut found = None;
        if let Some(bot) = &self.bot
            && clawgate_channel_sdk::same_secret(&digest(bot.expose()), &given)
        {
            found = Some(Origin::Bot);
        }
        for (channel, token) in &self.channels {
            if clawgate_channel_sdk::same_secret(&digest(token.expose()), &given) {
                found = Some(Origin::Channel(channel.clone()));
            }
        }
        found
    }
}

/// The largest webhook body taken: each delivery is one post's form fields
/// (platform-apis-wave2 §7, no size given), far below 256 KiB even percent-encoded.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// How the webhook listener is set up.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (the integrations' outgoing URL must reach it).
    pub listen: SocketAddr,
    /// The path it serves.
    pub path: String,
    /// The tokens events may carry.
    pub tokens: InboundTokens,
    /// How long a delivery waits for the engine's durable record before answering 500.
    pub answer_deadline: Duration,
}

/// The webhook listener.
#[derive(Debug)]
pub struct WebhookSource {
    config: WebhookConfig,
}

impl WebhookSource {
    /// A listener set up by `config`.
    pub fn new(config: WebhookConfig) -> WebhookSource {
        WebhookSource { config }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    tokens: InboundTokens,
    deadline: Duration,
}

/// The last value of form field `name` (the one a plain form decoder keeps), decoded.
fn field(body: &[u8], name: &str) -> Option<String> {
    form_urlencoded::parse(body)
        .filter(|(key, _)| key == name)
        .last()
        .map(|(_, value)| value.into_owned())
}

async fn deliver(State(delivery): State<Arc<Delivery>>, body: Bytes) -> Response {
    // The token alone is read before it is checked; the other fields only after.
    let origin = field(&body, "token").and_then(|t| delivery.tokens.origin(&t));
    let via = match origin {
        None => {
            warn!("a Synology Chat event with an unknown token was refused");
            return refused();
        }
        Some(Origin::Bot) => "bot",
        Some(Origin::Channel(channel)) => {
            if field(&body, "channel_id").as_deref() != Some(channel.as_str()) {
                warn!(
                    channel,
                    "an outgoing-webhook token arrived with another channel_id: refused"
                );
                return refused();
            }
            "outgoing"
        }
    };
    let fields: Map<String, Value> = form_urlencoded::parse(&body)
        .filter(|(key, _)| key != "token")
        .map(|(key, value)| (key.into_owned(), Value::String(value.into_owned())))
        .collect();
    if !fields.contains_key("post_id") {
        return (StatusCode::BAD_REQUEST, "not a Synology Chat event").into_response();
    }
    let (ack, signal) = AckSignal::new();
    delivery
        .sink
        .deliver(PushedEvent::new(
            json!({ "via": via, "fields": fields }),
            ack,
        ))
        .await;
    match signal.answer(delivery.deadline).await {
        AckAnswer::Acked => StatusCode::NO_CONTENT.into_response(),
        _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            tokens: self.config.tokens.clone(),
            deadline: self.config.answer_deadline,
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the Synology Chat webhook listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_origin_and_nothing_else_matches() {
        let tokens = InboundTokens::default()
            .with_bot(Secret::new("bot-token"))
            .with_channel("34", Secret::new("channel-token"));
        assert_eq!(tokens.origin("bot-token"), Some(Origin::Bot));
        assert_eq!(
            tokens.origin("channel-token"),
            Some(Origin::Channel("34".into()))
        );
        for wrong in [
            "",
            "bot-toke",
            "bot-token ",
            "\"bot-token\"",
            "channel-token2",
        ] {
            assert_eq!(tokens.origin(wrong), None, "{wrong:?}");
        }
        assert!(!format!("{tokens:?}").contains("token\""));
        assert!(!format!("{tokens:?}").contains("bot-token"));
    }
}
