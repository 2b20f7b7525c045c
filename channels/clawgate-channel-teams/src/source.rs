//! Where activities come from: the Bot Framework POSTing them to the bot's messaging endpoint.
//!
//! Every request's `Authorization: Bearer <JWT>` is checked before its body is parsed: RS256
//! signed by a key of the JWKS the OpenID configuration names (both fetched, kept a day,
//! fetched again for an unknown `kid`), the key endorsed for the activity's channel when it
//! lists endorsements, `iss` = `https://api.botframework.com`, `aud` = the app id, not expired
//! (five minutes of clock skew, as Bot Builder allows), and its `serviceurl` claim equal to the
//! activity's `serviceUrl`. A refused token is answered 401, the same for every reason (logged
//! only); keys that cannot be fetched are a bare 503. An activity is answered 200 only
//! once the engine has recorded it durably and its conversation reference is in the store;
//! otherwise 503, and it may come again, which the engine deduplicates by the activity id.

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
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use tokio::sync::Mutex;
use tracing::warn;

use crate::receive::split_thread;
use crate::references::{ConversationReference, References};

/// The issuer of the tokens the Bot Framework sends a bot.
pub const BOT_FRAMEWORK_ISSUER: &str = "https://api.botframework.com";
/// How long fetched keys are used before they are fetched again.
const KEYS_MAX_AGE: Duration = Duration::from_secs(24 * 3_600);
/// An unknown `kid` fetches the keys again at most this often (a flood of forged tokens must
/// not become a flood of fetches).
const REFETCH_AT_MOST_EVERY: Duration = Duration::from_secs(10);
/// The clock skew tokens are allowed.
const LEEWAY_S: u64 = 300;
/// The largest activity body: undocumented; activities carry cards and attachments inline.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Why an activity's token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// No `Authorization: Bearer …` header.
    #[error("the request has no bearer token: the Bot Framework signs every activity")]
    Missing,
    /// Not a JWT, or not one of the Bot Framework's (algorithm, header).
    #[error("the bearer token is not a Bot Framework token: {0}")]
    Malformed(String),
    /// Signed by a key the JWKS does not list, or one not endorsed for the channel.
    #[error("the bearer token's key {0:?} is not a Bot Framework signing key for this channel")]
    UnknownKey(String),
    /// Signature, issuer, audience or expiry wrong.
    #[error("the bearer token was refused: {0}")]
    Rejected(String),
    /// The token was issued for another service URL than the activity names.
    #[error("the token's serviceurl {claim:?} is not the activity's serviceUrl {activity:?}")]
    ServiceUrl {
        /// The `serviceurl` claim.
        claim: String,
        /// The activity's `serviceUrl`.
        activity: String,
    },
    /// The keys could not be fetched (then nothing can be checked).
    #[error("the Bot Framework signing keys could not be fetched from {url}: {reason}")]
    Keys {
        /// The OpenID configuration or JWKS URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

/// How the messaging endpoint is set up.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// The address the listener binds (TLS ends in front of it).
    pub listen: SocketAddr,
    /// The path of the messaging endpoint (`/api/messages`).
    pub path: String,
    /// The bot's app id: every token's `aud`.
    pub app_id: String,
    /// The OpenID configuration naming the signing keys.
    pub openid_url: String,
    /// How long a delivery waits for the engine's durable record before answering 503.
    pub answer_deadline: Duration,
}

struct Keys {
    set: Option<Value>,
    fetched: Option<Instant>,
}

/// The messaging endpoint.
pub struct MessagesEndpoint {
    config: EndpointConfig,
    http: reqwest::Client,
    keys: Mutex<Keys>,
    references: References,
}

impl std::fmt::Debug for MessagesEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessagesEndpoint")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl MessagesEndpoint {
    pub(crate) fn new(config: EndpointConfig, references: References) -> MessagesEndpoint {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap_or_default();
        MessagesEndpoint {
            config,
            http,
            keys: Mutex::new(Keys {
                set: None,
                fetched: None,
            }),
            references,
        }
    }

    async fn fetch_json(&self, url: &str) -> Result<Value, TokenError> {
        let failed = |reason: String| TokenError::Keys {
            url: url.to_owned(),
            reason,
        };
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| failed(e.without_url().to_string()))?;
        if !response.status().is_success() {
            return Err(failed(format!("HTTP {}", response.status())));
        }
        response
            .json::<Value>()
            .await
            .map_err(|e| failed(format!("not JSON: {e}")))
    }

    async fn fetch_keys(&self) -> Result<Value, TokenError> {
        let config = self.fetch_json(&self.config.openid_url).await?;
        let Some(jwks_uri) = config["jwks_uri"].as_str() else {
            return Err(TokenError::Keys {
                url: self.config.openid_url.clone(),
                reason: "the OpenID configuration names no jwks_uri".into(),
            });
        };
        self.fetch_json(jwks_uri).await
    }

    /// The decoding key of `kid` and its endorsements: cached, or fetched again when stale or
    /// unknown.
    async fn key(&self, kid: &str) -> Result<(DecodingKey, Option<Vec<String>>), TokenError> {
        let mut keys = self.keys.lock().await;
        let find = |set: &Option<Value>| -> Option<Value> {
            set.as_ref()?["keys"]
                .as_array()?
                .iter()
                .find(|k| k["kid"].as_str() == Some(kid))
                .cloned()
        };
        let age = keys.fetched.map(|at| at.elapsed());
        let stale = age.is_none_or(|a| a >= KEYS_MAX_AGE);
        let known = find(&keys.set).is_some();
        let may_refetch = age.is_none_or(|a| a >= REFETCH_AT_MOST_EVERY);
        if stale || (!known && may_refetch) {
            let set = self.fetch_keys().await?;
            keys.set = Some(set);
            keys.fetched = Some(Instant::now());
        }
        let jwk = find(&keys.set).ok_or_else(|| TokenError::UnknownKey(kid.to_owned()))?;
        let endorsements = jwk["endorsements"].as_array().map(|list| {
            list.iter()
                .filter_map(|e| e.as_str().map(str::to_owned))
                .collect()
        });
        let (Some(n), Some(e)) = (jwk["n"].as_str(), jwk["e"].as_str()) else {
            return Err(TokenError::Malformed(format!(
                "key {kid:?} is not an RSA key"
            )));
        };
        let key = DecodingKey::from_rsa_components(n, e)
            .map_err(|e| TokenError::Malformed(e.to_string()))?;
        Ok((key, endorsements))
    }

    /// Checks one request's `Authorization` header value (before its body is read).
    pub async fn verify(&self, authorization: Option<&str>) -> Result<Verified, TokenError> {
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
        let (key, endorsements) = self.key(&kid).await?;
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_issuer(&[BOT_FRAMEWORK_ISSUER]);
        validation.set_audience(&[&self.config.app_id]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.leeway = LEEWAY_S;
        validation.validate_nbf = true;
        let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
            .map(|data| data.claims)
            .map_err(|e| TokenError::Rejected(e.to_string()))?;
        Ok(Verified {
            claims,
            kid,
            endorsements,
        })
    }
}

/// A token that passed: its claims, and what its key may sign for.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The token's claims.
    pub claims: Value,
    kid: String,
    endorsements: Option<Vec<String>>,
}

impl Verified {
    /// Whether the activity it came with may be trusted: its key is endorsed for the activity's
    /// `channelId` (when the key lists endorsements) and its `serviceurl` claim is the
    /// activity's `serviceUrl`.
    pub fn check_activity(&self, activity: &Value) -> Result<(), TokenError> {
        let channel = activity["channelId"].as_str().unwrap_or_default();
        if let Some(endorsements) = &self.endorsements
            && !endorsements.iter().any(|e| e == channel)
        {
            return Err(TokenError::UnknownKey(self.kid.clone()));
        }
        let service_url = activity["serviceUrl"].as_str().unwrap_or_default();
        if let Some(claim) = self.claims["serviceurl"].as_str()
            && claim.trim_end_matches('/') != service_url.trim_end_matches('/')
        {
            return Err(TokenError::ServiceUrl {
                claim: claim.to_owned(),
                activity: service_url.to_owned(),
            });
        }
        Ok(())
    }
}

struct Delivery {
    endpoint: Arc<MessagesEndpoint>,
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
    let verified = match delivery.endpoint.verify(authorization).await {
        Ok(verified) => verified,
        // Nothing can be checked now: the Bot Framework sends it again.
        Err(error @ TokenError::Keys { .. }) => {
            warn!(%error, "a Teams activity could not be checked");
            // The key URLs and why they failed stay in the log: the caller is not yet trusted.
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
        Err(error) => {
            warn!(%error, "a Teams activity was refused");
            return listener::refused();
        }
    };
    let raw: Value = match serde_json::from_slice(&body) {
        Ok(raw @ Value::Object(_)) => raw,
        _ => return (StatusCode::BAD_REQUEST, "not a JSON activity").into_response(),
    };
    // The token binds to fields of the activity (channel, service URL), so this check can only
    // follow the parse; the token's signature was verified before the body was looked at.
    if let Err(error) = verified.check_activity(&raw) {
        warn!(%error, "a Teams activity was refused");
        return listener::refused();
    }
    let service_url = raw["serviceUrl"].as_str().unwrap_or_default();
    if let Some(conversation) = raw["conversation"]["id"].as_str()
        && !service_url.is_empty()
    {
        let (base, _) = split_thread(conversation);
        let reference = ConversationReference {
            service_url: service_url.to_owned(),
            conversation_type: raw["conversation"]["conversationType"]
                .as_str()
                .unwrap_or("personal")
                .to_owned(),
        };
        if let Err(error) = delivery.endpoint.references.learn(base, reference).await {
            warn!(%error, "a Teams conversation reference could not be stored");
            return StatusCode::SERVICE_UNAVAILABLE.into_response();
        }
    }
    let (ack, signal) = AckSignal::new();
    delivery.sink.deliver(PushedEvent::new(raw, ack)).await;
    match signal
        .answer(delivery.endpoint.config.answer_deadline)
        .await
    {
        AckAnswer::Acked => StatusCode::OK.into_response(),
        _ => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}

/// The endpoint's feed.
#[derive(Debug)]
pub(crate) struct MessagesFeed(pub(crate) Arc<MessagesEndpoint>);

#[async_trait]
impl PushedFeed for MessagesFeed {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let config = &self.0.config;
        let state = Arc::new(Delivery {
            endpoint: self.0.clone(),
            sink: sink.clone(),
        });
        let app = axum::Router::new()
            .route(&config.path, post(deliver))
            .with_state(state);
        listener::serve(
            "the Teams messaging endpoint",
            config.listen,
            app,
            Limits::with_max_body(MAX_BODY_BYTES),
            async move { sink.stopped().await },
        )
        .await
    }
}
