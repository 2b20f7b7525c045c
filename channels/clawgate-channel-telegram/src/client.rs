//! One Bot API call over HTTP, and what its failure means: Telegram refused it (nothing
//! happened), it never reached Telegram, or it went out and no usable answer came back (Telegram
//! may have acted).

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError, SourceError};
use clawgate_types::DeliveryFailureKind;
use serde::de::DeserializeOwned;

use crate::wire::Envelope;

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// Telegram answered `ok: false`: the call had no effect.
    Refused {
        status: u16,
        description: String,
        retry_after: Option<u64>,
        migrate_to_chat_id: Option<i64>,
    },
    /// Nothing reached Telegram (no connection).
    Unreachable(String),
    /// The request went out and no Bot API answer came back (a timeout, a dropped connection,
    /// a proxy's error page): Telegram may have acted.
    Lost(String),
}

impl CallError {
    /// The Bot API description, for a refusal.
    pub(crate) fn description(&self) -> Option<&str> {
        match self {
            CallError::Refused { description, .. } => Some(description),
            _ => None,
        }
    }

    /// Whether Telegram refused with a description starting (after its `Bad Request: ` prefix)
    /// with `detail`, ignoring case.
    pub(crate) fn refused_with(&self, detail: &str) -> bool {
        self.description().is_some_and(|d| {
            let d = d.to_ascii_lowercase();
            let body = d.split_once(": ").map_or(d.as_str(), |(_, rest)| rest);
            body.starts_with(&detail.to_ascii_lowercase())
        })
    }

    /// The failure class of a refusal, from Telegram's own answers (platform-apis §1.2).
    fn kind(&self) -> DeliveryFailureKind {
        match self {
            CallError::Refused { status: 400, .. }
                if self.refused_with("chat not found")
                    || self.refused_with("message thread not found")
                    || self.refused_with("message to edit not found")
                    || self.refused_with("message to delete not found")
                    || self.refused_with("message to be replied not found") =>
            {
                DeliveryFailureKind::NotFound
            }
            CallError::Refused { status, .. } => match status {
                400 => DeliveryFailureKind::InvalidPayload,
                401 => DeliveryFailureKind::Auth,
                403 => DeliveryFailureKind::Permission,
                404 => DeliveryFailureKind::NotFound,
                409 => DeliveryFailureKind::Conflict,
                429 => DeliveryFailureKind::RateLimit,
                _ => DeliveryFailureKind::Transient,
            },
            CallError::Unreachable(_) => DeliveryFailureKind::Transient,
            CallError::Lost(_) => DeliveryFailureKind::Unknown,
        }
    }

    /// As a send failure: a refusal or an unreachable server had no side effect; a lost answer
    /// may have.
    pub(crate) fn into_send_error(self, method: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused {
                status,
                description,
                retry_after,
                ..
            } => SendError::before_io(kind, format!("Telegram {method}: {description}"))
                .with_retry_after_ms(retry_after.map(|s| s.saturating_mul(1_000)))
                .with_platform_code(status.to_string()),
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Telegram {method}: the Bot API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Telegram {method}: the request went out and no answer came back ({reason}); \
                     Telegram may have acted"
                ),
            ),
        }
    }

    /// As a source failure (polling, webhook set-up).
    pub(crate) fn into_source_error(self, method: &str) -> SourceError {
        let error = self.into_send_error(method);
        SourceError::new(error.kind, error.message).with_retry_after_ms(error.retry_after_ms)
    }
}

/// A Bot API endpoint and the bot's token.
#[derive(Clone)]
pub(crate) struct BotApi {
    base: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
}

/// The token is in every request path: never printed.
impl std::fmt::Debug for BotApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotApi")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl BotApi {
    /// Calls to `base` (`https://api.telegram.org`, a local Bot API server, the simulator) with
    /// `token`; each call may take `timeout` before its outcome counts as unknown.
    pub(crate) fn new(base: &str, token: Secret, timeout: Duration) -> BotApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        BotApi {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http,
            timeout,
        }
    }

    /// The base URL (no token).
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Calls `method` with JSON `params`; `wait` is added to the call's deadline (a long poll's
    /// own timeout).
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        params: &serde_json::Value,
        wait: Duration,
    ) -> Result<T, CallError> {
        let url = format!("{}/bot{}/{method}", self.base, self.token.expose());
        let sent = self
            .http
            .post(url)
            .json(params)
            .timeout(self.timeout.saturating_add(wait))
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            // The URL holds the token: errors are printed without it. A request that could
            // not be built or connected never reached Telegram.
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(error.without_url().to_string()));
            }
            Err(error) => return Err(CallError::Lost(error.without_url().to_string())),
        };
        let status = response.status().as_u16();
        let header_retry = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.without_url().to_string()))?;
        let Ok(envelope) = serde_json::from_slice::<Envelope>(&body) else {
            // Not the Bot API talking (a proxy's page, a cut body): the call may have landed.
            return Err(CallError::Lost(format!(
                "HTTP {status} without a Bot API answer"
            )));
        };
        if !envelope.ok {
            let parameters = envelope.parameters.unwrap_or_default();
            return Err(CallError::Refused {
                status: envelope.error_code.unwrap_or(status),
                description: envelope
                    .description
                    .unwrap_or_else(|| format!("HTTP {status}")),
                retry_after: parameters.retry_after.or(header_retry),
                migrate_to_chat_id: parameters.migrate_to_chat_id,
            });
        }
        let result = envelope.result.unwrap_or(serde_json::Value::Null);
        serde_json::from_value(result).map_err(|e| {
            // Telegram acted; its answer is not what this method returns.
            CallError::Lost(format!("unexpected {method} result: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, description: &str) -> CallError {
        CallError::Refused {
            status,
            description: description.into(),
            retry_after: None,
            migrate_to_chat_id: None,
        }
    }

    #[test]
    fn telegram_refusals_are_classified_by_status_and_description() {
        use DeliveryFailureKind::*;
        let cases = [
            (400, "Bad Request: chat not found", NotFound),
            (400, "Bad Request: message thread not found", NotFound),
            (400, "Bad Request: message to edit not found", NotFound),
            (400, "Bad Request: message is too long", InvalidPayload),
            (400, "Bad Request: can't parse entities: x", InvalidPayload),
            (401, "Unauthorized", Auth),
            (403, "Forbidden: bot was blocked by the user", Permission),
            (
                409,
                "Conflict: terminated by other getUpdates request",
                Conflict,
            ),
            (429, "Too Many Requests: retry after 3", RateLimit),
            (500, "Internal Server Error: x", Transient),
        ];
        for (status, description, kind) in cases {
            let error = refused(status, description).into_send_error("sendMessage");
            assert_eq!(error.kind, kind, "{description}");
            assert_eq!(error.side_effect, clawgate_channel_sdk::SideEffect::None);
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("sendMessage");
        assert_eq!(lost.side_effect, clawgate_channel_sdk::SideEffect::Possible);
        assert_eq!(lost.kind, Unknown);
    }

    #[test]
    fn descriptions_match_after_the_prefix_ignoring_case() {
        let error = refused(400, "Bad Request: message is not modified: specified new…");
        assert!(error.refused_with("message is not modified"));
        assert!(!error.refused_with("message to edit not found"));
        assert!(refused(400, "Bad Request: Can't parse entities: x").refused_with("can't parse"));
    }

    #[tokio::test]
    async fn an_https_endpoint_that_refuses_the_connection_is_unreachable_not_unknown() {
        // Also proves the client speaks TLS: without it the call fails before connecting.
        let api = BotApi::new(
            "https://127.0.0.1:1",
            Secret::new("123:secret"),
            Duration::from_secs(2),
        );
        let error = api
            .call::<serde_json::Value>("getMe", &serde_json::json!({}), Duration::ZERO)
            .await
            .expect_err("nothing listens there");
        assert!(matches!(error, CallError::Unreachable(_)), "{error:?}");
        assert!(!format!("{error:?}").contains("secret"), "{error:?}");
    }

    #[test]
    fn the_token_never_prints() {
        let api = BotApi::new(
            "http://127.0.0.1:1",
            Secret::new("123:very-secret"),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
