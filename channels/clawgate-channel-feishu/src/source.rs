//! Where events come from: Feishu posting to the app's event request URL.
//!
//! Every request is checked before its body is read as an event: `X-Lark-Signature` over the
//! raw bytes (a mismatch is 401 and nothing is decrypted), then the `encrypt` field is
//! decrypted with the Encrypt Key, then the verification token in the event is compared. The
//! one unsigned request Feishu sends is the URL verification (`type: "url_verification"`),
//! answered `{"challenge"}` when its token matches. An event is handed to the engine and
//! answered 200 only once the engine recorded it durably (within the deadline, under Feishu's
//! 3 s); otherwise 503, and Feishu pushes it again (15 s, 5 min, 1 h, 6 h), which the engine
//! deduplicates.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, Secret, SourceError,
};
use clawgate_types::DeliveryFailureKind;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::crypto::{self, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};

/// How the event listener is set up.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (a reverse proxy terminates TLS in front of it).
    pub listen: SocketAddr,
    /// The path of the app's request URL.
    pub path: String,
    /// The app's Encrypt Key: bodies are encrypted and signed with it.
    pub encrypt_key: Secret,
    /// The app's Verification Token, carried inside every event.
    pub verification_token: Secret,
    /// How long an event waits for the engine's durable record before answering 503.
    pub answer_deadline: Duration,
}

/// The event listener.
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
    config: WebhookConfig,
}

fn refuse(status: StatusCode, why: impl std::fmt::Display) -> Response {
    warn!(%why, "a Feishu callback was refused");
    (status, json!({ "msg": why.to_string() }).to_string()).into_response()
}

/// The event's verification token (schema 2.0 `header.token`, 1.0 and URL verification `token`).
fn token_of(event: &Value) -> Option<&str> {
    event["header"]["token"]
        .as_str()
        .or_else(|| event["token"].as_str())
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = delivery.config.encrypt_key.expose();
    let signed = header(SIGNATURE_HEADER).is_some();
    if signed
        && let Err(error) = crypto::verify(
            header(TIMESTAMP_HEADER),
            header(NONCE_HEADER),
            header(SIGNATURE_HEADER),
            key,
            &body,
        )
    {
        return refuse(StatusCode::UNAUTHORIZED, error);
    }
    let outer: Value = match serde_json::from_slice(&body) {
        Ok(outer @ Value::Object(_)) => outer,
        _ => return refuse(StatusCode::BAD_REQUEST, "not a JSON callback body"),
    };
    let Some(encrypted) = outer.get("encrypt").and_then(Value::as_str) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "a plaintext callback: set an Encrypt Key for the app (Events & Callbacks → \
             Encryption strategy); this channel takes encrypted events only",
        );
    };
    let event: Value = match crypto::decrypt(encrypted, key)
        .map_err(|e| e.to_string())
        .and_then(|plain| serde_json::from_slice(&plain).map_err(|e| e.to_string()))
    {
        Ok(event) => event,
        Err(error) => return refuse(StatusCode::BAD_REQUEST, error),
    };
    if token_of(&event) != Some(delivery.config.verification_token.expose()) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "the event's verification token does not match verification_token_env",
        );
    }
    if event["type"] == "url_verification" {
        info!("Feishu verified the request URL");
        return axum::Json(json!({ "challenge": event["challenge"] })).into_response();
    }
    if !signed {
        return refuse(
            StatusCode::UNAUTHORIZED,
            crypto::CallbackError::Missing(SIGNATURE_HEADER),
        );
    }
    let (ack, signal) = AckSignal::new();
    delivery.sink.deliver(PushedEvent::new(event, ack)).await;
    match signal.answer(delivery.config.answer_deadline).await {
        AckAnswer::Acked => axum::Json(json!({})).into_response(),
        // Feishu pushes it again; the engine deduplicates.
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let listener = tokio::net::TcpListener::bind(self.config.listen)
            .await
            .map_err(|e| {
                SourceError::new(
                    DeliveryFailureKind::Transient,
                    format!(
                        "the Feishu event listener cannot listen on {}: {e}",
                        self.config.listen
                    ),
                )
            })?;
        info!(listen = %self.config.listen, path = %self.config.path, "Feishu event listener up");
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            config: self.config.clone(),
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { sink.stopped().await })
            .await
            .map_err(|e| {
                SourceError::new(
                    DeliveryFailureKind::Transient,
                    format!("the Feishu event listener failed: {e}"),
                )
            })
    }
}
