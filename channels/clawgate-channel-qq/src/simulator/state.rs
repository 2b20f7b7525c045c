//! The platform's state: tokens, people's messages and their reply windows, the bot's
//! messages and streams, uploaded files, active quotas, faults, the call record and the
//! callback queue; and the endpoints acting on it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::{
    CallRecord, DeliveryRecord, Fault, FaultKind, SimInbound, SimMessage, SimulatorConfig,
};
use crate::client::{
    CODE_ACTIVE_QUOTA, CODE_DEDUPLICATED, CODE_MESSAGE_GONE, CODE_PASSIVE_EXPIRED,
    CODE_PASSIVE_EXPIRED_GROUP, CODE_REPLY_LIMIT, CODE_STREAM_CLOSED, CODE_TOKEN_INVALID,
};
use crate::journal::month_of;

/// Longest text of one message.
const MAX_TEXT: usize = 2_000;
/// A parameter QQ refuses.
const CODE_INVALID_PARAM: i64 = 40_034_001;
/// The answered `msg_id` is unknown (or of another chat).
const CODE_BAD_MSG_ID: i64 = 40_034_003;
/// The app id and secret do not match (token endpoint).
const CODE_BAD_SECRET: i64 = 100_016;

/// A conversation: a person (C2C) or a group.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SimChat {
    /// A person, by `user_openid`.
    User(String),
    /// A group, by `group_openid`.
    Group(String),
}

impl SimChat {
    /// The openid.
    pub fn id(&self) -> &str {
        match self {
            SimChat::User(id) | SimChat::Group(id) => id,
        }
    }
}

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

/// One queued dispatch.
#[derive(Debug, Clone)]
pub(crate) struct QueuedDelivery {
    pub(crate) id: usize,
    pub(crate) body: Value,
    /// The exact bytes posted (and signed), the same on every attempt.
    pub(crate) bytes: String,
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
    /// This HTTP status and body.
    Answer(u16, Value),
    /// Carried out, answer dropped.
    Lost,
    /// Not QQ talking.
    ServerError(u16),
}

impl Outcome {
    /// QQ's error body: `{code, message, err_code, trace_id}`.
    pub(crate) fn error(status: u16, code: i64, message: &str) -> Outcome {
        Outcome::Answer(
            status,
            json!({ "code": code, "message": message, "err_code": code,
                "trace_id": format!("sim-{code}") }),
        )
    }
}

struct Inbound {
    chat: SimChat,
    at: Instant,
    replies: u32,
}

struct OpenStream {
    index: u64,
    last_chunk: Instant,
}

pub(crate) struct World {
    config: SimulatorConfig,
    pub(crate) callback_url: Option<String>,
    /// Token → when it stops working.
    tokens: HashMap<String, Instant>,
    current_token: Option<String>,
    inbound_state: HashMap<String, Inbound>,
    /// (msg_id, msg_seq) pairs acted on.
    pairs: HashSet<(String, u64)>,
    streams: HashMap<String, OpenStream>,
    /// file_info → (file_type, source).
    files: HashMap<String, (u64, String)>,
    /// (chat id, month) → active messages.
    active: HashMap<(String, String), u32>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) messages: Vec<SimMessage>,
    pub(crate) inbound: Vec<SimInbound>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<QueuedDelivery>,
    pub(crate) cut_deliveries: u32,
    seq: u64,
    next_id: u64,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn timestamp() -> String {
    // An RFC 3339 time is what QQ returns; the seconds are enough for a test platform.
    format!("{}", now_ms() / 1_000)
}

impl World {
    fn new(config: SimulatorConfig) -> World {
        World {
            config,
            callback_url: None,
            tokens: HashMap::new(),
            current_token: None,
            inbound_state: HashMap::new(),
            pairs: HashSet::new(),
            streams: HashMap::new(),
            files: HashMap::new(),
            active: HashMap::new(),
            faults: Vec::new(),
            messages: Vec::new(),
            inbound: Vec::new(),
            calls: Vec::new(),
            deliveries: Vec::new(),
            cut_deliveries: 0,
            seq: 0,
            next_id: 1,
        }
    }

    fn id(&mut self, prefix: &str) -> String {
        let n = self.next_id;
        self.next_id += 1;
        format!("{prefix}{n:08}")
    }

    pub(crate) fn next_trace(&mut self) -> String {
        self.id("trace-")
    }

    /// `POST /app/getAppAccessToken`.
    pub(crate) fn access_token(&mut self, body: &Value) -> Outcome {
        let app = body.get("appId").and_then(Value::as_str);
        let secret = body.get("clientSecret").and_then(Value::as_str);
        if app != Some(self.config.app_id.as_str()) || secret != Some(self.config.secret.as_str()) {
            return Outcome::Answer(
                200,
                json!({ "code": CODE_BAD_SECRET, "message": "invalid appid or secret" }),
            );
        }
        let now = Instant::now();
        let reuse = self.current_token.as_ref().and_then(|token| {
            let left = self.tokens.get(token)?.saturating_duration_since(now);
            (left > Duration::from_secs(60)).then(|| (token.clone(), left))
        });
        let (token, left) = match reuse {
            Some(reused) => reused,
            None => {
                let token = self.id("sim-token-");
                self.tokens
                    .insert(token.clone(), now + self.config.token_lifetime);
                self.current_token = Some(token.clone());
                (token, self.config.token_lifetime)
            }
        };
        Outcome::Answer(
            200,
            json!({ "access_token": token, "expires_in": left.as_secs().to_string() }),
        )
    }

    pub(crate) fn authorize(&self, header: Option<&str>) -> Result<(), Outcome> {
        let token = header.and_then(|h| h.strip_prefix("QQBot "));
        match token.and_then(|t| self.tokens.get(t)) {
            Some(until) if *until > Instant::now() => Ok(()),
            _ => Err(Outcome::error(
                401,
                CODE_TOKEN_INVALID,
                "token invalid or expired",
            )),
        }
    }

    pub(crate) fn expire_tokens(&mut self) {
        let past = Instant::now();
        for until in self.tokens.values_mut() {
            *until = past;
        }
        self.current_token = None;
    }

    /// The first fault that applies to a send to `chat` (a stream chunk or not).
    fn fault_for(&self, chat: &SimChat, stream_chunk: bool) -> Option<usize> {
        self.faults.iter().position(|f| {
            f.to.as_deref().is_none_or(|to| to == chat.id()) && f.streams == stream_chunk
        })
    }

    /// Counts one send against fault `at`; whether the fault hits this send.
    fn consume(&mut self, at: usize) -> bool {
        let fault = &mut self.faults[at];
        if fault.after > 0 {
            fault.after -= 1;
            return false;
        }
        fault.times -= 1;
        if fault.times == 0 {
            self.faults.remove(at);
        }
        true
    }

    /// `POST …/messages`. A refusal or server error hits the next send; a lost answer hits the
    /// next send QQ accepts (a refused one has no answer to lose).
    pub(crate) fn post_message(&mut self, chat: &SimChat, body: &Value) -> Outcome {
        if !body.is_object() {
            return Outcome::error(400, CODE_INVALID_PARAM, "the body is not a JSON object");
        }
        let stream = body.get("stream").filter(|s| s.is_object());
        let fault = self.fault_for(chat, stream.is_some());
        if let Some(at) = fault {
            match self.faults[at].kind.clone() {
                FaultKind::Refuse(status, code, message) => {
                    if self.consume(at) {
                        return Outcome::error(status, code, &message);
                    }
                }
                FaultKind::ServerError(status) => {
                    if self.consume(at) {
                        return Outcome::ServerError(status);
                    }
                }
                FaultKind::LoseAnswer => {
                    let outcome = self.message(chat, body, stream);
                    if matches!(outcome, Outcome::Answer(200, _)) && self.consume(at) {
                        return Outcome::Lost;
                    }
                    return outcome;
                }
            }
        }
        self.message(chat, body, stream)
    }

    fn message(&mut self, chat: &SimChat, body: &Value, stream: Option<&Value>) -> Outcome {
        let msg_type = body.get("msg_type").and_then(Value::as_u64).unwrap_or(0);
        let content = body.get("content").and_then(Value::as_str).unwrap_or("");
        let (text, media) = match msg_type {
            0 | 2 => {
                let text = if msg_type == 2 {
                    body.pointer("/markdown/content")
                        .and_then(Value::as_str)
                        .unwrap_or(content)
                } else {
                    content
                };
                let ending_chunk = stream.is_some_and(|s| s.get("id").is_some());
                if text.trim().is_empty() && !ending_chunk {
                    return Outcome::error(400, CODE_INVALID_PARAM, "content is empty");
                }
                if text.chars().count() > MAX_TEXT {
                    return Outcome::error(400, CODE_INVALID_PARAM, "content is too long");
                }
                (text.to_owned(), None)
            }
            7 => {
                let info = body.pointer("/media/file_info").and_then(Value::as_str);
                match info.and_then(|i| self.files.get(i)) {
                    Some((file_type, source)) => (
                        format!("[media {file_type}]"),
                        Some((*file_type, source.clone())),
                    ),
                    None => {
                        return Outcome::error(
                            400,
                            CODE_INVALID_PARAM,
                            "media.file_info is invalid",
                        );
                    }
                }
            }
            _ => return Outcome::error(400, CODE_INVALID_PARAM, "msg_type is not supported"),
        };
        if let Some(stream) = stream {
            if matches!(chat, SimChat::Group(_)) {
                return Outcome::error(400, CODE_INVALID_PARAM, "groups cannot stream");
            }
            if let Some(id) = stream.get("id").and_then(Value::as_str) {
                return self.stream_chunk(chat, id, stream, &text);
            }
        }
        let msg_id = body.get("msg_id").and_then(Value::as_str);
        let msg_seq = body.get("msg_seq").and_then(Value::as_u64).unwrap_or(1);
        let now = Instant::now();
        match msg_id {
            Some(msg_id) => {
                let Some(inbound) = self.inbound_state.get(msg_id) else {
                    return Outcome::error(400, CODE_BAD_MSG_ID, "msg_id is invalid");
                };
                if &inbound.chat != chat {
                    return Outcome::error(400, CODE_BAD_MSG_ID, "msg_id is not of this chat");
                }
                let (window, expired) = match chat {
                    SimChat::User(_) => (self.config.c2c_window, CODE_PASSIVE_EXPIRED),
                    SimChat::Group(_) => (self.config.group_window, CODE_PASSIVE_EXPIRED_GROUP),
                };
                if now.saturating_duration_since(inbound.at) > window {
                    return Outcome::error(400, expired, "被动回复超时");
                }
                if self.pairs.contains(&(msg_id.to_owned(), msg_seq)) {
                    return Outcome::error(400, CODE_DEDUPLICATED, "消息被去重，请检查请求msgseq");
                }
                if inbound.replies >= self.config.max_replies {
                    return Outcome::error(400, CODE_REPLY_LIMIT, "被动回复次数超限");
                }
                self.pairs.insert((msg_id.to_owned(), msg_seq));
                if let Some(inbound) = self.inbound_state.get_mut(msg_id) {
                    inbound.replies += 1;
                }
            }
            None => {
                let key = (chat.id().to_owned(), month_of(now_ms()));
                let used = self.active.get(&key).copied().unwrap_or(0);
                if used >= self.config.active_quota {
                    return Outcome::error(400, CODE_ACTIVE_QUOTA, "msg limit exceed");
                }
                self.active.insert(key, used + 1);
            }
        }
        let id = self.id("ROBOT1.0_sim");
        let streaming = stream.map(|s| s.get("state").and_then(Value::as_u64) != Some(10));
        if streaming == Some(true) {
            self.streams.insert(
                id.clone(),
                OpenStream {
                    index: stream
                        .and_then(|s| s.get("index"))
                        .and_then(Value::as_u64)
                        .unwrap_or(1),
                    last_chunk: now,
                },
            );
        }
        self.messages.push(SimMessage {
            id: id.clone(),
            chat: chat.clone(),
            msg_type,
            text,
            reply_to: msg_id.map(str::to_owned),
            msg_seq: msg_id.map(|_| msg_seq),
            stream: streaming.map(|open| !open),
            media,
            recalled: false,
        });
        Outcome::Answer(200, json!({ "id": id, "timestamp": timestamp() }))
    }

    fn stream_chunk(&mut self, chat: &SimChat, id: &str, stream: &Value, text: &str) -> Outcome {
        let now = Instant::now();
        let Some(at) = self
            .messages
            .iter()
            .position(|m| m.id == id && &m.chat == chat && m.stream.is_some())
        else {
            return Outcome::error(400, CODE_INVALID_PARAM, "stream.id is invalid");
        };
        let idle = self.config.stream_idle;
        let open = match self.streams.get(id) {
            Some(open) if now.saturating_duration_since(open.last_chunk) <= idle => open,
            _ => {
                self.streams.remove(id);
                return Outcome::error(400, CODE_STREAM_CLOSED, "stream is closed");
            }
        };
        if self.messages[at].recalled {
            return Outcome::error(400, CODE_STREAM_CLOSED, "stream is closed");
        }
        let reset = stream.get("reset").and_then(Value::as_bool) == Some(true);
        let index = stream.get("index").and_then(Value::as_u64).unwrap_or(0);
        if !reset && index != open.index + 1 {
            return Outcome::error(400, CODE_INVALID_PARAM, "stream.index is out of order");
        }
        let message = &mut self.messages[at];
        if reset {
            message.text = text.to_owned();
        } else {
            message.text.push_str(text);
        }
        if stream.get("state").and_then(Value::as_u64) == Some(10) {
            message.stream = Some(true);
            self.streams.remove(id);
        } else if let Some(open) = self.streams.get_mut(id) {
            open.index = index;
            open.last_chunk = now;
        }
        Outcome::Answer(200, json!({ "id": id, "timestamp": timestamp() }))
    }

    /// `POST …/files`.
    pub(crate) fn post_file(&mut self, chat: &SimChat, body: &Value) -> Outcome {
        let file_type = body.get("file_type").and_then(Value::as_u64).unwrap_or(0);
        if !(1..=4).contains(&file_type) {
            return Outcome::error(400, CODE_INVALID_PARAM, "file_type is invalid");
        }
        let source = match (
            body.get("url").and_then(Value::as_str),
            body.get("file_data").and_then(Value::as_str),
        ) {
            (Some(url), _) if url.starts_with("http://") || url.starts_with("https://") => {
                url.to_owned()
            }
            (_, Some(data)) => {
                let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data) else {
                    return Outcome::error(400, CODE_INVALID_PARAM, "file_data is not base64");
                };
                if file_type == 3
                    && !bytes.starts_with(b"#!SILK_V3")
                    && !bytes.starts_with(b"\x02#!SILK_V3")
                {
                    return Outcome::error(400, CODE_INVALID_PARAM, "voice must be SILK audio");
                }
                if bytes.is_empty() {
                    return Outcome::error(400, CODE_INVALID_PARAM, "file_data is empty");
                }
                format!("data:{} bytes", bytes.len())
            }
            _ => return Outcome::error(400, CODE_INVALID_PARAM, "url or file_data is required"),
        };
        let file_info = self.id("sim-file-info-");
        self.files
            .insert(file_info.clone(), (file_type, source.clone()));
        if body.get("srv_send_msg").and_then(Value::as_bool) == Some(true) {
            // Sent at once, as an active message.
            let message = json!({ "msg_type": 7, "media": { "file_info": file_info } });
            return self.message(chat, &message, None);
        }
        Outcome::Answer(
            200,
            json!({ "file_uuid": self.id("sim-file-"), "file_info": file_info, "ttl": 3600 }),
        )
    }

    /// `DELETE …/messages/{id}`.
    pub(crate) fn recall(&mut self, chat: &SimChat, id: &str) -> Outcome {
        match self
            .messages
            .iter_mut()
            .find(|m| m.id == id && &m.chat == chat && !m.recalled)
        {
            Some(message) => {
                message.recalled = true;
                self.streams.remove(id);
                Outcome::Answer(200, json!({}))
            }
            None => Outcome::error(404, CODE_MESSAGE_GONE, "message not found"),
        }
    }

    pub(crate) fn active_sent(&self, chat_id: &str) -> u32 {
        self.active
            .get(&(chat_id.to_owned(), month_of(now_ms())))
            .copied()
            .unwrap_or(0)
    }

    /// Someone writes: the message, its reply window and its dispatch.
    pub(crate) fn writes(&mut self, chat: SimChat, author: &str, text: &str) -> String {
        let msg_id = self.id("ROBOT1.0_in");
        self.inbound_state.insert(
            msg_id.clone(),
            Inbound {
                chat: chat.clone(),
                at: Instant::now(),
                replies: 0,
            },
        );
        self.inbound.push(SimInbound {
            msg_id: msg_id.clone(),
            chat: chat.clone(),
            author: author.to_owned(),
            text: text.to_owned(),
        });
        let at = "2026-12-02T17:00:00+08:00";
        let (event, d) = match &chat {
            SimChat::User(openid) => (
                "C2C_MESSAGE_CREATE",
                json!({ "id": msg_id, "content": text, "timestamp": at,
                    "author": { "id": openid, "user_openid": openid } }),
            ),
            SimChat::Group(group) => (
                "GROUP_AT_MESSAGE_CREATE",
                json!({ "id": msg_id, "content": format!(" {text}"), "timestamp": at,
                    "group_id": group, "group_openid": group,
                    "author": { "id": author, "member_openid": author } }),
            ),
        };
        self.seq += 1;
        let event_id = format!("{event}:{}", self.id("ev"));
        self.enqueue(json!({ "op": 0, "id": event_id, "d": d, "s": self.seq, "t": event }));
        msg_id
    }

    pub(crate) fn age_inbound(&mut self, msg_id: &str, age: Duration) {
        if let Some(inbound) = self.inbound_state.get_mut(msg_id) {
            inbound.at = Instant::now().checked_sub(age).unwrap_or(inbound.at);
        }
    }

    pub(crate) fn age_streams(&mut self, age: Duration) {
        for open in self.streams.values_mut() {
            open.last_chunk = Instant::now().checked_sub(age).unwrap_or(open.last_chunk);
        }
    }

    /// Queues a dispatch; returns its number.
    pub(crate) fn enqueue(&mut self, body: Value) -> usize {
        let id = self.deliveries.len();
        self.deliveries.push(QueuedDelivery {
            id,
            bytes: body.to_string(),
            body,
            attempts: Vec::new(),
            acked: false,
            given_up: false,
            in_flight: false,
            next_at: Instant::now(),
        });
        id
    }
}
