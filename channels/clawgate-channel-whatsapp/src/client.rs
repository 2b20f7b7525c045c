//! One Graph API call over HTTP, and what its failure means: Meta refused it (an `error`
//! envelope: nothing was sent), it never reached Meta, or it went out and no usable answer
//! came back (a message may have been sent).
//!
//! Failures are classified by `error.code`, never by the HTTP status: client libraries see the
//! throttling codes under 400 as well as 429 (platform-apis-wave2 §1.4).

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use serde_json::Value;

/// A Graph error answer (`{"error": {message, type, code, error_subcode, error_data,
/// fbtrace_id}}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GraphError {
    pub(crate) status: u16,
    pub(crate) code: i64,
    pub(crate) subcode: Option<i64>,
    pub(crate) message: String,
    pub(crate) details: Option<String>,
    pub(crate) fbtrace_id: Option<String>,
    pub(crate) retry_after_s: Option<u64>,
}

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// Meta answered with an error envelope: the call had no effect.
    Refused(GraphError),
    /// Nothing reached Meta (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: it may have been carried out.
    Lost(String),
}

/// The 24-hour customer-service window is closed (only templates may be sent).
pub(crate) const OUTSIDE_WINDOW: i64 = 131_047;

impl GraphError {
    /// The failure class of `code` (the Cloud API's error-codes page, as
    /// platform-apis-wave2 §1.4 lists it).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        match self.code {
            // 0 AuthException, 190 expired/invalid token, 102 session.
            0 | 102 | 190 => Auth,
            // Throughput, pair rate limit, spam limit, app and WABA call limits, the ≤1 min
            // throughput upgrade.
            4 | 80_007 | 130_429 | 131_048 | 131_056 | 131_057 => RateLimit,
            // API service down, unknown error, service unavailable.
            1 | 2 | 131_000 | 131_016 => Transient,
            // Outside the 24-hour window: no free-form text until the person writes again. Not a
            // retry loop: it parks with the code for the operator.
            OUTSIDE_WINDOW => Permission,
            // Permission denied, API permission range, access denied, recipient not in the test
            // allow-list, temporarily blocked, account locked or restricted, display name not
            // approved, business payment issue.
            10 | 200..=299 | 131_005 | 131_030 | 368 | 131_031 | 130_497 | 131_037 | 131_042 => {
                Permission
            }
            // The recipient cannot receive this message (not on WhatsApp, old app, policy).
            131_026 | 131_049 | 131_050 => NotFound,
            // Parameter errors, unsupported type, media errors, templates.
            100 | 131_008 | 131_009 | 131_051 | 131_052 | 131_053 | 132_000..=132_999 => {
                InvalidPayload
            }
            _ if self.status >= 500 => Transient,
            _ if self.status == 429 => RateLimit,
            _ => InvalidPayload,
        }
    }

    /// How long Meta's documentation says to wait before trying again, when it says so: a
    /// `Retry-After` header first, else the code's documented pace.
    pub(crate) fn retry_after_ms(&self) -> Option<u64> {
        let documented = match self.code {
            // "API service down": up to 5 minutes during updates.
            2 => Some(300),
            // One message every 6 s to one recipient.
            131_056 => Some(6),
            130_429 | 131_057 => Some(1),
            4 | 80_007 => Some(60),
            _ => None,
        };
        self.retry_after_s
            .or(documented)
            .map(|s| s.saturating_mul(1_000))
    }

    fn hint(&self) -> &'static str {
        match self.code {
            0 | 102 | 190 => {
                " (the access token is invalid or expired: put a System User token with \
                 whatsapp_business_messaging in token_env)"
            }
            OUTSIDE_WINDOW => {
                " (more than 24 hours since the person last wrote: WhatsApp accepts only \
                 template messages until they write again; not retried)"
            }
            131_030 => " (add the recipient to the test number's allowed list)",
            10 | 200..=299 => {
                " (the token lacks the whatsapp_business_messaging permission for this number)"
            }
            _ => "",
        }
    }
}

impl CallError {
    /// The failure class.
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        match self {
            CallError::Refused(error) => error.kind(),
            CallError::Unreachable(_) => DeliveryFailureKind::Transient,
            CallError::Lost(_) => DeliveryFailureKind::Unknown,
        }
    }

    /// As a send failure: a refusal or an unreachable server had no side effect; a lost answer
    /// may have.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused(error) => {
                let details = error
                    .details
                    .as_deref()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                let trace = error
                    .fbtrace_id
                    .as_deref()
                    .map(|t| format!(" [fbtrace_id {t}]"))
                    .unwrap_or_default();
                SendError::before_io(
                    kind,
                    format!(
                        "WhatsApp {what}: {} (code {}){details}{}{trace}",
                        error.message,
                        error.code,
                        error.hint()
                    ),
                )
                .with_retry_after_ms(error.retry_after_ms())
                .with_platform_code(error.code.to_string())
            }
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("WhatsApp {what}: the Graph API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "WhatsApp {what}: the request went out and no usable answer came back \
                     ({reason}); the message may have been sent"
                ),
            ),
        }
    }
}

/// The Graph endpoint of one business phone number, and its access token.
#[derive(Clone)]
pub(crate) struct GraphApi {
    /// `https://graph.facebook.com/v23.0/<phone-number-id>`.
    number_url: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
}

/// The token rides in every request's header: never printed.
impl std::fmt::Debug for GraphApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphApi")
            .field("number_url", &self.number_url)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl GraphApi {
    /// Calls to `base`/`version`/`phone_number_id` with `token`; each call may take `timeout`
    /// before its outcome counts as unknown.
    pub(crate) fn new(
        base: &str,
        version: &str,
        phone_number_id: &str,
        token: Secret,
        timeout: Duration,
    ) -> GraphApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        GraphApi {
            number_url: format!(
                "{}/{}/{}",
                base.trim_end_matches('/'),
                version.trim_matches('/'),
                phone_number_id
            ),
            token,
            http,
            timeout,
        }
    }

    pub(crate) fn number_url(&self) -> &str {
        &self.number_url
    }

    /// `POST /<phone-number-id>/messages` with a JSON body; the answer on success.
    pub(crate) async fn messages(&self, body: &Value) -> Result<Value, CallError> {
        let request = self
            .http
            .post(format!("{}/messages", self.number_url))
            .json(body);
        self.call(request).await
    }

    /// `GET /<phone-number-id>?fields=…`: the number itself (the start-up token check).
    pub(crate) async fn number(&self) -> Result<Value, CallError> {
        let request = self
            .http
            .get(&self.number_url)
            .query(&[("fields", "display_phone_number,verified_name")]);
        self.call(request).await
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> Result<Value, CallError> {
        let sent = request
            .bearer_auth(self.token.expose())
            .timeout(self.timeout)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.to_string())),
        };
        let status = response.status().as_u16();
        let retry_after_s = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if let Some(error) = answer.get("error").filter(|e| e.is_object()) {
            let text = |key: &str| error.get(key).and_then(Value::as_str).map(str::to_owned);
            return Err(CallError::Refused(GraphError {
                status,
                code: error.get("code").and_then(Value::as_i64).unwrap_or(-1),
                subcode: error.get("error_subcode").and_then(Value::as_i64),
                message: text("message").unwrap_or_else(|| "no message".into()),
                details: error
                    .get("error_data")
                    .and_then(|d| d.get("details"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                fbtrace_id: text("fbtrace_id"),
                retry_after_s,
            }));
        }
        if (200..300).contains(&status) && answer.is_object() {
            return Ok(answer);
        }
        // Not Graph talking (a proxy's page, a cut body): the call may have been carried out.
        Err(CallError::Lost(format!(
            "HTTP {status} without a Graph answer"
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    fn refused(status: u16, code: i64) -> CallError {
        CallError::Refused(GraphError {
            status,
            code,
            subcode: None,
            message: format!("(#{code}) refused"),
            details: None,
            fbtrace_id: Some("Atrace".into()),
            retry_after_s: None,
        })
    }

    #[test]
    fn graph_errors_are_classified_by_code_not_status() {
        use DeliveryFailureKind::*;
        let cases = [
            (401, 190, Auth),
            (400, 0, Auth),
            (400, 130_429, RateLimit),
            (429, 130_429, RateLimit),
            (400, 131_056, RateLimit),
            (400, 4, RateLimit),
            (400, 80_007, RateLimit),
            (400, 131_047, Permission),
            (403, 10, Permission),
            (400, 131_026, NotFound),
            (400, 100, InvalidPayload),
            (400, 131_009, InvalidPayload),
            (500, 131_000, Transient),
            (503, 131_016, Transient),
            (500, 2, Transient),
            (502, 99_999, Transient),
        ];
        for (status, code, kind) in cases {
            let error = refused(status, code).into_send_error("send");
            assert_eq!(error.kind, kind, "{code}");
            assert_eq!(error.side_effect, SideEffect::None, "{code}");
            assert_eq!(
                error.platform_code.as_deref(),
                Some(code.to_string().as_str())
            );
        }
        let window = refused(400, 131_047).into_send_error("send");
        assert!(window.message.contains("24 hours"), "{}", window.message);
        assert_eq!(
            refused(400, 131_056).into_send_error("send").retry_after_ms,
            Some(6_000)
        );
        let lost = CallError::Lost("timeout".into()).into_send_error("send");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
    }

    #[test]
    fn the_token_never_prints() {
        let api = GraphApi::new(
            "http://127.0.0.1:1",
            "v23.0",
            "1234",
            Secret::new("EAAG-very-secret"),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
