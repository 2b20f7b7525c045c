//! Where events come from: the BlueBubbles server POSTing its webhook events
//! (`{type, data}`, JSON) to a listener of ours.
//!
//! BlueBubbles signs nothing and retries nothing (platform-apis-wave2 §3.1). So the URL the
//! operator registers in the server carries a secret: `…/bluebubbles/webhook?token=<secret>`.
//! Each `POST` is checked before anything else of it is read: the `token` query parameter is
//! compared in constant time, over SHA-256 digests (no length leak), with the secret the
//! `webhook_token_env` variable holds; without one or with a wrong one the answer is the
//! gateway's one 401 (`listener::refused`), and nothing is parsed or handed on.
//!
//! Then:
//! - `new-message` with `isFromMe: true`: looked up in the [`EchoCache`] (fed from the send
//!   journal in the store first when it matches nothing: the send may be another gateway's,
//!   or newer than what the cache was fed). Our own echo is
//!   answered 200 and dropped (never a turn). Another own-account message is dropped too,
//!   unless the account answers its own messages (`from_me_is_inbound`).
//! - Every other `new-message` is handed to the engine (event id: its guid) and answered 200
//!   once the engine recorded it durably, 500 otherwise. BlueBubbles does not send it again:
//!   a failure here is a prompt lost (logged), which the README says.
//! - Every other event type (`updated-message`, typing, read receipts, chat changes) is
//!   answered 200 and dropped: none is a new turn.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::listener::{self, Limits, refused};
use clawgate_channel_sdk::{
    AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, Secret, SourceError,
};
use clawgate_types::clock::Clock;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use crate::adapter::now_ms;
use crate::echoes::EchoCache;
use crate::journal::SendJournal;
use crate::receive::NEW_MESSAGE;

/// The largest webhook body taken: each POST is one event about one message, attachments by
/// reference only (platform-apis-wave2 §3.1, no size given), far below 256 KiB.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// How the webhook listener is set up.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// The address the listener binds (the server's webhook URL must reach it).
    pub listen: SocketAddr,
    /// The path of the webhook URL.
    pub path: String,
    /// The secret the URL's `token` parameter carries.
    pub token: Secret,
    /// Whether `isFromMe` messages that are not our echoes are turns.
    pub from_me_is_inbound: bool,
    /// How long a delivery waits for the engine's durable record before answering 500.
    pub answer_deadline: Duration,
}

/// What the listener dropped, for operators and tests.
#[derive(Debug, Default)]
pub struct SourceCounts {
    echoes: AtomicU64,
    own: AtomicU64,
    refused: AtomicU64,
}

impl SourceCounts {
    /// Echoes of our own sends recognised and dropped.
    pub fn echoes(&self) -> u64 {
        self.echoes.load(Ordering::SeqCst)
    }
    /// Other own-account messages dropped.
    pub fn own(&self) -> u64 {
        self.own.load(Ordering::SeqCst)
    }
    /// Requests refused for a missing or wrong token.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::SeqCst)
    }
}

/// The webhook listener.
#[derive(Debug)]
pub struct WebhookSource {
    config: WebhookConfig,
    echoes: EchoCache,
    journal: SendJournal,
    clock: Arc<dyn Clock>,
    counts: Arc<SourceCounts>,
}

impl WebhookSource {
    pub(crate) fn new(
        config: WebhookConfig,
        echoes: EchoCache,
        journal: SendJournal,
        clock: Arc<dyn Clock>,
        counts: Arc<SourceCounts>,
    ) -> WebhookSource {
        WebhookSource {
            config,
            echoes,
            journal,
            clock,
            counts,
        }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    config: WebhookConfig,
    echoes: EchoCache,
    journal: SendJournal,
    clock: Arc<dyn Clock>,
    counts: Arc<SourceCounts>,
}

/// Whether an event is an own-account message (an echo of ours, or the person's own).
fn from_me(raw: &Value) -> bool {
    raw.get("type").and_then(Value::as_str) == Some(NEW_MESSAGE)
        && raw.pointer("/data/isFromMe").and_then(Value::as_bool) == Some(true)
}

/// Whether the query carries the right `token`.
fn token_ok(query: Option<&str>, secret: &Secret) -> bool {
    let given = query.and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.into_owned())
    });
    let Some(given) = given else {
        return false;
    };
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(secret.expose().as_bytes());
    clawgate_channel_sdk::same_secret(&a, &b)
}

/// What to do with a verified event.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Echo,
    Own,
    Drop,
    Deliver,
}

fn route(delivery: &Delivery, raw: &Value) -> Route {
    if raw.get("type").and_then(Value::as_str) != Some(NEW_MESSAGE) {
        return Route::Drop;
    }
    let data = raw.get("data").unwrap_or(&Value::Null);
    if data.get("isFromMe").and_then(Value::as_bool) != Some(true) {
        return Route::Deliver;
    }
    let at = |key: &str| data.get(key).and_then(Value::as_str);
    let chat = data
        .pointer("/chats/0/guid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let created = data.get("dateCreated").and_then(Value::as_u64).unwrap_or(0);
    let echo = delivery.echoes.is_echo(
        chat,
        at("guid").unwrap_or_default(),
        at("tempGuid"),
        at("text").unwrap_or_default(),
        created,
        now_ms(delivery.clock.as_ref()),
    );
    match echo {
        Some(how) => {
            debug!(?how, guid = at("guid"), "the echo of our own send dropped");
            Route::Echo
        }
        None if delivery.config.from_me_is_inbound => Route::Deliver,
        None => Route::Own,
    }
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    if !token_ok(query.as_deref(), &delivery.config.token) {
        delivery.counts.refused.fetch_add(1, Ordering::SeqCst);
        warn!("a BlueBubbles webhook POST without the right token was refused");
        return refused();
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a BlueBubbles event").into_response(),
    };
    let mut routed = route(&delivery, &raw);
    if routed != Route::Echo && from_me(&raw) {
        // Not an echo of a send the cache was fed: feed it what the store gained since (the
        // sends of other gateways, or of this one the cache dropped) and look again.
        match delivery
            .journal
            .feed(&delivery.echoes, now_ms(delivery.clock.as_ref()))
            .await
        {
            Ok(()) => routed = route(&delivery, &raw),
            Err(error) => {
                warn!(%error, "the send journal could not be read to recognise an echo; the message is taken as an own-account message");
            }
        }
    }
    match routed {
        Route::Echo => {
            delivery.counts.echoes.fetch_add(1, Ordering::SeqCst);
            return StatusCode::OK.into_response();
        }
        Route::Own => {
            delivery.counts.own.fetch_add(1, Ordering::SeqCst);
            return StatusCode::OK.into_response();
        }
        Route::Drop => return StatusCode::OK.into_response(),
        Route::Deliver => {}
    }
    let (ack, signal) = AckSignal::new();
    delivery.sink.deliver(PushedEvent::new(raw, ack)).await;
    match signal.answer(delivery.config.answer_deadline).await {
        AckAnswer::Acked => StatusCode::OK.into_response(),
        answer => {
            warn!(
                ?answer,
                "a BlueBubbles event was not recorded; the server will not send it again"
            );
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[async_trait]
impl PushedFeed for WebhookSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            config: self.config.clone(),
            echoes: self.echoes.clone(),
            journal: self.journal.clone(),
            clock: self.clock.clone(),
            counts: self.counts.clone(),
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the BlueBubbles webhook listener",
            self.config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_passes() {
        let secret = Secret::new("s3cr3t&x");
        assert!(token_ok(Some("token=s3cr3t%26x"), &secret));
        assert!(token_ok(Some("a=1&token=s3cr3t%26x"), &secret));
        for wrong in [
            None,
            Some(""),
            Some("token="),
            Some("token=s3cr3t"),
            Some("tok=s3cr3t%26x"),
            Some("token=s3cr3t%26x%20"),
        ] {
            assert!(!token_ok(wrong, &secret), "{wrong:?}");
        }
    }
}
