//! Bot mode's source: Talk POSTing Activity Streams events to the bot's URL.
//!
//! Talk signs each POST: `X-Nextcloud-Talk-Random` and `X-Nextcloud-Talk-Signature` = hex
//! HMAC-SHA256(secret, random ‖ raw body). The signature is checked, in constant time, over the
//! raw bytes **before** the body is parsed; a missing or wrong one gets the gateway's one 401
//! (`listener::refused`, which does not say which), and nothing is read or recorded. The event is then handed to the engine and answered 200 only once the engine
//! has recorded it durably; otherwise (no record within `answer_deadline`, under Talk's 5 s)
//! 503. Talk gives each event one attempt of at most 5 seconds and never retries: an event this
//! listener could not record is dropped by Talk (it only counts an error for the bot). The
//! engine's durable dedupe by message id drops a copy that does arrive twice.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::listener::{self, Limits, refused};
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, Secret, SourceError,
};
use serde_json::{Value, json};
use tracing::warn;

use crate::sign;

/// The largest webhook body taken: a message is at most 32000 characters (platform-apis-wave2
/// §6.2), JSON-encoded twice by Talk: up to 14 bytes an emoji (`\\ud83d\\ude00`), ~440 KB.
pub const MAX_BODY_BYTES: usize = 512 * 1024;

/// How the webhook listener is set up.
#[derive(Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (the bot's URL given to `occ talk:bot:install` must
    /// reach it).
    pub listen: SocketAddr,
    /// The path it serves.
    pub path: String,
    /// The bot's shared secret.
    pub secret: Secret,
    /// How long a delivery waits for the engine's durable record before answering 503 (under
    /// Talk's 5-second timeout).
    pub answer_deadline: Duration,
}

impl std::fmt::Debug for WebhookConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("listen", &self.listen)
            .field("path", &self.path)
            .field("answer_deadline", &self.answer_deadline)
            .finish_non_exhaustive()
    }
}

/// The bot's webhook listener.
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
    secret: Secret,
    deadline: Duration,
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks one POST and hands its event on; the answer Talk gets.
async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (Some(random), Some(signature)) = (
        header(&headers, "x-nextcloud-talk-random"),
        header(&headers, "x-nextcloud-talk-signature"),
    ) else {
        warn!("a Talk webhook without its signature headers was refused");
        return refused();
    };
    if !sign::verify(delivery.secret.expose(), random, &body, signature) {
        warn!("a Talk webhook with a wrong signature was refused");
        return refused();
    }
    let event: Value = match serde_json::from_slice(&body) {
        Ok(event @ Value::Object(_)) => event,
        _ => return (StatusCode::BAD_REQUEST, "not a Talk bot event").into_response(),
    };
    if event.get("type").and_then(Value::as_str).is_none() {
        return (StatusCode::BAD_REQUEST, "not a Talk bot event").into_response();
    }
    let (ack, signal) = AckSignal::new();
    delivery
        .sink
        .deliver(PushedEvent::new(
            json!({ "via": "webhook", "event": event }),
            ack,
        ))
        .await;
    match signal.answer(delivery.deadline).await {
        AckAnswer::Acked => StatusCode::OK.into_response(),
        // Talk does not retry: this event is lost on the platform's side. Said loudly.
        _ => {
            warn!(
                "a Talk webhook event could not be recorded in time: answered 503, and Talk does not send it again"
            );
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            secret: self.config.secret.clone(),
            deadline: self.config.answer_deadline,
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the Talk bot webhook listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}
