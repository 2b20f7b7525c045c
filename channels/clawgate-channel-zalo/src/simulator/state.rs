//! The platform's state: people and their interaction windows, tokens, sent and received
//! messages, faults, the call record and the webhook queue; and the endpoints acting on it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};

use super::{
    CallRecord, DeliveryRecord, Fault, FaultKind, SimInbound, SimMessage, SimulatorConfig,
};

/// Longest consultation text.
const MAX_TEXT: usize = 2_000;

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    world: Mutex<World>,
    pub(crate) wake: Notify,
    pub(crate) shutdown: watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        Inner {
            world: Mutex::new(World::new(config.clone())),
            config,
            addr,
            wake: Notify::new(),
            shutdown: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One queued webhook delivery.
#[derive(Debug, Clone)]
pub(crate) struct QueuedDelivery {
    pub(crate) id: usize,
    pub(crate) body: Value,
    /// The exact bytes posted (and signed), the same on every attempt.
    pub(crate) bytes: String,
    pub(crate) timestamp: String,
    pub(crate) attempts: Vec<u16>,
    pub(crate) acked: bool,
    pub(crate) given_up: bool,
    pub(crate) in_flight: bool,
    pub(crate) next_at: Instant,
}

impl QueuedDelivery {
    pub(crate) fn record(&self) -> DeliveryRecord {
        DeliveryRecord {
            id: self.id,
            body: self.body.clone(),
            attempts: self.attempts.clone(),
            acked: self.acked,
            given_up: self.given_up,
        }
    }
}

/// What a call does besides being recorded.
pub(crate) enum Outcome {
    /// HTTP 200 with this body (a success or an `error` body alike).
    Answer(Value),
    /// Carried out, answer dropped.
    Lost,
    /// Not Zalo talking.
    ServerError(u16),
    /// A Zalo error body under another HTTP status.
    Status(u16, Value),
}

pub(crate) struct World {
    config: SimulatorConfig,
    pub(crate) webhook_url: Option<String>,
    /// When each person last interacted with the OA.
    interactions: HashMap<String, Instant>,
    /// Access token → when it stops working.
    access_tokens: HashMap<String, Instant>,
    /// Refresh token → spent.
    refresh_tokens: HashMap<String, bool>,
    /// Authorization code → used.
    codes: HashMap<String, bool>,
    pub(crate) lose_token_answers: u32,
    pub(crate) faults: Vec<Fault>,
    pub(crate) sent: Vec<SimMessage>,
    pub(crate) inbound: Vec<SimInbound>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<QueuedDelivery>,
    pub(crate) cut_deliveries: u32,
    next_id: u64,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A Zalo `error` body.
pub(crate) fn error(code: i64, message: &str) -> Value {
    json!({ "error": code, "message": message })
}

/// The OAuth host's error body (it names the error and its reason besides the code).
fn oauth_error(code: i64, name: &str, description: &str) -> Value {
    json!({
        "error_name": name,
        "error_reason": description,
        "ref_doc": "https://developers.zalo.me/docs/official-account/bat-dau/xac-thuc-va-uy-quyen-cho-ung-dung-new",
        "error_description": description,
        "error": code,
    })
}

impl World {
    fn new(config: SimulatorConfig) -> World {
        World {
            config,
            webhook_url: None,
            interactions: HashMap::new(),
            access_tokens: HashMap::new(),
            refresh_tokens: HashMap::new(),
            codes: HashMap::new(),
            lose_token_answers: 0,
            faults: Vec::new(),
            sent: Vec::new(),
            inbound: Vec::new(),
            calls: Vec::new(),
            deliveries: Vec::new(),
            cut_deliveries: 0,
            next_id: 0,
        }
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// A token-looking string: unique, URL-safe, long as Zalo's.
    fn opaque(&mut self, kind: &str, len: usize) -> String {
        let n = self.next();
        let mut out = String::new();
        let mut round = 0u32;
        while out.len() < len {
            let digest = Sha256::digest(format!("{}/{kind}/{n}/{round}", self.config.app_id));
            out.extend(digest.iter().map(|b| {
                let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
                char::from(alphabet[usize::from(*b) % alphabet.len()])
            }));
            round += 1;
        }
        out.truncate(len);
        out
    }

    /// A `msg_id`: 32 hex digits.
    fn msg_id(&mut self) -> String {
        let n = self.next();
        let digest = Sha256::digest(format!("{}/msg/{n}", self.config.oa_id));
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    pub(crate) fn new_refresh_token(&mut self) -> String {
        let token = self.opaque("refresh", 120);
        self.refresh_tokens.insert(token.clone(), false);
        token
    }

    pub(crate) fn new_code(&mut self) -> String {
        let code = self.opaque("code", 64);
        self.codes.insert(code.clone(), false);
        code
    }

    pub(crate) fn live_refresh_tokens(&self) -> usize {
        self.refresh_tokens
            .values()
            .filter(|spent| !**spent)
            .count()
    }

    pub(crate) fn interacted(&mut self, user_id: &str) {
        self.interactions.insert(user_id.to_owned(), Instant::now());
    }

    pub(crate) fn close_window(&mut self, user_id: &str) {
        let long_ago = Instant::now()
            .checked_sub(self.config.window + Duration::from_secs(1))
            .unwrap_or_else(Instant::now);
        self.interactions.insert(user_id.to_owned(), long_ago);
    }

    pub(crate) fn expire_access_tokens(&mut self) {
        let now = Instant::now();
        for expiry in self.access_tokens.values_mut() {
            *expiry = now;
        }
    }

    pub(crate) fn enqueue(&mut self, body: Value) -> usize {
        let id = self.deliveries.len();
        let timestamp = match body.get("timestamp") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        self.deliveries.push(QueuedDelivery {
            id,
            bytes: body.to_string(),
            timestamp,
            body,
            attempts: Vec::new(),
            acked: false,
            given_up: false,
            in_flight: false,
            next_at: Instant::now(),
        });
        id
    }

    /// An OA webhook event, in the shape Zalo posts.
    fn event(&self, name: &str, sender: &str, recipient: &str, msg_id: &str, text: &str) -> Value {
        let user = if sender == self.config.oa_id {
            recipient
        } else {
            sender
        };
        json!({
            "app_id": self.config.app_id,
            "oa_id": self.config.oa_id,
            "user_id_by_app": format!("{}0", user),
            "event_name": name,
            "timestamp": now_ms().to_string(),
            "sender": { "id": sender },
            "recipient": { "id": recipient },
            "message": { "msg_id": msg_id, "text": text },
        })
    }

    pub(crate) fn person_writes(&mut self, user_id: &str, text: &str) -> String {
        let msg_id = self.msg_id();
        self.interacted(user_id);
        self.inbound.push(SimInbound {
            msg_id: msg_id.clone(),
            user_id: user_id.to_owned(),
            text: text.to_owned(),
        });
        let oa = self.config.oa_id.clone();
        let body = self.event("user_send_text", user_id, &oa, &msg_id, text);
        self.enqueue(body);
        msg_id
    }

    /// `Err` with the `-216` body when the access token is missing, unknown or expired.
    pub(crate) fn authorize(&self, token: Option<&str>) -> Result<(), Value> {
        match token.and_then(|t| self.access_tokens.get(t)) {
            Some(expiry) if *expiry > Instant::now() => Ok(()),
            _ => Err(error(-216, "Access token is invalid")),
        }
    }

    pub(crate) fn oa_info(&self) -> Value {
        json!({
            "data": {
                "oa_id": self.config.oa_id,
                "name": "Clawgate Simulated OA",
                "description": "An Official Account on the Zalo OA simulator",
                "oa_alias": "clawgate",
                "is_verified": true,
                "oa_type": 2,
                "cate_name": "Technology",
                "num_follower": self.interactions.len(),
                "avatar": "https://s160-ava-talk.zadn.vn/simulated.jpg",
                "cover": "https://cover-talk.zadn.vn/simulated.jpg",
            },
            "error": 0,
            "message": "Success",
        })
    }

    fn take_fault(&mut self, to: &str) -> Option<FaultKind> {
        let index = self
            .faults
            .iter()
            .position(|f| f.to.as_deref().is_none_or(|t| t == to))?;
        let fault = &mut self.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times -= 1;
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(kind)
    }

    /// `POST /v3.0/oa/message/cs`.
    pub(crate) fn message_cs(&mut self, body: &Value) -> Outcome {
        let user_id = body
            .pointer("/recipient/user_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let fault = self.take_fault(&user_id);
        match &fault {
            Some(FaultKind::Refuse(code, message)) => {
                return Outcome::Answer(error(*code, message));
            }
            Some(FaultKind::ServerError(status)) => return Outcome::ServerError(*status),
            Some(FaultKind::Unavailable) => {
                return Outcome::Status(
                    503,
                    error(-500, "Service is temporarily unavailable, please try again"),
                );
            }
            _ => {}
        }
        if user_id.is_empty() {
            return Outcome::Answer(error(
                -201,
                "Parameters are invalid: recipient.user_id is required",
            ));
        }
        let Some(last) = self.interactions.get(&user_id).copied() else {
            return Outcome::Answer(error(
                -201,
                "Parameters are invalid: user_id is not a user of this OA",
            ));
        };
        let Some(text) = body.pointer("/message/text").and_then(Value::as_str) else {
            return Outcome::Answer(error(
                -201,
                "Parameters are invalid: message.text is required",
            ));
        };
        if text.trim().is_empty() {
            return Outcome::Answer(error(-201, "Parameters are invalid: message.text is empty"));
        }
        if text.chars().count() > MAX_TEXT {
            return Outcome::Answer(error(
                -201,
                "Parameters are invalid: message.text is longer than 2000 characters",
            ));
        }
        if last.elapsed() >= self.config.window {
            return Outcome::Answer(error(
                -230,
                "User has not interacted with the OA in the past 7 days",
            ));
        }
        let msg_id = self.msg_id();
        self.sent.push(SimMessage {
            msg_id: msg_id.clone(),
            user_id: user_id.clone(),
            text: text.to_owned(),
            at_ms: now_ms(),
        });
        if self.config.echo_sends {
            let oa = self.config.oa_id.clone();
            let echo = self.event("oa_send_text", &oa, &user_id, &msg_id, text);
            self.enqueue(echo);
        }
        if fault == Some(FaultKind::LoseAnswer) {
            return Outcome::Lost;
        }
        Outcome::Answer(json!({
            "data": { "message_id": msg_id, "user_id": user_id },
            "error": 0,
            "message": "Success",
        }))
    }

    /// `POST /v4/oa/access_token`.
    pub(crate) fn access_token(
        &mut self,
        secret_key: Option<&str>,
        form: &HashMap<String, String>,
    ) -> Outcome {
        let field = |key: &str| form.get(key).map(String::as_str);
        if field("app_id") != Some(self.config.app_id.as_str()) {
            return Outcome::Answer(oauth_error(
                -14001,
                "Invalid parameter",
                "app_id is invalid",
            ));
        }
        if secret_key != Some(self.config.app_secret.as_str()) {
            return Outcome::Answer(oauth_error(
                -14002,
                "Invalid parameter",
                "secret_key is invalid",
            ));
        }
        match field("grant_type") {
            Some("refresh_token") => {
                let Some(token) = field("refresh_token") else {
                    return Outcome::Answer(oauth_error(
                        -14014,
                        "Invalid parameter",
                        "refresh_token is required",
                    ));
                };
                match self.refresh_tokens.get(token) {
                    Some(false) => {}
                    // Spent (rotated) or never issued.
                    _ => {
                        return Outcome::Answer(oauth_error(
                            -14014,
                            "Invalid parameter",
                            "Refresh token is invalid",
                        ));
                    }
                }
                self.refresh_tokens.insert(token.to_owned(), true);
            }
            Some("authorization_code") => {
                let code = field("code").unwrap_or_default();
                if self.codes.get(code) != Some(&false) {
                    return Outcome::Answer(oauth_error(
                        -14019,
                        "Invalid parameter",
                        "Authorization code is invalid",
                    ));
                }
                self.codes.insert(code.to_owned(), true);
            }
            _ => {
                return Outcome::Answer(oauth_error(
                    -14003,
                    "Invalid parameter",
                    "grant_type is invalid",
                ));
            }
        }
        let access = self.opaque("access", 160);
        self.access_tokens
            .insert(access.clone(), Instant::now() + self.config.access_lifetime);
        let refresh = self.new_refresh_token();
        if self.lose_token_answers > 0 {
            self.lose_token_answers -= 1;
            return Outcome::Lost;
        }
        Outcome::Answer(json!({
            "access_token": access,
            "refresh_token": refresh,
            "expires_in": self.config.access_lifetime.as_secs().to_string(),
        }))
    }
}
