//! Where events come from: the Events API posting to a listener of ours.
//!
//! Every request is checked before anything else: the `v0` signature over the raw body with
//! the signing secret, compared in constant time, and a timestamp at most five minutes away
//! (a replayed request is refused). A `url_verification` is answered with its challenge. An
//! `event_callback` is answered 2xx only once the engine has recorded it durably; otherwise
//! 503, and Slack retries (`X-Slack-Retry-Num`), which the engine deduplicates by the
//! message's `<channel>:<ts>` — also when Slack resends one message under a new `event_id`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::listener::{self, Limits};
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, Secret, SourceError,
};
use clawgate_types::clock::Clock;
use serde_json::Value;
use tracing::{info, warn};

use crate::signature::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// The largest Events API body: undocumented; a `message_changed` holds two 40,000-char messages.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How the events listener is set up.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// The address the listener binds (a reverse proxy terminates TLS in front of it).
    pub listen: SocketAddr,
    /// The path of the app's Request URL.
    pub path: String,
    /// The app's signing secret.
    pub signing_secret: Secret,
    /// How long a delivery waits for the engine's durable record before answering 503 (Slack
    /// gives up on an answer after 3 s).
    pub answer_deadline: Duration,
}

/// The Events API listener.
#[derive(Debug)]
pub struct EventsSource {
    config: EventsConfig,
    /// The gateway's clock: a request's timestamp is checked against it.
    clock: Arc<dyn Clock>,
}

impl EventsSource {
    /// A listener set up by `config`, checking request timestamps against `clock`.
    pub fn new(config: EventsConfig, clock: Arc<dyn Clock>) -> EventsSource {
        EventsSource { config, clock }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    secret: Secret,
    deadline: Duration,
    clock: Arc<dyn Clock>,
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Err(error) = signature::verify(
        delivery.secret.expose().as_bytes(),
        header(TIMESTAMP_HEADER),
        header(SIGNATURE_HEADER),
        &body,
        // A clock before 1970 is a broken host: 0 refuses every request as too old.
        u64::try_from(delivery.clock.now_ms().div_euclid(1_000)).unwrap_or(0),
    ) {
        warn!(%error, "an Events API request was refused");
        return listener::refused();
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a JSON envelope").into_response(),
    };
    match raw.get("type").and_then(Value::as_str) {
        Some("url_verification") => {
            let challenge = raw
                .get("challenge")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            return ([(header::CONTENT_TYPE, "text/plain")], challenge).into_response();
        }
        Some("event_callback") => {}
        // app_rate_limited and the like: nothing to record.
        _ => return StatusCode::OK.into_response(),
    }
    if let Some(retry) = header("x-slack-retry-num") {
        info!(
            retry,
            reason = header("x-slack-retry-reason").unwrap_or_default(),
            event = raw["event_id"].as_str().unwrap_or_default(),
            "Slack retried a delivery"
        );
    }
    let (ack, signal) = AckSignal::new();
    delivery.sink.deliver(PushedEvent::new(raw, ack)).await;
    match signal.answer(delivery.deadline).await {
        AckAnswer::Acked => StatusCode::OK.into_response(),
        // Slack delivers it again; the engine deduplicates.
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

#[async_trait]
impl PushedFeed for EventsSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            secret: self.config.signing_secret.clone(),
            deadline: self.config.answer_deadline,
            clock: self.clock.clone(),
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the Slack events listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}
