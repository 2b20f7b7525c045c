//! Service-account authentication: the app signs a JWT with its key (RS256), exchanges it at the
//! key's `token_uri` for an access token (the JWT-bearer grant), and keeps that token fresh.
//!
//! The token is minted on first use, cached, and minted again ahead of its expiry (5 minutes
//! before it, or at half its lifetime when that is shorter). One mint runs at a time: callers
//! that find the cache stale wait for it instead of starting their own.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use clawgate_types::clock::Clock;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

/// The scope of a Chat app acting as itself.
pub const CHAT_BOT_SCOPE: &str = "https://www.googleapis.com/auth/chat.bot";
/// The OAuth grant of a signed JWT (RFC 7523).
pub(crate) const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Google accepts assertions valid for at most an hour.
const ASSERTION_LIFETIME_S: u64 = 3_600;
/// A token is minted again this long before it expires…
const REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// …the lifetime Google gives when an answer names none.
const DEFAULT_TOKEN_LIFETIME_S: u64 = 3_600;

/// Why a service account key was refused at start. Never quotes the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Not a JSON object.
    #[error("is not a JSON object ({0}); it holds the service account's JSON key file")]
    NotJson(String),
    /// A member the key file always has is missing or not a string.
    #[error("has no string `{0}`: it is not a complete service account JSON key")]
    Missing(&'static str),
    /// `type` is not `service_account` (an OAuth client secret, a user credential, …).
    #[error(
        "is a key of type {0:?}, not \"service_account\": download a key of the app's service \
         account (IAM → Service accounts → Keys → Add key → JSON)"
    )]
    WrongType(String),
    /// `private_key` is not an RSA private key in PEM.
    #[error("has a `private_key` that is not an RSA private key in PEM ({0})")]
    BadPrivateKey(String),
    /// `token_uri` is not an http(s) URL.
    #[error("has a `token_uri` that is not an http(s) URL")]
    BadTokenUri,
}

/// A service account's JSON key, parsed and its private key loaded.
#[derive(Clone)]
pub(crate) struct ServiceAccountKey {
    pub(crate) client_email: String,
    key_id: String,
    key: EncodingKey,
    pub(crate) token_uri: String,
}

/// The private key is never printed.
impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

impl ServiceAccountKey {
    /// Parses a JSON key file's text. Errors name members, never their values.
    pub(crate) fn parse(text: &str) -> Result<ServiceAccountKey, KeyError> {
        // Parsed as a Value first: serde's messages for typed fields can quote the input.
        let value: Value = serde_json::from_str(text)
            .map_err(|e| KeyError::NotJson(format!("line {} column {}", e.line(), e.column())))?;
        if !value.is_object() {
            return Err(KeyError::NotJson("not an object".into()));
        }
        let member = |name: &'static str| {
            value[name]
                .as_str()
                .map(str::to_owned)
                .ok_or(KeyError::Missing(name))
        };
        let kind = member("type")?;
        if kind != "service_account" {
            return Err(KeyError::WrongType(kind));
        }
        let client_email = member("client_email")?;
        let private_key = member("private_key")?;
        let key_id = member("private_key_id")?;
        let token_uri = member("token_uri")?;
        if !(token_uri.starts_with("https://") || token_uri.starts_with("http://")) {
            return Err(KeyError::BadTokenUri);
        }
        let key = EncodingKey::from_rsa_pem(private_key.as_bytes())
            .map_err(|e| KeyError::BadPrivateKey(pem_problem(&e)))?;
        let account = ServiceAccountKey {
            client_email,
            key_id,
            key,
            token_uri,
        };
        // The DER is only read by the signer: sign once now so a key ring cannot use fails at
        // start, not at the first send (the time signed does not matter to that).
        account
            .assertion(0)
            .map_err(|e| KeyError::BadPrivateKey(pem_problem(&e)))?;
        Ok(account)
    }

    /// The signed assertion of a token request: valid for an hour from `iat` (Unix seconds,
    /// the gateway clock's now: Google refuses one outside its own clock's hour).
    pub(crate) fn assertion(&self, iat: u64) -> Result<String, jsonwebtoken::errors::Error> {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.key_id.clone());
        let claims = json!({
            "iss": self.client_email,
            "scope": CHAT_BOT_SCOPE,
            "aud": self.token_uri,
            "iat": iat,
            "exp": iat + ASSERTION_LIFETIME_S,
        });
        jsonwebtoken::encode(&header, &claims, &self.key)
    }
}

/// What went wrong loading or using a key, without its content.
fn pem_problem(error: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::InvalidKeyFormat => "the key is not a valid RSA private key".into(),
        ErrorKind::InvalidRsaKey(_) => "the RSA key is refused by the signer".into(),
        ErrorKind::RsaFailedSigning => "the RSA key cannot sign".into(),
        _ => "no PEM private key block".into(),
    }
}

/// How getting an access token failed. The call it was for never went out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TokenFailure {
    /// The token endpoint answered an OAuth error (`{"error", "error_description"}`).
    Refused {
        /// The HTTP status.
        code: u16,
        /// `error` (`invalid_grant`, …).
        error: String,
        /// `error_description`.
        description: String,
    },
    /// The token endpoint could not be reached, did not answer in time, or answered something
    /// that is not a token.
    Transport(String),
}

impl TokenFailure {
    /// Refusals of the credentials are permanent until an operator acts; the rest passes.
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        match self {
            TokenFailure::Refused { code, .. } if *code >= 500 => DeliveryFailureKind::Transient,
            TokenFailure::Refused { code: 429, .. } => DeliveryFailureKind::RateLimit,
            TokenFailure::Refused { .. } => DeliveryFailureKind::Auth,
            TokenFailure::Transport(_) => DeliveryFailureKind::Transient,
        }
    }

    /// As a send failure: nothing reached the Chat API.
    pub(crate) fn into_send_error(self, key_env: &str) -> SendError {
        let kind = self.kind();
        let message = match &self {
            TokenFailure::Refused {
                code,
                error,
                description,
            } => {
                let advice = match error.as_str() {
                    "invalid_grant" => format!(
                        ": the service account key in {key_env} was refused: check that the key \
                         and its service account exist and are enabled (IAM → Service accounts), \
                         and that this machine's clock is right"
                    ),
                    "invalid_client" | "unauthorized_client" => format!(
                        ": the service account of the key in {key_env} may not use this grant"
                    ),
                    _ => String::new(),
                };
                format!(
                    "Google Chat access token: the token endpoint answered {code} {error}: \
                     {description}{advice}"
                )
            }
            TokenFailure::Transport(reason) => {
                format!("Google Chat access token: the token endpoint failed: {reason}")
            }
        };
        let error = SendError::before_io(kind, message);
        match self {
            TokenFailure::Refused { error: code, .. } => error.with_platform_code(code),
            TokenFailure::Transport(_) => error,
        }
    }
}

struct Cached {
    token: Secret,
    /// When it is minted again, on the gateway's clock (ms since the epoch).
    refresh_at: i64,
}

/// Access tokens of one service account, minted as needed.
pub(crate) struct TokenSource {
    account: ServiceAccountKey,
    /// The variable the key came from (for messages).
    pub(crate) key_env: String,
    http: reqwest::Client,
    timeout: Duration,
    /// The gateway's clock: assertion times and token expiry are read on it.
    clock: Arc<dyn Clock>,
    /// Held across a mint: the lock is what keeps concurrent callers to one request.
    cached: tokio::sync::Mutex<Option<Cached>>,
}

/// The key and the tokens are never printed.
impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("account", &self.account)
            .field("key_env", &self.key_env)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    pub(crate) fn new(
        account: ServiceAccountKey,
        key_env: &str,
        http: reqwest::Client,
        timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> TokenSource {
        TokenSource {
            account,
            key_env: key_env.to_owned(),
            http,
            timeout,
            clock,
            cached: tokio::sync::Mutex::new(None),
        }
    }

    /// A token good for a call now: the cached one, or a fresh one when it is due.
    pub(crate) async fn token(&self) -> Result<Secret, TokenFailure> {
        let mut cached = self.cached.lock().await;
        if let Some(current) = cached.as_ref()
            && self.clock.now_ms() < current.refresh_at
        {
            return Ok(current.token.clone());
        }
        let minted = self.mint().await?;
        let token = minted.token.clone();
        *cached = Some(minted);
        Ok(token)
    }

    /// A source holding `token` as if minted (for tests of what prints).
    #[cfg(test)]
    pub(crate) fn with_cached(self, token: &str) -> TokenSource {
        *self.cached.try_lock().expect("a new source is unlocked") = Some(Cached {
            token: Secret::new(token),
            refresh_at: self.clock.now_ms(),
        });
        self
    }

    /// Forgets `stale` (the API refused it) unless a newer token already replaced it.
    pub(crate) async fn invalidate(&self, stale: &Secret) {
        let mut cached = self.cached.lock().await;
        if cached.as_ref().is_some_and(|c| c.token == *stale) {
            *cached = None;
        }
    }

    async fn mint(&self) -> Result<Cached, TokenFailure> {
        let asked_at = self.clock.now_ms();
        let iat = u64::try_from(asked_at.div_euclid(1_000)).unwrap_or(0);
        let assertion = self.account.assertion(iat).map_err(|e| {
            TokenFailure::Transport(format!("signing the assertion: {}", pem_problem(&e)))
        })?;
        let response = self
            .http
            .post(&self.account.token_uri)
            .form(&[("grant_type", JWT_BEARER_GRANT), ("assertion", &assertion)])
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| TokenFailure::Transport(e.without_url().to_string()))?;
        let code = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|e| TokenFailure::Transport(e.without_url().to_string()))?;
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !(200..300).contains(&code) {
            return Err(match parsed["error"].as_str() {
                Some(error) => TokenFailure::Refused {
                    code,
                    error: error.to_owned(),
                    description: parsed["error_description"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                },
                // Not the token endpoint talking (a proxy's page): passes like a 5xx, or is
                // refused like Google's own answer would be.
                None if code >= 500 => {
                    TokenFailure::Transport(format!("HTTP {code} without an OAuth answer"))
                }
                None => TokenFailure::Refused {
                    code,
                    error: format!("http_{code}"),
                    description: "an answer without an OAuth error".into(),
                },
            });
        }
        let Some(token) = parsed["access_token"].as_str().filter(|t| !t.is_empty()) else {
            return Err(TokenFailure::Transport(format!(
                "HTTP {code} without an access_token"
            )));
        };
        let lifetime = Duration::from_secs(
            parsed["expires_in"]
                .as_u64()
                .unwrap_or(DEFAULT_TOKEN_LIFETIME_S),
        );
        let fresh_for = lifetime - REFRESH_MARGIN.min(lifetime / 2);
        Ok(Cached {
            token: Secret::new(token),
            // Counted from when the request left: the token was issued no earlier.
            refresh_at: asked_at
                .saturating_add(i64::try_from(fresh_for.as_millis()).unwrap_or(i64::MAX)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = include_str!("simulator/service-account-key.pem");

    fn key_json(kind: &str, private_key: &str) -> String {
        json!({
            "type": kind, "project_id": "p", "private_key_id": "k1", "private_key": private_key,
            "client_email": "app@p.iam.gserviceaccount.com", "token_uri": "http://127.0.0.1:1/token",
        })
        .to_string()
    }

    #[test]
    fn a_service_account_key_loads_and_signs() {
        let key = ServiceAccountKey::parse(&key_json("service_account", PEM))
            .expect("the test key loads");
        assert_eq!(key.client_email, "app@p.iam.gserviceaccount.com");
        let jwt = key.assertion(1_700_000_000).expect("the test key signs");
        let header = jsonwebtoken::decode_header(&jwt).expect("a JWT");
        assert_eq!(header.alg, Algorithm::RS256);
        assert_eq!(header.kid.as_deref(), Some("k1"));
        let mut validation = jsonwebtoken::Validation::new(Algorithm::RS256);
        validation.insecure_disable_signature_validation();
        validation.validate_exp = false;
        validation.validate_aud = false;
        let claims = jsonwebtoken::decode::<Value>(
            &jwt,
            &jsonwebtoken::DecodingKey::from_secret(&[]),
            &validation,
        )
        .expect("readable claims")
        .claims;
        assert_eq!(claims["iat"], 1_700_000_000);
        assert_eq!(claims["exp"], 1_700_003_600);
        assert!(!format!("{key:?}").contains("PRIVATE"));
    }

    #[test]
    fn bad_keys_are_refused_without_quoting_them() {
        let cases = [
            ("{not json".to_owned(), "is not a JSON object"),
            (key_json("authorized_user", PEM), "\"authorized_user\""),
            (
                key_json(
                    "service_account",
                    "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n",
                ),
                "not an RSA private key",
            ),
            (
                key_json("service_account", "secret-material"),
                "not an RSA private key",
            ),
            (
                json!({ "type": "service_account", "private_key": "secret-material" }).to_string(),
                "client_email",
            ),
        ];
        for (text, expected) in cases {
            let error = ServiceAccountKey::parse(&text)
                .expect_err("refused")
                .to_string();
            assert!(error.contains(expected), "{error}");
            assert!(
                !error.contains("secret") && !error.contains("c2VjcmV0"),
                "{error}"
            );
        }
    }

    #[test]
    fn token_failures_are_classified() {
        use DeliveryFailureKind::*;
        let refused = |code: u16, error: &str| TokenFailure::Refused {
            code,
            error: error.into(),
            description: "d".into(),
        };
        assert_eq!(refused(400, "invalid_grant").kind(), Auth);
        assert_eq!(refused(401, "invalid_client").kind(), Auth);
        assert_eq!(refused(503, "temporarily_unavailable").kind(), Transient);
        assert_eq!(refused(429, "rate_limit_exceeded").kind(), RateLimit);
        assert_eq!(TokenFailure::Transport("timeout".into()).kind(), Transient);
        let error = refused(400, "invalid_grant").into_send_error("GOOGLE_CHAT_KEY");
        assert_eq!(error.side_effect, clawgate_channel_sdk::SideEffect::None);
        assert!(
            error.message.contains("GOOGLE_CHAT_KEY"),
            "{}",
            error.message
        );
    }
}
