//! Where events come from: QQ posting HTTP callbacks to a listener of ours (the "webhook"
//! event subscription of the QQ open platform).
//!
//! - Each `POST` is checked before anything else reads it: the Ed25519 signature of
//!   `X-Signature-Timestamp` + the raw body ([`signature`], platform-apis-wave2 §14.4), then
//!   that signed timestamp (Unix seconds) within `max_signature_age` of the gateway's clock, so
//!   a captured callback cannot be replayed once the engine's dedupe record is gone. Every
//!   refusal (no signature, a bad one, a stale one) is the gateway's one 401
//!   (`listener::refused`); why goes to the log. Nothing is parsed or recorded before.
//! - op 13 (URL validation, when the callback URL is configured): answered
//!   `{plain_token, signature}` with our own signature of `event_ts` + `plain_token`.
//! - op 0 (dispatch): handed to the engine (event id: the message id) and answered
//!   `{"op": 12, "d": 0}` once the engine recorded it durably; otherwise `{"op": 12, "d": 1}`
//!   and QQ pushes it again, which the engine deduplicates. The wait for the record is bounded
//!   by `answer_deadline` (QQ waits a few seconds).
//! - op 1 (heartbeat): answered `{"op": 11, "d": <seq>}`.

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
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::signature::{self, SIGNATURE_HEADER, SignatureError, TIMESTAMP_HEADER};
use clawgate_channel_sdk::freshness::{self, FreshnessError};

/// The largest callback body taken: platform-apis-wave2 §14.4 states no size; 1 MiB leaves
/// room for a dispatch with markdown, attachments and its JSON escaping.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How the callback listener is set up.
#[derive(Debug, Clone)]
pub struct CallbackConfig {
    /// The address the listener binds (a reverse proxy terminates TLS in front of it).
    pub listen: SocketAddr,
    /// The path of the callback URL.
    pub path: String,
    /// The bot secret callbacks are signed with.
    pub secret: Secret,
    /// How long a dispatch waits for the engine's durable record before asking QQ to push it
    /// again.
    pub answer_deadline: Duration,
    /// How far a callback's signed timestamp may be from the gateway's clock, either way.
    pub max_signature_age: Duration,
}

/// The HTTP callback listener.
#[derive(Debug)]
pub struct CallbackSource {
    config: CallbackConfig,
    /// The gateway's clock: signed timestamps are checked against it.
    clock: Arc<dyn Clock>,
}

impl CallbackSource {
    pub(crate) fn new(config: CallbackConfig, clock: Arc<dyn Clock>) -> CallbackSource {
        CallbackSource { config, clock }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    config: CallbackConfig,
    clock: Arc<dyn Clock>,
}

/// Why a callback was refused: logged, never answered.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error(transparent)]
    Signature(#[from] SignatureError),
    #[error(transparent)]
    Stale(#[from] FreshnessError),
}

/// The signature, then the signed timestamp's distance from the gateway's clock (checked
/// second, so a stale one in the log is a genuine callback replayed or a wrong clock).
fn authenticate(delivery: &Delivery, headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let timestamp = header(TIMESTAMP_HEADER);
    signature::verify(
        delivery.config.secret.expose(),
        header(SIGNATURE_HEADER),
        timestamp,
        body,
    )?;
    freshness::check(
        freshness::seconds(timestamp.unwrap_or_default())?,
        delivery.clock.now_ms(),
        delivery.config.max_signature_age,
    )?;
    Ok(())
}

fn dispatch_ack(ok: bool) -> Response {
    axum::Json(json!({ "op": 12, "d": u8::from(!ok) })).into_response()
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(why) = authenticate(&delivery, &headers, &body) {
        warn!(%why, "a QQ callback was refused");
        return refused();
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a JSON payload").into_response(),
    };
    match raw.get("op").and_then(Value::as_u64) {
        Some(13) => {
            let at = |key: &str| raw.pointer(&format!("/d/{key}")).and_then(Value::as_str);
            let (Some(plain_token), Some(event_ts)) = (at("plain_token"), at("event_ts")) else {
                return (
                    StatusCode::BAD_REQUEST,
                    "op 13 without d.plain_token and d.event_ts",
                )
                    .into_response();
            };
            match signature::validation_answer(
                delivery.config.secret.expose(),
                plain_token,
                event_ts,
            ) {
                Ok(answer) => {
                    info!("QQ validated the callback URL");
                    axum::Json(answer).into_response()
                }
                Err(error) => {
                    (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response()
                }
            }
        }
        Some(1) => {
            axum::Json(json!({ "op": 11, "d": raw.get("d").cloned().unwrap_or(Value::Null) }))
                .into_response()
        }
        Some(0) => {
            let (ack, signal) = AckSignal::new();
            delivery.sink.deliver(PushedEvent::new(raw, ack)).await;
            match signal.answer(delivery.config.answer_deadline).await {
                AckAnswer::Acked => dispatch_ack(true),
                // QQ pushes it again; the engine deduplicates by message id.
                _ => dispatch_ack(false),
            }
        }
        _ => (StatusCode::BAD_REQUEST, "an op this listener does not take").into_response(),
    }
}

#[async_trait]
impl PushedFeed for CallbackSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            config: self.config.clone(),
            clock: self.clock.clone(),
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the QQ callback listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}
