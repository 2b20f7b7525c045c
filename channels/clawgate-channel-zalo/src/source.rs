//! Where events come from: Zalo posting OA webhook events to a listener of ours.
//!
//! - Each `POST` is checked before anything else reads it: `X-ZEvent-Signature` over the raw
//!   body ([`signature`]), in constant time. The signature covers the body's `timestamp`
//!   (milliseconds, platform-apis-wave2 §9.1), which must then lie within `max_signature_age`
//!   of the gateway's clock, so a captured delivery replayed once the engine's dedupe record is
//!   gone is refused. Every refusal (no signature, a wrong one, a stale one) is the gateway's
//!   one 401 (`listener::refused`): a replay cannot be told from a forgery, nor a missing
//!   header from a wrong one. Why goes to the log only.
//! - `oa_send_text` (the OA's own texts) is written to the [`EchoBook`], durably, and answered
//!   200: it settles sends, it is never a turn.
//! - Every other event is handed to the engine (event id: its `msg_id`) and answered 200 only
//!   once the engine recorded it durably; otherwise 500 and Zalo posts it again (reported at
//!   30 s, 5 min, 15 min, 30 min, 1 h), which the engine deduplicates. Zalo expects the answer
//!   within about 2 seconds, so the wait for the record is bounded by `answer_deadline`.

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
use clawgate_types::clock::Clock;
use serde_json::Value;
use tracing::warn;

use crate::echoes::EchoBook;
use crate::receive::OA_SEND_TEXT;
use crate::signature::{self, SIGNATURE_HEADER, SignatureError};
use clawgate_channel_sdk::freshness::{self, FreshnessError};

/// The largest webhook body taken: each delivery is one event about one message
/// (platform-apis-wave2 §9.1 lists its fields, no size), far below 256 KiB.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// How the webhook listener is set up.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (a reverse proxy terminates TLS in front of it).
    pub listen: SocketAddr,
    /// The path of the webhook URL.
    pub path: String,
    /// The app's id (part of what the signature covers).
    pub app_id: String,
    /// The OA secret key every event is signed with.
    pub oa_secret_key: Secret,
    /// How long a delivery waits for the engine's durable record before answering 500.
    pub answer_deadline: Duration,
    /// How far a delivery's signed `timestamp` may be from the gateway's clock, either way.
    pub max_signature_age: Duration,
}

/// The webhook listener.
#[derive(Debug)]
pub struct WebhookSource {
    config: WebhookConfig,
    book: EchoBook,
    /// The gateway's clock: signed timestamps are checked against it.
    clock: Arc<dyn Clock>,
}

impl WebhookSource {
    pub(crate) fn new(
        config: WebhookConfig,
        book: EchoBook,
        clock: Arc<dyn Clock>,
    ) -> WebhookSource {
        WebhookSource {
            config,
            book,
            clock,
        }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    config: WebhookConfig,
    book: EchoBook,
    clock: Arc<dyn Clock>,
}

/// Why a delivery was refused: logged, never answered.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error(transparent)]
    Stale(#[from] FreshnessError),
}

/// The signature, then the signed timestamp's distance from the gateway's clock (checked
/// second, so a stale one in the log is a genuine delivery replayed or a wrong clock).
fn authenticate(delivery: &Delivery, headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
    let header = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    signature::verify(
        &delivery.config.app_id,
        delivery.config.oa_secret_key.expose(),
        header,
        body,
    )?;
    let signed_at = signature::timestamp_of(body).ok_or(SignatureError::NoTimestamp)?;
    freshness::check(
        freshness::millis(&signed_at)?,
        delivery.clock.now_ms(),
        delivery.config.max_signature_age,
    )?;
    Ok(())
}

/// Writes one `oa_send_text` echo to the book.
async fn record_echo(book: &EchoBook, raw: &Value) -> StatusCode {
    let at = |pointer: &str| raw.pointer(pointer).and_then(Value::as_str);
    let (Some(msg_id), Some(user_id)) = (at("/message/msg_id"), at("/recipient/id")) else {
        warn!("an oa_send_text event without message.msg_id or recipient.id");
        return StatusCode::OK;
    };
    let text = at("/message/text").unwrap_or_default();
    let at_ms = at("/timestamp")
        .and_then(|t| t.parse::<u64>().ok())
        .or_else(|| raw.get("timestamp").and_then(Value::as_u64))
        .unwrap_or(0);
    match book.echo(msg_id, user_id, text, at_ms).await {
        Ok(()) => StatusCode::OK,
        Err(error) => {
            warn!(%error, "an echo could not be recorded; Zalo will post it again");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(why) = authenticate(&delivery, &headers, &body) {
        warn!(%why, "a Zalo webhook delivery was refused");
        return refused();
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a JSON event").into_response(),
    };
    if raw.get("event_name").and_then(Value::as_str) == Some(OA_SEND_TEXT) {
        return record_echo(&delivery.book, &raw).await.into_response();
    }
    let (ack, signal) = AckSignal::new();
    delivery.sink.deliver(PushedEvent::new(raw, ack)).await;
    match signal.answer(delivery.config.answer_deadline).await {
        AckAnswer::Acked => StatusCode::OK.into_response(),
        // Zalo posts it again; the engine deduplicates by msg_id.
        _ => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            config: self.config.clone(),
            book: self.book.clone(),
            clock: self.clock.clone(),
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the Zalo webhook listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}
