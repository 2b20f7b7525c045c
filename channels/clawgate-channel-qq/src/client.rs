//! The QQ Bot API over HTTP: the app access token (`POST /app/getAppAccessToken`, refreshed
//! before it expires), calls with `Authorization: QQBot <token>`, and what their failures mean.
//!
//! QQ answers failures with an HTTP error status and `{code, message, err_code, trace_id}`
//! plus the `X-Tps-trace-ID` header (platform-apis-wave2 §14.5). A failure is one of: QQ
//! refused the call (nothing happened; its code says why), it never reached QQ, or it went out
//! and no usable answer came back (it may have been carried out).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::Value;
use tokio::sync::Mutex;

/// The answered message was already answered under this `(msg_id, msg_seq)`: QQ deduplicated
/// the request, so the earlier one landed ("消息被去重，请检查请求msgseq").
pub const CODE_DEDUPLICATED: i64 = 40_054_005;
/// A passive reply outside the answered message's window (C2C 60 min, group 5 min).
pub const CODE_PASSIVE_EXPIRED: i64 = 40_034_005;
/// A passive reply outside the window (the code clients report for groups).
pub const CODE_PASSIVE_EXPIRED_GROUP: i64 = 40_034_128;
/// The answered message has had all the replies it may have.
pub const CODE_REPLY_LIMIT: i64 = 304_103;
/// An active message without the permission to send one.
pub const CODE_NO_ACTIVE_PERMISSION: i64 = 40_034_102;
/// The monthly active-message quota of the user or group is used up.
pub const CODE_ACTIVE_QUOTA: i64 = 22_009;
/// The bot is muted in the group.
pub const CODE_MUTED: i64 = 40_054_002;
/// The bot is not a member of the group.
pub const CODE_NOT_MEMBER: i64 = 40_054_003;
/// The access token is invalid or expired.
pub const CODE_TOKEN_INVALID: i64 = 11_241;
/// A stream message's stream is over (finished, or idle past the platform's limit).
pub const CODE_STREAM_CLOSED: i64 = 40_054_010;
/// The message to recall does not exist (or is already recalled).
pub const CODE_MESSAGE_GONE: i64 = 40_054_011;
/// The header carrying QQ's trace id.
pub const TRACE_HEADER: &str = "x-tps-trace-id";

/// A refusal: the HTTP status and QQ's error body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QqError {
    pub(crate) what: String,
    pub(crate) status: u16,
    pub(crate) code: i64,
    pub(crate) message: String,
    pub(crate) trace_id: Option<String>,
}

impl QqError {
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        match self.code {
            CODE_TOKEN_INVALID => Auth,
            CODE_PASSIVE_EXPIRED | CODE_PASSIVE_EXPIRED_GROUP | CODE_REPLY_LIMIT => Permission,
            CODE_NO_ACTIVE_PERMISSION | CODE_ACTIVE_QUOTA | CODE_MUTED | CODE_NOT_MEMBER => {
                Permission
            }
            CODE_MESSAGE_GONE => NotFound,
            _ => match self.status {
                401 => Auth,
                429 => RateLimit,
                s if s >= 500 => Transient,
                s => match clawgate_channel_sdk::classify_http_status(s) {
                    Unknown => InvalidPayload,
                    kind => kind,
                },
            },
        }
    }

    /// The passive window of the answered message is closed (expired or out of replies).
    pub(crate) fn passive_closed(&self) -> bool {
        matches!(
            self.code,
            CODE_PASSIVE_EXPIRED | CODE_PASSIVE_EXPIRED_GROUP | CODE_REPLY_LIMIT
        )
    }

    pub(crate) fn is_token_refusal(&self) -> bool {
        self.kind() == DeliveryFailureKind::Auth
    }

    fn hint(&self) -> &'static str {
        match self.code {
            CODE_PASSIVE_EXPIRED | CODE_PASSIVE_EXPIRED_GROUP => {
                " (the reply window of the answered message is over: C2C 60 min, group 5 min)"
            }
            CODE_REPLY_LIMIT => " (the answered message has had all its replies)",
            CODE_ACTIVE_QUOTA => {
                " (the monthly active-message quota of this user or group is used up; not retried)"
            }
            CODE_NO_ACTIVE_PERMISSION => " (this bot may not send active messages)",
            CODE_MUTED => " (the bot is muted in this group)",
            CODE_NOT_MEMBER => " (the bot is not a member of this group)",
            CODE_TOKEN_INVALID => " (the access token is invalid or expired)",
            _ => "",
        }
    }
}

impl std::fmt::Display for QqError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answered HTTP {} code {}: {}{}",
            self.what,
            self.status,
            self.code,
            self.message,
            self.hint()
        )?;
        if let Some(trace) = &self.trace_id {
            write!(f, " [trace {trace}]")?;
        }
        Ok(())
    }
}

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// QQ answered with an error: the call had no effect.
    Refused(QqError),
    /// Nothing reached QQ (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: it may have been carried out.
    Lost(String),
}

impl CallError {
    pub(crate) fn refusal(&self) -> Option<&QqError> {
        match self {
            CallError::Refused(error) => Some(error),
            _ => None,
        }
    }

    pub(crate) fn code(&self) -> Option<i64> {
        self.refusal().map(|e| e.code)
    }

    /// As a send failure: a refusal or an unreachable server had no side effect; a lost
    /// answer may have.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        match self {
            CallError::Refused(error) => {
                SendError::before_io(error.kind(), format!("QQ {what}: {error}"))
                    .with_platform_code(error.code.to_string())
            }
            CallError::Unreachable(reason) => SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("QQ {what}: the QQ Bot API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!(
                    "QQ {what}: the request went out and no usable answer came back ({reason}); \
                     it may have been carried out"
                ),
            ),
        }
    }
}

/// Why no access token could be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The token endpoint refused the app id and secret.
    #[error(
        "the QQ token endpoint refused app {app_id} ({detail}): check app_id and that secret_env \
         holds the bot's AppSecret"
    )]
    Refused {
        /// The app id.
        app_id: String,
        /// QQ's words.
        detail: String,
    },
    /// The token endpoint could not be reached or answered nonsense.
    #[error("no QQ access token: {0}")]
    Unavailable(String),
}

impl TokenError {
    pub(crate) fn into_send_error(self) -> SendError {
        let kind = match self {
            TokenError::Refused { .. } => DeliveryFailureKind::Auth,
            TokenError::Unavailable(_) => DeliveryFailureKind::Transient,
        };
        SendError::before_io(kind, self.to_string())
    }
}

struct Cached {
    token: String,
    expires_at: Instant,
}

/// The QQ Bot API of one bot.
#[derive(Clone)]
pub(crate) struct OpenApi {
    api_base: String,
    token_base: String,
    app_id: String,
    secret: Secret,
    http: reqwest::Client,
    timeout: Duration,
    refresh_ahead: Duration,
    token: Arc<Mutex<Option<Cached>>>,
}

/// The secret and the token are never printed.
impl std::fmt::Debug for OpenApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenApi")
            .field("api_base", &self.api_base)
            .field("token_base", &self.token_base)
            .field("app_id", &self.app_id)
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

impl OpenApi {
    pub(crate) fn new(
        api_base: &str,
        token_base: &str,
        app_id: &str,
        secret: Secret,
        timeout: Duration,
        refresh_ahead: Duration,
    ) -> OpenApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        OpenApi {
            api_base: api_base.trim_end_matches('/').to_owned(),
            token_base: token_base.trim_end_matches('/').to_owned(),
            app_id: app_id.to_owned(),
            secret,
            http,
            timeout,
            refresh_ahead,
            token: Arc::new(Mutex::new(None)),
        }
    }

    /// A token with more than `refresh_ahead` left, fetched when the cached one is older.
    /// One fetch at a time: concurrent callers wait for it.
    pub(crate) async fn access_token(&self) -> Result<String, TokenError> {
        let mut cached = self.token.lock().await;
        if let Some(c) = cached.as_ref()
            && c.expires_at.saturating_duration_since(Instant::now()) > self.refresh_ahead
        {
            return Ok(c.token.clone());
        }
        let fresh = self.fetch_token().await?;
        let token = fresh.token.clone();
        *cached = Some(fresh);
        Ok(token)
    }

    /// Forgets `refused` (QQ said it is invalid) so the next call fetches a new one.
    pub(crate) async fn forget_token(&self, refused: &str) {
        let mut cached = self.token.lock().await;
        if cached.as_ref().is_some_and(|c| c.token == refused) {
            *cached = None;
        }
    }

    async fn fetch_token(&self) -> Result<Cached, TokenError> {
        let body =
            serde_json::json!({ "appId": self.app_id, "clientSecret": self.secret.expose() });
        let asked = Instant::now();
        let response = self
            .http
            .post(format!("{}/app/getAppAccessToken", self.token_base))
            .json(&body)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| TokenError::Unavailable(format!("POST /app/getAppAccessToken: {e}")))?;
        let status = response.status().as_u16();
        let answer: Value = response
            .json()
            .await
            .map_err(|e| TokenError::Unavailable(format!("the token answer is not JSON: {e}")))?;
        let token = answer.get("access_token").and_then(Value::as_str);
        // `expires_in` is a string of seconds ("7200"); a number is read all the same.
        let expires_in = match answer.get("expires_in") {
            Some(Value::String(s)) => s.trim().parse::<u64>().ok(),
            Some(Value::Number(n)) => n.as_u64(),
            _ => None,
        };
        match (token, expires_in) {
            (Some(token), Some(seconds)) if status == 200 && !token.is_empty() => Ok(Cached {
                token: token.to_owned(),
                expires_at: asked + Duration::from_secs(seconds),
            }),
            _ if (400..500).contains(&status) || answer.get("code").is_some() => {
                Err(TokenError::Refused {
                    app_id: self.app_id.clone(),
                    detail: format!(
                        "HTTP {status} code {}: {}",
                        answer.get("code").unwrap_or(&Value::Null),
                        answer
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("no message")
                    ),
                })
            }
            _ => Err(TokenError::Unavailable(format!(
                "HTTP {status} without access_token and expires_in"
            ))),
        }
    }

    /// One API call with the current token; a token QQ refuses is replaced once and the call
    /// made again (the refusal had no effect).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Result<CallError, TokenError>> {
        let token = self.access_token().await.map_err(Err)?;
        match self.call_with(&token, method.clone(), path, body).await {
            Err(CallError::Refused(error)) if error.is_token_refusal() => {
                self.forget_token(&token).await;
                let fresh = self.access_token().await.map_err(Err)?;
                self.call_with(&fresh, method, path, body).await.map_err(Ok)
            }
            other => other.map_err(Ok),
        }
    }

    async fn call_with(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let what = format!("{method} {path}");
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.api_base))
            .header("authorization", format!("QQBot {token}"))
            .header("x-union-appid", &self.app_id)
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
        let status = response.status().as_u16();
        let trace_id = response
            .headers()
            .get(TRACE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let answer: Value = if bytes.is_empty() {
            Value::Object(serde_json::Map::new())
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        let code = answer.get("code").and_then(Value::as_i64);
        match (status, code) {
            (200..=299, None | Some(0)) if answer.is_object() => Ok(answer),
            (_, Some(code)) if code != 0 => Err(CallError::Refused(QqError {
                what,
                status,
                code,
                message: answer
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("no message")
                    .to_owned(),
                trace_id: trace_id.or_else(|| {
                    answer
                        .get("trace_id")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                }),
            })),
            // Not QQ talking (a proxy's page, a cut body): the call may have been carried out.
            _ => Err(CallError::Lost(format!(
                "{what}: HTTP {status} without a QQ answer"
            ))),
        }
    }
}

/// A call failure of [`OpenApi::call`] as a send failure.
pub(crate) fn send_error(error: Result<CallError, TokenError>, what: &str) -> SendError {
    match error {
        Ok(call) => call.into_send_error(what),
        Err(token) => token.into_send_error(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    fn refused(status: u16, code: i64) -> CallError {
        CallError::Refused(QqError {
            what: "POST /v2/users/U/messages".into(),
            status,
            code,
            message: "m".into(),
            trace_id: Some("t-1".into()),
        })
    }

    #[test]
    fn refusals_are_classified_by_code_then_status() {
        use DeliveryFailureKind::*;
        let cases = [
            ("window", 400, CODE_PASSIVE_EXPIRED, Permission),
            ("group window", 400, CODE_PASSIVE_EXPIRED_GROUP, Permission),
            ("reply count", 400, CODE_REPLY_LIMIT, Permission),
            ("quota", 400, CODE_ACTIVE_QUOTA, Permission),
            ("muted", 400, CODE_MUTED, Permission),
            ("token", 401, CODE_TOKEN_INVALID, Auth),
            ("rate", 429, 20_028, RateLimit),
            ("server", 500, 850_027, Transient),
            ("bad body", 400, 40_034_001, InvalidPayload),
            ("gone", 404, CODE_MESSAGE_GONE, NotFound),
        ];
        for (case, status, code, kind) in cases {
            let error = refused(status, code).into_send_error("send");
            assert_eq!(error.kind, kind, "{case}");
            assert_eq!(error.side_effect, SideEffect::None, "{case}");
            assert!(
                error.message.contains("trace t-1"),
                "{case}: {}",
                error.message
            );
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("send");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
    }

    #[test]
    fn the_secret_never_prints() {
        let api = OpenApi::new(
            "http://127.0.0.1:1",
            "http://127.0.0.1:1",
            "102000001",
            Secret::new("very-secret-key"),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
