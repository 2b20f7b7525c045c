//! Google's OAuth token endpoint for service accounts (`POST /token`, the JWT-bearer grant) and
//! the access tokens it issues, which the Chat API then accepts until they expire.
//!
//! The assertion is checked as Google checks it: RS256 signed by a key registered for its `iss`,
//! `aud` the token endpoint, a `scope`, `exp - iat` at most an hour and `exp` not passed.
//! Refusals are Google's OAuth shapes (`{"error", "error_description"}`, 400).

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Value, json};

use crate::auth::{CHAT_BOT_SCOPE, JWT_BEARER_GRANT};

/// Where the token endpoint is served.
pub(crate) const TOKEN_PATH: &str = "/token";
/// Google's token endpoint: `google-auth` puts it in every assertion's `aud`, whatever the
/// key's `token_uri` says, so the simulator accepts it beside its own URL.
pub const GOOGLE_TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// The longest assertion Google accepts (`exp - iat`).
const MAX_ASSERTION_S: i64 = 3_600;
/// How far `iat` may be ahead of the simulator's clock.
const CLOCK_SKEW_S: i64 = 60;

/// A test key pair made for the simulator: `private_key` of the key files
/// [`super::GoogleChatSimulator::add_test_service_account`] writes (PKCS#8 PEM).
pub const TEST_SERVICE_ACCOUNT_PRIVATE_KEY: &str = include_str!("service-account-key.pem");
/// The `private_key_id` of those key files (the `kid` of their assertions).
pub const TEST_SERVICE_ACCOUNT_KEY_ID: &str = "0123456789abcdef0123456789abcdef01234567";
/// The public half of [`TEST_SERVICE_ACCOUNT_PRIVATE_KEY`] (SPKI PEM).
pub const TEST_SERVICE_ACCOUNT_PUBLIC_KEY: &str = include_str!("service-account-pub.pem");

/// What a token request met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenFault {
    /// HTTP `code` with `{"error", "error_description"}` and no token.
    Error {
        /// The HTTP status.
        code: u16,
        /// `error`.
        error: String,
        /// `error_description`.
        description: String,
    },
    /// The request is read, then the connection is cut without an answer.
    LoseAnswer,
}

impl TokenFault {
    /// Google's answer to a failure on its side: 503 `temporarily_unavailable`.
    pub fn unavailable() -> TokenFault {
        TokenFault::Error {
            code: 503,
            error: "temporarily_unavailable".into(),
            description: "The service is currently unavailable.".into(),
        }
    }
}

/// One token request as the endpoint answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// The assertion's `iss` (when it had one).
    pub client_email: Option<String>,
    /// The HTTP status.
    pub status: u16,
    /// `error` of a refusal.
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
struct Issued {
    client_email: String,
    expires_at: Instant,
    chat_scope: bool,
    revoked: bool,
}

/// What the Chat API makes of a bearer token.
pub(crate) enum Bearer {
    Valid,
    /// Issued without the `chat.bot` scope.
    NoScope,
    Invalid,
}

/// The token endpoint's state: registered keys, issued tokens, faults, the record.
#[derive(Debug)]
pub(crate) struct OAuth {
    /// client_email → the public keys of its service account (PEM), by key id.
    accounts: HashMap<String, HashMap<String, String>>,
    issued: HashMap<String, Issued>,
    pub(crate) lifetime: Duration,
    pub(crate) faults: Vec<TokenFault>,
    pub(crate) records: Vec<TokenRecord>,
    next: u64,
}

fn refusal(error: &str, description: impl Into<String>) -> (u16, Value) {
    (
        400,
        json!({ "error": error, "error_description": description.into() }),
    )
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl OAuth {
    pub(crate) fn new(lifetime: Duration) -> OAuth {
        OAuth {
            accounts: HashMap::new(),
            issued: HashMap::new(),
            lifetime,
            faults: Vec::new(),
            records: Vec::new(),
            next: 1,
        }
    }

    pub(crate) fn register(&mut self, client_email: &str, key_id: &str, public_pem: &str) -> bool {
        if DecodingKey::from_rsa_pem(public_pem.as_bytes()).is_err() {
            return false;
        }
        self.accounts
            .entry(client_email.to_owned())
            .or_default()
            .insert(key_id.to_owned(), public_pem.to_owned());
        true
    }

    pub(crate) fn delete_key(&mut self, client_email: &str, key_id: &str) -> bool {
        self.accounts
            .get_mut(client_email)
            .is_some_and(|keys| keys.remove(key_id).is_some())
    }

    /// Revokes every token issued so far; returns how many were live.
    pub(crate) fn revoke_all(&mut self) -> usize {
        let now = Instant::now();
        self.issued
            .values_mut()
            .filter(|t| !t.revoked && t.expires_at > now)
            .map(|t| t.revoked = true)
            .count()
    }

    pub(crate) fn bearer(&self, token: &str) -> Bearer {
        match self.issued.get(token) {
            Some(t) if t.revoked || t.expires_at <= Instant::now() => Bearer::Invalid,
            Some(t) if !t.chat_scope => Bearer::NoScope,
            Some(_) => Bearer::Valid,
            None => Bearer::Invalid,
        }
    }

    /// Answers a token request (`form`: the decoded body) arriving at `own_uri`.
    pub(crate) fn grant(&mut self, form: &[(String, String)], own_uri: &str) -> (u16, Value) {
        let field = |key: &str| form.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        let claims = field("assertion").and_then(unverified_claims);
        let issuer = claims
            .as_ref()
            .and_then(|c| c["iss"].as_str())
            .map(str::to_owned);
        let (status, body) = match self.take_fault() {
            Some(TokenFault::Error {
                code,
                error,
                description,
            }) => (
                code,
                json!({ "error": error, "error_description": description }),
            ),
            _ => self.check(field("grant_type"), field("assertion"), own_uri),
        };
        self.records.push(TokenRecord {
            client_email: issuer,
            status,
            error: body["error"].as_str().map(str::to_owned),
        });
        (status, body)
    }

    /// Whether the next request's answer is to be lost (checked before [`OAuth::grant`]).
    pub(crate) fn take_lost(&mut self) -> bool {
        if self.faults.first() == Some(&TokenFault::LoseAnswer) {
            self.faults.remove(0);
            return true;
        }
        false
    }

    fn take_fault(&mut self) -> Option<TokenFault> {
        (!self.faults.is_empty()).then(|| self.faults.remove(0))
    }

    fn check(
        &mut self,
        grant_type: Option<&str>,
        assertion: Option<&str>,
        own_uri: &str,
    ) -> (u16, Value) {
        match grant_type {
            Some(JWT_BEARER_GRANT) => {}
            Some(other) => {
                return refusal(
                    "unsupported_grant_type",
                    format!("Invalid grant_type: {other}"),
                );
            }
            None => return refusal("invalid_request", "Missing required parameter: grant_type"),
        }
        let Some(assertion) = assertion else {
            return refusal("invalid_request", "Missing required parameter: assertion");
        };
        let Some(claims) = unverified_claims(assertion) else {
            return refusal("invalid_grant", "Invalid JWT: the assertion is not a JWT.");
        };
        let Some(issuer) = claims["iss"].as_str() else {
            return refusal("invalid_request", "Invalid JWT: the iss claim is missing.");
        };
        let Some(keys) = self.accounts.get(issuer) else {
            return refusal("invalid_grant", "Invalid grant: account not found");
        };
        let kid = jsonwebtoken::decode_header(assertion)
            .ok()
            .and_then(|h| (h.alg == Algorithm::RS256).then_some(h.kid))
            .flatten();
        let verified = kid
            .and_then(|kid| keys.get(&kid))
            .and_then(|pem| DecodingKey::from_rsa_pem(pem.as_bytes()).ok())
            .is_some_and(|key| {
                let mut validation = Validation::new(Algorithm::RS256);
                validation.validate_exp = false;
                validation.validate_aud = false;
                validation.required_spec_claims.clear();
                jsonwebtoken::decode::<Value>(assertion, &key, &validation).is_ok()
            });
        if !verified {
            return refusal("invalid_grant", "Invalid JWT Signature.");
        }
        let audience = claims["aud"].as_str().unwrap_or_default();
        if audience != own_uri && audience != GOOGLE_TOKEN_URI {
            return refusal(
                "invalid_grant",
                format!("Invalid JWT: Failed audience check. The right audience is {own_uri}"),
            );
        }
        let now = now_s();
        let (iat, exp) = (claims["iat"].as_i64(), claims["exp"].as_i64());
        let timely = match (iat, exp) {
            (Some(iat), Some(exp)) => {
                exp > now && iat <= now + CLOCK_SKEW_S && exp > iat && exp - iat <= MAX_ASSERTION_S
            }
            _ => false,
        };
        if !timely {
            return refusal(
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable \
                 timeframe. Check your iat and exp values in the JWT claim.",
            );
        }
        let scope = claims["scope"].as_str().unwrap_or_default();
        if scope.trim().is_empty() {
            return refusal(
                "invalid_scope",
                "Invalid OAuth scope or ID token audience provided.",
            );
        }
        let token = format!("ya29.sim-{}-{:016x}", self.next, rand_suffix(self.next));
        self.next += 1;
        self.issued.insert(
            token.clone(),
            Issued {
                client_email: issuer.to_owned(),
                expires_at: Instant::now() + self.lifetime,
                chat_scope: scope.split(' ').any(|s| s == CHAT_BOT_SCOPE),
                revoked: false,
            },
        );
        (
            200,
            json!({
                "access_token": token,
                "expires_in": self.lifetime.as_secs(),
                "token_type": "Bearer",
            }),
        )
    }

    /// Tokens issued to `client_email` so far.
    pub(crate) fn issued_to(&self, client_email: &str) -> usize {
        self.issued
            .values()
            .filter(|t| t.client_email == client_email)
            .count()
    }
}

/// The claims of a JWT, its signature not checked (to find the account that signed it).
fn unverified_claims(jwt: &str) -> Option<Value> {
    let mut parts = jwt.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64url(payload)?;
    serde_json::from_slice::<Value>(&bytes)
        .ok()
        .filter(Value::is_object)
}

fn base64url(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut buffer, mut bits) = (0u32, 0u32);
    for byte in text.bytes().filter(|b| *b != b'=') {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => return None,
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    Some(out)
}

/// A token no client can guess from its counter alone.
fn rand_suffix(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(n);
    hasher.finish()
}
