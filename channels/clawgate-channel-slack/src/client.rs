//! One Web API call over HTTP, and what its failure means: Slack refused it (`ok: false`:
//! nothing happened), it never reached Slack, or it went out and no usable answer came back
//! (Slack may have acted).

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError, SideEffect};
use clawgate_types::DeliveryFailureKind;
use serde_json::Value;

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// Slack answered `ok: false` with `error`: the call had no effect.
    Refused {
        status: u16,
        error: String,
        retry_after: Option<u64>,
    },
    /// Nothing reached Slack (no connection).
    Unreachable(String),
    /// The request went out and no answer came back, or Slack says it may have completed part
    /// of it (`internal_error`, `fatal_error`, `request_timeout`).
    Lost(String),
}

/// Slack's errors that say the operation may have partly happened ("it's possible some aspect
/// of the operation succeeded before the error was raised").
const MAYBE_DONE: &[&str] = &["internal_error", "fatal_error"];

impl CallError {
    /// The `error` code of a refusal.
    pub(crate) fn code(&self) -> Option<&str> {
        match self {
            CallError::Refused { error, .. } => Some(error),
            _ => None,
        }
    }

    /// The failure class of a refusal, from Slack's error codes (platform-apis §2.1–2.4).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        let CallError::Refused { status, error, .. } = self else {
            return match self {
                CallError::Unreachable(_) => Transient,
                _ => Unknown,
            };
        };
        match error.as_str() {
            "ratelimited" | "rate_limited" => RateLimit,
            _ if *status == 429 => RateLimit,
            "not_authed" | "invalid_auth" | "token_revoked" | "token_expired"
            | "account_inactive" | "no_permission" => Auth,
            "channel_not_found" | "message_not_found" | "thread_not_found" => NotFound,
            "not_in_channel"
            | "is_archived"
            | "cant_update_message"
            | "cant_delete_message"
            | "edit_window_closed"
            | "missing_scope"
            | "ekm_access_denied"
            | "messages_tab_disabled"
            | "cannot_reply_to_message"
            | "message_not_owned_by_app"
            | "is_inactive"
            | "team_access_not_granted" => Permission,
            e if e.starts_with("restricted_action") => Permission,
            "streaming_state_conflict" | "message_not_in_streaming_state" | "stopped_by_user" => {
                Conflict
            }
            "service_unavailable" | "request_timeout" => Transient,
            _ if *status >= 500 => Transient,
            // no_text, msg_too_long, invalid_blocks*, invalid_metadata_*, metadata_too_large,
            // markdown_text_conflict, invalid_arguments, too_many_attachments, …
            _ => InvalidPayload,
        }
    }

    /// As a send failure: a refusal or an unreachable server had no side effect; a lost answer
    /// may have.
    pub(crate) fn into_send_error(self, method: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused {
                error, retry_after, ..
            } => SendError::before_io(kind, format!("Slack {method}: {error}{}", hint(&error)))
                .with_retry_after_ms(retry_after.map(|s| s.saturating_mul(1_000)))
                .with_platform_code(error),
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Slack {method}: the Web API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Slack {method}: the request went out and no usable answer came back \
                     ({reason}); Slack may have acted"
                ),
            ),
        }
    }
}

/// What to do about the refusals an operator can fix.
fn hint(error: &str) -> &'static str {
    match error {
        "not_authed" | "invalid_auth" | "token_revoked" | "token_expired" => {
            " (check the bot token in token_env: Slack app → OAuth & Permissions → Bot User OAuth Token)"
        }
        "not_in_channel" => " (invite the app to the channel: /invite @app)",
        "missing_scope" => {
            " (add the chat:write and channels:history scopes and reinstall the app)"
        }
        _ => "",
    }
}

/// Whether a send error is a definite refusal of `kinds`.
pub(crate) fn refused_as(error: &SendError, kinds: &[DeliveryFailureKind]) -> bool {
    error.side_effect == SideEffect::None && kinds.contains(&error.kind)
}

/// A Web API endpoint and the bot token.
#[derive(Clone)]
pub(crate) struct WebApi {
    base: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
}

/// The token rides in every request's header: never printed.
impl std::fmt::Debug for WebApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebApi")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl WebApi {
    /// Calls to `base` (`https://slack.com/api/`, the simulator) with `token`; each call may take
    /// `timeout` before its outcome counts as unknown.
    pub(crate) fn new(base: &str, token: Secret, timeout: Duration) -> WebApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        WebApi {
            base: format!("{}/", base.trim_end_matches('/')),
            token,
            http,
            timeout,
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Calls `method` with a JSON body; the answer's whole envelope on `ok: true`.
    pub(crate) async fn call(&self, method: &str, args: &Value) -> Result<Value, CallError> {
        let sent = self
            .http
            .post(format!("{}{method}", self.base))
            .bearer_auth(self.token.expose())
            .json(args)
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
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let envelope: Value = match serde_json::from_slice(&body) {
            Ok(envelope @ Value::Object(_)) => envelope,
            // A 429 is a refusal whatever its body says.
            _ if status == 429 => {
                return Err(CallError::Refused {
                    status,
                    error: "ratelimited".into(),
                    retry_after,
                });
            }
            // Not Slack talking (a proxy's page, a cut body): the call may have landed.
            _ => {
                return Err(CallError::Lost(format!(
                    "HTTP {status} without a Web API answer"
                )));
            }
        };
        if envelope.get("ok") == Some(&Value::Bool(true)) {
            return Ok(envelope);
        }
        let error = envelope
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("unknown_error")
            .to_owned();
        if MAYBE_DONE.contains(&error.as_str()) {
            return Err(CallError::Lost(format!("Slack answered {error}")));
        }
        Err(CallError::Refused {
            status,
            error,
            retry_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, error: &str) -> CallError {
        CallError::Refused {
            status,
            error: error.into(),
            retry_after: None,
        }
    }

    #[test]
    fn slack_errors_are_classified_by_code() {
        use DeliveryFailureKind::*;
        let cases = [
            (429, "ratelimited", RateLimit),
            (200, "rate_limited", RateLimit),
            (200, "channel_not_found", NotFound),
            (200, "message_not_found", NotFound),
            (200, "not_in_channel", Permission),
            (200, "is_archived", Permission),
            (200, "edit_window_closed", Permission),
            (200, "invalid_auth", Auth),
            (200, "token_revoked", Auth),
            (200, "msg_too_long", InvalidPayload),
            (200, "no_text", InvalidPayload),
            (200, "invalid_metadata_format", InvalidPayload),
            (200, "streaming_state_conflict", Conflict),
            (200, "message_not_in_streaming_state", Conflict),
        ];
        for (status, code, kind) in cases {
            let error = refused(status, code).into_send_error("chat.postMessage");
            assert_eq!(error.kind, kind, "{code}");
            assert_eq!(error.side_effect, SideEffect::None, "{code}");
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("chat.postMessage");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
    }

    #[test]
    fn the_token_never_prints() {
        let api = WebApi::new(
            "http://127.0.0.1:1/api",
            Secret::new("xoxb-very-secret"),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
