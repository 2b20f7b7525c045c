//! The Zalo Web calls the channel makes, over HTTP (zca-js `login.ts`, `sendMessage.ts`,
//! `utils.ts`):
//!
//! - `GET {login}/api/login/getLoginInfo` with the saved cookies, the IMEI and the user agent
//!   of the browser session, its parameters encrypted under a key derived from `zcid`; the
//!   answer's `data` (encrypted under the same key) holds `uid`, the session key `zpw_enk`, the
//!   service map `zpw_service_map_v3` (`chat`, `group`, … hosts) and the listener URLs `zpw_ws`.
//! - `GET {login}/api/login/getServerInfo` (signed): the settings, among them the listener's
//!   `ping_interval` (the answer spells the key `setttings`; `settings` is read too).
//! - `POST {chat}/api/message/sms` (a person) or `{group}/api/group/sendmsg` (a group), form
//!   `params=<AES-CBC of the JSON under zpw_enk>`; the answer
//!   `{"error_code":0,"data":"<encrypted {\"error_code\":0,\"data\":{\"msgId\":…}}>"}`.
//!   A non-zero `error_code` (outside or inside) is a refusal.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::{Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use clawgate_types::clock::Clock;
use serde_json::{Value, json};

use crate::wire::{self, API_TYPE, API_VERSION, LoginKey, SessionKey};

/// Zalo Web's origin (the `Origin` and `Referer` of every call).
pub(crate) const ORIGIN: &str = "https://chat.zalo.me";

/// What a Zalo Web session is logged in with: the browser session's cookies, its IMEI
/// (zca-js's "imei": the browser's device id) and its user agent.
#[derive(Clone)]
pub struct Credentials {
    /// The `Cookie` header value (`name=value; …`).
    pub cookie: Secret,
    /// The IMEI of the browser session the cookies belong to.
    pub imei: Secret,
    /// The browser's user agent.
    pub user_agent: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user_agent", &self.user_agent)
            .finish_non_exhaustive()
    }
}

/// A logged-in session.
#[derive(Debug, Clone)]
pub struct Session {
    /// The account's user id.
    pub uid: String,
    pub(crate) key: SessionKey,
    /// The `chat` service host (direct messages).
    pub chat_base: String,
    /// The `group` service host.
    pub group_base: String,
    /// The listener URLs, first one first.
    pub ws_urls: Vec<String>,
    /// How often the listener pings (server settings).
    pub ping_interval: Duration,
}

/// Why a login failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// Zalo answered, but not with a session: the cookies are expired or logged out, or the
    /// IMEI or user agent is not the one of the browser session they came from.
    #[error(
        "Zalo refused the login ({0}): export fresh cookies, the IMEI and the user agent from a \
         logged-in Zalo Web session (chat.zalo.me) and set them again"
    )]
    Refused(String),
    /// Zalo could not be reached or answered something unreadable.
    #[error("the Zalo login could not complete ({0}); it is tried again")]
    Unreachable(String),
}

/// What a send call came to, short of Zalo's message id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Nothing reached Zalo (the connection was never made).
    #[error("Zalo could not be reached: {0}")]
    Unreachable(String),
    /// The request may have reached Zalo but its answer did not come back readable.
    #[error("the answer to a send was lost ({0}); the message may have landed")]
    Lost(String),
    /// An HTTP error status.
    #[error("Zalo answered HTTP {0}")]
    Status(u16),
    /// Zalo refused (a non-zero `error_code`).
    #[error("Zalo refused the message (error_code {code}: {message})")]
    Refused {
        /// `error_code`.
        code: i64,
        /// `error_message`.
        message: String,
    },
}

impl CallError {
    /// The send error of this outcome.
    pub(crate) fn into_send_error(self) -> SendError {
        let text = self.to_string();
        match self {
            CallError::Unreachable(_) => SendError::before_io(DeliveryFailureKind::Transient, text),
            CallError::Lost(_) => SendError::after_io(DeliveryFailureKind::Transient, text),
            CallError::Status(status) => {
                SendError::before_io(clawgate_channel_sdk::classify_http_status(status), text)
            }
            // Zalo Web's error codes are not public: a refusal is final for this message
            // (retrying the same text would be refused the same way).
            CallError::Refused { .. } => SendError::before_io(
                DeliveryFailureKind::InvalidPayload,
                format!(
                    "{text}; Zalo Web's codes are not documented, so the message is not retried"
                ),
            ),
        }
    }
}

/// A person or a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadKind {
    /// A one-to-one chat.
    User,
    /// A group chat.
    Group,
}

/// A random lower-case hex string of 12 characters (zca-js `randomString`), mixed with `now`.
pub(crate) fn random_hex(now: u64) -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(now);
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// The Zalo Web HTTP client of one account.
#[derive(Clone)]
pub struct WebClient {
    http: reqwest::Client,
    login_base: String,
    credentials: Credentials,
    /// The gateway's clock (login timestamps, `clientId`s, the listener's `t`).
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for WebClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebClient")
            .field("login_base", &self.login_base)
            .finish_non_exhaustive()
    }
}

fn url_with(base: &str, params: &[(&str, String)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in params {
        query.append_pair(k, v);
    }
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{}", query.finish())
}

fn versioned(base: &str, mut params: Vec<(&str, String)>) -> String {
    params.push(("zpw_ver", API_VERSION.to_string()));
    params.push(("zpw_type", API_TYPE.to_string()));
    url_with(base, &params)
}

fn first_host(map: &Value, service: &str) -> Option<String> {
    map.get(service)?
        .as_array()?
        .first()?
        .as_str()
        .map(|s| s.trim_end_matches('/').to_owned())
}

impl WebClient {
    /// A client logging in at `login_base` (`https://wpa.chat.zalo.me`, or a simulator), whose
    /// times come from `clock` (the gateway's).
    pub fn new(
        login_base: &str,
        credentials: Credentials,
        timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> WebClient {
        let http = clawgate_channel_sdk::http::client_builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .unwrap_or_default();
        WebClient {
            http,
            login_base: login_base.trim_end_matches('/').to_owned(),
            credentials,
            clock,
        }
    }

    /// The gateway clock's now, in the unsigned milliseconds Zalo's fields hold.
    pub(crate) fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now_ms()).unwrap_or(0)
    }

    /// The credentials (the listener sends the same cookie and user agent).
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        self.http
            .get(url)
            .header("accept", "application/json, text/plain, */*")
            .header("cookie", self.credentials.cookie.expose())
            .header("origin", ORIGIN)
            .header("referer", format!("{ORIGIN}/"))
            .header("user-agent", &self.credentials.user_agent)
    }

    /// `getLoginInfo` then `getServerInfo`.
    pub async fn login(&self) -> Result<Session, LoginError> {
        let imei = self.credentials.imei.expose().to_owned();
        let now = self.now_ms();
        let zcid = wire::zcid(&imei, now);
        let zcid_ext = random_hex(now);
        let key = LoginKey::derive(&zcid, &zcid_ext)
            .map_err(|e| LoginError::Unreachable(e.to_string()))?;
        let data = json!({
            "computer_name": "Web", "imei": imei, "language": "vi", "ts": now,
        });
        let mut params = vec![
            ("zcid", zcid),
            ("zcid_ext", zcid_ext),
            ("enc_ver", "v2".to_owned()),
            ("params", key.encrypt(&data.to_string())),
            ("type", API_TYPE.to_string()),
            ("client_version", API_VERSION.to_string()),
        ];
        params.push(("signkey", wire::sign_key("getlogininfo", &params)));
        params.push(("nretry", "0".to_owned()));
        let url = versioned(
            &format!("{}/api/login/getLoginInfo", self.login_base),
            params,
        );
        let body = self.get_json(&url).await?;
        let info = body
            .get("data")
            .and_then(Value::as_str)
            .and_then(|d| key.decrypt(d).ok())
            .and_then(|d| serde_json::from_str::<Value>(&d).ok())
            .ok_or_else(|| LoginError::Refused(describe(&body)))?;
        if info.get("error_code").and_then(Value::as_i64).unwrap_or(0) != 0 {
            return Err(LoginError::Refused(describe(&info)));
        }
        let info = info.get("data").cloned().unwrap_or(Value::Null);
        let field = |k: &str| info.get(k).and_then(Value::as_str).map(str::to_owned);
        let (Some(uid), Some(enk)) = (
            field("uid").or_else(|| info.get("uid").map(|v| v.to_string())),
            field("zpw_enk"),
        ) else {
            return Err(LoginError::Refused(
                "the login answer has no uid or zpw_enk".into(),
            ));
        };
        let session_key =
            SessionKey::from_enk(&enk).map_err(|e| LoginError::Refused(e.to_string()))?;
        let map = info.get("zpw_service_map_v3").cloned().unwrap_or_default();
        let (Some(chat_base), Some(group_base)) =
            (first_host(&map, "chat"), first_host(&map, "group"))
        else {
            return Err(LoginError::Refused(
                "the login answer's service map has no chat or group host".into(),
            ));
        };
        let ws_urls: Vec<String> = info
            .get("zpw_ws")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        if ws_urls.is_empty() {
            return Err(LoginError::Refused("the login answer has no zpw_ws".into()));
        }
        let ping_interval = self.server_info(&imei).await?;
        Ok(Session {
            uid,
            key: session_key,
            chat_base,
            group_base,
            ws_urls,
            ping_interval,
        })
    }

    async fn server_info(&self, imei: &str) -> Result<Duration, LoginError> {
        let mut params = vec![
            ("imei", imei.to_owned()),
            ("type", API_TYPE.to_string()),
            ("client_version", API_VERSION.to_string()),
            ("computer_name", "Web".to_owned()),
        ];
        params.push(("signkey", wire::sign_key("getserverinfo", &params)));
        let url = url_with(
            &format!("{}/api/login/getServerInfo", self.login_base),
            &params,
        );
        let body = self.get_json(&url).await?;
        let data = body
            .get("data")
            .filter(|d| !d.is_null())
            .ok_or_else(|| LoginError::Refused(describe(&body)))?;
        let settings = data.get("setttings").or_else(|| data.get("settings"));
        let ping = settings
            .and_then(|s| s.pointer("/features/socket/ping_interval"))
            .and_then(Value::as_u64)
            .unwrap_or(20_000);
        Ok(Duration::from_millis(ping.max(100)))
    }

    async fn get_json(&self, url: &str) -> Result<Value, LoginError> {
        let response = self
            .get(url)
            .send()
            .await
            .map_err(|e| LoginError::Unreachable(e.without_url().to_string()))?;
        let status = response.status();
        if status.is_server_error() {
            return Err(LoginError::Unreachable(format!("HTTP {status}")));
        }
        if !status.is_success() {
            return Err(LoginError::Refused(format!("HTTP {status}")));
        }
        response
            .json::<Value>()
            .await
            .map_err(|e| LoginError::Unreachable(e.without_url().to_string()))
    }

    /// Sends `text` to a person or a group with `client_id`; Zalo's `msgId`.
    pub async fn send_text(
        &self,
        session: &Session,
        kind: ThreadKind,
        thread: &str,
        text: &str,
        client_id: u64,
    ) -> Result<String, CallError> {
        let (url, params) = match kind {
            ThreadKind::User => (
                format!("{}/api/message/sms", session.chat_base),
                json!({
                    "message": text, "clientId": client_id,
                    "imei": self.credentials.imei.expose(), "ttl": 0, "toid": thread,
                }),
            ),
            ThreadKind::Group => (
                format!("{}/api/group/sendmsg", session.group_base),
                json!({
                    "message": text, "clientId": client_id, "ttl": 0, "visibility": 0,
                    "grid": thread,
                }),
            ),
        };
        let url = versioned(&url, vec![("nretry", "0".to_owned())]);
        let form = url_with("", &[("params", session.key.encrypt(&params.to_string()))]);
        let response = self
            .http
            .post(url)
            .header("accept", "application/json, text/plain, */*")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("cookie", self.credentials.cookie.expose())
            .header("origin", ORIGIN)
            .header("referer", format!("{ORIGIN}/"))
            .header("user-agent", &self.credentials.user_agent)
            .body(form.trim_start_matches('?').to_owned())
            .send()
            .await
            .map_err(|e| {
                let connect = e.is_connect();
                let text = e.without_url().to_string();
                if connect {
                    CallError::Unreachable(text)
                } else {
                    CallError::Lost(text)
                }
            })?;
        let status = response.status().as_u16();
        if !response.status().is_success() {
            return Err(CallError::Status(status));
        }
        let body: Value = response
            .json()
            .await
            .map_err(|e| CallError::Lost(e.without_url().to_string()))?;
        let refused = |v: &Value| {
            let code = v.get("error_code").and_then(Value::as_i64).unwrap_or(0);
            (code != 0).then(|| CallError::Refused {
                code,
                message: v
                    .get("error_message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            })
        };
        if let Some(error) = refused(&body) {
            return Err(error);
        }
        let inner: Value = body
            .get("data")
            .and_then(Value::as_str)
            .and_then(|d| session.key.decrypt(d).ok())
            .and_then(|d| serde_json::from_str(&d).ok())
            .ok_or_else(|| CallError::Lost("an answer whose data does not decrypt".into()))?;
        if let Some(error) = refused(&inner) {
            return Err(error);
        }
        match inner.pointer("/data/msgId") {
            Some(Value::String(id)) if !id.is_empty() => Ok(id.clone()),
            Some(Value::Number(id)) => Ok(id.to_string()),
            _ => Err(CallError::Lost("an answer without msgId".into())),
        }
    }
}

fn describe(body: &Value) -> String {
    match (
        body.get("error_code").and_then(Value::as_i64),
        body.get("error_message").and_then(Value::as_str),
    ) {
        (Some(code), Some(message)) => format!("error_code {code}: {message}"),
        (Some(code), None) => format!("error_code {code}"),
        _ => "no session in the answer".to_owned(),
    }
}
