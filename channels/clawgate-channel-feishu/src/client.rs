//! One Open Platform call over HTTP, and what its failure means. Feishu reports failure in the
//! body: `{code, msg}` with `code ≠ 0` is a refusal even under HTTP 200 (platform-apis-wave2
//! §13.1, §17), and nothing was done. A call that never reached Feishu did nothing either; a
//! call that went out and got no usable answer may have acted.
//!
//! The `tenant_access_token` comes from `POST /open-apis/auth/v3/tenant_access_token/internal`
//! and is kept until shortly before its `expire`; a refusal of the token itself (expired early,
//! revoked) fetches a new one and repeats the call once — the refusal proves nothing was done.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::{Value, json};

/// The platform's frequency limit ("request trigger frequency limit"), HTTP 429.
pub const CODE_RATE_LIMITED: i64 = 99_991_400;
/// The in-API frequency limit (e.g. one chat's send rate).
pub const CODE_CHAT_RATE_LIMITED: i64 = 230_020;
/// A CardKit update after the platform closed the card's streaming mode.
pub const CODE_STREAMING_CLOSED: i64 = 300_309;
/// The tenant access token is invalid or expired.
pub const CODE_TOKEN_INVALID: i64 = 99_991_663;
/// The tenant access token is missing.
pub const CODE_TOKEN_MISSING: i64 = 99_991_661;
/// The app secret does not match the app id.
pub const CODE_APP_SECRET_INVALID: i64 = 10_014;
/// The bot is not in the chat.
pub const CODE_BOT_NOT_IN_CHAT: i64 = 230_002;
/// The message was recalled or deleted.
pub const CODE_MESSAGE_GONE: i64 = 230_011;
/// A request parameter is invalid.
pub const CODE_INVALID_PARAM: i64 = 230_001;
/// The header naming how many seconds to wait after a frequency limit.
pub const RATELIMIT_RESET_HEADER: &str = "x-ogw-ratelimit-reset";

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// Feishu answered `code ≠ 0` (under any status): nothing was done.
    Refused {
        status: u16,
        code: i64,
        msg: String,
        retry_after: Option<u64>,
    },
    /// Nothing reached Feishu (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: Feishu may have acted.
    Lost(String),
}

impl CallError {
    /// The platform code of a refusal.
    pub(crate) fn code(&self) -> Option<i64> {
        match self {
            CallError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The failure class (platform-apis-wave2 §13.1; the codes beyond 99991400, 230020 and
    /// 300309 are the Open Platform's published ones as its SDKs name them).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        let CallError::Refused { status, code, .. } = self else {
            return match self {
                CallError::Unreachable(_) => Transient,
                _ => Unknown,
            };
        };
        match *code {
            CODE_RATE_LIMITED | CODE_CHAT_RATE_LIMITED => RateLimit,
            CODE_TOKEN_INVALID | CODE_TOKEN_MISSING | CODE_APP_SECRET_INVALID | 99_991_677 => Auth,
            CODE_BOT_NOT_IN_CHAT | 230_006 | 230_013 | 230_027 | 99_991_672 => Permission,
            CODE_MESSAGE_GONE => NotFound,
            CODE_STREAMING_CLOSED => Conflict,
            _ if *status == 429 => RateLimit,
            _ if *status >= 500 => Transient,
            _ => InvalidPayload,
        }
    }

    /// As a send failure of `what`: a refusal or an unreachable server had no side effect; a
    /// lost answer may have.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused {
                status,
                code,
                msg,
                retry_after,
            } => SendError::before_io(
                kind,
                format!(
                    "Feishu {what}: HTTP {status} code {code} {msg}{}",
                    hint(code)
                ),
            )
            .with_retry_after_ms(retry_after.map(|s| s.saturating_mul(1_000)))
            .with_platform_code(code.to_string()),
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Feishu {what}: the Open Platform is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Feishu {what}: the request went out and no usable answer came back \
                     ({reason}); Feishu may have acted"
                ),
            ),
        }
    }
}

/// What to do about the refusals an operator can fix.
fn hint(code: i64) -> &'static str {
    match code {
        CODE_APP_SECRET_INVALID => {
            " (check app_id and the App Secret in app_secret_env: Developer Console → \
             Credentials & Basic Info)"
        }
        CODE_TOKEN_INVALID | CODE_TOKEN_MISSING => " (the tenant access token was refused)",
        CODE_BOT_NOT_IN_CHAT => " (add the bot to the chat)",
        230_006 => " (enable the app's bot capability in the Developer Console)",
        99_991_672 => " (grant the app the im:message scope and publish a version)",
        _ => "",
    }
}

#[derive(Debug, Clone)]
struct Token {
    value: Secret,
    /// Refreshed after this.
    until: Instant,
}

/// The Open Platform endpoint and the app's credentials.
#[derive(Clone)]
pub(crate) struct OpenApi {
    base: String,
    app_id: String,
    app_secret: Secret,
    http: reqwest::Client,
    timeout: Duration,
    token: Arc<Mutex<Option<Token>>>,
}

/// The secret and the token ride in requests: never printed.
impl std::fmt::Debug for OpenApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenApi")
            .field("base", &self.base)
            .field("app_id", &self.app_id)
            .field("app_secret", &self.app_secret)
            .finish_non_exhaustive()
    }
}

/// A token is refreshed this long before Feishu says it expires.
const TOKEN_MARGIN: Duration = Duration::from_secs(300);

impl OpenApi {
    /// Calls to `base` (`https://open.feishu.cn`, `https://open.larksuite.com`, the simulator);
    /// each call may take `timeout` before its outcome counts as unknown.
    pub(crate) fn new(base: &str, app_id: &str, app_secret: Secret, timeout: Duration) -> OpenApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        OpenApi {
            base: base.trim_end_matches('/').to_owned(),
            app_id: app_id.to_owned(),
            app_secret,
            http,
            timeout,
            token: Arc::new(Mutex::new(None)),
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    fn cached_token(&self) -> Option<Secret> {
        let token = self
            .token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        token
            .as_ref()
            .filter(|t| Instant::now() < t.until)
            .map(|t| t.value.clone())
    }

    fn forget_token(&self) {
        *self
            .token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// A tenant access token: the cached one, or a new one.
    pub(crate) async fn tenant_token(&self) -> Result<Secret, CallError> {
        if let Some(token) = self.cached_token() {
            return Ok(token);
        }
        let body = json!({ "app_id": self.app_id, "app_secret": self.app_secret.expose() });
        let request = self
            .http
            .post(format!(
                "{}/open-apis/auth/v3/tenant_access_token/internal",
                self.base
            ))
            .json(&body);
        let (status, _, answer) = self.exchange(request).await?;
        if let Some(error) = refusal(status, &answer, None) {
            return Err(error);
        }
        let value = answer["tenant_access_token"]
            .as_str()
            .ok_or_else(|| CallError::Lost("a token answer without tenant_access_token".into()))?;
        let expire = Duration::from_secs(answer["expire"].as_u64().unwrap_or(0));
        let token = Secret::new(value);
        *self
            .token
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Token {
            value: token.clone(),
            until: Instant::now() + expire.saturating_sub(TOKEN_MARGIN).max(expire / 2),
        });
        Ok(token)
    }

    /// `method path?query` with a JSON body; the answer's `data` (`Null` when it has none).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        self.call_answer(method, path, query, body)
            .await
            .map(|answer| answer.get("data").cloned().unwrap_or(Value::Null))
    }

    /// `GET /open-apis/bot/v3/info`: the bot (answered beside `code`, not under `data`).
    pub(crate) async fn bot_info(&self) -> Result<Value, CallError> {
        let answer = self
            .call_answer(Method::GET, "/open-apis/bot/v3/info", &[], None)
            .await?;
        Ok(answer.get("bot").cloned().unwrap_or(Value::Null))
    }

    /// The whole answer of a call that succeeded.
    async fn call_answer(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        match self.call_once(method.clone(), path, query, body).await {
            Err(CallError::Refused { code, .. })
                if code == CODE_TOKEN_INVALID || code == 99_991_677 =>
            {
                // Refused for the token alone: nothing was done, so the call is repeated with
                // a fresh token.
                self.forget_token();
                self.call_once(method, path, query, body).await
            }
            other => other,
        }
    }

    async fn call_once(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let token = match self.tenant_token().await {
            Ok(token) => token,
            // No token: the call itself never went out.
            Err(CallError::Lost(reason)) => return Err(CallError::Unreachable(reason)),
            Err(error) => return Err(error),
        };
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token.expose())
            .query(query);
        if let Some(body) = body {
            request = request.json(body);
        }
        let (status, headers, answer) = self.exchange(request).await?;
        let retry_after = headers
            .get(RATELIMIT_RESET_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match refusal(status, &answer, retry_after) {
            Some(error) => Err(error),
            None => Ok(answer),
        }
    }

    /// Sends a request; its status, headers and JSON body (`Null` when the body is not JSON).
    async fn exchange(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<(u16, reqwest::header::HeaderMap, Value), CallError> {
        let response = match request.timeout(self.timeout).send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.to_string())),
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        Ok((
            status,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        ))
    }
}

/// The refusal an answer is, if any: `code ≠ 0` under any status. An answer without Feishu's
/// body (a proxy's page, a cut body) is lost unless its status alone is a definite refusal.
fn refusal(status: u16, body: &Value, retry_after: Option<u64>) -> Option<CallError> {
    match body.get("code").and_then(Value::as_i64) {
        Some(0) if (200..300).contains(&status) => None,
        Some(code) => Some(CallError::Refused {
            status,
            code,
            msg: body["msg"].as_str().unwrap_or_default().to_owned(),
            retry_after,
        }),
        None if status == 429 => Some(CallError::Refused {
            status,
            code: CODE_RATE_LIMITED,
            msg: String::new(),
            retry_after,
        }),
        None => Some(CallError::Lost(format!(
            "HTTP {status} without an Open Platform answer"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn feishu_answers_are_classified_by_code_even_under_200() {
        use DeliveryFailureKind::*;
        let cases = [
            (429, CODE_RATE_LIMITED, RateLimit),
            (200, CODE_CHAT_RATE_LIMITED, RateLimit),
            (400, CODE_TOKEN_INVALID, Auth),
            (400, CODE_APP_SECRET_INVALID, Auth),
            (400, CODE_BOT_NOT_IN_CHAT, Permission),
            (400, CODE_MESSAGE_GONE, NotFound),
            (400, CODE_STREAMING_CLOSED, Conflict),
            (400, CODE_INVALID_PARAM, InvalidPayload),
            (500, 1_500_000, Transient),
            (200, 230_099, InvalidPayload),
        ];
        for (status, code, kind) in cases {
            let body = json!({ "code": code, "msg": "refused" });
            let error = refusal(status, &body, Some(3)).unwrap();
            assert_eq!(error.kind(), kind, "{status} {code}");
            let send = error.into_send_error("create");
            assert_eq!(send.kind, kind);
            assert_eq!(send.side_effect, clawgate_channel_sdk::SideEffect::None);
        }
        assert_eq!(
            refusal(
                200,
                &json!({ "code": 0, "msg": "success", "data": {} }),
                None
            ),
            None
        );
        assert!(matches!(
            refusal(502, &Value::Null, None),
            Some(CallError::Lost(_))
        ));
        assert!(matches!(
            refusal(200, &Value::Null, None),
            Some(CallError::Lost(_))
        ));
        let limited = refusal(429, &Value::Null, Some(2))
            .unwrap()
            .into_send_error("create");
        assert_eq!(limited.retry_after_ms, Some(2_000));
        let lost = CallError::Lost("timeout".into()).into_send_error("create");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, clawgate_channel_sdk::SideEffect::Possible)
        );
    }

    #[test]
    fn the_secret_never_prints() {
        let api = OpenApi::new(
            "http://127.0.0.1:1",
            "cli_a",
            Secret::new("very-secret-app-secret"),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
