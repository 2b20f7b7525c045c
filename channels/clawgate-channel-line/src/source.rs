//! Where events come from: LINE posting to the channel's webhook URL.
//!
//! Every request is checked before its body is parsed: `x-line-signature` over the raw body
//! with the channel secret, in constant time (a mismatch is 401 and nothing is read). A
//! delivery's events (LINE may batch several; an empty list is the console's connectivity
//! check) are handed to the engine one by one, each stamped with its arrival time, and the
//! delivery is answered 200 only once the engine has recorded every one of them durably;
//! otherwise 500, and LINE sends it again when the channel's "Webhook redelivery" is on
//! (`deliveryContext.isRedelivery: true`, the same `webhookEventId`, which the engine
//! deduplicates).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::listener::{self, Limits};
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, Secret, SourceError,
};
use clawgate_types::clock::Clock;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::reply::now_ms;
use crate::signature::{self, SIGNATURE_HEADER};

/// The largest webhook body: undocumented; one delivery batches events (platform-apis-wave2 §5.3).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How the webhook listener is set up.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (a reverse proxy terminates TLS in front of it: LINE
    /// posts to HTTPS URLs only).
    pub listen: SocketAddr,
    /// The path of the channel's webhook URL.
    pub path: String,
    /// The channel secret: every delivery is signed with it.
    pub channel_secret: Secret,
    /// How long a delivery waits for the engine's durable records before answering 500.
    pub answer_deadline: Duration,
}

/// The webhook listener.
#[derive(Debug)]
pub struct WebhookSource {
    config: WebhookConfig,
    clock: Arc<dyn Clock>,
}

impl WebhookSource {
    /// A listener set up by `config`, stamping arrivals by `clock` (the gateway's).
    pub fn new(config: WebhookConfig, clock: Arc<dyn Clock>) -> WebhookSource {
        WebhookSource { config, clock }
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
    let given = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    if let Err(error) = signature::verify(delivery.secret.expose().as_bytes(), given, &body) {
        warn!(%error, "a webhook delivery was refused");
        return listener::refused();
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a webhook body").into_response(),
    };
    let received_at = now_ms(delivery.clock.as_ref());
    let destination = raw.get("destination").cloned().unwrap_or(Value::Null);
    let events = raw
        .get("events")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut signals = Vec::with_capacity(events.len());
    for event in events {
        if event["deliveryContext"]["isRedelivery"] == Value::Bool(true) {
            info!(
                event = event["webhookEventId"].as_str().unwrap_or_default(),
                "LINE redelivered an event"
            );
        }
        let (ack, signal) = AckSignal::new();
        let envelope =
            json!({ "destination": destination, "event": event, "receivedAtMs": received_at });
        delivery.sink.deliver(PushedEvent::new(envelope, ack)).await;
        signals.push(signal);
    }
    for signal in signals {
        if !matches!(signal.answer(delivery.deadline).await, AckAnswer::Acked) {
            // LINE redelivers (when redelivery is on); the engine deduplicates.
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    }
    StatusCode::OK.into_response()
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            secret: self.config.channel_secret.clone(),
            deadline: self.config.answer_deadline,
            clock: self.clock.clone(),
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the LINE webhook listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}
