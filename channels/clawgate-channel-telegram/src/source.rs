//! Where updates come from: `getUpdates` long polling from the engine's durable watermark, or a
//! webhook Telegram posts to.
//!
//! Polling: the offset sent is always the safe-completed watermark + 1, so an update accepted
//! but not finished before a crash is fetched again after the restart (Telegram keeps
//! unconfirmed updates for 24 h). Webhook: each update is answered 2xx only once the engine
//! has recorded it durably; anything else makes Telegram deliver it again, and the engine
//! deduplicates the redelivery.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::listener::{self, Limits};
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PollFrom, PollWait, PolledEvent, PollingFeed, PushedEvent,
    PushedFeed, Secret, SourceError,
};
use clawgate_types::DeliveryFailureKind;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::client::{BotApi, CallError};
use crate::wire::ALLOWED_UPDATES;

/// The longest `getUpdates` timeout Telegram honours.
pub const MAX_POLL_TIMEOUT_S: u64 = 50;
/// How long after a 409 the next poll waits: never a tight loop against another poller.
const CONFLICT_PAUSE_MS: u64 = 5_000;
/// Webhook header carrying the secret set with `setWebhook`.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";
/// The largest webhook body: one Update per POST (platform-apis §1.3), a few 4,096-character texts.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// `getUpdates` long polling.
#[derive(Debug)]
pub struct PollingSource {
    api: BotApi,
    timeout_s: u64,
    /// `deleteWebhook` was called once (getUpdates answers 409 while a webhook is set).
    prepared: AtomicBool,
}

impl PollingSource {
    pub(crate) fn new(api: BotApi, timeout_s: u64) -> PollingSource {
        PollingSource {
            api,
            timeout_s: timeout_s.min(MAX_POLL_TIMEOUT_S),
            prepared: AtomicBool::new(false),
        }
    }

    fn conflict(error: CallError) -> SourceError {
        let description = error.description().unwrap_or_default().to_owned();
        let message = if error.refused_with("terminated by other getUpdates request") {
            format!(
                "another instance polls this bot: stop it, or give each gateway its own bot \
                 token (Telegram: {description})"
            )
        } else if error.refused_with("can't use getUpdates method while webhook is active") {
            format!(
                "a webhook is set for this bot: another process uses it in webhook mode \
                 (Telegram: {description})"
            )
        } else {
            format!("Telegram getUpdates: {description}")
        };
        SourceError::new(DeliveryFailureKind::Conflict, message)
            .with_retry_after_ms(Some(CONFLICT_PAUSE_MS))
    }
}

#[async_trait]
impl PollingFeed for PollingSource {
    async fn poll(&self, from: &PollFrom, wait: PollWait) -> Result<Vec<PolledEvent>, SourceError> {
        if !self.prepared.load(Ordering::SeqCst) {
            // Polling was chosen for this account: a webhook left from webhook mode goes (its
            // pending updates stay and are polled).
            self.api
                .call::<Value>(
                    "deleteWebhook",
                    &json!({ "drop_pending_updates": false }),
                    Duration::ZERO,
                )
                .await
                .map_err(|e| e.into_source_error("deleteWebhook"))?;
            self.prepared.store(true, Ordering::SeqCst);
        }
        let timeout = match wait {
            PollWait::Long => self.timeout_s,
            _ => 0,
        };
        let mut params = json!({
            "limit": 100,
            "timeout": timeout,
            "allowed_updates": ALLOWED_UPDATES,
        });
        // Confirms every update at or below the watermark, and nothing above it.
        if from.after > 0 {
            params["offset"] = json!(from.after.saturating_add(1));
        }
        let updates: Vec<Value> = match self
            .api
            .call("getUpdates", &params, Duration::from_secs(timeout))
            .await
        {
            Ok(updates) => updates,
            Err(error @ CallError::Refused { status: 409, .. }) => {
                return Err(Self::conflict(error));
            }
            Err(error) => return Err(error.into_source_error("getUpdates")),
        };
        Ok(updates
            .into_iter()
            .filter_map(|update| {
                let Some(id) = update.get("update_id").and_then(Value::as_i64) else {
                    warn!("an update without update_id was skipped");
                    return None;
                };
                Some(PolledEvent::new(id, update))
            })
            .collect())
    }
}

/// How a webhook listens.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (a reverse proxy terminates TLS in front of it).
    pub listen: SocketAddr,
    /// The path Telegram posts to.
    pub path: String,
    /// The public HTTPS URL given to `setWebhook` (it reaches `listen` + `path`).
    pub url: String,
    /// The `secret_token` Telegram sends back in every delivery's header.
    pub secret: Secret,
    /// How long a delivery waits for the engine's durable record before answering 503.
    pub answer_deadline: Duration,
}

/// The webhook: `setWebhook`, then a listener taking Telegram's deliveries.
#[derive(Debug)]
pub struct WebhookSource {
    api: BotApi,
    config: WebhookConfig,
}

impl WebhookSource {
    pub(crate) fn new(api: BotApi, config: WebhookConfig) -> WebhookSource {
        WebhookSource { api, config }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    secret: Secret,
    deadline: Duration,
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let given = headers
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !delivery.secret.matches(given) {
        warn!("a webhook request without the right secret token was refused");
        return listener::refused();
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => {
            warn!(
                bytes = body.len(),
                "a webhook body that is not a JSON update was refused"
            );
            return StatusCode::BAD_REQUEST.into_response();
        }
    };
    let (ack, signal) = AckSignal::new();
    delivery.sink.deliver(PushedEvent::new(raw, ack)).await;
    match signal.answer(delivery.deadline).await {
        AckAnswer::Acked => StatusCode::OK.into_response(),
        // Telegram delivers it again later; the engine deduplicates.
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let bound = tokio::net::TcpListener::bind(self.config.listen)
            .await
            .map_err(|e| {
                SourceError::new(
                    DeliveryFailureKind::Transient,
                    format!(
                        "the Telegram webhook cannot listen on {}: {e}",
                        self.config.listen
                    ),
                )
            })?;
        // Listening before Telegram is told where to post.
        self.api
            .call::<Value>(
                "setWebhook",
                &json!({
                    "url": self.config.url,
                    "secret_token": self.config.secret.expose(),
                    "allowed_updates": ALLOWED_UPDATES,
                }),
                Duration::ZERO,
            )
            .await
            .map_err(|e| e.into_source_error("setWebhook"))?;
        info!(listen = %self.config.listen, path = %self.config.path, "Telegram webhook set");
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            secret: self.config.secret.clone(),
            deadline: self.config.answer_deadline,
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        // `serve_on`: bound before setWebhook above (`serve` would bind only now).
        listener::serve_on(
            bound,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await;
        Ok(())
    }
}
