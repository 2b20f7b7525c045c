//! One Messaging API call over HTTP, and what its failure means: LINE refused it (a 4xx with
//! LINE's error body: nothing was sent), it never reached LINE, or it went out and no usable
//! answer came back (LINE may have acted).
//!
//! A push repeated under an accepted `X-Line-Retry-Key` answers 409 with
//! `x-line-accepted-request-id` and the original `sentMessages`: that is a success carrying
//! the first request's ids (platform-apis-wave2 §5.2), never a conflict.

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use serde::Deserialize;
use serde_json::Value;

/// The Reply API's answer to a token that is expired, used, or unknown (one text for all
/// three: platform-apis-wave2 §5.1).
pub(crate) const INVALID_REPLY_TOKEN: &str = "Invalid reply token";
/// The header a push carries its retry key in.
pub(crate) const RETRY_KEY_HEADER: &str = "x-line-retry-key";
/// The header naming the request id every answer carries.
pub(crate) const REQUEST_ID_HEADER: &str = "x-line-request-id";
/// The header of a 409 naming the request that was accepted under the retry key.
pub(crate) const ACCEPTED_REQUEST_ID_HEADER: &str = "x-line-accepted-request-id";

/// One message LINE created.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SentMessage {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) quote_token: Option<String>,
}

/// A successful send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sent {
    pub(crate) messages: Vec<SentMessage>,
    /// `x-line-request-id` of this answer.
    pub(crate) request_id: Option<String>,
    /// Set when LINE had accepted the retry key before (409): the first request's id.
    pub(crate) accepted_request_id: Option<String>,
}

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// LINE answered with an error status and its error body: nothing was sent.
    Refused {
        status: u16,
        message: String,
        details: Vec<String>,
        retry_after: Option<u64>,
    },
    /// Nothing reached LINE (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: LINE may have acted.
    Lost(String),
}

impl CallError {
    /// Whether this is the Reply API's refusal of the token.
    pub(crate) fn is_invalid_reply_token(&self) -> bool {
        matches!(self, CallError::Refused { status: 400, message, .. } if message == INVALID_REPLY_TOKEN)
    }

    /// The failure class of a refusal (platform-apis-wave2 §5.4).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        let CallError::Refused {
            status, message, ..
        } = self
        else {
            return match self {
                CallError::Unreachable(_) => Transient,
                _ => Unknown,
            };
        };
        match status {
            // The monthly free-message quota is spent: no retry helps before the month ends or
            // the plan changes.
            429 if is_quota(message) => Permission,
            429 => RateLimit,
            401 => Auth,
            403 => Permission,
            404 => NotFound,
            409 => Conflict,
            500..=599 => Transient,
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
                message,
                details,
                retry_after,
            } => {
                let details = if details.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", details.join("; "))
                };
                SendError::before_io(
                    kind,
                    format!(
                        "LINE {what}: HTTP {status} {message}{details}{}",
                        hint(status, &message)
                    ),
                )
                .with_retry_after_ms(retry_after.map(|s| s.saturating_mul(1_000)))
                .with_platform_code(status.to_string())
            }
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("LINE {what}: the Messaging API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "LINE {what}: the request went out and no usable answer came back \
                     ({reason}); LINE may have sent it"
                ),
            ),
        }
    }
}

fn is_quota(message: &str) -> bool {
    message.contains("monthly limit")
}

/// What to do about the refusals an operator can fix.
fn hint(status: u16, message: &str) -> &'static str {
    match status {
        401 => {
            " (check the channel access token in token_env: LINE Developers console → \
             Messaging API → Channel access token)"
        }
        403 => " (this channel's plan or permissions do not allow the call)",
        429 if is_quota(message) => {
            " (the monthly message quota is spent: pushes fail until next month or a plan \
             upgrade; replies are not counted)"
        }
        _ => "",
    }
}

/// LINE's error body: `{"message", "details"?: [{"message", "property"}]}`.
fn error_of(body: &Value) -> Option<(String, Vec<String>)> {
    let message = body.get("message")?.as_str()?.to_owned();
    let details = body
        .get("details")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|d| {
            let text = d["message"].as_str().unwrap_or_default();
            match d["property"].as_str() {
                Some(property) => format!("{property}: {text}"),
                None => text.to_owned(),
            }
        })
        .collect();
    Some((message, details))
}

fn sent_messages(body: &Value) -> Option<Vec<SentMessage>> {
    serde_json::from_value(body.get("sentMessages")?.clone()).ok()
}

/// The Messaging API endpoint and the channel access token.
#[derive(Clone)]
pub(crate) struct MessagingApi {
    base: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
}

/// The token rides in every request's header: never printed.
impl std::fmt::Debug for MessagingApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessagingApi")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl MessagingApi {
    /// Calls to `base` (`https://api.line.me`, the simulator) with `token`; each call may take
    /// `timeout` before its outcome counts as unknown.
    pub(crate) fn new(base: &str, token: Secret, timeout: Duration) -> MessagingApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        MessagingApi {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http,
            timeout,
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// `GET /v2/bot/info`: the bot's own user id (the webhook's `destination`).
    pub(crate) async fn bot_info(&self) -> Result<Value, CallError> {
        let request = self
            .http
            .get(format!("{}/v2/bot/info", self.base))
            .bearer_auth(self.token.expose());
        let (status, _, body) = self.exchange(request).await?;
        if status == 200 {
            return Ok(body);
        }
        Err(refusal(status, &body, None))
    }

    /// `POST path` with a JSON body (and the push's retry key); the created messages.
    pub(crate) async fn send(
        &self,
        path: &str,
        body: &Value,
        retry_key: Option<&str>,
    ) -> Result<Sent, CallError> {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(self.token.expose())
            .json(body);
        if let Some(key) = retry_key {
            request = request.header(RETRY_KEY_HEADER, key);
        }
        let (status, headers, answer) = self.exchange(request).await?;
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let request_id = header(REQUEST_ID_HEADER);
        if status == 200 {
            let messages = sent_messages(&answer).ok_or_else(|| {
                CallError::Lost(format!("HTTP 200 without sentMessages from {path}"))
            })?;
            return Ok(Sent {
                messages,
                request_id,
                accepted_request_id: None,
            });
        }
        if status == 409
            && let (Some(accepted), Some(messages)) =
                (header(ACCEPTED_REQUEST_ID_HEADER), sent_messages(&answer))
        {
            // Sent before under this retry key: these are the first request's messages.
            return Ok(Sent {
                messages,
                request_id,
                accepted_request_id: Some(accepted),
            });
        }
        let retry_after = header("retry-after").and_then(|v| v.trim().parse::<u64>().ok());
        Err(refusal(status, &answer, retry_after))
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

/// An error answer as a refusal; an answer that is not LINE's error body (a proxy's page, a cut
/// body) is a lost answer unless its status alone is a definite refusal.
fn refusal(status: u16, body: &Value, retry_after: Option<u64>) -> CallError {
    match error_of(body) {
        Some((message, details)) => CallError::Refused {
            status,
            message,
            details,
            retry_after,
        },
        None if status == 429 || status == 401 || status == 403 => CallError::Refused {
            status,
            message: String::new(),
            details: Vec::new(),
            retry_after,
        },
        None => CallError::Lost(format!("HTTP {status} without a Messaging API answer")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn refused(status: u16, message: &str) -> CallError {
        CallError::Refused {
            status,
            message: message.into(),
            details: Vec::new(),
            retry_after: None,
        }
    }

    #[test]
    fn line_errors_are_classified_by_status_and_message() {
        use DeliveryFailureKind::*;
        let cases = [
            (400, "The request body has 1 error(s)", InvalidPayload),
            (400, INVALID_REPLY_TOKEN, InvalidPayload),
            (401, "Authentication failed", Auth),
            (
                403,
                "Access to this API is not available for your account",
                Permission,
            ),
            (404, "Not found", NotFound),
            (409, "The retry key is already accepted", Conflict),
            (
                429,
                "The API rate limit has been exceeded. Try again later.",
                RateLimit,
            ),
            (429, "You have reached your monthly limit.", Permission),
            (500, "Internal server error", Transient),
        ];
        for (status, message, kind) in cases {
            let error = refused(status, message);
            assert_eq!(error.kind(), kind, "{status} {message}");
            let send = error.into_send_error("push");
            assert_eq!(send.kind, kind);
            assert_eq!(send.side_effect, clawgate_channel_sdk::SideEffect::None);
        }
        assert!(refused(400, INVALID_REPLY_TOKEN).is_invalid_reply_token());
        assert!(!refused(400, "Invalid reply token.").is_invalid_reply_token());
        let lost = CallError::Lost("timeout".into()).into_send_error("reply");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, clawgate_channel_sdk::SideEffect::Possible)
        );
    }

    #[test]
    fn a_cut_body_is_lost_and_an_error_body_is_read() {
        assert!(matches!(
            refusal(502, &Value::Null, None),
            CallError::Lost(_)
        ));
        let body = serde_json::json!({ "message": "The request body has 1 error(s)",
            "details": [{ "message": "Length must be between 0 and 5000", "property": "messages[0].text" }] });
        let error = refusal(400, &body, None).into_send_error("push");
        assert!(
            error
                .message
                .contains("messages[0].text: Length must be between 0 and 5000")
        );
    }

    #[test]
    fn the_token_never_prints() {
        let api = MessagingApi::new(
            "http://127.0.0.1:1",
            Secret::new("very-secret-token"),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
