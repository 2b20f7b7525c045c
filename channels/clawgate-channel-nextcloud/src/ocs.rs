//! One OCS call to the Nextcloud server, and what its failure means: Nextcloud refused it (an
//! HTTP error status with the OCS envelope `{"ocs":{"meta":{status,statuscode,message},"data"}}`:
//! nothing was done), it never reached the server (no connection), or it went out and no usable
//! answer came back (the server may have acted).

use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError, classify_http_status};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::Value;

/// How one call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// An HTTP error status from Nextcloud itself: nothing was done.
    Refused {
        status: u16,
        message: String,
        retry_after_ms: Option<u64>,
    },
    /// Nothing reached the server (no connection).
    Unreachable(String),
    /// The request went out and no usable answer came back: the server may have acted.
    Lost(String),
}

impl CallError {
    /// The failure class of a refusal: the usual HTTP classes, and Talk's own — 412 is a
    /// conversation lobby (the account may not write there yet), 405 a message kind that
    /// cannot be edited or deleted.
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        match self {
            CallError::Refused { status, .. } => match *status {
                412 => DeliveryFailureKind::Permission,
                405 => DeliveryFailureKind::InvalidPayload,
                status => match classify_http_status(status) {
                    // Another 4xx: the request is wrong; repeating it will not help.
                    DeliveryFailureKind::Unknown => DeliveryFailureKind::InvalidPayload,
                    kind => kind,
                },
            },
            CallError::Unreachable(_) => DeliveryFailureKind::Transient,
            CallError::Lost(_) => DeliveryFailureKind::Unknown,
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
                retry_after_ms,
            } => {
                let message = if message.is_empty() {
                    String::new()
                } else {
                    format!(" ({message})")
                };
                SendError::before_io(
                    kind,
                    format!(
                        "Nextcloud Talk {what}: HTTP {status}{message}{}",
                        hint(what, status)
                    ),
                )
                .with_platform_code(status.to_string())
                .with_retry_after_ms(retry_after_ms)
            }
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Nextcloud Talk {what}: the server is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Nextcloud Talk {what}: the request went out and no usable answer came back \
                     ({reason}); the server may have acted on it"
                ),
            ),
        }
    }
}

/// What to do about the refusals an operator can fix.
fn hint(what: &str, status: u16) -> &'static str {
    match status {
        401 if what.starts_with("bot") => {
            " (the signature was not accepted: check that bot_secret_env holds the secret given \
             to `occ talk:bot:install`, and that a moderator enabled the bot in this \
             conversation)"
        }
        401 => " (the user or app password was refused: create a new app password)",
        403 => " (the conversation is read-only for this account)",
        404 => " (no such conversation for this account, or no such message)",
        412 => " (the conversation's lobby is on: this account may not write yet)",
        413 => " (the message is over the server's chat max-length)",
        429 => " (Nextcloud's brute-force protection throttles this client)",
        _ => "",
    }
}

/// An answer Nextcloud gave with a 2xx (or 304) status.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    /// The envelope's `data` (`Null` for an empty or 304 answer).
    pub(crate) data: Value,
    /// `X-Chat-Last-Given`, when present.
    pub(crate) last_given: Option<i64>,
}

/// The server's OCS endpoints and the HTTP client.
#[derive(Clone)]
pub(crate) struct TalkApi {
    base: String,
    http: reqwest::Client,
    timeout: Duration,
    /// HTTP Basic credentials (user mode): the user and an app password.
    auth: Option<(String, Secret)>,
}

impl std::fmt::Debug for TalkApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TalkApi")
            .field("base", &self.base)
            .field("timeout", &self.timeout)
            .field("user", &self.auth.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

/// The Talk API root under the server's base URL.
pub(crate) const SPREED: &str = "/ocs/v2.php/apps/spreed/api";

impl TalkApi {
    /// Calls to `base`; each call may take `timeout` before its outcome counts as unknown.
    pub(crate) fn new(base: &str, timeout: Duration, auth: Option<(String, Secret)>) -> TalkApi {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .unwrap_or_default();
        TalkApi {
            base: base.trim_end_matches('/').to_owned(),
            http,
            timeout,
            auth,
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `method path?query` with a JSON `body` and `headers`; `timeout` overrides the default
    /// (a long poll waits longer).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        headers: &[(&str, String)],
        timeout: Option<Duration>,
    ) -> Result<Answer, CallError> {
        let mut url = format!("{}{path}", self.base);
        if !query.is_empty() {
            let query = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(query.iter().map(|(k, v)| (*k, v.as_str())))
                .finish();
            url = format!("{url}?{query}");
        }
        let mut request = self
            .http
            .request(method, url)
            .header("OCS-APIRequest", "true")
            .header("Accept", "application/json")
            .timeout(timeout.unwrap_or(self.timeout));
        if let Some((user, password)) = &self.auth {
            request = request.basic_auth(user, Some(password.expose()));
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) if error.is_connect() || error.is_builder() => {
                return Err(CallError::Unreachable(without_url(&error)));
            }
            Err(error) => return Err(CallError::Lost(without_url(&error))),
        };
        let status = response.status().as_u16();
        let last_given = response
            .headers()
            .get("x-chat-last-given")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let retry_after_ms = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| s * 1_000);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(without_url(&e)))?;
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let ocs = body.as_ref().and_then(|b| b.get("ocs"));
        if (200..300).contains(&status) || status == 304 {
            return Ok(Answer {
                status,
                data: ocs
                    .and_then(|o| o.get("data"))
                    .cloned()
                    .unwrap_or(Value::Null),
                last_given,
            });
        }
        match ocs.and_then(|o| o.get("meta")) {
            Some(meta) => Err(CallError::Refused {
                status,
                message: meta
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect(),
                retry_after_ms,
            }),
            // No OCS envelope: a proxy's error page. A 5xx from in front of Nextcloud may come
            // after Nextcloud acted; anything else is a refusal of the request as such.
            None if status >= 500 => Err(CallError::Lost(format!(
                "HTTP {status} without an OCS answer"
            ))),
            None => Err(CallError::Refused {
                status,
                message: body
                    .as_ref()
                    .and_then(|b| b.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .chars()
                    .take(200)
                    .collect(),
                retry_after_ms,
            }),
        }
    }
}

/// A reqwest error without its URL (which names the server and conversation, never a secret,
/// but keeps messages short).
fn without_url(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    if let Some(url) = error.url() {
        text = text.replace(url.as_str(), "the Talk API");
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_channel_sdk::SideEffect;

    #[test]
    fn refusals_are_classified_and_have_no_side_effect() {
        use DeliveryFailureKind::*;
        for (status, kind) in [
            (400, InvalidPayload),
            (401, Auth),
            (403, Permission),
            (404, NotFound),
            (405, InvalidPayload),
            (412, Permission),
            (413, InvalidPayload),
            (429, RateLimit),
            (503, Transient),
            (418, InvalidPayload),
        ] {
            let error = CallError::Refused {
                status,
                message: String::new(),
                retry_after_ms: None,
            }
            .into_send_error("chat send");
            assert_eq!(
                (error.kind, error.side_effect),
                (kind, SideEffect::None),
                "{status}"
            );
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("chat send");
        assert_eq!(
            (lost.kind, lost.side_effect),
            (Unknown, SideEffect::Possible)
        );
    }

    #[tokio::test]
    async fn the_app_password_never_reaches_an_error_or_debug() {
        let api = TalkApi::new(
            "http://127.0.0.1:1",
            Duration::from_secs(2),
            Some(("bot".into(), Secret::new("very-secret-app-password"))),
        );
        let error = api
            .call(Method::GET, "/ocs/v2.php/cloud/user", &[], None, &[], None)
            .await
            .unwrap_err();
        assert!(matches!(error, CallError::Unreachable(_)), "{error:?}");
        let text = format!(
            "{error:?} {} {api:?}",
            error.clone().into_send_error("x").message
        );
        assert!(!text.contains("very-secret"), "{text}");
    }
}
