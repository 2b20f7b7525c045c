//! One REST call to Discord, the rate limiter in front of it, and what a failure means:
//! Discord refused it (nothing happened), it never reached Discord, or it went out and no usable
//! answer came back (Discord may have acted).
//!
//! The limiter does what Discord asks (platform-apis §3.3): it learns each route's bucket from
//! `X-RateLimit-Bucket`, waits out an empty bucket (`-Remaining: 0` until `-Reset-After`) and a
//! 429's `retry_after` (per bucket, or for everything when `global`), and counts 401/403/429
//! answers so a bot that keeps being refused stops calling before Discord bans it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_sdk::{Secret, SendError, SourceError};
use clawgate_types::DeliveryFailureKind;
use reqwest::Method;
use serde_json::Value;
use tracing::{debug, warn};

use crate::wire::ErrorBody;

/// Discord counts invalid requests over this window.
const INVALID_WINDOW: Duration = Duration::from_secs(600);

/// How one call failed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CallError {
    /// Discord answered with an error: the call had no effect.
    Refused {
        status: u16,
        body: ErrorBody,
        /// Seconds to wait (a 429).
        retry_after: Option<f64>,
    },
    /// The limiter kept the call back: waiting would take longer than allowed.
    Held { wait: Duration, reason: String },
    /// Nothing reached Discord (no connection).
    Unreachable(String),
    /// The request went out and no answer came back: Discord may have acted.
    Lost(String),
}

impl CallError {
    /// Discord's JSON error code of a refusal.
    pub(crate) fn code(&self) -> Option<i64> {
        match self {
            CallError::Refused { body, .. } => Some(body.code),
            _ => None,
        }
    }

    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            CallError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The failure class, from Discord's status and JSON code (platform-apis §3.2).
    pub(crate) fn kind(&self) -> DeliveryFailureKind {
        use DeliveryFailureKind::*;
        match self {
            CallError::Refused { status, body, .. } => match (status, body.code) {
                (_, 10003 | 10008 | 10013) => NotFound,
                (400, 50035)
                    if body.first_form_error().as_deref() == Some("REPLIES_UNKNOWN_MESSAGE") =>
                {
                    NotFound
                }
                (_, 50001 | 50013 | 50005 | 50007 | 160002 | 160005 | 50083) => Permission,
                (_, 20028) => RateLimit,
                (401, _) => Auth,
                (403, _) => Permission,
                (404, _) => NotFound,
                (429, _) => RateLimit,
                (400 | 405 | 413, _) => InvalidPayload,
                (409, _) => Conflict,
                _ => Transient,
            },
            CallError::Held { .. } => RateLimit,
            CallError::Unreachable(_) => Transient,
            CallError::Lost(_) => Unknown,
        }
    }

    /// As a send failure: a refusal, a held call or an unreachable server had no side effect;
    /// a lost answer may have.
    pub(crate) fn into_send_error(self, what: &str) -> SendError {
        let kind = self.kind();
        match self {
            CallError::Refused {
                status,
                body,
                retry_after,
            } => {
                let detail = body
                    .first_form_error()
                    .map_or_else(String::new, |e| format!(" ({e})"));
                SendError::before_io(
                    kind,
                    format!(
                        "Discord {what}: {status} {} {}{detail}",
                        body.code, body.message
                    ),
                )
                .with_retry_after_ms(retry_after.map(secs_to_ms))
                .with_platform_code(body.code.to_string())
            }
            CallError::Held { wait, reason } => SendError::before_io(
                kind,
                format!(
                    "Discord {what}: not sent, {reason}; retry in {} ms",
                    wait.as_millis()
                ),
            )
            .with_retry_after_ms(Some(
                u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
            )),
            CallError::Unreachable(reason) => SendError::before_io(
                kind,
                format!("Discord {what}: the API is unreachable: {reason}"),
            ),
            CallError::Lost(reason) => SendError::after_io(
                kind,
                format!(
                    "Discord {what}: the request went out and no answer came back ({reason}); \
                     Discord may have acted"
                ),
            ),
        }
    }

    pub(crate) fn into_source_error(self, what: &str) -> SourceError {
        let error = self.into_send_error(what);
        SourceError::new(error.kind, error.message).with_retry_after_ms(error.retry_after_ms)
    }
}

fn secs_to_ms(secs: f64) -> u64 {
    // A float of seconds; never 0 ms for a real wait.
    let ms = (secs.max(0.0) * 1000.0).ceil();
    if ms >= u64::MAX as f64 {
        u64::MAX
    } else {
        (ms as u64).max(1)
    }
}

/// What the limiter knows of one bucket (per major parameter).
#[derive(Debug, Clone, Copy)]
struct BucketState {
    remaining: u32,
    reset_at: Instant,
}

#[derive(Debug, Default)]
struct Limits {
    /// Route key → Discord's bucket id.
    bucket_of: HashMap<String, String>,
    /// (bucket id, major) → state.
    buckets: HashMap<(String, String), BucketState>,
    /// A route key's own state until its bucket id is known.
    unnamed: HashMap<(String, String), BucketState>,
    global_until: Option<Instant>,
    /// When each 401/403/429 came, newest last.
    invalid: VecDeque<Instant>,
}

/// The limiter's knobs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimiterConfig {
    /// A call that would wait longer than this is refused before I/O (the engine retries it
    /// after the wait) rather than holding a send.
    pub max_wait: Duration,
    /// 401/403/429 answers per 10 minutes after which calls stop until the window drains
    /// (Discord bans at 10,000).
    pub invalid_budget: u32,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        LimiterConfig {
            max_wait: Duration::from_secs(5),
            invalid_budget: 1_000,
        }
    }
}

/// The bucket-aware limiter every call of one bot goes through.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    config: LimiterConfig,
    limits: Mutex<Limits>,
}

impl Limiter {
    pub(crate) fn new(config: LimiterConfig) -> Limiter {
        Limiter {
            config,
            limits: Mutex::new(Limits::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Limits> {
        self.limits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until `route`/`major` may be called and takes one call from its bucket; refuses
    /// when the wait would exceed `max_wait` or the invalid-request budget is spent.
    async fn acquire(&self, route: &str, major: &str) -> Result<(), CallError> {
        loop {
            let wait = {
                let mut l = self.lock();
                let now = Instant::now();
                while l
                    .invalid
                    .front()
                    .is_some_and(|t| now.duration_since(*t) >= INVALID_WINDOW)
                {
                    l.invalid.pop_front();
                }
                if l.invalid.len() >= self.config.invalid_budget as usize {
                    let oldest = l.invalid.front().copied().unwrap_or(now);
                    return Err(CallError::Held {
                        wait: INVALID_WINDOW.saturating_sub(now.duration_since(oldest)),
                        reason: format!(
                            "{} refused calls (401/403/429) in 10 minutes; calls pause so \
                             Discord does not ban the bot: check the token and permissions",
                            l.invalid.len()
                        ),
                    });
                }
                let global = l.global_until.filter(|u| *u > now).map(|u| u - now);
                let key = (route.to_owned(), major.to_owned());
                let bucket = match l.bucket_of.get(route).cloned() {
                    Some(id) => l.buckets.get_mut(&(id, major.to_owned())),
                    None => l.unnamed.get_mut(&key),
                };
                let bucket_wait = match bucket {
                    Some(b) if b.reset_at <= now => None,
                    Some(b) if b.remaining == 0 => Some(b.reset_at - now),
                    Some(b) => {
                        // Taken now, so concurrent calls do not all spend the same slot.
                        b.remaining -= 1;
                        None
                    }
                    None => None,
                };
                match global.max(bucket_wait) {
                    None => return Ok(()),
                    Some(wait) if wait > self.config.max_wait => {
                        return Err(CallError::Held {
                            wait,
                            reason: "Discord's rate limit for this route is spent".to_owned(),
                        });
                    }
                    Some(wait) => wait,
                }
            };
            debug!(
                route,
                major,
                wait_ms = wait.as_millis(),
                "waiting for Discord's rate limit"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Learns from an answer's headers (and a 429's body).
    fn learn(
        &self,
        route: &str,
        major: &str,
        status: u16,
        headers: &reqwest::header::HeaderMap,
        body: Option<&ErrorBody>,
    ) {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let now = Instant::now();
        let mut l = self.lock();
        let remaining = header("x-ratelimit-remaining").and_then(|v| v.parse::<u32>().ok());
        let reset_after = header("x-ratelimit-reset-after").and_then(|v| v.parse::<f64>().ok());
        let bucket_id = header("x-ratelimit-bucket").map(str::to_owned);
        if let Some(id) = &bucket_id {
            l.bucket_of.insert(route.to_owned(), id.clone());
        }
        let slot = |l: &mut Limits| -> Option<(String, String)> {
            l.bucket_of
                .get(route)
                .map(|id| (id.clone(), major.to_owned()))
        };
        if let (Some(remaining), Some(after)) = (remaining, reset_after) {
            let state = BucketState {
                remaining,
                reset_at: now + Duration::from_secs_f64(after.max(0.0)),
            };
            match slot(&mut l) {
                Some(key) => {
                    l.buckets.insert(key, state);
                }
                None => {
                    l.unnamed
                        .insert((route.to_owned(), major.to_owned()), state);
                }
            }
        }
        if matches!(status, 401 | 403 | 429) {
            let shared = header("x-ratelimit-scope") == Some("shared");
            if !shared {
                l.invalid.push_back(now);
            }
        }
        if status == 429 {
            let retry = body
                .and_then(|b| b.retry_after)
                .or_else(|| header("retry-after").and_then(|v| v.parse::<f64>().ok()))
                .unwrap_or(1.0);
            let until = now + Duration::from_secs_f64(retry.max(0.0));
            let global = body.and_then(|b| b.global) == Some(true)
                || header("x-ratelimit-global") == Some("true");
            if global {
                l.global_until = Some(until);
            } else {
                let state = BucketState {
                    remaining: 0,
                    reset_at: until,
                };
                match slot(&mut l) {
                    Some(key) => {
                        l.buckets.insert(key, state);
                    }
                    None => {
                        l.unnamed
                            .insert((route.to_owned(), major.to_owned()), state);
                    }
                }
            }
        }
    }
}

/// A REST endpoint and the bot's token.
#[derive(Clone)]
pub(crate) struct Rest {
    base: String,
    token: Secret,
    http: reqwest::Client,
    timeout: Duration,
    limiter: Arc<Limiter>,
}

/// The token is in every request's header: never printed.
impl std::fmt::Debug for Rest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rest")
            .field("base", &self.base)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Rest {
    /// Calls to `base` (`https://discord.com/api/v10` or the simulator's) with `token`.
    pub(crate) fn new(
        base: &str,
        token: Secret,
        timeout: Duration,
        limiter: LimiterConfig,
    ) -> Rest {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!(
                "DiscordBot (https://github.com/clawgate/clawgate, ",
                env!("CARGO_PKG_VERSION"),
                ")"
            ))
            .build()
            .unwrap_or_default();
        Rest {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http,
            timeout,
            limiter: Arc::new(Limiter::new(limiter)),
        }
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    pub(crate) fn token(&self) -> &Secret {
        &self.token
    }

    /// One call. `route` is the route template (`POST /channels/{id}/messages`) and `major`
    /// its top-level id (the channel): Discord's buckets are keyed by both. `Ok(None)` is a
    /// 204.
    pub(crate) async fn call(
        &self,
        method: Method,
        route: &str,
        major: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Option<Value>, CallError> {
        self.limiter.acquire(route, major).await?;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header(
                reqwest::header::AUTHORIZATION,
                format!("Bot {}", self.token.expose()),
            )
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
        if status == 204 {
            self.limiter.learn(route, major, status, &headers, None);
            return Ok(None);
        }
        if (200..300).contains(&status) {
            self.limiter.learn(route, major, status, &headers, None);
            return serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                CallError::Lost(format!("HTTP {status} with an unreadable body: {e}"))
            });
        }
        let Ok(body) = serde_json::from_slice::<ErrorBody>(&bytes) else {
            self.limiter.learn(route, major, status, &headers, None);
            // Not Discord answering (a proxy's page, a cut body): the call may have landed.
            return Err(CallError::Lost(format!(
                "HTTP {status} without a Discord error body"
            )));
        };
        self.limiter
            .learn(route, major, status, &headers, Some(&body));
        if status == 429 {
            warn!(route, major, retry_after = ?body.retry_after, global = ?body.global, "Discord rate limited a call");
        }
        let retry_after = (status == 429).then(|| body.retry_after.unwrap_or(1.0));
        Err(CallError::Refused {
            status,
            body,
            retry_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(status: u16, code: i64, errors: Option<Value>) -> CallError {
        CallError::Refused {
            status,
            body: ErrorBody {
                code,
                message: "x".into(),
                errors,
                ..ErrorBody::default()
            },
            retry_after: None,
        }
    }

    #[test]
    fn discord_refusals_are_classified_by_status_and_code() {
        use DeliveryFailureKind::*;
        let reply = serde_json::json!({"message_reference": {"_errors": [{"code": "REPLIES_UNKNOWN_MESSAGE", "message": "Unknown message"}]}});
        let cases = [
            (refused(404, 10003, None), NotFound),
            (refused(404, 10008, None), NotFound),
            (refused(400, 50035, Some(reply)), NotFound),
            (refused(400, 50035, None), InvalidPayload),
            (refused(400, 50006, None), InvalidPayload),
            (refused(403, 50001, None), Permission),
            (refused(403, 50013, None), Permission),
            (refused(401, 0, None), Auth),
            (refused(429, 0, None), RateLimit),
            (refused(502, 0, None), Transient),
            (refused(500, 0, None), Transient),
        ];
        for (error, kind) in cases {
            let sent = error.clone().into_send_error("create message");
            assert_eq!(sent.kind, kind, "{error:?}");
            assert_eq!(sent.side_effect, clawgate_channel_sdk::SideEffect::None);
        }
        let lost = CallError::Lost("timeout".into()).into_send_error("create message");
        assert_eq!(lost.side_effect, clawgate_channel_sdk::SideEffect::Possible);
        assert_eq!(lost.kind, Unknown);
    }

    #[test]
    fn the_token_never_prints() {
        let rest = Rest::new(
            "http://127.0.0.1:1",
            Secret::new("very-secret"),
            Duration::from_secs(1),
            LimiterConfig::default(),
        );
        assert!(!format!("{rest:?}").contains("very-secret"));
    }

    #[test]
    fn retry_after_floats_round_up_to_whole_ms() {
        assert_eq!(secs_to_ms(0.0001), 1);
        assert_eq!(secs_to_ms(1.5), 1500);
        assert_eq!(secs_to_ms(0.0), 1);
    }
}
