//! Where events come from: Google Chat POSTing interaction events to a listener of ours.
//!
//! Every request's `Authorization: Bearer <JWT>` is checked before its body is parsed: RS256
//! signed by a key of the certificate URL's JWKS (fetched, cached an hour, fetched again for
//! an unknown `kid`), `iss` = `chat@system.gserviceaccount.com`, `aud` = the configured audience
//! (the Cloud project number, or the endpoint URL), not expired. A refused token is answered
//! 401, the same for every reason (logged only); keys that cannot be fetched are a bare 503. An
//! event is answered 200 (`{}`: no synchronous reply) only once the engine has recorded
//! it durably; otherwise 503, and the event may come again, which the engine deduplicates by
//! the message's name.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use clawgate_channel_sdk::listener::{self, Limits};
use clawgate_channel_sdk::{AckAnswer, AckSignal, EventSink, PushedEvent, PushedFeed, SourceError};
use clawgate_types::clock::Clock;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tracing::warn;

/// The issuer of the tokens Google Chat sends.
pub const CHAT_ISSUER: &str = "chat@system.gserviceaccount.com";
/// How long fetched keys are used before they are fetched again.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3_600);
/// An unknown `kid` fetches the keys again at most this often (a flood of forged tokens must
/// not become a flood of fetches).
const REFETCH_AT_MOST_EVERY: Duration = Duration::from_secs(10);
/// How long past its `exp` a token is still taken (clock skew; the signer library's default).
const EXPIRY_LEEWAY_S: i64 = 60;
/// The largest event body: one event per POST, a message ≤ 32,000 bytes (platform-apis-wave2 §4.4).
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Why an event's token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No `Authorization: Bearer …` header.
    #[error("the request has no bearer token: Google Chat signs every event")]
    Missing,
    /// Not a JWT, or not one of ours (algorithm, header).
    #[error("the bearer token is not a Chat event token: {0}")]
    Malformed(String),
    /// Signed by a key the certificate URL does not list.
    #[error("the bearer token's key {0:?} is not among the Chat service account's keys")]
    UnknownKey(String),
    /// Signature, issuer, audience or expiry wrong.
    #[error("the bearer token was refused: {0}")]
    Rejected(String),
    /// The keys could not be fetched (then nothing can be checked).
    #[error("the Chat service account's keys could not be fetched from {url}: {reason}")]
    Certs {
        /// The certificate URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

/// How the events listener is set up.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// The address the listener binds (TLS ends in front of it).
    pub listen: SocketAddr,
    /// The path of the app's endpoint URL.
    pub path: String,
    /// The `aud` every token must carry.
    pub audience: String,
    /// The JWKS of the keys that sign the tokens.
    pub certs_url: String,
    /// How long a delivery waits for the engine's durable record before answering 503.
    pub answer_deadline: Duration,
}

struct Keys {
    set: Option<JwkSet>,
    fetched: Option<Instant>,
}

/// The interaction-event listener.
pub struct EventsSource {
    config: EventsConfig,
    /// The gateway's clock: a token's expiry is checked on it.
    clock: Arc<dyn Clock>,
    http: reqwest::Client,
    keys: Mutex<Keys>,
}

impl std::fmt::Debug for EventsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventsSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EventsSource {
    /// A listener set up by `config`, checking expiry on `clock`.
    pub fn new(config: EventsConfig, clock: Arc<dyn Clock>) -> EventsSource {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        EventsSource {
            config,
            clock,
            http,
            keys: Mutex::new(Keys {
                set: None,
                fetched: None,
            }),
        }
    }

    async fn fetch_keys(&self) -> Result<JwkSet, TokenError> {
        let certs = |reason: String| TokenError::Certs {
            url: self.config.certs_url.clone(),
            reason,
        };
        let response = self
            .http
            .get(&self.config.certs_url)
            .send()
            .await
            .map_err(|e| certs(e.to_string()))?;
        if !response.status().is_success() {
            return Err(certs(format!("HTTP {}", response.status())));
        }
        response
            .json::<JwkSet>()
            .await
            .map_err(|e| certs(format!("not a JWKS: {e}")))
    }

    /// The decoding key of `kid`: cached, or fetched again when stale or unknown.
    async fn key(&self, kid: &str) -> Result<DecodingKey, TokenError> {
        let mut keys = self.keys.lock().await;
        let age = keys.fetched.map(|at| at.elapsed());
        let stale = age.is_none_or(|a| a >= KEYS_MAX_AGE);
        let known = keys.set.as_ref().and_then(|s| s.find(kid)).is_some();
        let may_refetch = age.is_none_or(|a| a >= REFETCH_AT_MOST_EVERY);
        if stale || (!known && may_refetch) {
            let set = self.fetch_keys().await?;
            keys.set = Some(set);
            keys.fetched = Some(Instant::now());
        }
        let jwk = keys
            .set
            .as_ref()
            .and_then(|s| s.find(kid))
            .ok_or_else(|| TokenError::UnknownKey(kid.to_owned()))?;
        DecodingKey::from_jwk(jwk).map_err(|e| TokenError::Malformed(e.to_string()))
    }

    /// Checks one request's `Authorization` header value; the token's claims.
    pub async fn verify(&self, authorization: Option<&str>) -> Result<Value, TokenError> {
        let token = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(TokenError::Missing)?;
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        if header.alg != Algorithm::RS256 {
            return Err(TokenError::Malformed(format!(
                "signed with {:?}, not RS256",
                header.alg
            )));
        }
        let kid = header
            .kid
            .ok_or_else(|| TokenError::Malformed("no `kid` in the header".into()))?;
        let key = self.key(&kid).await?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_issuer(&[CHAT_ISSUER]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        // The library would read the system clock: expiry is checked below, on the gateway's.
        validation.validate_exp = false;
        let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
            .map(|data| data.claims)
            .map_err(|e| TokenError::Rejected(e.to_string()))?;
        let exp = claims["exp"]
            .as_i64()
            .ok_or_else(|| TokenError::Rejected("`exp` is not a number of seconds".into()))?;
        let now = self.clock.now_ms().div_euclid(1_000);
        if exp.saturating_add(EXPIRY_LEEWAY_S) < now {
            return Err(TokenError::Rejected(format!(
                "it expired at {exp} (Unix seconds) and the gateway's clock reads {now}"
            )));
        }
        Ok(claims)
    }
}

struct Delivery {
    source: Arc<EventsSource>,
    sink: Arc<dyn EventSink>,
}

async fn deliver(
    State(delivery): State<Arc<Delivery>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match delivery.source.verify(authorization).await {
        Ok(_) => {}
        // Nothing can be checked now: Google sends it again later.
        Err(error @ TokenError::Certs { .. }) => {
            warn!(%error, "a Chat event could not be checked");
            // The certificate URL and why it failed stay in the log: the caller is not yet trusted.
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        Err(error) => {
            warn!(%error, "a Chat event was refused");
            return listener::refused();
        }
    }
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a JSON event").into_response(),
    };
    let (ack, signal) = AckSignal::new();
    delivery.sink.deliver(PushedEvent::new(raw, ack)).await;
    match signal.answer(delivery.source.config.answer_deadline).await {
        AckAnswer::Acked => (StatusCode::OK, axum::Json(json!({}))).into_response(),
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The listener's feed: one per source, sharing its key cache.
#[derive(Debug)]
pub(crate) struct EventsFeed(pub(crate) Arc<EventsSource>);

#[async_trait]
impl PushedFeed for EventsFeed {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let config = &self.0.config;
        let state = Arc::new(Delivery {
            source: self.0.clone(),
            sink: sink.clone(),
        });
        let app = axum::Router::new()
            .route(&config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the Google Chat events listener",
            config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}
