//! One Bot Connector call over HTTP, and what its failure means: the connector refused it (its
//! error envelope: nothing happened), it never reached the connector, or it went out and no
//! usable answer came back (the activity may have landed). A 2xx whose body carries an error
//! (a streaming activity dropped for its order) is its own case: nothing was applied.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::Value;

use crate::auth::{TokenFailure, TokenSource};

/// The wait a 429 without `Retry-After` gets: the rate-limit page's sample backs off from 2 s.
const DEFAULT_RATE_LIMIT_WAIT_MS: u64 = 2_000;

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The connector answered `{"error": {"code", "message"}}` (or its 401 page): no effect.
    Refused {
        status: u16,
        code: String,
        message: String,
        retry_after_ms: Option<u64>,
    },
    /// A 2xx whose body carries an error: the activity was dropped, not applied.
    Dropped { status: u16, code: String },
    /// Nothing reached the connector (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back.
    Lost(String),
    /// The conversation reference could not be read from the gateway's store: the call never
    /// went out.
    State(String),
    /// No access token could be had: the call never went out.
    Token {
        failure: TokenFailure,
        password_env: String,
    },
}

impl CallError {
    /// `error.code` of a refusal.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            CallError::Refused { code, .. } | CallError::Dropped { code, .. } => Some(code),
            _ => None,
        }
    }

    /// `error.message` of a refusal.
    pub(crate) fn message(&self) -> &str {
        match self {
            CallError::Refused { message, .. } => message,
            _ => "",
        }
    }

    /// The failure class, from the HTTP status and the code.
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        match self {
            CallError::Refused { status, code, .. } => match (*status, code.as_str()) {
                (401, _) => Auth,
                (403, "ContentStreamNotAllowed") => Conflict,
                (403, _) => Permission,
                (404, _) => NotFound,
                (409 | 412, _) => Conflict,
                (429, _) => RateLimit,
                (s, _) if s >= 500 => Transient,
                // BadArgument, BadSyntax, MessageSizeTooBig, …
                _ => InvalidPayload,
            },
            CallError::Dropped { .. } => Conflict,
            CallError::Unreachable(_) | CallError::State(_) => Transient,
            CallError::Token { failure, .. } => failure.kind(),
            CallError::Lost(_) => Unknown,
        }
    }

    /// As a send failure. A refusal had no effect (the connector's own error answer); an
    /// unreachable connector neither; a lost answer may have.
    pub(crate) fn into_send_error(self, operation: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused {
                status,
                code,
                message,
                retry_after_ms,
            } => {
                let retry = retry_after_ms
                    .or((kind == DeliveryFailureKind::RateLimit)
                        .then_some(DEFAULT_RATE_LIMIT_WAIT_MS));
                SendError::before_io(
                    kind,
                    format!(
                        "Teams {operation}: {status} {code}: {message}{}",
                        hint(status, &code)
                    ),
                )
                .with_retry_after_ms(retry)
                .with_platform_code(code)
            }
            CallError::Dropped { status, code } => SendError::before_io(
                kind,
                format!("Teams {operation}: answered {status} but dropped the activity: {code}"),
            )
            .with_platform_code(code),
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Teams {operation}: the Bot Connector is unreachable: {reason}"),
            ),
            CallError::State(reason) => SendError::before_io(
                kind,
                format!("Teams {operation}: nothing was sent: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Teams {operation}: the request went out and no usable answer came back \
                     ({reason}); the activity may have landed"
                ),
            ),
            CallError::Token {
                failure,
                password_env,
            } => failure.into_send_error(&password_env),
        }
    }
}

/// What to do about the refusals an operator can fix.
fn hint(status: u16, code: &str) -> &'static str {
    match (status, code) {
        (401, _) => {
            " (the connector refused a freshly fetched token too: check app_id and the client \
             secret, and that the app registration's tenant setting matches the bot's)"
        }
        (403, "BotNotInConversationRoster") => {
            " (the bot was removed from this conversation; someone must add it again)"
        }
        (404, "ConversationNotFound") => {
            " (no such conversation for this bot: it may have been deleted, or the service URL \
             is another region's)"
        }
        _ => "",
    }
}

/// One HTTP client for the connector, the token endpoint and the OpenID metadata.
pub(crate) fn http_client() -> reqwest::Client {
    clawgate_channel_sdk::http::client_builder()
        .connect_timeout(Duration::from_secs(5))
        .build()
        .unwrap_or_default()
}

/// A conversation id as one path segment (it holds `:`, `@`, `;` and `=`).
pub(crate) fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(char::from(byte));
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

/// The Bot Connector, reached at each conversation's service URL, with the app's tokens.
#[derive(Clone)]
pub(crate) struct ConnectorApi {
    tokens: Arc<TokenSource>,
    http: reqwest::Client,
    timeout: Duration,
}

/// Tokens ride in every request's header: never printed.
impl std::fmt::Debug for ConnectorApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorApi")
            .field("tokens", &self.tokens)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ConnectorApi {
    pub(crate) fn new(
        tokens: Arc<TokenSource>,
        http: reqwest::Client,
        timeout: Duration,
    ) -> ConnectorApi {
        ConnectorApi {
            tokens,
            http,
            timeout,
        }
    }

    /// `method` on `{service_url}v3/{path}` with a JSON `body`; the answer's status and JSON
    /// (`Null` when empty).
    ///
    /// A 401 forgets the token and the call is made once more with a fresh one: the connector
    /// refused the first, so nothing of it took effect.
    pub(crate) async fn call(
        &self,
        method: Method,
        service_url: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), CallError> {
        let token_failed = |failure| CallError::Token {
            failure,
            password_env: self.tokens.password_env.clone(),
        };
        let token = self.tokens.token().await.map_err(token_failed)?;
        match self
            .call_with(method.clone(), service_url, path, body, &token)
            .await
        {
            Err(CallError::Refused { status: 401, .. }) => {
                self.tokens.invalidate(&token).await;
                let fresh = self.tokens.token().await.map_err(token_failed)?;
                self.call_with(method, service_url, path, body, &fresh)
                    .await
            }
            outcome => outcome,
        }
    }

    async fn call_with(
        &self,
        method: Method,
        service_url: &str,
        path: &str,
        body: Option<&Value>,
        token: &Secret,
    ) -> Result<(u16, Value), CallError> {
        let url = format!("{}/v3/{path}", service_url.trim_end_matches('/'));
        let mut request = self
            .http
            .request(method, url)
            .bearer_auth(token.expose())
            .timeout(self.timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.without_url().to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.without_url().to_string())),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| s.saturating_mul(1_000));
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.without_url().to_string()))?;
        let parsed: Option<Value> = if bytes.iter().all(u8::is_ascii_whitespace) {
            Some(Value::Null)
        } else {
            serde_json::from_slice(&bytes).ok()
        };
        let error_code = parsed
            .as_ref()
            .and_then(|v| v["error"]["code"].as_str())
            .map(str::to_owned);
        if (200..300).contains(&status) {
            return match (parsed, error_code) {
                (Some(_), Some(code)) => Err(CallError::Dropped { status, code }),
                (Some(value @ (Value::Object(_) | Value::Null)), None) => Ok((status, value)),
                _ => Err(CallError::Lost(format!(
                    "HTTP {status} without a JSON answer"
                ))),
            };
        }
        let message = parsed
            .as_ref()
            .and_then(|v| v["error"]["message"].as_str().or(v["message"].as_str()))
            .unwrap_or_default()
            .to_owned();
        match (status, error_code) {
            (_, Some(code)) => Err(CallError::Refused {
                status,
                code,
                message,
                retry_after_ms: retry_after,
            }),
            // The connector's own 401 page (`{"message": "Authorization has been denied…"}`).
            (401, None) => Err(CallError::Refused {
                status,
                code: "Unauthorized".into(),
                message,
                retry_after_ms: None,
            }),
            // A 429 is a refusal whatever its body says.
            (429, None) => Err(CallError::Refused {
                status,
                code: "Throttled".into(),
                message,
                retry_after_ms: retry_after,
            }),
            // Not the connector talking (a proxy's page, a cut body): the call may have landed.
            _ => Err(CallError::Lost(format!(
                "HTTP {status} without a Bot Connector answer"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    fn refused(status: u16, code: &str) -> CallError {
        CallError::Refused {
            status,
            code: code.into(),
            message: "m".into(),
            retry_after_ms: None,
        }
    }

    #[test]
    fn connector_errors_are_classified() {
        use DeliveryFailureKind::*;
        for (status, code, kind) in [
            (401, "Unauthorized", Auth),
            (403, "BotNotInConversationRoster", Permission),
            (403, "ContentStreamNotAllowed", Conflict),
            (404, "ConversationNotFound", NotFound),
            (429, "Throttled", RateLimit),
            (400, "BadArgument", InvalidPayload),
            (413, "MessageSizeTooBig", InvalidPayload),
            (500, "ServiceError", Transient),
            (503, "ServiceError", Transient),
        ] {
            let error = refused(status, code).into_send_error("send");
            assert_eq!(error.kind, kind, "{status} {code}");
            assert_eq!(error.side_effect, SideEffect::None, "{code}");
        }
        let limited = refused(429, "Throttled").into_send_error("send");
        assert_eq!(limited.retry_after_ms, Some(DEFAULT_RATE_LIMIT_WAIT_MS));
        let lost = CallError::Lost("timeout".into()).into_send_error("send");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
    }

    #[test]
    fn conversation_ids_are_one_segment() {
        assert_eq!(
            encode_segment("19:ab@thread.tacv2;messageid=17"),
            "19%3Aab%40thread.tacv2%3Bmessageid%3D17"
        );
    }
}
