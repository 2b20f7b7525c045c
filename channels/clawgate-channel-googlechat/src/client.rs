//! One Chat API call over HTTP, and what its failure means: Google refused it (an error
//! envelope: nothing happened), it never reached Google, or it went out and no usable answer
//! came back (Google may have acted).

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::Value;

use crate::auth::{TokenFailure, TokenSource};

/// The wait a 429 without a delay of its own gets: the documented answer is exponential
/// backoff, which the engine's retry policy grows from here.
const DEFAULT_RATE_LIMIT_WAIT_MS: u64 = 1_000;

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// Google answered `{"error": {"code", "message", "status"}}`: the call had no effect.
    Refused {
        code: u16,
        status: String,
        message: String,
        retry_after_ms: Option<u64>,
    },
    /// Nothing reached Google (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back.
    Lost(String),
    /// No access token could be had: the call never went out.
    Token {
        failure: TokenFailure,
        key_env: String,
    },
}

impl CallError {
    /// `error.status` of a refusal (`NOT_FOUND`, `ALREADY_EXISTS`, …).
    pub(crate) fn status(&self) -> Option<&str> {
        match self {
            CallError::Refused { status, .. } => Some(status),
            _ => None,
        }
    }

    /// The failure class, from the canonical status (then the HTTP code).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        let CallError::Refused { code, status, .. } = self else {
            return match self {
                CallError::Unreachable(_) => Transient,
                CallError::Token { failure, .. } => failure.kind(),
                _ => Unknown,
            };
        };
        match (status.as_str(), code) {
            ("UNAUTHENTICATED", _) | (_, 401) => Auth,
            ("PERMISSION_DENIED", _) | (_, 403) => Permission,
            ("NOT_FOUND", _) | (_, 404) => NotFound,
            ("ALREADY_EXISTS" | "ABORTED", _) | (_, 409) => Conflict,
            ("RESOURCE_EXHAUSTED", _) | (_, 429) => RateLimit,
            ("UNAVAILABLE" | "INTERNAL" | "DEADLINE_EXCEEDED" | "UNKNOWN", _) => Transient,
            (_, c) if *c >= 500 => Transient,
            // INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, …
            _ => InvalidPayload,
        }
    }

    /// As a send failure. A refusal had no effect (a 5xx in Google's envelope included: the
    /// retry carries the same `requestId`, so it cannot make a second message); an unreachable
    /// API neither; a lost answer may have.
    pub(crate) fn into_send_error(self, method: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused {
                code,
                status,
                message,
                retry_after_ms,
            } => {
                let retry = retry_after_ms
                    .or((kind == DeliveryFailureKind::RateLimit)
                        .then_some(DEFAULT_RATE_LIMIT_WAIT_MS));
                SendError::before_io(
                    kind,
                    format!(
                        "Google Chat {method}: {code} {status}: {message}{}",
                        hint(&status)
                    ),
                )
                .with_retry_after_ms(retry)
                .with_platform_code(status)
            }
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Google Chat {method}: the API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Google Chat {method}: the request went out and no usable answer came back \
                     ({reason}); Google may have acted"
                ),
            ),
            CallError::Token { failure, key_env } => failure.into_send_error(&key_env),
        }
    }
}

/// What to do about the refusals an operator can fix.
fn hint(status: &str) -> &'static str {
    match status {
        "UNAUTHENTICATED" => {
            " (check the credentials: the access token in token_env is an OAuth token of the \
             Chat app's service account with the https://www.googleapis.com/auth/chat.bot \
             scope; a service account key's token was refused even freshly minted)"
        }
        "PERMISSION_DENIED" => " (add the Chat app to the space, or check its configuration)",
        _ => "",
    }
}

/// The delay a refusal asks for: `google.rpc.RetryInfo` in `error.details`, else `Retry-After`.
fn retry_delay_ms(error: &Value, header: Option<u64>) -> Option<u64> {
    let from_details = error["details"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|d| {
            if d["@type"].as_str()? != "type.googleapis.com/google.rpc.RetryInfo" {
                return None;
            }
            let delay = d["retryDelay"].as_str()?.strip_suffix('s')?;
            let secs: f64 = delay.parse().ok()?;
            Some((secs * 1_000.0).ceil() as u64)
        });
    from_details.or(header.map(|s| s.saturating_mul(1_000)))
}

/// Where the access token of each call comes from.
#[derive(Debug, Clone)]
pub(crate) enum Credentials {
    /// A token given ready (`token_env`); nobody here can renew it.
    Static(Secret),
    /// Tokens minted from the service account's key, renewed as they age.
    ServiceAccount(Arc<TokenSource>),
}

/// The Chat API endpoint and the app's credentials.
#[derive(Clone)]
pub(crate) struct ChatApi {
    base: String,
    credentials: Credentials,
    http: reqwest::Client,
    timeout: Duration,
}

/// The token rides in every request's header: never printed.
impl std::fmt::Debug for ChatApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatApi")
            .field("base", &self.base)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// One HTTP client for the API and the token endpoint.
pub(crate) fn http_client() -> reqwest::Client {
    clawgate_channel_sdk::http::client_builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default()
}

impl ChatApi {
    /// Calls below `base` (`https://chat.googleapis.com/`, the simulator) with `credentials`;
    /// each may take `timeout` before its outcome counts as unknown.
    pub(crate) fn new(
        base: &str,
        credentials: Credentials,
        http: reqwest::Client,
        timeout: Duration,
    ) -> ChatApi {
        ChatApi {
            base: format!("{}/", base.trim_end_matches('/')),
            credentials,
            http,
            timeout,
        }
    }

    /// `method` on `v1/{path}` with `query` and a JSON `body`; the answer's JSON object.
    ///
    /// With a service account, a 401 forgets the token and the call is made once more with a
    /// fresh one: Google refused the first, so nothing of it took effect.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let source = match &self.credentials {
            Credentials::Static(token) => {
                return self.call_with(method, path, query, body, token).await;
            }
            Credentials::ServiceAccount(source) => source,
        };
        let token_failed = |failure| CallError::Token {
            failure,
            key_env: source.key_env.clone(),
        };
        let token = source.token().await.map_err(token_failed)?;
        match self
            .call_with(method.clone(), path, query, body, &token)
            .await
        {
            Err(CallError::Refused { code: 401, .. }) => {
                source.invalidate(&token).await;
                let fresh = source.token().await.map_err(token_failed)?;
                self.call_with(method, path, query, body, &fresh).await
            }
            outcome => outcome,
        }
    }

    async fn call_with(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        token: &Secret,
    ) -> Result<Value, CallError> {
        let mut request = self
            .http
            .request(method, format!("{}v1/{path}", self.base))
            .bearer_auth(token.expose())
            .query(query)
            .timeout(self.timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.to_string())),
        };
        let code = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let parsed: Option<Value> = serde_json::from_slice(&body).ok();
        if (200..300).contains(&code) {
            return match parsed {
                Some(value @ Value::Object(_)) => Ok(value),
                _ => Err(CallError::Lost(format!(
                    "HTTP {code} without a JSON answer"
                ))),
            };
        }
        match parsed
            .as_ref()
            .map(|v| &v["error"])
            .filter(|e| e.is_object())
        {
            Some(error) => Err(CallError::Refused {
                code: error["code"]
                    .as_u64()
                    .and_then(|c| u16::try_from(c).ok())
                    .unwrap_or(code),
                status: error["status"].as_str().unwrap_or_default().to_owned(),
                message: error["message"].as_str().unwrap_or_default().to_owned(),
                retry_after_ms: retry_delay_ms(error, retry_after),
            }),
            // A 429 is a refusal whatever its body says.
            None if code == 429 => Err(CallError::Refused {
                code,
                status: "RESOURCE_EXHAUSTED".into(),
                message: "Too many requests".into(),
                retry_after_ms: retry_after.map(|s| s.saturating_mul(1_000)),
            }),
            // Not Google talking (a proxy's page, a cut body): the call may have landed.
            None => Err(CallError::Lost(format!(
                "HTTP {code} without a Google API answer"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;
    use serde_json::json;

    fn refused(code: u16, status: &str) -> CallError {
        CallError::Refused {
            code,
            status: status.into(),
            message: "m".into(),
            retry_after_ms: None,
        }
    }

    #[test]
    fn google_errors_are_classified_by_status() {
        use DeliveryFailureKind::*;
        for (code, status, kind) in [
            (401, "UNAUTHENTICATED", Auth),
            (403, "PERMISSION_DENIED", Permission),
            (404, "NOT_FOUND", NotFound),
            (409, "ALREADY_EXISTS", Conflict),
            (429, "RESOURCE_EXHAUSTED", RateLimit),
            (400, "INVALID_ARGUMENT", InvalidPayload),
            (400, "FAILED_PRECONDITION", InvalidPayload),
            (500, "INTERNAL", Transient),
            (503, "UNAVAILABLE", Transient),
        ] {
            let error = refused(code, status).into_send_error("create");
            assert_eq!(error.kind, kind, "{status}");
            assert_eq!(error.side_effect, SideEffect::None, "{status}");
        }
        let limited = refused(429, "RESOURCE_EXHAUSTED").into_send_error("create");
        assert_eq!(limited.retry_after_ms, Some(DEFAULT_RATE_LIMIT_WAIT_MS));
        let lost = CallError::Lost("timeout".into()).into_send_error("create");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
    }

    #[test]
    fn retry_info_wins_over_retry_after() {
        let error = json!({ "details": [{ "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": "2.5s" }] });
        assert_eq!(retry_delay_ms(&error, Some(9)), Some(2_500));
        assert_eq!(retry_delay_ms(&json!({}), Some(9)), Some(9_000));
        assert_eq!(retry_delay_ms(&json!({}), None), None);
    }

    #[test]
    fn the_token_never_prints() {
        let api = ChatApi::new(
            "http://127.0.0.1:1/",
            Credentials::Static(Secret::new("ya29.very-secret")),
            http_client(),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }

    #[test]
    fn a_service_account_key_and_its_cached_token_never_print() {
        const PEM: &str = include_str!("simulator/service-account-key.pem");
        let key = json!({
            "type": "service_account", "private_key_id": "k1", "private_key": PEM,
            "client_email": "app@p.iam.gserviceaccount.com", "token_uri": "http://127.0.0.1:1/token",
        });
        let key = crate::auth::ServiceAccountKey::parse(&key.to_string()).expect("loads");
        let source = TokenSource::new(
            key,
            "KEY_ENV",
            http_client(),
            Duration::from_secs(1),
            Arc::new(clawgate_types::clock::ManualClock::new(0)),
        )
        .with_cached("ya29.minted-secret");
        let api = ChatApi::new(
            "http://127.0.0.1:1/",
            Credentials::ServiceAccount(Arc::new(source)),
            http_client(),
            Duration::from_secs(1),
        );
        let shown = format!("{api:?}");
        assert!(shown.contains("app@p.iam.gserviceaccount.com"), "{shown}");
        let body = PEM.lines().nth(1).expect("a PEM body");
        assert!(
            !shown.contains(body) && !shown.contains("minted-secret"),
            "{shown}"
        );
    }
}
