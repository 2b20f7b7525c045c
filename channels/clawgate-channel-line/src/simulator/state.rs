//! The platform's state: people, chats, messages, reply tokens, retry keys, queued webhook
//! events, faults, and the record of every call and delivery. Every API decision is made here
//! under one lock, so the record and the answer always agree.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};

use super::{
    CallRecord, DeliveryRecord, Fault, FaultKind, PUSH_PATH, REPLY_PATH, SimMessage,
    SimulatorConfig, Via, Written,
};

/// How often the webhook sender looks at its queue without being told.
pub(crate) const QUEUE_TICK: Duration = Duration::from_millis(50);
/// Longest text of one message.
const MAX_TEXT: usize = 5_000;
/// Messages per call.
const MAX_MESSAGES: usize = 5;

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    pub(crate) bot_user_id: String,
    world: Mutex<World>,
    pub(crate) events_changed: Notify,
    pub(crate) shutdown_tx: watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        let seed = format!("{addr}");
        let bot_user_id = format!("U{}", hex_of(&seed, "bot", 32));
        let world = World {
            seed,
            redelivery: config.redelivery,
            reply_token_ttl: config.reply_token_ttl,
            reply_token_max_age: config.reply_token_max_age,
            retry_key_ttl: config.retry_key_ttl,
            redelivery_delays: config.redelivery_delays.clone(),
            monthly_push_limit: config.monthly_push_limit,
            bot_user_id: bot_user_id.clone(),
            ..World::default()
        };
        Inner {
            config,
            addr,
            bot_user_id,
            world: Mutex::new(world),
            events_changed: Notify::new(),
            shutdown_tx: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `len` hex digits derived from the simulator's seed, a kind and a name.
fn hex_of(seed: &str, kind: &str, len: usize) -> String {
    let digest = Sha256::digest(format!("{seed}/{kind}/{len}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..len.min(hex.len())].to_owned()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A ULID (26 Crockford base32 characters: 48 bits of milliseconds, 80 of entropy).
fn ulid(ms: u64, entropy: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    let mut value: u128 = u128::from(ms & 0xFFFF_FFFF_FFFF) << 80;
    let mut low: u128 = 0;
    for byte in entropy.iter().take(10) {
        low = (low << 8) | u128::from(*byte);
    }
    value |= low;
    (0..26)
        .rev()
        .map(|i| ALPHABET[((value >> (i * 5)) & 0x1f) as usize] as char)
        .collect()
}

/// A UUID (version 4 shape) from a counter, for `x-line-request-id`.
fn uuid_of(seed: &str, n: u64) -> String {
    let hex = hex_of(seed, &format!("request-{n}"), 32);
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// Whether `key` is a UUID in its canonical text form (8-4-4-4-12 hex digits).
fn is_uuid(key: &str) -> bool {
    let groups: Vec<&str> = key.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[derive(Debug, Clone)]
struct Token {
    chat: String,
    /// From when its minute runs (the webhook, or its redelivery).
    issued: Instant,
    event_at: Instant,
    used: bool,
    expired: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Accepted {
    request_id: String,
    sent: Vec<(String, String)>,
    at: Instant,
}

#[derive(Debug, Clone)]
pub(crate) struct QueuedEvent {
    pub(crate) id: String,
    pub(crate) event: Value,
    pub(crate) reply_token: Option<String>,
    pub(crate) acked: bool,
    pub(crate) given_up: bool,
    pub(crate) in_flight: bool,
    pub(crate) redeliveries: u32,
    pub(crate) next_at: Instant,
    /// A redelivery asked for while an attempt was in flight: due once it ends.
    pub(crate) again: bool,
}

/// An API error: status and LINE's error body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

impl ApiError {
    pub(crate) fn new(status: u16, message: &str) -> ApiError {
        ApiError {
            status,
            body: json!({ "message": message }),
        }
    }

    fn invalid(details: Vec<(String, &str)>) -> ApiError {
        ApiError {
            status: 400,
            body: json!({
                "message": format!("The request body has {} error(s)", details.len()),
                "details": details.iter().map(|(property, message)| json!({ "message": message, "property": property })).collect::<Vec<_>>(),
            }),
        }
    }

    pub(crate) fn message(&self) -> Option<String> {
        self.body["message"].as_str().map(str::to_owned)
    }
}

/// A successful send: the `sentMessages` and, for a repeated retry key, the accepted id.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
    pub(crate) accepted_request_id: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct World {
    seed: String,
    bot_user_id: String,
    pub(crate) redelivery: bool,
    reply_token_ttl: Duration,
    reply_token_max_age: Duration,
    retry_key_ttl: Duration,
    pub(crate) redelivery_delays: Vec<Duration>,
    monthly_push_limit: Option<u32>,
    pushes: u32,
    counter: u64,
    next_message_id: u64,
    users: HashMap<String, String>,
    /// User id → whether they follow the bot.
    following: HashMap<String, bool>,
    chats: HashMap<String, String>,
    tokens: HashMap<String, Token>,
    pub(crate) retry_keys: HashMap<String, Accepted>,
    pub(crate) webhook_url: Option<String>,
    pub(crate) messages: Vec<SimMessage>,
    pub(crate) events: Vec<QueuedEvent>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<DeliveryRecord>,
    pub(crate) faults: Vec<Fault>,
    /// The next delivery's answer is never read (the connection drops under it).
    pub(crate) cut_next_delivery: bool,
}

impl World {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    pub(crate) fn request_id(&mut self) -> String {
        let n = self.next();
        uuid_of(&self.seed, n)
    }

    fn token_text(&mut self) -> String {
        let n = self.next();
        hex_of(&self.seed, &format!("token-{n}"), 32)
    }

    fn quote_token(&mut self) -> String {
        let n = self.next();
        let hex = hex_of(&self.seed, &format!("quote-{n}"), 64);
        format!("q{hex}")
    }

    fn message_id(&mut self) -> String {
        self.next_message_id += 1;
        format!("{}", 580_000_000_000_000_000u64 + self.next_message_id)
    }

    pub(crate) fn user(&mut self, name: &str) -> String {
        if let Some(id) = self.users.get(name) {
            return id.clone();
        }
        let id = format!("U{}", hex_of(&self.seed, &format!("user-{name}"), 32));
        self.users.insert(name.to_owned(), id.clone());
        self.following.insert(id.clone(), true);
        id
    }

    pub(crate) fn chat(&mut self, name: &str, prefix: char, _members: &[String]) -> String {
        let key = format!("{prefix}{name}");
        if let Some(id) = self.chats.get(&key) {
            return id.clone();
        }
        let id = format!("{prefix}{}", hex_of(&self.seed, &format!("chat-{key}"), 32));
        self.chats.insert(key, id.clone());
        id
    }

    fn known_chat(&self, id: &str) -> bool {
        self.following.get(id) == Some(&true) || self.chats.values().any(|c| c == id)
    }

    fn source(&self, chat: &str, user: &str) -> Value {
        match chat.chars().next() {
            Some('C') => json!({ "type": "group", "groupId": chat, "userId": user }),
            Some('R') => json!({ "type": "room", "roomId": chat, "userId": user }),
            _ => json!({ "type": "user", "userId": user }),
        }
    }

    fn queue(&mut self, event: Value, reply_token: Option<String>) -> String {
        let id = event["webhookEventId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.events.push(QueuedEvent {
            id: id.clone(),
            event,
            reply_token,
            acked: false,
            given_up: false,
            in_flight: false,
            redeliveries: 0,
            next_at: Instant::now(),
            again: false,
        });
        id
    }

    fn event_id(&mut self) -> String {
        let n = self.next();
        let entropy = Sha256::digest(format!("{}/event-{n}", self.seed).as_bytes());
        ulid(now_ms(), &entropy)
    }

    fn issue_token(&mut self, chat: &str) -> String {
        let token = self.token_text();
        let now = Instant::now();
        self.tokens.insert(
            token.clone(),
            Token {
                chat: chat.to_owned(),
                issued: now,
                event_at: now,
                used: false,
                expired: false,
            },
        );
        token
    }

    pub(crate) fn write(&mut self, chat: &str, user: &str, text: &str) -> Written {
        let message_id = self.message_id();
        let quote_token = self.quote_token();
        self.messages.push(SimMessage {
            id: message_id.clone(),
            chat: chat.to_owned(),
            author: user.to_owned(),
            text: text.to_owned(),
            quote_token: quote_token.clone(),
            via: Via::Person,
            request_id: None,
        });
        let reply_token = self.issue_token(chat);
        let event_id = self.event_id();
        let mark = self.token_text();
        let event = json!({
            "type": "message",
            "message": { "type": "text", "id": message_id, "quoteToken": quote_token,
                         "markAsReadToken": mark, "text": text },
            "webhookEventId": event_id,
            "deliveryContext": { "isRedelivery": false },
            "timestamp": now_ms(),
            "source": self.source(chat, user),
            "replyToken": reply_token,
            "mode": "active",
        });
        self.queue(event, Some(reply_token.clone()));
        Written {
            message_id,
            event_id,
            reply_token,
        }
    }

    pub(crate) fn follow(&mut self, user: &str, follow: bool) -> String {
        self.following.insert(user.to_owned(), follow);
        let event_id = self.event_id();
        let mut event = json!({
            "type": if follow { "follow" } else { "unfollow" },
            "webhookEventId": event_id,
            "deliveryContext": { "isRedelivery": false },
            "timestamp": now_ms(),
            "source": { "type": "user", "userId": user },
            "mode": "active",
        });
        let token = follow.then(|| self.issue_token(user));
        if let Some(token) = &token {
            event["replyToken"] = json!(token);
            event["follow"] = json!({ "isUnblocked": false });
        }
        self.queue(event, token)
    }

    pub(crate) fn expire_token(&mut self, token: &str) -> bool {
        self.tokens
            .get_mut(token)
            .map(|t| t.expired = true)
            .is_some()
    }

    /// The event goes out again as a redelivery now.
    pub(crate) fn redeliver(&mut self, event_id: &str) -> bool {
        let Some(index) = self.events.iter().position(|e| e.id == event_id) else {
            return false;
        };
        let event = &mut self.events[index];
        if event.in_flight {
            event.again = true;
            return true;
        }
        event.acked = false;
        event.given_up = false;
        event.redeliveries += 1;
        event.next_at = Instant::now();
        true
    }

    /// The body of a delivery of event `index` now.
    pub(crate) fn delivery_body(&mut self, index: usize) -> Option<(String, Vec<String>, bool)> {
        let event = self.events.get(index)?;
        let redelivery = event.redeliveries > 0;
        if let Some(token) = event
            .reply_token
            .as_ref()
            .and_then(|t| self.tokens.get_mut(t))
            && redelivery
        {
            // A redelivered token works one minute from the redelivery (capped by its age).
            token.issued = Instant::now();
        }
        let mut body = event.event.clone();
        body["deliveryContext"]["isRedelivery"] = json!(redelivery);
        let id = event.id.clone();
        let text = json!({ "destination": self.bot_user_id, "events": [body] }).to_string();
        Some((text, vec![id], redelivery))
    }

    /// The fault the next call to `path` meets, if any.
    pub(crate) fn take_fault(&mut self, path: &str) -> Option<FaultKind> {
        let index = self.faults.iter().position(|f| {
            f.path
                .as_deref()
                .map_or(path == REPLY_PATH || path == PUSH_PATH, |p| p == path)
        })?;
        let fault = &mut self.faults[index];
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times = fault.times.saturating_sub(1);
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(kind)
    }

    /// Checks `messages`: one to five text messages of at most 5000 characters.
    fn validate(&self, body: &Value) -> Result<Vec<String>, ApiError> {
        let Some(messages) = body.get("messages").and_then(Value::as_array) else {
            return Err(ApiError::invalid(vec![(
                "messages".into(),
                "must be specified",
            )]));
        };
        let mut details = Vec::new();
        if messages.is_empty() || messages.len() > MAX_MESSAGES {
            details.push(("messages".to_owned(), "Size must be between 1 and 5"));
        }
        let mut texts = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if message["type"].as_str() != Some("text") {
                details.push((format!("messages[{i}].type"), "Invalid message type"));
                continue;
            }
            let text = message["text"].as_str().unwrap_or_default();
            if text.is_empty() {
                details.push((format!("messages[{i}].text"), "May not be empty"));
            } else if text.chars().count() > MAX_TEXT {
                details.push((
                    format!("messages[{i}].text"),
                    "Length must be between 0 and 5000",
                ));
            }
            texts.push(text.to_owned());
        }
        if details.is_empty() {
            Ok(texts)
        } else {
            Err(ApiError::invalid(details))
        }
    }

    fn create(
        &mut self,
        chat: &str,
        texts: &[String],
        via: &Via,
        request_id: &str,
    ) -> Vec<(String, String)> {
        texts
            .iter()
            .map(|text| {
                let id = self.message_id();
                let quote_token = self.quote_token();
                self.messages.push(SimMessage {
                    id: id.clone(),
                    chat: chat.to_owned(),
                    author: self.bot_user_id.clone(),
                    text: text.clone(),
                    quote_token: quote_token.clone(),
                    via: via.clone(),
                    request_id: Some(request_id.to_owned()),
                });
                (id, quote_token)
            })
            .collect()
    }

    fn sent_messages(sent: &[(String, String)]) -> Value {
        json!(
            sent.iter()
                .map(|(id, quote)| json!({ "id": id, "quoteToken": quote }))
                .collect::<Vec<_>>()
        )
    }

    /// `POST /v2/bot/message/reply`.
    pub(crate) fn reply(
        &mut self,
        body: &Value,
        retry_key: Option<&str>,
        request_id: &str,
    ) -> Result<Answer, ApiError> {
        if retry_key.is_some() {
            return Err(ApiError::new(
                400,
                "The X-Line-Retry-Key header cannot be specified for this endpoint",
            ));
        }
        let texts = self.validate(body)?;
        let token = body["replyToken"].as_str().unwrap_or_default().to_owned();
        let (ttl, max_age) = (self.reply_token_ttl, self.reply_token_max_age);
        let chat = match self.tokens.get(&token) {
            Some(t)
                if !t.used
                    && !t.expired
                    && t.issued.elapsed() < ttl
                    && t.event_at.elapsed() < max_age =>
            {
                t.chat.clone()
            }
            _ => return Err(ApiError::new(400, "Invalid reply token")),
        };
        if let Some(t) = self.tokens.get_mut(&token) {
            t.used = true;
        }
        let sent = self.create(&chat, &texts, &Via::Reply(token), request_id);
        Ok(Answer {
            status: 200,
            body: json!({ "sentMessages": Self::sent_messages(&sent) }),
            accepted_request_id: None,
        })
    }

    /// `POST /v2/bot/message/push`.
    pub(crate) fn push(
        &mut self,
        body: &Value,
        retry_key: Option<&str>,
        request_id: &str,
    ) -> Result<Answer, ApiError> {
        if let Some(key) = retry_key {
            if !is_uuid(key) {
                return Err(ApiError::new(
                    400,
                    "The value of the X-Line-Retry-Key header must be a UUID",
                ));
            }
            let ttl = self.retry_key_ttl;
            self.retry_keys.retain(|_, a| a.at.elapsed() < ttl);
            if let Some(accepted) = self.retry_keys.get(key) {
                return Ok(Answer {
                    status: 409,
                    body: json!({ "message": "The retry key is already accepted",
                                  "sentMessages": Self::sent_messages(&accepted.sent) }),
                    accepted_request_id: Some(accepted.request_id.clone()),
                });
            }
        }
        let texts = self.validate(body)?;
        let to = body["to"].as_str().unwrap_or_default().to_owned();
        if !self.known_chat(&to) {
            return Err(ApiError::invalid(vec![(
                "to".into(),
                "The property, 'to', in the request body is invalid (line: -, column: -)",
            )]));
        }
        if let Some(limit) = self.monthly_push_limit
            && self.pushes >= limit
        {
            return Err(ApiError::new(429, "You have reached your monthly limit."));
        }
        self.pushes += 1;
        let sent = self.create(
            &to,
            &texts,
            &Via::Push(retry_key.map(str::to_owned)),
            request_id,
        );
        if let Some(key) = retry_key {
            self.retry_keys.insert(
                key.to_owned(),
                Accepted {
                    request_id: request_id.to_owned(),
                    sent: sent.clone(),
                    at: Instant::now(),
                },
            );
        }
        Ok(Answer {
            status: 200,
            body: json!({ "sentMessages": Self::sent_messages(&sent) }),
            accepted_request_id: None,
        })
    }

    /// `GET /v2/bot/info`.
    pub(crate) fn bot_info(&self) -> Value {
        json!({ "userId": self.bot_user_id, "basicId": "@000simul", "displayName": "clawgate simulator",
                "chatMode": "bot", "markAsReadMode": "manual" })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn ulids_are_26_crockford_characters_sorted_by_time() {
        let a = ulid(1_000, &[0xff; 10]);
        let b = ulid(1_001, &[0; 10]);
        assert_eq!(a.len(), 26);
        assert!(a < b);
        assert!(
            a.chars()
                .all(|c| "0123456789ABCDEFGHJKMNPQRSTVWXYZ".contains(c))
        );
    }

    #[test]
    fn retry_keys_must_be_uuids() {
        assert!(is_uuid("123e4567-e89b-42d3-a456-426614174000"));
        assert!(!is_uuid("123e4567e89b42d3a456426614174000"));
        assert!(!is_uuid("key-1"));
    }
}
