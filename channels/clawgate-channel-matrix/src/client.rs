//! One client-server API call over HTTP, and what its failure means: the homeserver refused it
//! with a Matrix error (nothing happened), it never reached the homeserver, or it went out and
//! no usable answer came back (the homeserver may have acted).

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError, SourceError};
use clawgate_types::DeliveryFailureKind;
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// A Matrix error body: `{"errcode": "M_FORBIDDEN", "error": "…", "retry_after_ms": 1000}`.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    errcode: String,
    #[serde(default)]
    error: String,
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// The homeserver answered with a Matrix error: the call had no effect.
    Refused {
        status: u16,
        errcode: String,
        error: String,
        retry_after_ms: Option<u64>,
    },
    /// Nothing reached the homeserver (no connection).
    Unreachable(String),
    /// The request went out and no Matrix answer came back (a timeout, a dropped connection, a
    /// proxy's error page): the homeserver may have acted.
    Lost(String),
}

impl CallError {
    /// The Matrix `errcode` of a refusal.
    pub(crate) fn errcode(&self) -> Option<&str> {
        match self {
            CallError::Refused { errcode, .. } => Some(errcode),
            _ => None,
        }
    }

    /// The failure class, from the errcode first (the spec's meaning), then the status.
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        match self {
            CallError::Refused {
                status, errcode, ..
            } => match errcode.as_str() {
                "M_LIMIT_EXCEEDED" => DeliveryFailureKind::RateLimit,
                "M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN" | "M_USER_DEACTIVATED" => {
                    DeliveryFailureKind::Auth
                }
                "M_FORBIDDEN"
                | "M_USER_LOCKED"
                | "M_USER_SUSPENDED"
                | "M_GUEST_ACCESS_FORBIDDEN" => DeliveryFailureKind::Permission,
                "M_NOT_FOUND" | "M_UNRECOGNIZED" if *status == 404 => DeliveryFailureKind::NotFound,
                "M_BAD_JSON" | "M_NOT_JSON" | "M_TOO_LARGE" | "M_INVALID_PARAM"
                | "M_MISSING_PARAM" | "M_BAD_STATE" => DeliveryFailureKind::InvalidPayload,
                _ => clawgate_channel_sdk::classify_http_status(*status),
            },
            CallError::Unreachable(_) => DeliveryFailureKind::Transient,
            CallError::Lost(_) => DeliveryFailureKind::Unknown,
        }
    }

    /// As a send failure: a refusal or an unreachable server had no side effect; a lost answer
    /// may have.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused {
                status,
                errcode,
                error,
                retry_after_ms,
            } => {
                let hint = match kind {
                    DeliveryFailureKind::Auth => {
                        ": the access token is refused; create a new one and export it in the \
                         variable token_env names"
                    }
                    DeliveryFailureKind::Permission => {
                        ": the account may not do this here (is it joined to the room, with the \
                         power level to post?)"
                    }
                    _ => "",
                };
                SendError::before_io(kind, format!("Matrix {what}: {errcode} {error}{hint}"))
                    .with_retry_after_ms(retry_after_ms)
                    .with_platform_code(format!("{status} {errcode}"))
            }
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Matrix {what}: the homeserver is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Matrix {what}: the request went out and no answer came back ({reason}); \
                     the homeserver may have acted"
                ),
            ),
        }
    }

    /// As a source failure (`/sync`, joins).
    pub(crate) fn into_source_error(self, what: &str) -> SourceError {
        let error = self.into_send_error(what);
        SourceError::new(error.kind, error.message).with_retry_after_ms(error.retry_after_ms)
    }
}

/// The wait a refusal asks for: the body's `retry_after_ms`, else the `Retry-After` header in
/// seconds (the spec's newer form; homeservers send both).
fn retry_after(body_ms: Option<u64>, header: Option<&str>) -> Option<u64> {
    body_ms.or_else(|| {
        header?
            .trim()
            .parse::<u64>()
            .ok()
            .map(|s| s.saturating_mul(1_000))
    })
}

/// Percent-encodes one path segment (room ids hold `!` and `:`, event ids `$`).
pub(crate) fn segment(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A homeserver and the account's access token.
#[derive(Clone)]
pub(crate) struct MatrixApi {
    base: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
}

/// The token travels in a header: never printed.
impl std::fmt::Debug for MatrixApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatrixApi")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl MatrixApi {
    /// Calls to the homeserver at `base` with `token`; each call may take `timeout` before its
    /// outcome counts as unknown.
    pub(crate) fn new(base: &str, token: Secret, timeout: Duration) -> MatrixApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        MatrixApi {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http,
            timeout,
        }
    }

    /// The homeserver's base URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// `method` on `/_matrix/client/v3/<path>` (path and query already encoded) with an
    /// optional JSON body; `wait` is added to the deadline (a long poll's own timeout).
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&serde_json::Value>,
        wait: Duration,
    ) -> Result<T, CallError> {
        let url = format!("{}/_matrix/client/v3/{path}", self.base);
        let mut request = self
            .http
            .request(method, url)
            .bearer_auth(self.token.expose())
            .timeout(self.timeout.saturating_add(wait));
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            // Nothing left this process: no connection, or a request that could not be built.
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.to_string())),
        };
        let status = response.status();
        let header_retry = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<ErrorBody>(&body) {
                Ok(error) => CallError::Refused {
                    status: status.as_u16(),
                    errcode: error.errcode,
                    error: error.error,
                    retry_after_ms: retry_after(error.retry_after_ms, header_retry.as_deref()),
                },
                // Not the homeserver talking (a proxy's page): the call may have landed.
                Err(_) => CallError::Lost(format!("HTTP {status} without a Matrix error body")),
            });
        }
        serde_json::from_slice(&body).map_err(|e| {
            // The homeserver acted; its answer is not what this endpoint returns.
            CallError::Lost(format!("unexpected answer to {path}: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, errcode: &str) -> CallError {
        CallError::Refused {
            status,
            errcode: errcode.into(),
            error: "x".into(),
            retry_after_ms: None,
        }
    }

    #[test]
    fn matrix_errors_are_classified_by_errcode_then_status() {
        use DeliveryFailureKind::*;
        let cases = [
            (429, "M_LIMIT_EXCEEDED", RateLimit),
            (401, "M_UNKNOWN_TOKEN", Auth),
            (401, "M_MISSING_TOKEN", Auth),
            (403, "M_FORBIDDEN", Permission),
            (404, "M_NOT_FOUND", NotFound),
            (400, "M_BAD_JSON", InvalidPayload),
            (413, "M_TOO_LARGE", InvalidPayload),
            (500, "M_UNKNOWN", Transient),
            (502, "M_UNKNOWN", Transient),
        ];
        for (status, errcode, kind) in cases {
            let error = refused(status, errcode).into_send_error("send");
            assert_eq!(error.kind, kind, "{status} {errcode}");
            assert_eq!(error.side_effect, clawgate_channel_sdk::SideEffect::None);
            assert_eq!(
                error.platform_code.as_deref(),
                Some(format!("{status} {errcode}").as_str())
            );
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("send");
        assert_eq!(lost.side_effect, clawgate_channel_sdk::SideEffect::Possible);
        assert_eq!(lost.kind, Unknown);
    }

    #[test]
    fn retry_after_ms_is_passed_on() {
        let error = CallError::Refused {
            status: 429,
            errcode: "M_LIMIT_EXCEEDED".into(),
            error: "Too Many Requests".into(),
            retry_after_ms: Some(1_234),
        }
        .into_send_error("send");
        assert_eq!(error.retry_after_ms, Some(1_234));
    }

    #[test]
    fn the_wait_comes_from_the_body_else_the_header() {
        assert_eq!(retry_after(Some(1_500), Some("9")), Some(1_500));
        assert_eq!(retry_after(None, Some(" 3 ")), Some(3_000));
        assert_eq!(
            retry_after(None, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            None
        );
        assert_eq!(retry_after(None, None), None);
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(segment("!abc:localhost"), "%21abc%3Alocalhost");
        assert_eq!(segment("$ev/1"), "%24ev%2F1");
        assert_eq!(segment("cg-01_a.b~"), "cg-01_a.b~");
    }

    #[test]
    fn the_token_never_prints() {
        let api = MatrixApi::new(
            "http://127.0.0.1:1",
            Secret::new("syt_very_secret"),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very_secret"));
    }
}
