//! Where events come from: Feishu posting to the app's event request URL.
//!
//! A signed request (`X-Lark-Signature` = SHA-256 of `timestamp + nonce + encrypt_key + raw
//! body`, platform-apis-wave2 §13.3) is checked before its body is read: the signature over the
//! raw bytes, then `X-Lark-Request-Timestamp` (the signature covers it) within
//! `max_signature_age` of the gateway's clock, so a captured request cannot be replayed later.
//! Only then is the `encrypt` field decrypted and the verification token in the event compared.
//!
//! The one unsigned request Feishu sends is the URL verification (`type: "url_verification"`).
//! An unsigned body has to be decrypted to see whether it is one, so unsigned requests are
//! rate limited ([`UNSIGNED_BURST`], then one per [`UNSIGNED_REFILL`]); beyond that they are
//! refused unread, and one that is not a URL verification with the right token is refused.
//!
//! Every refusal — bad or missing signature, stale timestamp, bad padding, bad JSON, wrong
//! token, over the limit — is the same answer (status, headers, body): decryption tells a bad
//! padding from bad JSON, and a caller who could see which would have a padding oracle on
//! captured bodies. The answer is the gateway's one refusal (`listener::refused`, 401
//! `unauthorized`); why a request was refused goes to the log only.
//!
//! An event is handed to the engine and answered 200 only once the engine recorded it durably
//! (within the deadline, under Feishu's 3 s); otherwise 503, and Feishu pushes it again (15 s,
//! 5 min, 1 h, 6 h; each push is expected to carry a fresh timestamp and signature, unverified
//! on the live platform), which the engine deduplicates.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
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
use tracing::{debug, info, warn};

use crate::crypto::{self, CallbackError, NONCE_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use clawgate_channel_sdk::freshness::{self, FreshnessError};

/// Unsigned requests (URL verifications) decrypted in a burst; Feishu sends one when the
/// request URL is saved.
pub const UNSIGNED_BURST: u32 = 5;
/// After the burst, one more unsigned request is decrypted per this long.
pub const UNSIGNED_REFILL: Duration = Duration::from_secs(12);
/// The largest callback body taken: platform-apis-wave2 §13.3 states no size, and an event
/// arrives as base64 of its encryption (4/3 of it), so a long text or post event needs room.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

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
    /// How far a signed request's timestamp may be from the gateway's clock, either way.
    pub max_signature_age: Duration,
}

/// The event listener.
#[derive(Debug)]
pub struct WebhookSource {
    config: WebhookConfig,
    /// The gateway's clock: signed timestamps are checked against it, and it paces the
    /// unsigned requests.
    clock: Arc<dyn Clock>,
}

impl WebhookSource {
    /// A listener set up by `config`, checking signed timestamps against `clock`.
    pub fn new(config: WebhookConfig, clock: Arc<dyn Clock>) -> WebhookSource {
        WebhookSource { config, clock }
    }
}

/// A token bucket: [`UNSIGNED_BURST`] tokens, one back per [`UNSIGNED_REFILL`].
#[derive(Debug)]
struct Bucket {
    tokens: u32,
    refilled_at_ms: i64,
}

impl Bucket {
    fn full(now_ms: i64) -> Bucket {
        Bucket {
            tokens: UNSIGNED_BURST,
            refilled_at_ms: now_ms,
        }
    }

    /// Takes a token if one is left at `now_ms`.
    fn take(&mut self, now_ms: i64) -> bool {
        let refill_ms = i64::try_from(UNSIGNED_REFILL.as_millis()).unwrap_or(i64::MAX);
        // A clock set back must not hold tokens back until it catches up again.
        let elapsed = now_ms.saturating_sub(self.refilled_at_ms).max(0);
        let earned = elapsed / refill_ms;
        if earned > 0 {
            let earned = u32::try_from(earned).unwrap_or(u32::MAX);
            self.tokens = self.tokens.saturating_add(earned).min(UNSIGNED_BURST);
            self.refilled_at_ms = now_ms;
        } else if now_ms < self.refilled_at_ms {
            self.refilled_at_ms = now_ms;
        }
        match self.tokens.checked_sub(1) {
            Some(left) => {
                self.tokens = left;
                true
            }
            None => false,
        }
    }
}

struct Delivery {
    sink: Arc<dyn EventSink>,
    config: WebhookConfig,
    clock: Arc<dyn Clock>,
    unsigned: Mutex<Bucket>,
}

/// Why a request was refused: logged, never answered.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// A missing header, a signature mismatch, a body that does not decrypt.
    #[error(transparent)]
    Callback(#[from] CallbackError),
    /// A signed timestamp outside the window.
    #[error(transparent)]
    Stale(#[from] FreshnessError),
    #[error("more unsigned requests than the limit allows; refused without decrypting")]
    UnsignedOverLimit,
    #[error("an unsigned request that is not a URL verification (Feishu signs every event)")]
    Unsigned,
    #[error("the body is not a JSON object")]
    NotJson,
    #[error(
        "a plaintext callback: set an Encrypt Key for the app (Events & Callbacks → \
         Encryption strategy); this channel takes encrypted events only"
    )]
    Plaintext,
    #[error("the decrypted event is not a JSON object")]
    EventNotJson,
    #[error("the event's verification token does not match verification_token_env")]
    WrongToken,
}

impl Refusal {
    fn log(&self) {
        match self {
            // Floods end up here; one line each would drown the log.
            Refusal::UnsignedOverLimit => debug!(why = %self, "a Feishu callback was refused"),
            _ => warn!(why = %self, "a Feishu callback was refused"),
        }
    }
}

/// What a request turned out to be.
enum Accepted {
    /// A URL verification: its challenge is answered.
    Challenge(Value),
    /// A signed event for the engine.
    Event(Value),
}

/// The event's verification token (schema 2.0 `header.token`, 1.0 and URL verification `token`).
fn token_of(event: &Value) -> Option<&str> {
    event["header"]["token"]
        .as_str()
        .or_else(|| event["token"].as_str())
}

/// Checks a request and opens its body; see the module's documentation for the order.
fn accept(delivery: &Delivery, headers: &HeaderMap, body: &[u8]) -> Result<Accepted, Refusal> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = delivery.config.encrypt_key.expose();
    let signed = [SIGNATURE_HEADER, TIMESTAMP_HEADER, NONCE_HEADER]
        .iter()
        .any(|name| headers.contains_key(*name));
    if signed {
        let timestamp = header(TIMESTAMP_HEADER);
        crypto::verify(
            timestamp,
            header(NONCE_HEADER),
            header(SIGNATURE_HEADER),
            key,
            body,
        )?;
        // After the signature: a stale timestamp in the log is then a genuine request that was
        // replayed or came from a wrong clock, not noise.
        let signed_at = freshness::seconds(timestamp.unwrap_or_default())?;
        freshness::check(
            signed_at,
            delivery.clock.now_ms(),
            delivery.config.max_signature_age,
        )?;
    } else {
        let now = delivery.clock.now_ms();
        let mut bucket = delivery
            .unsigned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !bucket.take(now) {
            return Err(Refusal::UnsignedOverLimit);
        }
    }
    let outer: Value = match serde_json::from_slice(body) {
        Ok(outer @ Value::Object(_)) => outer,
        _ => return Err(Refusal::NotJson),
    };
    let encrypted = outer
        .get("encrypt")
        .and_then(Value::as_str)
        .ok_or(Refusal::Plaintext)?;
    let event: Value = match serde_json::from_slice(&crypto::decrypt(encrypted, key)?) {
        Ok(event @ Value::Object(_)) => event,
        _ => return Err(Refusal::EventNotJson),
    };
    let token = delivery.config.verification_token.expose();
    if !token_of(&event)
        .is_some_and(|given| clawgate_channel_sdk::same_secret(token.as_bytes(), given.as_bytes()))
    {
        return Err(Refusal::WrongToken);
    }
    if event["type"] == "url_verification" {
        return Ok(Accepted::Challenge(event["challenge"].clone()));
    }
    if !signed {
        return Err(Refusal::Unsigned);
    }
    Ok(Accepted::Event(event))
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let event = match accept(&delivery, &headers, &body) {
        Ok(Accepted::Event(event)) => event,
        Ok(Accepted::Challenge(challenge)) => {
            info!("Feishu verified the request URL");
            return axum::Json(json!({ "challenge": challenge })).into_response();
        }
        Err(refusal) => {
            refusal.log();
            return refused();
        }
    };
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
        let state = Arc::new(Delivery {
            sink: sink.clone(),
            config: self.config.clone(),
            clock: self.clock.clone(),
            unsigned: Mutex::new(Bucket::full(self.clock.now_ms())),
        });
        let app = axum::Router::new()
            .route(&self.config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the Feishu event listener",
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
    fn the_bucket_gives_a_burst_then_one_per_refill_and_survives_a_clock_set_back() {
        let refill = i64::try_from(UNSIGNED_REFILL.as_millis()).unwrap_or(i64::MAX);
        let mut bucket = Bucket::full(1_000_000);
        for _ in 0..UNSIGNED_BURST {
            assert!(bucket.take(1_000_000));
        }
        assert!(!bucket.take(1_000_000));
        assert!(!bucket.take(1_000_000 + refill - 1));
        assert!(bucket.take(1_000_000 + refill));
        assert!(!bucket.take(1_000_000 + refill));
        // A long quiet spell refills the burst, no more.
        let later = 1_000_000 + 1_000 * refill;
        for _ in 0..UNSIGNED_BURST {
            assert!(bucket.take(later));
        }
        assert!(!bucket.take(later));
        // The clock set back an hour: a refill later, a token again.
        let back = later - 3_600_000;
        assert!(!bucket.take(back));
        assert!(bucket.take(back + refill));
    }
}
