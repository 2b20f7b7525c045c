//! One DSM Web API call (`SYNO.Chat.External`), and what its failure means: Synology refused
//! it (`success:false` in an HTTP 200 body: nothing was posted), it never reached the NAS, or
//! it went out and no usable answer came back (the NAS may have posted).
//!
//! HTTP 200 is not success: only `"success": true` is (platform-apis-wave2 §7).

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use serde_json::Value;

/// DSM's and Chat's error codes, as Synology Chat clients know them (\[obs\]).
pub(crate) mod code {
    /// The API name is unknown (`api=`). This client's API name is fixed, so for it the code
    /// means the NAS does not serve the API right now: DSM drops a package's APIs while the
    /// package is stopped or being updated.
    pub(crate) const NO_SUCH_API: i64 = 102;
    /// The method is unknown (`method=`).
    pub(crate) const NO_SUCH_METHOD: i64 = 103;
    /// The version is not supported (`version=`).
    pub(crate) const BAD_VERSION: i64 = 104;
    /// DSM's generic "no permission".
    pub(crate) const NO_PERMISSION: i64 = 105;
    /// The payload is invalid (bad JSON, no text, a `file_url` the NAS cannot fetch).
    #[cfg(test)]
    pub(crate) const INVALID_PAYLOAD: i64 = 117;
    /// The token matches no integration.
    pub(crate) const INVALID_TOKEN: i64 = 404;
    /// Posts are created too fast.
    pub(crate) const TOO_FAST: i64 = 411;
}

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// `success: false` with this code: nothing was posted.
    Refused { code: i64, errors: Option<String> },
    /// Nothing reached the NAS (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: the NAS may have posted.
    Lost(String),
}

impl CallError {
    /// The failure class.
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        match self {
            CallError::Refused { code, .. } => match *code {
                code::TOO_FAST => RateLimit,
                code::NO_SUCH_API => Transient,
                code::INVALID_TOKEN => Auth,
                code::NO_PERMISSION => Permission,
                // 117 and the method/version codes: the request itself is wrong. A code
                // no client knows is treated the same: nothing was posted, and repeating the
                // same request will not help.
                _ => InvalidPayload,
            },
            CallError::Unreachable(_) => Transient,
            CallError::Lost(_) => Unknown,
        }
    }

    /// As a send failure of `what`: a refusal or an unreachable NAS had no side effect; a lost
    /// answer may have. A 411 asks to wait `pace_ms` (the channel's own spacing) first.
    pub(crate) fn into_send_error(self, what: &str, pace_ms: u64) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused { code, errors } => {
                let errors = errors.map(|e| format!(" ({e})")).unwrap_or_default();
                let error = SendError::before_io(
                    kind,
                    format!(
                        "Synology Chat {what}: success:false, error {code}{errors}{}",
                        hint(code)
                    ),
                )
                .with_platform_code(code.to_string());
                if code == code::TOO_FAST {
                    error.with_retry_after_ms(Some(pace_ms.max(1)))
                } else {
                    error
                }
            }
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Synology Chat {what}: the NAS is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Synology Chat {what}: the request went out and no usable answer came back \
                     ({reason}); the NAS may have posted it"
                ),
            ),
        }
    }
}

/// What to do about the refusals an operator can fix.
fn hint(code: i64) -> &'static str {
    match code {
        code::INVALID_TOKEN => {
            " (the token matches no integration: copy it again from Synology Chat → \
             Integration, and check it is the bot's for DMs, the channel's incoming webhook's \
             for a channel)"
        }
        code::NO_SUCH_API => {
            " (DSM does not serve SYNO.Chat.External now: is the Synology Chat Server package \
             running? It is tried again)"
        }
        code::NO_SUCH_METHOD | code::BAD_VERSION => {
            " (this NAS's Chat package does not serve SYNO.Chat.External version 2: update the \
             Synology Chat Server package)"
        }
        code::NO_PERMISSION => " (the integration may not post here)",
        code::TOO_FAST => " (posting too fast: raise send_interval_ms)",
        _ => "",
    }
}

/// The NAS's `entry.cgi` and the HTTP client.
#[derive(Clone, Debug)]
pub(crate) struct ChatApi {
    base: String,
    http: reqwest::Client,
    timeout: Duration,
}

impl ChatApi {
    /// Calls to `base` (`https://nas:5001`, the simulator); each call may take `timeout`
    /// before its outcome counts as unknown.
    pub(crate) fn new(base: &str, timeout: Duration) -> ChatApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        ChatApi {
            base: base.trim_end_matches('/').to_owned(),
            http,
            timeout,
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// `method` with `token` and, for posts, `payload`; the answer's `data` (`Null` when none).
    pub(crate) async fn call(
        &self,
        method: &str,
        token: &Secret,
        payload: Option<&Value>,
    ) -> Result<Value, CallError> {
        // The token goes inside double quotes, URL-encoded with the rest of the query.
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("api", "SYNO.Chat.External")
            .append_pair("method", method)
            .append_pair("version", "2")
            .append_pair("token", &format!("\"{}\"", token.expose()))
            .finish();
        let url = format!("{}/webapi/entry.cgi?{query}", self.base);
        let request = match payload {
            Some(payload) => self
                .http
                .post(url)
                .header("content-type", "application/x-www-form-urlencoded")
                .body(
                    form_urlencoded::Serializer::new(String::new())
                        .append_pair("payload", &payload.to_string())
                        .finish(),
                ),
            None => self.http.get(url),
        };
        let response = match request.timeout(self.timeout).send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(without_url(&error)));
            }
            Err(error) => return Err(CallError::Lost(without_url(&error))),
        };
        let status = response.status().as_u16();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(without_url(&e)))?;
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match body.get("success").and_then(Value::as_bool) {
            Some(true) => Ok(body.get("data").cloned().unwrap_or(Value::Null)),
            Some(false) => Err(CallError::Refused {
                code: body
                    .pointer("/error/code")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                errors: body
                    .pointer("/error/errors")
                    .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned)),
            }),
            // A proxy's page, a cut body: the NAS may have acted before it.
            None => Err(CallError::Lost(format!(
                "HTTP {status} without a DSM answer"
            ))),
        }
    }
}

/// A reqwest error without its URL: the URL carries the token.
fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "entry.cgi");
    }
    // The error's source chain may name the URL too.
    if text.contains("token=") {
        return "the request failed (details withheld: they name the token)".into();
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    #[test]
    fn refusals_are_classified_by_code_and_have_no_side_effect() {
        use DeliveryFailureKind::*;
        let cases = [
            (code::TOO_FAST, RateLimit),
            (code::INVALID_TOKEN, Auth),
            (code::NO_PERMISSION, Permission),
            (code::INVALID_PAYLOAD, InvalidPayload),
            (code::NO_SUCH_METHOD, InvalidPayload),
            (code::NO_SUCH_API, Transient),
        ];
        for (code, kind) in cases {
            let error = CallError::Refused { code, errors: None }.into_send_error("chatbot", 500);
            assert_eq!(
                (error.kind, error.side_effect),
                (kind, SideEffect::None),
                "{code}"
            );
            assert_eq!(
                error.platform_code.as_deref(),
                Some(code.to_string().as_str())
            );
            assert_eq!(error.retry_after_ms.is_some(), code == code::TOO_FAST);
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("incoming", 500);
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
        let down = CallError::Unreachable("refused".into()).into_send_error("incoming", 500);
        assert_eq!((down.kind, down.side_effect), (Transient, SideEffect::None));
    }

    #[tokio::test]
    async fn the_token_never_reaches_an_error_or_debug() {
        let api = ChatApi::new("http://127.0.0.1:1", Duration::from_secs(2));
        let error = api
            .call("user_list", &Secret::new("very-secret-token"), None)
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::Unreachable(_)), "{error:?}");
        let text = format!(
            "{error:?} {}",
            error.clone().into_send_error("user_list", 0).message
        );
        assert!(!text.contains("very-secret"), "{text}");
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
