//! Eyre, the ship's HTTP server, as this channel speaks to it:
//!
//! - `POST /~/login` with the form `password=<+code>` → a `urbauth-~ship` session cookie;
//! - `PUT /~/channel/<uid>` with a JSON array of actions (`poke`, `subscribe`, `unsubscribe`,
//!   `ack`, `delete`) → 204 once Eyre took them (the first PUT creates the channel);
//! - `GET /~/channel/<uid>` → the channel's server-sent events, each with an `id:`; unacked
//!   events are replayed on every new GET, a reaped channel answers 404;
//! - `GET /~/scry/<app><path>.json` → a read of an agent's state (404: nothing there).
//!
//! A 401/403 means the session is gone: the client logs in again once and repeats the call.

use std::sync::Mutex;
use std::time::Duration;

use clawgate_channel_sdk::Secret;
use serde_json::Value;

/// Why an Eyre call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EyreError {
    /// The ship refused the `+code` (the login answered without a session cookie).
    #[error(
        "the ship at {url} refused the login code (HTTP {status}): check the variable code_env names (the ship's `+code`)"
    )]
    LoginRefused {
        /// The ship's URL.
        url: String,
        /// Eyre's status.
        status: u16,
    },
    /// Eyre answered with an error status; nothing was done.
    #[error("Eyre answered {what} with HTTP {status}: {body}")]
    Refused {
        /// The call.
        what: String,
        /// Eyre's status.
        status: u16,
        /// The start of Eyre's body.
        body: String,
    },
    /// The channel no longer exists (reaped, deleted): open a new one.
    #[error("the Eyre channel {uid} is gone (404): a new channel is needed")]
    Reaped {
        /// The channel's uid.
        uid: String,
    },
    /// The request never reached the ship (connection refused, DNS): nothing was done.
    #[error("could not reach the ship for {what}: {reason}")]
    Unreachable {
        /// The call.
        what: String,
        /// The transport's words.
        reason: String,
    },
    /// The request may have reached the ship, but its answer was lost (timeout, reset).
    #[error("the ship's answer to {what} was lost: {reason}")]
    Lost {
        /// The call.
        what: String,
        /// The transport's words.
        reason: String,
    },
    /// Eyre answered something this client cannot read.
    #[error("Eyre's answer to {what} is malformed: {reason}")]
    Malformed {
        /// The call.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// One server-sent event of a channel: its `id:` and its JSON `data:`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelEvent {
    /// The event id (what an ack names).
    pub id: u64,
    /// The event's JSON (`{"id", "response": "poke" | "subscribe" | "diff" | "quit", …}`).
    pub data: Value,
}

/// An Eyre HTTP client of one ship, holding its session cookie.
pub struct Eyre {
    http: reqwest::Client,
    base: String,
    our: String,
    code: Secret,
    cookie: Mutex<Option<String>>,
}

impl std::fmt::Debug for Eyre {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eyre")
            .field("base", &self.base)
            .field("logged_in", &self.cookie_value().is_some())
            .finish_non_exhaustive()
    }
}

fn classify(what: &str, error: &reqwest::Error) -> EyreError {
    let reason = error.to_string();
    if error.is_connect() || error.is_builder() {
        EyreError::Unreachable {
            what: what.to_owned(),
            reason,
        }
    } else {
        EyreError::Lost {
            what: what.to_owned(),
            reason,
        }
    }
}

impl Eyre {
    /// A client of ship `our` at `base` (`http://localhost:8080`) logging in with `code`; each
    /// request may take `timeout` (the event stream is exempt).
    pub fn new(base: &str, our: &str, code: Secret, timeout: Duration) -> Eyre {
        let http = clawgate_channel_sdk::http::client_builder()
            .connect_timeout(timeout)
            .build()
            .unwrap_or_default();
        Eyre {
            http,
            base: base.trim_end_matches('/').to_owned(),
            our: crate::aura::ship(our),
            code,
            cookie: Mutex::new(None),
        }
    }

    /// The ship's URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The ship this client logs in to (`~zod`).
    pub fn our(&self) -> &str {
        &self.our
    }

    fn cookie_value(&self) -> Option<String> {
        self.cookie
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Logs in: `POST /~/login` with `password=<+code>`; keeps the `urbauth-~ship` cookie.
    pub async fn login(&self, timeout: Duration) -> Result<(), EyreError> {
        let body = form_urlencoded::Serializer::new(String::new())
            .append_pair("password", self.code.expose())
            .finish();
        let response = self
            .http
            .post(format!("{}/~/login", self.base))
            .header("content-type", "application/x-www-form-urlencoded")
            .timeout(timeout)
            .body(body)
            .send()
            .await
            .map_err(|e| classify("login", &e))?;
        let status = response.status().as_u16();
        let cookie = response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("urbauth-"))
            .and_then(|v| v.split(';').next())
            .map(str::to_owned);
        match cookie {
            Some(cookie) if status < 400 => {
                *self
                    .cookie
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(cookie);
                Ok(())
            }
            _ if status >= 500 => Err(EyreError::Refused {
                what: "login".into(),
                status,
                body: String::new(),
            }),
            _ => Err(EyreError::LoginRefused {
                url: self.base.clone(),
                status,
            }),
        }
    }

    async fn ensure_login(&self, timeout: Duration) -> Result<String, EyreError> {
        if let Some(cookie) = self.cookie_value() {
            return Ok(cookie);
        }
        self.login(timeout).await?;
        self.cookie_value().ok_or_else(|| EyreError::Malformed {
            what: "login".into(),
            reason: "no session cookie kept".into(),
        })
    }

    fn forget_session(&self) {
        *self
            .cookie
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Sends `actions` to channel `uid` (`PUT /~/channel/<uid>`).
    pub async fn put(
        &self,
        uid: &str,
        actions: &Value,
        timeout: Duration,
    ) -> Result<(), EyreError> {
        for attempt in 0..2 {
            let cookie = self.ensure_login(timeout).await?;
            let response = self
                .http
                .put(format!("{}/~/channel/{uid}", self.base))
                .header("cookie", cookie)
                .header("content-type", "application/json")
                .timeout(timeout)
                .body(actions.to_string())
                .send()
                .await
                .map_err(|e| classify("a channel PUT", &e))?;
            let status = response.status().as_u16();
            if (200..300).contains(&status) {
                return Ok(());
            }
            if (status == 401 || status == 403) && attempt == 0 {
                self.forget_session();
                continue;
            }
            let body = response.text().await.unwrap_or_default();
            return Err(EyreError::Refused {
                what: "a channel PUT".into(),
                status,
                body: body.chars().take(200).collect(),
            });
        }
        unreachable!("the loop returns on its second pass")
    }

    /// Opens channel `uid`'s event stream (`GET /~/channel/<uid>`).
    pub async fn stream(&self, uid: &str, timeout: Duration) -> Result<EventStream, EyreError> {
        for attempt in 0..2 {
            let cookie = self.ensure_login(timeout).await?;
            let response = self
                .http
                .get(format!("{}/~/channel/{uid}", self.base))
                .header("cookie", cookie)
                .header("accept", "text/event-stream")
                .send()
                .await
                .map_err(|e| classify("the channel's event stream", &e))?;
            let status = response.status().as_u16();
            if status == 404 {
                return Err(EyreError::Reaped {
                    uid: uid.to_owned(),
                });
            }
            if (status == 401 || status == 403) && attempt == 0 {
                self.forget_session();
                continue;
            }
            if !(200..300).contains(&status) {
                return Err(EyreError::Refused {
                    what: "the channel's event stream".into(),
                    status,
                    body: String::new(),
                });
            }
            return Ok(EventStream {
                response,
                buffer: String::new(),
            });
        }
        unreachable!("the loop returns on its second pass")
    }

    /// Reads `/<app><path>.json`; `Ok(None)` when Eyre answers 404 (nothing there).
    pub async fn scry(
        &self,
        app: &str,
        path: &str,
        timeout: Duration,
    ) -> Result<Option<Value>, EyreError> {
        for attempt in 0..2 {
            let cookie = self.ensure_login(timeout).await?;
            let response = self
                .http
                .get(format!("{}/~/scry/{app}{path}.json", self.base))
                .header("cookie", cookie)
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| classify("a scry", &e))?;
            let status = response.status().as_u16();
            if status == 404 {
                return Ok(None);
            }
            if (status == 401 || status == 403) && attempt == 0 {
                self.forget_session();
                continue;
            }
            if !(200..300).contains(&status) {
                return Err(EyreError::Refused {
                    what: format!("the scry /{app}{path}"),
                    status,
                    body: String::new(),
                });
            }
            let value = response
                .json::<Value>()
                .await
                .map_err(|e| EyreError::Malformed {
                    what: format!("the scry /{app}{path}"),
                    reason: e.to_string(),
                })?;
            return Ok(Some(value));
        }
        unreachable!("the loop returns on its second pass")
    }
}

/// A channel's open event stream.
#[derive(Debug)]
pub struct EventStream {
    response: reqwest::Response,
    buffer: String,
}

impl EventStream {
    /// The next event; `Ok(None)` when the ship closed the stream. Events without an `id:` or
    /// JSON data (comments, heartbeats) are skipped.
    pub async fn next(&mut self) -> Result<Option<ChannelEvent>, EyreError> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                if let Some(event) = parse_event(&block)? {
                    return Ok(Some(event));
                }
                continue;
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => {
                    self.buffer
                        .push_str(&String::from_utf8_lossy(&bytes).replace("\r\n", "\n"));
                }
                Ok(None) => return Ok(None),
                Err(e) => return Err(classify("the channel's event stream", &e)),
            }
        }
    }
}

fn parse_event(block: &str) -> Result<Option<ChannelEvent>, EyreError> {
    let mut id = None;
    let mut data = String::new();
    for line in block.lines() {
        if let Some(rest) = line.strip_prefix("id:") {
            id = rest.trim().parse::<u64>().ok();
        } else if let Some(rest) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        }
    }
    let (Some(id), false) = (id, data.is_empty()) else {
        return Ok(None);
    };
    let data = serde_json::from_str(&data).map_err(|e| EyreError::Malformed {
        what: format!("channel event {id}"),
        reason: e.to_string(),
    })?;
    Ok(Some(ChannelEvent { id, data }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_blocks_parse_into_events() {
        let event = parse_event("id: 7\ndata: {\"id\":1,\"response\":\"poke\",\"ok\":\"ok\"}\n\n")
            .expect("parses")
            .expect("an event");
        assert_eq!(event.id, 7);
        assert_eq!(event.data["ok"], "ok");
        assert_eq!(parse_event(":\n\n").expect("a comment"), None);
        assert!(parse_event("id: 3\ndata: {nope\n\n").is_err());
    }
}
