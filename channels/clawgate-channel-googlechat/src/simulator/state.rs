//! The platform's state: spaces, messages, threads, `requestId`s, the per-space write quota,
//! faults, the call record and the event queue; and the `spaces.messages` methods acting on it
//! (platform-apis-wave2 §4.1, §4.4).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tokio::sync::{Notify, watch};

use super::{CallRecord, DeliveryRecord, Fault, SimMessage, SimUser, SimulatorConfig, SpaceKind};

/// The message size limit (bytes of the whole message resource as sent).
pub const MAX_MESSAGE_BYTES: usize = 32_000;
/// `thread.threadKey` at most this many characters.
const MAX_THREAD_KEY_CHARS: usize = 4_000;
/// A client-assigned id: `client-` and at most 63 characters of `[a-z0-9-]` in all.
const MAX_CLIENT_ID_CHARS: usize = 63;
/// Writes (create, patch, delete) per space per minute, shared by every app in the space.
pub const SPACE_WRITES_PER_MINUTE: usize = 60;
/// Page size of `spaces.messages.list`: default and ceiling.
const LIST_DEFAULT_PAGE: usize = 25;
const LIST_MAX_PAGE: usize = 1_000;
/// How long the sender waits between looks at the queue when nothing wakes it.
pub(crate) const QUEUE_TICK: Duration = Duration::from_millis(25);
/// Top-level fields of a Message a create or patch may carry (others are refused as unknown).
const MESSAGE_FIELDS: &[&str] = &[
    "name",
    "text",
    "formattedText",
    "cards",
    "cardsV2",
    "thread",
    "fallbackText",
    "actionResponse",
    "annotations",
    "attachment",
    "accessoryWidgets",
    "privateMessageViewer",
    "clientAssignedMessageId",
    "sender",
    "createTime",
    "space",
    "argumentText",
    "threadReply",
];
/// `updateMask` paths a patch accepts.
const UPDATE_PATHS: &[&str] = &[
    "text",
    "attachment",
    "cards",
    "cards_v2",
    "accessory_widgets",
    "*",
];

/// A refusal in Google's error envelope: `{"error": {"code", "message", "status"}}`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) status: &'static str,
    pub(crate) message: String,
    pub(crate) details: Vec<Value>,
}

impl ApiError {
    pub(crate) fn new(code: u16, status: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            status,
            message: message.into(),
            details: Vec::new(),
        }
    }

    pub(crate) fn body(&self) -> Value {
        let mut error =
            json!({ "code": self.code, "message": self.message, "status": self.status });
        if !self.details.is_empty() {
            error["details"] = Value::Array(self.details.clone());
        }
        json!({ "error": error })
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(400, "INVALID_ARGUMENT", message)
}

fn not_found() -> ApiError {
    ApiError::new(404, "NOT_FOUND", "Requested entity was not found.")
}

fn denied() -> ApiError {
    ApiError::new(
        403,
        "PERMISSION_DENIED",
        "The caller does not have permission",
    )
}

/// The quota refusal, with the `ErrorInfo` detail Google's APIs attach (no retry delay: the
/// documented answer to a 429 is exponential backoff).
pub(crate) fn quota_exceeded(metric: &str) -> ApiError {
    let mut error = ApiError::new(
        429,
        "RESOURCE_EXHAUSTED",
        format!(
            "Quota exceeded for quota metric '{metric}' and limit '{metric} per minute' of \
             service 'chat.googleapis.com'."
        ),
    );
    error.details.push(json!({
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "RATE_LIMIT_EXCEEDED",
        "domain": "googleapis.com",
        "metadata": { "service": "chat.googleapis.com", "quota_metric": metric },
    }));
    error
}

/// One queued event and where its delivery stands.
#[derive(Debug, Clone)]
pub(crate) struct QueuedEvent {
    pub(crate) id: String,
    pub(crate) body: Value,
    pub(crate) acked: bool,
    pub(crate) given_up: bool,
    pub(crate) in_flight: bool,
    /// Attempts made so far.
    pub(crate) attempts: u32,
    pub(crate) next_at: Instant,
}

#[derive(Debug)]
struct Space {
    display_name: String,
    kind: SpaceKind,
    app_member: bool,
    messages: Vec<SimMessage>,
    /// `thread.threadKey` → thread name (keys are scoped to the calling app: one app here).
    thread_keys: HashMap<String, String>,
    /// `requestId` → the message it created.
    requests: HashMap<String, String>,
    /// When each write of the last minute happened.
    writes: VecDeque<Instant>,
}

#[derive(Debug)]
pub(crate) struct World {
    pub(crate) app: SimUser,
    people: BTreeMap<String, SimUser>,
    bots: BTreeMap<String, SimUser>,
    spaces: BTreeMap<String, Space>,
    dms: BTreeMap<String, String>,
    next_id: u64,
    pub(crate) faults: Vec<Fault>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<DeliveryRecord>,
    pub(crate) events: Vec<QueuedEvent>,
    pub(crate) endpoint_url: Option<String>,
    pub(crate) cut_next_delivery: bool,
    rate_limits: bool,
    /// The token endpoint and the tokens it issued.
    pub(crate) oauth: super::oauth::OAuth,
}

/// Shared by the HTTP handlers, the event sender and the control handle.
pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    world: Mutex<World>,
    pub(crate) events_changed: Notify,
    pub(crate) shutdown_tx: watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("addr", &self.addr)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        let world = World {
            app: SimUser {
                name: "users/100000000000000000001".into(),
                display_name: "clawgate".into(),
                bot: true,
            },
            people: BTreeMap::new(),
            bots: BTreeMap::new(),
            spaces: BTreeMap::new(),
            dms: BTreeMap::new(),
            next_id: 1,
            faults: Vec::new(),
            calls: Vec::new(),
            deliveries: Vec::new(),
            events: Vec::new(),
            endpoint_url: None,
            cut_next_delivery: false,
            rate_limits: config.rate_limits,
            oauth: super::oauth::OAuth::new(config.token_lifetime),
        };
        Inner {
            config,
            addr,
            world: Mutex::new(world),
            events_changed: Notify::new(),
            shutdown_tx: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// RFC 3339 in UTC with microseconds, as Google's JSON writes a `Timestamp`.
pub(crate) fn rfc3339(at: SystemTime) -> String {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_micros()
    )
}

/// A resource id in Google Chat's style: 11 characters of `[A-Za-z0-9_-]`.
fn resource_id(n: u64, salt: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    (0..11)
        .map(|_| {
            let c = ALPHABET[(x & 63) as usize] as char;
            x = x.rotate_right(6) ^ n;
            c
        })
        .collect()
}

/// Whether `id` is a valid client-assigned message id.
pub(crate) fn valid_client_id(id: &str) -> bool {
    id.starts_with("client-")
        && id.len() > "client-".len()
        && id.chars().count() <= MAX_CLIENT_ID_CHARS
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The arguments of a create: what the query string and body say.
#[derive(Debug, Default)]
pub(crate) struct CreateArgs {
    pub(crate) request_id: Option<String>,
    pub(crate) message_id: Option<String>,
    pub(crate) reply_option: Option<String>,
}

impl SimMessage {
    /// The message resource, as the API and events show it.
    pub(crate) fn resource(&self, space: &Value) -> Value {
        let mut thread = json!({ "name": self.thread });
        if let Some(key) = &self.thread_key {
            thread["threadKey"] = json!(key);
        }
        let mut message = json!({
            "name": self.name,
            "sender": self.sender.resource(),
            "createTime": self.create_time,
            "text": self.text,
            "argumentText": self.text,
            "thread": thread,
            "threadReply": self.thread_reply,
            "space": space,
        });
        if let Some(id) = &self.client_id {
            message["clientAssignedMessageId"] = json!(id);
        }
        if let Some(at) = &self.last_update_time {
            message["lastUpdateTime"] = json!(at);
        }
        message
    }
}

impl SimUser {
    pub(crate) fn resource(&self) -> Value {
        json!({
            "name": self.name,
            "displayName": self.display_name,
            "type": if self.bot { "BOT" } else { "HUMAN" },
        })
    }
}

impl World {
    fn next(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    pub(crate) fn person(&mut self, display_name: &str) -> SimUser {
        if let Some(user) = self.people.get(display_name) {
            return user.clone();
        }
        let n = self.next();
        let user = SimUser {
            name: format!("users/{}", 200_000_000_000_000_000_000u128 + u128::from(n)),
            display_name: display_name.to_owned(),
            bot: false,
        };
        self.people.insert(display_name.to_owned(), user.clone());
        user
    }

    pub(crate) fn other_bot(&mut self, display_name: &str) -> SimUser {
        if let Some(user) = self.bots.get(display_name) {
            return user.clone();
        }
        let n = self.next();
        let user = SimUser {
            name: format!("users/{}", 300_000_000_000_000_000_000u128 + u128::from(n)),
            display_name: display_name.to_owned(),
            bot: true,
        };
        self.bots.insert(display_name.to_owned(), user.clone());
        user
    }

    pub(crate) fn create_space(&mut self, display_name: &str, kind: SpaceKind) -> String {
        let n = self.next();
        let name = format!("spaces/{}", resource_id(n, 1));
        self.spaces.insert(
            name.clone(),
            Space {
                display_name: display_name.to_owned(),
                kind,
                app_member: false,
                messages: Vec::new(),
                thread_keys: HashMap::new(),
                requests: HashMap::new(),
                writes: VecDeque::new(),
            },
        );
        name
    }

    pub(crate) fn dm(&mut self, person: &SimUser) -> String {
        if let Some(space) = self.dms.get(&person.name) {
            return space.clone();
        }
        let space = self.create_space(&person.display_name, SpaceKind::DirectMessage);
        self.dms.insert(person.name.clone(), space.clone());
        space
    }

    /// The space resource, as messages and events carry it.
    pub(crate) fn space_resource(&self, name: &str) -> Value {
        let Some(space) = self.spaces.get(name) else {
            return json!({ "name": name });
        };
        match space.kind {
            SpaceKind::Room => json!({
                "name": name, "type": "ROOM", "spaceType": "SPACE",
                "displayName": space.display_name, "singleUserBotDm": false,
            }),
            SpaceKind::DirectMessage => json!({
                "name": name, "type": "DM", "spaceType": "DIRECT_MESSAGE",
                "singleUserBotDm": true,
            }),
        }
    }

    /// The app joins (`ADDED_TO_SPACE`, sent by `user`) or leaves (`REMOVED_FROM_SPACE`).
    pub(crate) fn set_app_member(&mut self, space: &str, member: bool, by: &SimUser) -> bool {
        let Some(s) = self.spaces.get_mut(space) else {
            return false;
        };
        if s.app_member == member {
            return true;
        }
        s.app_member = member;
        let kind = if member {
            "ADDED_TO_SPACE"
        } else {
            "REMOVED_FROM_SPACE"
        };
        let n = self.next();
        let body = json!({
            "type": kind,
            "eventTime": rfc3339(SystemTime::now()),
            "space": self.space_resource(space),
            "user": by.resource(),
        });
        self.queue_event(format!("{kind}:{space}:{n}"), body);
        true
    }

    pub(crate) fn queue_event(&mut self, id: String, body: Value) {
        self.events.push(QueuedEvent {
            id,
            body,
            acked: false,
            given_up: false,
            in_flight: false,
            attempts: 0,
            next_at: Instant::now(),
        });
    }

    /// A person or another app writes: the message lands, and its `MESSAGE` event is queued
    /// while the app is in the space.
    pub(crate) fn write(
        &mut self,
        space: &str,
        sender: &SimUser,
        text: &str,
        thread: Option<&str>,
        client_id: Option<&str>,
    ) -> Option<SimMessage> {
        let n = self.next();
        let thread_name = match thread {
            Some(thread) => thread.to_owned(),
            None => format!("{space}/threads/{}", resource_id(n, 3)),
        };
        let s = self.spaces.get_mut(space)?;
        let thread_reply = s.messages.iter().any(|m| m.thread == thread_name);
        let message = SimMessage {
            name: format!(
                "{space}/messages/{}.{}",
                resource_id(n, 2),
                resource_id(n, 4)
            ),
            space: space.to_owned(),
            thread: thread_name,
            thread_key: None,
            thread_reply,
            sender: sender.clone(),
            text: text.to_owned(),
            client_id: client_id.map(str::to_owned),
            create_time: rfc3339(SystemTime::now()),
            last_update_time: None,
            edits: 0,
            deleted: false,
            from_app: false,
            request_id: None,
        };
        s.messages.push(message.clone());
        if s.app_member {
            let space_value = self.space_resource(space);
            let body = json!({
                "type": "MESSAGE",
                "eventTime": message.create_time,
                "message": message.resource(&space_value),
                "user": sender.resource(),
                "space": space_value,
            });
            self.queue_event(message.name.clone(), body);
        }
        Some(message)
    }

    pub(crate) fn all_messages(&self, space: &str) -> Vec<SimMessage> {
        self.spaces
            .get(space)
            .map(|s| s.messages.clone())
            .unwrap_or_default()
    }

    pub(crate) fn every_message(&self) -> Vec<SimMessage> {
        self.spaces
            .values()
            .flat_map(|s| s.messages.iter().filter(|m| !m.deleted).cloned())
            .collect()
    }

    /// The space of a call, which the app must be a member of.
    fn member_space(&mut self, space: &str) -> Result<&mut Space, ApiError> {
        match self.spaces.get_mut(space) {
            None => Err(not_found()),
            Some(s) if !s.app_member => Err(denied()),
            Some(s) => Ok(s),
        }
    }

    /// Counts one write against the space's per-minute quota, or refuses it.
    fn count_write(&mut self, space: &str) -> Result<(), ApiError> {
        let limits = self.rate_limits;
        let s = self.member_space(space)?;
        let now = Instant::now();
        while s
            .writes
            .front()
            .is_some_and(|at| now.duration_since(*at) >= Duration::from_secs(60))
        {
            s.writes.pop_front();
        }
        if limits && s.writes.len() >= SPACE_WRITES_PER_MINUTE {
            return Err(quota_exceeded("Write requests per space"));
        }
        s.writes.push_back(now);
        Ok(())
    }

    /// `spaces.messages.create`.
    pub(crate) fn create(
        &mut self,
        space: &str,
        args: &CreateArgs,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let fields = check_message_body(body)?;
        self.member_space(space)?;
        // A known requestId answers the message it created, whatever else the request says.
        if let Some(request_id) = &args.request_id {
            let s = self.member_space(space)?;
            if let Some(name) = s.requests.get(request_id).cloned()
                && let Some(message) = s.messages.iter().find(|m| m.name == name).cloned()
            {
                return Ok(message.resource(&self.space_resource(space)));
            }
        }
        let text = fields
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let has_cards = ["cards", "cardsV2"].iter().any(|k| {
            fields
                .get(*k)
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
        });
        if text.is_empty() && !has_cards {
            return Err(invalid("Message cannot be empty. Discarding message."));
        }
        if let Some(id) = &args.message_id
            && !valid_client_id(id)
        {
            return Err(invalid(format!(
                "Invalid message ID \"{id}\": a custom ID starts with client-, has at most 63 \
                 characters and only lowercase letters, numbers and hyphens."
            )));
        }
        let thread = fields.get("thread");
        let thread_name = thread
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let thread_key = thread
            .and_then(|t| t.get("threadKey"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        if thread_key
            .as_ref()
            .is_some_and(|k| k.chars().count() > MAX_THREAD_KEY_CHARS)
        {
            return Err(invalid("thread.threadKey is longer than 4000 characters."));
        }
        let reply_option = args
            .reply_option
            .as_deref()
            .unwrap_or("MESSAGE_REPLY_OPTION_UNSPECIFIED");
        // Generated clients send enums as numbers (`$alt=json;enum-encoding=int`).
        let reply_option = match reply_option {
            "0" => "MESSAGE_REPLY_OPTION_UNSPECIFIED",
            "1" => "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD",
            "2" => "REPLY_MESSAGE_OR_FAIL",
            other => other,
        };
        if !matches!(
            reply_option,
            "MESSAGE_REPLY_OPTION_UNSPECIFIED"
                | "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"
                | "REPLY_MESSAGE_OR_FAIL"
        ) {
            return Err(invalid(format!(
                "Invalid value at 'message_reply_option' (type.googleapis.com/google.chat.v1.\
                 CreateMessageRequest.MessageReplyOption), \"{reply_option}\""
            )));
        }
        let size = serde_json::to_vec(body).map_or(0, |b| b.len());
        if size > MAX_MESSAGE_BYTES {
            return Err(invalid(format!(
                "Message is {size} bytes: a message holds at most {MAX_MESSAGE_BYTES} bytes."
            )));
        }
        {
            let s = self.member_space(space)?;
            if let Some(id) = &args.message_id
                && s.messages
                    .iter()
                    .any(|m| m.client_id.as_deref() == Some(id))
            {
                return Err(ApiError::new(
                    409,
                    "ALREADY_EXISTS",
                    "Message with the given client-assigned ID already exists.",
                ));
            }
        }
        // Where it lands: the default starts a new thread whatever the thread fields say.
        let existing = {
            let s = self.member_space(space)?;
            let by_name = thread_name
                .as_ref()
                .filter(|n| s.messages.iter().any(|m| &m.thread == *n))
                .cloned();
            let by_key = thread_key
                .as_ref()
                .and_then(|k| s.thread_keys.get(k).cloned());
            by_name.or(by_key)
        };
        let wants_thread = thread_name.is_some() || thread_key.is_some();
        let (thread, reply) = match reply_option {
            "REPLY_MESSAGE_OR_FAIL" if wants_thread => match existing {
                Some(thread) => (Some(thread), true),
                None => return Err(not_found()),
            },
            "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD" | "REPLY_MESSAGE_OR_FAIL" => match existing {
                Some(thread) => (Some(thread), true),
                None => (None, false),
            },
            _ => (None, false),
        };
        self.count_write(space)?;
        let n = self.next();
        let thread = thread.unwrap_or_else(|| format!("{space}/threads/{}", resource_id(n, 3)));
        let id = match &args.message_id {
            Some(id) => id.clone(),
            None => format!("{}.{}", resource_id(n, 2), resource_id(n, 4)),
        };
        let message = SimMessage {
            name: format!("{space}/messages/{id}"),
            space: space.to_owned(),
            thread: thread.clone(),
            thread_key: thread_key.clone(),
            thread_reply: reply,
            sender: self.app.clone(),
            text,
            client_id: args.message_id.clone(),
            create_time: rfc3339(SystemTime::now()),
            last_update_time: None,
            edits: 0,
            deleted: false,
            from_app: true,
            request_id: args.request_id.clone(),
        };
        let s = self.member_space(space)?;
        if let Some(key) = thread_key
            && reply_option != "MESSAGE_REPLY_OPTION_UNSPECIFIED"
        {
            s.thread_keys.entry(key).or_insert(thread);
        }
        if let Some(request_id) = &args.request_id {
            s.requests.insert(request_id.clone(), message.name.clone());
        }
        s.messages.push(message.clone());
        Ok(message.resource(&self.space_resource(space)))
    }

    /// The message `spaces/{space}/messages/{id}` (`id` a server id or a client-assigned one).
    fn find(&mut self, space: &str, id: &str) -> Result<&mut SimMessage, ApiError> {
        let name = format!("{space}/messages/{id}");
        let s = self.member_space(space)?;
        s.messages
            .iter_mut()
            .find(|m| !m.deleted && (m.name == name || m.client_id.as_deref() == Some(id)))
            .ok_or_else(not_found)
    }

    /// `spaces.messages.get`.
    pub(crate) fn get(&mut self, space: &str, id: &str) -> Result<Value, ApiError> {
        let message = self.find(space, id)?.clone();
        Ok(message.resource(&self.space_resource(space)))
    }

    /// `spaces.messages.patch` with `updateMask` (and `allowMissing`).
    pub(crate) fn patch(
        &mut self,
        space: &str,
        id: &str,
        update_mask: Option<&str>,
        allow_missing: bool,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let fields = check_message_body(body)?;
        let Some(mask) = update_mask.filter(|m| !m.is_empty()) else {
            return Err(invalid("update_mask is required."));
        };
        let paths: Vec<&str> = mask.split(',').map(str::trim).collect();
        if let Some(bad) = paths.iter().find(|p| !UPDATE_PATHS.contains(p)) {
            return Err(invalid(format!(
                "Invalid update mask path \"{bad}\": one of text, attachment, cards, cards_v2, \
                 accessory_widgets or *."
            )));
        }
        let found = self.find(space, id).map(|m| m.from_app);
        match found {
            Err(error) if error.code == 404 && allow_missing && valid_client_id(id) => {
                let args = CreateArgs {
                    message_id: Some(id.to_owned()),
                    ..CreateArgs::default()
                };
                return self.create(space, &args, body);
            }
            Err(error) => return Err(error),
            Ok(false) => return Err(denied()),
            Ok(true) => {}
        }
        let sets_text = paths.iter().any(|p| *p == "text" || *p == "*");
        let text = fields
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if sets_text && text.is_empty() {
            return Err(invalid("Message cannot be empty. Discarding message."));
        }
        let size = serde_json::to_vec(body).map_or(0, |b| b.len());
        if size > MAX_MESSAGE_BYTES {
            return Err(invalid(format!(
                "Message is {size} bytes: a message holds at most {MAX_MESSAGE_BYTES} bytes."
            )));
        }
        self.count_write(space)?;
        let message = self.find(space, id)?;
        if sets_text {
            message.text = text.to_owned();
        }
        message.edits += 1;
        message.last_update_time = Some(rfc3339(SystemTime::now()));
        let message = message.clone();
        Ok(message.resource(&self.space_resource(space)))
    }

    /// `spaces.messages.delete`.
    pub(crate) fn delete(&mut self, space: &str, id: &str) -> Result<Value, ApiError> {
        if !self.find(space, id)?.from_app {
            return Err(denied());
        }
        self.count_write(space)?;
        self.find(space, id)?.deleted = true;
        Ok(json!({}))
    }

    /// `spaces.messages.list`: oldest first, `pageSize` (≤ 1000) and `pageToken`.
    pub(crate) fn list(
        &mut self,
        space: &str,
        page_size: Option<usize>,
        page_token: Option<&str>,
    ) -> Result<Value, ApiError> {
        let size = page_size
            .filter(|s| *s > 0)
            .unwrap_or(LIST_DEFAULT_PAGE)
            .min(LIST_MAX_PAGE);
        let start = match page_token {
            None | Some("") => 0,
            Some(token) => token
                .parse::<usize>()
                .map_err(|_| invalid("Invalid page token."))?,
        };
        let space_value = self.space_resource(space);
        let s = self.member_space(space)?;
        let visible: Vec<&SimMessage> = s.messages.iter().filter(|m| !m.deleted).collect();
        let page: Vec<Value> = visible
            .iter()
            .skip(start)
            .take(size)
            .map(|m| m.resource(&space_value))
            .collect();
        let mut answer = json!({ "messages": page });
        if start + size < visible.len() {
            answer["nextPageToken"] = json!((start + size).to_string());
        }
        Ok(answer)
    }
}

/// A Message body: a JSON object of known fields.
fn check_message_body(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    let Some(fields) = body.as_object() else {
        return Err(invalid(
            "Invalid JSON payload received. Expected an object for 'message'.",
        ));
    };
    if let Some(unknown) = fields
        .keys()
        .find(|k| !MESSAGE_FIELDS.contains(&k.as_str()))
    {
        return Err(invalid(format!(
            "Invalid JSON payload received. Unknown name \"{unknown}\" at 'message': Cannot \
             find field."
        )));
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = UNIX_EPOCH + Duration::from_micros(1_764_624_256_123_456);
        assert_eq!(rfc3339(at), "2025-12-01T21:24:16.123456Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn client_ids_follow_the_format_rules() {
        assert!(valid_client_id("client-abc-123"));
        for bad in [
            "abc",
            "client-",
            "client-ABC",
            "client-a_b",
            &format!("client-{}", "a".repeat(57)),
        ] {
            assert!(!valid_client_id(bad), "{bad}");
        }
        assert!(valid_client_id(&format!("client-{}", "a".repeat(56))));
    }
}
