//! One REST v4 call and what its failure means: the server refused it (nothing happened), it
//! never reached the server, or it went out and no usable answer came back (the server may have
//! acted).
//!
//! Rate limits (`RateLimitSettings`, off by default on a server) are honoured: an answer with
//! `X-Ratelimit-Remaining: 0` or a 429 holds the next calls until `X-Ratelimit-Reset` seconds
//! have passed; a hold longer than `max_wait` is refused before I/O with the wait, so the engine
//! retries after it instead of a send hanging.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_sdk::{Secret, SendError, SourceError, classify_http_status};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::Value;
use tracing::warn;

use crate::wire::ErrorBody;

/// The error id of a create whose `pending_post_id` is still in flight.
pub(crate) const PENDING_IN_FLIGHT: &str = "api.post.deduplicate_create_post.pending";

/// How one call failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallError {
    /// The server answered with an error body: the call had no effect.
    Refused { status: u16, body: ErrorBody },
    /// A 429 (or a spent budget held back here): wait this long.
    RateLimited { wait: Duration },
    /// Nothing reached the server (no connection).
    Unreachable(String),
    /// The request went out and no answer came back: the server may have acted.
    Lost(String),
}

impl CallError {
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            CallError::Refused { status, .. } => Some(*status),
            CallError::RateLimited { .. } => Some(429),
            _ => None,
        }
    }

    pub(crate) fn error_id(&self) -> Option<&str> {
        match self {
            CallError::Refused { body, .. } => Some(body.id.as_str()),
            _ => None,
        }
    }

    /// The failure class, from the status and the error id.
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        match self {
            CallError::Refused { status, body } => match (status, body.id.as_str()) {
                // The same pending_post_id is being created right now: retry shortly.
                (_, PENDING_IN_FLIGHT) => Transient,
                (400, "api.post.create_post.root_id.app_error") => NotFound,
                (_, "app.post.get.app_error" | "app.channel.get.existing.app_error") => NotFound,
                (401, _) => Auth,
                (403, _) => Permission,
                (status, _) => classify_http_status(*status),
            },
            CallError::RateLimited { .. } => RateLimit,
            CallError::Unreachable(_) => Transient,
            CallError::Lost(_) => Unknown,
        }
    }

    /// As a send failure: refusals are before I/O; a lost answer may have landed.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused { status, body } => SendError::before_io(
                kind,
                format!(
                    "Mattermost {what}: refused ({status} {}: {})",
                    body.id, body.message
                ),
            )
            .with_platform_code(if body.id.is_empty() {
                status.to_string()
            } else {
                body.id
            }),
            CallError::RateLimited { wait } => SendError::before_io(
                kind,
                format!(
                    "Mattermost {what}: rate limited, not sent; retry in {} ms",
                    wait.as_millis()
                ),
            )
            .with_retry_after_ms(Some(
                u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
            ))
            .with_platform_code("429".to_owned()),
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Mattermost {what}: the server is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Mattermost {what}: the request went out and no answer came back ({reason}); \
                     the server may have acted"
                ),
            ),
        }
    }

    pub(crate) fn into_source_error(self, what: &str) -> SourceError {
        let error = self.into_send_error(what);
        SourceError::new(error.kind, error.message).with_retry_after_ms(error.retry_after_ms)
    }
}

/// A server's REST API and the bot's token.
#[derive(Clone)]
pub(crate) struct Api {
    base: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
    max_wait: Duration,
    hold_until: Arc<Mutex<Option<Instant>>>,
}

/// The token is in every request's header: never printed.
impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

fn header_secs(headers: &reqwest::header::HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

impl Api {
    /// Calls to `server` (`https://chat.example.com`) with `token`.
    pub(crate) fn new(server: &str, token: Secret, timeout: Duration, max_wait: Duration) -> Api {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!("clawgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Api {
            base: server.trim_end_matches('/').to_owned(),
            token,
            http,
            timeout,
            max_wait,
            hold_until: Arc::new(Mutex::new(None)),
        }
    }

    /// The server URL.
    pub(crate) fn server(&self) -> &str {
        &self.base
    }

    pub(crate) fn token(&self) -> &Secret {
        &self.token
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    fn hold(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.hold_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn hold_for(&self, wait: Duration) {
        let until = Instant::now() + wait;
        let mut hold = self.hold();
        if hold.is_none_or(|h| h < until) {
            *hold = Some(until);
        }
    }

    /// One call of `path` (under `/api/v4`).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let wait = (*self.hold()).and_then(|until| until.checked_duration_since(Instant::now()));
        if let Some(wait) = wait {
            if wait > self.max_wait {
                return Err(CallError::RateLimited { wait });
            }
            tokio::time::sleep(wait).await;
        }
        let mut request = self
            .http
            .request(method, format!("{}/api/v4{path}", self.base))
            .bearer_auth(self.token.expose())
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
        let headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CallError::Lost(e.to_string()))?;
        let reset = header_secs(&headers, "x-ratelimit-reset");
        if header_secs(&headers, "x-ratelimit-remaining") == Some(0)
            && let Some(reset) = reset
        {
            self.hold_for(Duration::from_secs(reset));
        }
        if status == 429 {
            // The throttler's plain `limit exceeded`: nothing was done.
            let wait = Duration::from_secs(reset.unwrap_or(1).max(1));
            self.hold_for(wait);
            warn!(
                path,
                wait_s = wait.as_secs(),
                "Mattermost rate limited a call"
            );
            return Err(CallError::RateLimited { wait });
        }
        if (200..300).contains(&status) {
            return serde_json::from_slice(&bytes).map_err(|e| {
                CallError::Lost(format!("HTTP {status} with an unreadable body: {e}"))
            });
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) if !body.id.is_empty() || body.status_code != 0 => {
                Err(CallError::Refused { status, body })
            }
            // Not the server answering (a proxy's page, a cut body): the call may have landed.
            _ => Err(CallError::Lost(format!(
                "HTTP {status} without a Mattermost error body"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, id: &str) -> CallError {
        CallError::Refused {
            status,
            body: ErrorBody {
                id: id.into(),
                status_code: status,
                ..ErrorBody::default()
            },
        }
    }

    #[test]
    fn refusals_are_classified_by_status_and_error_id() {
        use DeliveryFailureKind::*;
        let cases = [
            ("pending", refused(500, PENDING_IN_FLIGHT), Transient),
            (
                "reply as root",
                refused(400, "api.post.create_post.root_id.app_error"),
                NotFound,
            ),
            (
                "post gone",
                refused(404, "app.post.get.app_error"),
                NotFound,
            ),
            (
                "too long",
                refused(400, "model.post.is_valid.message_length.app_error"),
                InvalidPayload,
            ),
            (
                "token",
                refused(401, "api.context.session_expired.app_error"),
                Auth,
            ),
            (
                "not a member",
                refused(403, "api.context.permissions.app_error"),
                Permission,
            ),
            ("server", refused(503, "x"), Transient),
            (
                "limit",
                CallError::RateLimited {
                    wait: Duration::from_secs(1),
                },
                RateLimit,
            ),
        ];
        for (case, error, kind) in cases {
            let sent = error.clone().into_send_error("create post");
            assert_eq!(sent.kind, kind, "{case}");
            assert_eq!(
                sent.side_effect,
                clawgate_channel_sdk::SideEffect::None,
                "{case}"
            );
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("create post");
        assert_eq!(lost.side_effect, clawgate_channel_sdk::SideEffect::Possible);
        assert_eq!(lost.kind, Unknown);
    }

    #[test]
    fn the_token_never_prints() {
        let api = Api::new(
            "http://127.0.0.1:1",
            Secret::new("very-secret"),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert!(!format!("{api:?}").contains("very-secret"));
    }
}
