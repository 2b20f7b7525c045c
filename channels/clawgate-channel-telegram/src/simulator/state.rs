//! The simulated Telegram: chats, messages, the update queue, the call log, faults, flood
//! control and the clock. Everything lives behind one mutex, never held across an await.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot, watch};

use super::{
    CallRecord, Fault, FaultKind, SimDraft, SimMessage, SimUser, SimulatorConfig, WebhookDelivery,
    WriteOptions,
};

/// Pending updates are kept at most this long (simulated time).
pub(crate) const UPDATE_TTL_SECS: f64 = 24.0 * 3600.0;
/// Messages older than this can no longer be deleted (simulated time).
pub(crate) const DELETE_WINDOW_SECS: i64 = 48 * 3600;
/// The bot's `first_name`.
pub(crate) const BOT_FIRST_NAME: &str = "Clawgate Test Bot";
/// The first `update_id` handed out.
const FIRST_UPDATE_ID: i64 = 100_000_001;

/// What the server shares between connections, the webhook worker and the Rust API.
pub(crate) struct Inner {
    pub config: SimulatorConfig,
    pub addr: SocketAddr,
    pub bot_id: i64,
    state: Mutex<State>,
    /// Bumped whenever the update queue may have something new (wakes long polls).
    pub updates_tx: watch::Sender<u64>,
    /// Wakes the webhook worker.
    pub webhook_wake: Notify,
    /// `true` once `stop` began.
    pub shutdown_tx: watch::Sender<bool>,
    pub tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    pub(crate) fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        let bot_id = bot_id_of(&config.bot_token);
        let state = State::new(bot_id, config.bot_username.clone());
        Inner {
            config,
            addr,
            bot_id,
            state: Mutex::new(state),
            updates_tx: watch::Sender::new(0),
            webhook_wake: Notify::new(),
            shutdown_tx: watch::Sender::new(false),
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // A panic while holding the lock is a simulator bug; the state is still the best record.
        let mut guard = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut guard)
    }

    /// Wakes whoever waits for updates (long polls, the webhook worker).
    pub(crate) fn updates_changed(&self) {
        self.updates_tx.send_modify(|generation| *generation += 1);
        self.webhook_wake.notify_one();
    }
}

/// The bot id is the token's part before `:`.
pub(crate) fn bot_id_of(token: &str) -> i64 {
    token
        .split(':')
        .next()
        .and_then(|id| id.parse().ok())
        .unwrap_or(0)
}

/// Simulated time: wall-clock time at start, running in real time, plus every `advance_clock`.
pub(crate) struct Clock {
    start_unix: f64,
    start: Instant,
    advanced: Duration,
}

impl Clock {
    fn new() -> Clock {
        let start_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Clock {
            start_unix,
            start: Instant::now(),
            advanced: Duration::ZERO,
        }
    }

    pub(crate) fn advance(&mut self, by: Duration) {
        self.advanced += by;
    }

    /// Simulated unix time in seconds.
    pub(crate) fn now(&self) -> f64 {
        self.start_unix + (self.start.elapsed() + self.advanced).as_secs_f64()
    }

    pub(crate) fn unix(&self) -> i64 {
        self.now().floor() as i64
    }
}

/// A refusal: the envelope's `error_code`, `description` and `parameters`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub status: u16,
    pub description: String,
    pub retry_after: Option<u64>,
    pub migrate_to_chat_id: Option<i64>,
}

impl ApiError {
    pub(crate) fn new(status: u16, description: impl Into<String>) -> ApiError {
        ApiError {
            status,
            description: description.into(),
            retry_after: None,
            migrate_to_chat_id: None,
        }
    }

    /// 400 `Bad Request: <detail>`.
    pub(crate) fn bad_request(detail: impl std::fmt::Display) -> ApiError {
        ApiError::new(400, format!("Bad Request: {detail}"))
    }

    pub(crate) fn forbidden(detail: &str) -> ApiError {
        ApiError::new(403, format!("Forbidden: {detail}"))
    }

    pub(crate) fn too_many_requests(retry_after: u64) -> ApiError {
        ApiError {
            retry_after: Some(retry_after),
            ..ApiError::new(429, format!("Too Many Requests: retry after {retry_after}"))
        }
    }

    pub(crate) fn conflict(detail: &str) -> ApiError {
        ApiError::new(409, format!("Conflict: {detail}"))
    }
}

/// A success answer: `result`, and the `description` some methods add ("Webhook was set").
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Success {
    pub result: Value,
    pub description: Option<&'static str>,
}

impl From<Value> for Success {
    fn from(result: Value) -> Success {
        Success {
            result,
            description: None,
        }
    }
}

/// The kinds of chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChatKind {
    Private,
    Group,
    Supergroup,
    Channel,
}

impl ChatKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            ChatKind::Private => "private",
            ChatKind::Group => "group",
            ChatKind::Supergroup => "supergroup",
            ChatKind::Channel => "channel",
        }
    }
}

pub(crate) struct Chat {
    pub id: i64,
    pub kind: ChatKind,
    pub title: String,
    /// The other party of a private chat.
    pub user: Option<SimUser>,
    pub is_forum: bool,
    pub topics: BTreeMap<i64, String>,
    next_message_id: i64,
    pub messages: BTreeMap<i64, SimMessage>,
    /// The supergroup a basic group became.
    pub migrated_to: Option<i64>,
    /// The bot was kicked (groups, channels) or blocked (private chats).
    pub bot_removed: bool,
    /// The private chat's user deleted their account.
    pub deactivated: bool,
    pub drafts: Vec<SimDraft>,
    pub actions: Vec<String>,
}

impl Chat {
    fn new(id: i64, kind: ChatKind, title: &str) -> Chat {
        Chat {
            id,
            kind,
            title: title.to_owned(),
            user: None,
            is_forum: false,
            topics: BTreeMap::new(),
            next_message_id: 1,
            messages: BTreeMap::new(),
            migrated_to: None,
            bot_removed: false,
            deactivated: false,
            drafts: Vec::new(),
            actions: Vec::new(),
        }
    }

    pub(crate) fn next_message_id(&mut self) -> i64 {
        let id = self.next_message_id;
        self.next_message_id += 1;
        id
    }

    /// The short Chat object inside a Message.
    pub(crate) fn json(&self) -> Value {
        match self.kind {
            ChatKind::Private => {
                let mut chat = json!({"id": self.id, "type": "private"});
                if let Some(user) = &self.user {
                    chat["first_name"] = json!(user.first_name);
                    if let Some(username) = &user.username {
                        chat["username"] = json!(username);
                    }
                }
                chat
            }
            kind => {
                let mut chat = json!({"id": self.id, "type": kind.name(), "title": self.title});
                if self.is_forum {
                    chat["is_forum"] = json!(true);
                }
                chat
            }
        }
    }
}

pub(crate) fn user_json(user: &SimUser) -> Value {
    let mut value = json!({"id": user.id, "is_bot": user.is_bot, "first_name": user.first_name});
    if let Some(username) = &user.username {
        value["username"] = json!(username);
    }
    value
}

/// An update waiting for confirmation.
pub(crate) struct QueuedUpdate {
    pub id: i64,
    pub created: f64,
    pub chat_id: i64,
    pub json: Value,
    /// Webhook delivery bookkeeping.
    pub attempts: u32,
    pub next_attempt: Option<Instant>,
    pub in_flight: bool,
}

/// The webhook as set by `setWebhook`.
#[derive(Debug, Clone)]
pub(crate) struct Webhook {
    pub url: String,
    pub secret_token: Option<String>,
    pub max_connections: u32,
    pub last_error: Option<(i64, String)>,
    /// Changes with every setWebhook/deleteWebhook, so stale deliveries are ignored.
    pub generation: u64,
}

struct ActiveFault {
    fault: Fault,
    passed: u32,
    hit: u32,
}

/// A token bucket on the simulated clock.
#[derive(Debug, Clone)]
struct Bucket {
    tokens: f64,
    last: f64,
    capacity: f64,
    per_sec: f64,
}

impl Bucket {
    fn new(capacity: f64, per_sec: f64, now: f64) -> Bucket {
        Bucket {
            tokens: capacity,
            last: now,
            capacity,
            per_sec,
        }
    }

    fn refill(&mut self, now: f64) {
        let elapsed = (now - self.last).max(0.0);
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.capacity);
        self.last = now;
    }

    /// Seconds until one token is there (0 when one is there now).
    fn wait(&mut self, now: f64) -> f64 {
        self.refill(now);
        if self.tokens >= 1.0 {
            0.0
        } else {
            (1.0 - self.tokens) / self.per_sec
        }
    }
}

/// Per chat: a burst of 3, then 1/s. Per group: 20/min. Per bot: 30/s.
const CHAT_BURST: f64 = 3.0;
const CHAT_PER_SEC: f64 = 1.0;
const GROUP_PER_MIN: f64 = 20.0;
const BOT_PER_SEC: f64 = 30.0;

/// The held long poll, ended early with a 409 when another one arrives.
pub(crate) struct LongPoll {
    pub id: u64,
    pub end: oneshot::Sender<&'static str>,
}

pub(crate) struct State {
    pub clock: Clock,
    pub bot_id: i64,
    pub bot_username: String,
    pub chats: HashMap<i64, Chat>,
    next_group: i64,
    next_supergroup: i64,
    pub updates: VecDeque<QueuedUpdate>,
    pub next_update_id: i64,
    /// `None`: the default set (everything but chat_member and reactions).
    pub allowed_updates: Option<Vec<String>>,
    pub log: Vec<CallRecord>,
    faults: Vec<ActiveFault>,
    pub webhook: Option<Webhook>,
    pub webhook_generation: u64,
    pub webhook_deliveries: Vec<WebhookDelivery>,
    /// Webhook deliveries still to be cut off before their answer is read.
    pub webhook_cuts: u32,
    pub long_poll: Option<LongPoll>,
    pub next_poll_id: u64,
    /// The previous getUpdates (offset, when), for the server's repeated-poll throttle.
    pub previous_poll: Option<(i64, Instant)>,
    /// 409 answers are spaced 3 s apart.
    pub next_conflict_at: Option<Instant>,
    /// setWebhook with a URL is accepted once a second.
    pub next_set_webhook_at: Option<Instant>,
    chat_buckets: HashMap<i64, Bucket>,
    group_buckets: HashMap<i64, Bucket>,
    bot_bucket: Option<Bucket>,
    pub next_file: u64,
    /// file_id → (kind, url) of media the bot sent.
    pub files: HashMap<String, (String, String)>,
}

impl State {
    fn new(bot_id: i64, bot_username: String) -> State {
        State {
            clock: Clock::new(),
            bot_id,
            bot_username,
            chats: HashMap::new(),
            next_group: 4_000_000_001,
            next_supergroup: 1_002_000_000_001,
            updates: VecDeque::new(),
            next_update_id: FIRST_UPDATE_ID,
            allowed_updates: None,
            log: Vec::new(),
            faults: Vec::new(),
            webhook: None,
            webhook_generation: 0,
            webhook_deliveries: Vec::new(),
            webhook_cuts: 0,
            long_poll: None,
            next_poll_id: 1,
            previous_poll: None,
            next_conflict_at: None,
            next_set_webhook_at: None,
            chat_buckets: HashMap::new(),
            group_buckets: HashMap::new(),
            bot_bucket: None,
            next_file: 1,
            files: HashMap::new(),
        }
    }

    pub(crate) fn bot_user_json(&self) -> Value {
        json!({"id": self.bot_id, "is_bot": true, "first_name": BOT_FIRST_NAME, "username": self.bot_username})
    }

    pub(crate) fn private_chat(&mut self, user: &SimUser) -> i64 {
        let chat = self
            .chats
            .entry(user.id)
            .or_insert_with(|| Chat::new(user.id, ChatKind::Private, ""));
        chat.user = Some(user.clone());
        user.id
    }

    pub(crate) fn new_group(&mut self, title: &str) -> i64 {
        let id = -self.next_group;
        self.next_group += 1;
        self.chats.insert(id, Chat::new(id, ChatKind::Group, title));
        id
    }

    pub(crate) fn new_supergroup(&mut self, title: &str, forum: bool, kind: &str) -> i64 {
        let id = -self.next_supergroup;
        self.next_supergroup += 1;
        let kind = if kind == "channel" {
            ChatKind::Channel
        } else {
            ChatKind::Supergroup
        };
        let mut chat = Chat::new(id, kind, title);
        chat.is_forum = forum && kind == ChatKind::Supergroup;
        self.chats.insert(id, chat);
        id
    }

    pub(crate) fn create_topic(&mut self, chat_id: i64, name: &str) -> i64 {
        let now = self.clock.unix();
        let chat = self
            .chats
            .get_mut(&chat_id)
            .filter(|chat| chat.is_forum)
            .unwrap_or_else(|| panic!("create_topic: chat {chat_id} is not a forum supergroup"));
        // A topic's id is the id of its service message "forum_topic_created".
        let thread_id = chat.next_message_id();
        chat.topics.insert(thread_id, name.to_owned());
        let raw = json!({
            "message_id": thread_id, "date": now, "chat": chat.json(),
            "message_thread_id": thread_id, "is_topic_message": true,
            "forum_topic_created": {"name": name, "icon_color": 7322096},
        });
        chat.messages.insert(
            thread_id,
            SimMessage {
                message_id: thread_id,
                chat_id,
                from_bot_self: false,
                from_id: 0,
                text: None,
                caption: None,
                media: None,
                thread_id: Some(thread_id),
                reply_to_message_id: None,
                quote: None,
                parse_mode: None,
                edit_count: 0,
                date: now,
                raw,
            },
        );
        thread_id
    }

    pub(crate) fn user_writes(
        &mut self,
        chat_id: i64,
        from: &SimUser,
        text: &str,
        options: &WriteOptions,
    ) -> Value {
        let now = self.clock.unix();
        let bot_username = self.bot_username.clone();
        let chat = self
            .chats
            .get_mut(&chat_id)
            .unwrap_or_else(|| panic!("user_writes: no chat {chat_id}"));
        let message_id = chat.next_message_id();
        let mut raw =
            json!({"message_id": message_id, "date": now, "chat": chat.json(), "text": text});
        let channel = chat.kind == ChatKind::Channel;
        if channel {
            raw["sender_chat"] = chat.json();
        } else {
            raw["from"] = user_json(from);
        }
        if let Some(thread_id) = options.thread_id {
            assert!(
                chat.topics.contains_key(&thread_id),
                "user_writes: chat {chat_id} has no topic {thread_id}"
            );
            raw["message_thread_id"] = json!(thread_id);
            raw["is_topic_message"] = json!(true);
        }
        if let Some(reply_to) = options.reply_to {
            let replied = chat
                .messages
                .get(&reply_to)
                .unwrap_or_else(|| panic!("user_writes: chat {chat_id} has no message {reply_to}"));
            raw["reply_to_message"] = nested(&replied.raw);
        }
        let entities = user_entities(text, &bot_username);
        if !entities.is_empty() {
            raw["entities"] = Value::Array(entities);
        }
        chat.messages.insert(
            message_id,
            SimMessage {
                message_id,
                chat_id,
                from_bot_self: false,
                from_id: if channel { chat_id } else { from.id },
                text: Some(text.to_owned()),
                caption: None,
                media: None,
                thread_id: options.thread_id,
                reply_to_message_id: options.reply_to,
                quote: None,
                parse_mode: None,
                edit_count: 0,
                date: now,
                raw: raw.clone(),
            },
        );
        if from.is_bot && !channel {
            return Value::Null;
        }
        let kind = if channel { "channel_post" } else { "message" };
        if chat.bot_removed {
            return Value::Null;
        }
        self.push_update(chat_id, kind, raw)
    }

    pub(crate) fn user_edits(&mut self, chat_id: i64, message_id: i64, text: &str) -> Value {
        let now = self.clock.unix();
        let bot_username = self.bot_username.clone();
        let chat = self
            .chats
            .get_mut(&chat_id)
            .unwrap_or_else(|| panic!("user_edits: no chat {chat_id}"));
        let channel = chat.kind == ChatKind::Channel;
        let removed = chat.bot_removed;
        let message = chat
            .messages
            .get_mut(&message_id)
            .unwrap_or_else(|| panic!("user_edits: chat {chat_id} has no message {message_id}"));
        message.text = Some(text.to_owned());
        message.edit_count += 1;
        message.raw["text"] = json!(text);
        message.raw["edit_date"] = json!(now);
        let entities = user_entities(text, &bot_username);
        if let Some(object) = message.raw.as_object_mut() {
            object.remove("entities");
        }
        if !entities.is_empty() {
            message.raw["entities"] = Value::Array(entities);
        }
        let raw = message.raw.clone();
        let is_bot = raw["from"]["is_bot"].as_bool().unwrap_or(false);
        if is_bot || removed {
            return Value::Null;
        }
        let kind = if channel {
            "edited_channel_post"
        } else {
            "edited_message"
        };
        self.push_update(chat_id, kind, raw)
    }

    /// Queues an update unless `allowed_updates` excludes its kind (filtered on arrival, as the
    /// server does: a later allowed_updates does not touch queued updates).
    pub(crate) fn push_update(&mut self, chat_id: i64, kind: &str, object: Value) -> Value {
        let update_id = self.next_update_id;
        let mut update = json!({"update_id": update_id});
        update[kind] = object;
        if !self.allows(kind) {
            return update;
        }
        self.next_update_id += 1;
        self.updates.push_back(QueuedUpdate {
            id: update_id,
            created: self.clock.now(),
            chat_id,
            json: update.clone(),
            attempts: 0,
            next_attempt: None,
            in_flight: false,
        });
        update
    }

    fn allows(&self, kind: &str) -> bool {
        match &self.allowed_updates {
            Some(list) if !list.is_empty() => list.iter().any(|k| k == kind),
            _ => !matches!(
                kind,
                "chat_member" | "message_reaction" | "message_reaction_count"
            ),
        }
    }

    pub(crate) fn upgrade(&mut self, chat_id: i64) -> i64 {
        let title = self
            .chats
            .get(&chat_id)
            .filter(|chat| chat.kind == ChatKind::Group && chat.migrated_to.is_none())
            .map(|chat| chat.title.clone())
            .unwrap_or_else(|| panic!("upgrade_to_supergroup: {chat_id} is not a basic group"));
        let new_id = self.new_supergroup(&title, false, "supergroup");
        // Telegram announces the migration in both chats with service messages.
        self.service_message(chat_id, "migrate_to_chat_id", json!(new_id));
        self.service_message(new_id, "migrate_from_chat_id", json!(chat_id));
        if let Some(chat) = self.chats.get_mut(&chat_id) {
            chat.migrated_to = Some(new_id);
        }
        new_id
    }

    /// A service message (no text) in `chat_id`, delivered as a `message` update.
    fn service_message(&mut self, chat_id: i64, field: &str, value: Value) {
        let now = self.clock.unix();
        let Some(chat) = self.chats.get_mut(&chat_id) else {
            return;
        };
        let message_id = chat.next_message_id();
        let mut raw = json!({"message_id": message_id, "date": now, "chat": chat.json()});
        raw[field] = value;
        chat.messages.insert(
            message_id,
            SimMessage {
                message_id,
                chat_id,
                from_bot_self: false,
                from_id: 0,
                text: None,
                caption: None,
                media: None,
                thread_id: None,
                reply_to_message_id: None,
                quote: None,
                parse_mode: None,
                edit_count: 0,
                date: now,
                raw: raw.clone(),
            },
        );
        self.push_update(chat_id, "message", raw);
    }

    pub(crate) fn block(&mut self, user_id: i64) {
        assert!(
            self.chats
                .get(&user_id)
                .is_some_and(|c| c.kind == ChatKind::Private),
            "block_bot: no private chat with user {user_id}"
        );
        self.remove_bot(user_id);
    }

    pub(crate) fn deactivate(&mut self, user_id: i64) {
        match self.chats.get_mut(&user_id) {
            Some(chat) if chat.kind == ChatKind::Private => chat.deactivated = true,
            _ => panic!("deactivate_user: no private chat with user {user_id}"),
        }
    }

    pub(crate) fn kick(&mut self, chat_id: i64) {
        assert!(
            self.chats.contains_key(&chat_id),
            "kick_bot: no chat {chat_id}"
        );
        self.remove_bot(chat_id);
    }

    /// The bot loses the chat; Telegram tells it with a `my_chat_member` update.
    fn remove_bot(&mut self, chat_id: i64) {
        let now = self.clock.unix();
        let bot = self.bot_user_json();
        let Some(chat) = self.chats.get_mut(&chat_id) else {
            return;
        };
        if chat.bot_removed {
            return;
        }
        chat.bot_removed = true;
        let old_status = match chat.kind {
            ChatKind::Channel => "administrator",
            _ => "member",
        };
        // A private chat's blocker is its user; elsewhere an administrator nobody models.
        let from = chat
            .user
            .as_ref()
            .map(user_json)
            .unwrap_or_else(|| json!({"id": 1, "is_bot": false, "first_name": "Admin"}));
        let member = json!({
            "chat": chat.json(), "from": from, "date": now,
            "old_chat_member": {"user": bot, "status": old_status},
            "new_chat_member": {"user": bot, "status": "kicked", "until_date": 0},
        });
        self.push_update(chat_id, "my_chat_member", member);
    }

    pub(crate) fn messages(&self, chat_id: i64) -> Vec<SimMessage> {
        self.chats
            .get(&chat_id)
            .map(|chat| chat.messages.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(crate) fn drafts(&self, chat_id: i64) -> Vec<SimDraft> {
        self.chats
            .get(&chat_id)
            .map(|chat| chat.drafts.clone())
            .unwrap_or_default()
    }

    pub(crate) fn chat_actions(&self, chat_id: i64) -> Vec<String> {
        self.chats
            .get(&chat_id)
            .map(|chat| chat.actions.clone())
            .unwrap_or_default()
    }

    pub(crate) fn inject(&mut self, fault: Fault) {
        self.faults.push(ActiveFault {
            fault,
            passed: 0,
            hit: 0,
        });
    }

    /// The fault (if any) that hits this call; every matching fault counts the call.
    pub(crate) fn match_fault(&mut self, method: &str) -> Option<FaultKind> {
        let mut chosen = None;
        for active in &mut self.faults {
            let matches = active
                .fault
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method));
            if !matches || active.hit >= active.fault.count {
                continue;
            }
            if active.passed < active.fault.after {
                active.passed += 1;
            } else if chosen.is_none() {
                active.hit += 1;
                chosen = Some(active.fault.kind.clone());
            }
        }
        self.faults.retain(|a| a.hit < a.fault.count);
        chosen
    }

    pub(crate) fn expire_updates(&mut self) {
        let cutoff = self.clock.now() - UPDATE_TTL_SECS;
        self.updates.retain(|u| u.created >= cutoff);
    }

    pub(crate) fn pending_updates(&mut self) -> usize {
        self.expire_updates();
        self.updates.len()
    }

    /// getUpdates' queue step: confirms what `offset` confirms and returns up to `limit`.
    pub(crate) fn take_updates(&mut self, offset: i64, limit: usize) -> Vec<Value> {
        self.expire_updates();
        if offset < 0 {
            let keep = offset.unsigned_abs() as usize;
            while self.updates.len() > keep {
                self.updates.pop_front();
            }
        }
        let head = self
            .updates
            .front()
            .map_or(self.next_update_id, |update| update.id);
        // An offset past the newest update is not a confirmation: delivery restarts at the head.
        let from = if offset <= 0 || offset > self.next_update_id {
            head
        } else {
            offset
        };
        while self.updates.front().is_some_and(|update| update.id < from) {
            self.updates.pop_front();
        }
        self.updates
            .iter()
            .take(limit)
            .map(|update| update.json.clone())
            .collect()
    }

    /// Flood control for one message into `chat_id`: all buckets must allow it, and only then
    /// is a token taken from each (a refused call costs nothing).
    pub(crate) fn rate_check(&mut self, chat_id: i64, kind: ChatKind) -> Result<(), ApiError> {
        let now = self.clock.now();
        let chat = self
            .chat_buckets
            .entry(chat_id)
            .or_insert_with(|| Bucket::new(CHAT_BURST, CHAT_PER_SEC, now));
        let mut wait = chat.wait(now);
        let group_limited = matches!(kind, ChatKind::Group | ChatKind::Supergroup);
        if group_limited {
            let group = self
                .group_buckets
                .entry(chat_id)
                .or_insert_with(|| Bucket::new(GROUP_PER_MIN, GROUP_PER_MIN / 60.0, now));
            wait = wait.max(group.wait(now));
        }
        let bot = self
            .bot_bucket
            .get_or_insert_with(|| Bucket::new(BOT_PER_SEC, BOT_PER_SEC, now));
        wait = wait.max(bot.wait(now));
        if wait > 0.0 {
            return Err(ApiError::too_many_requests(wait.ceil().max(1.0) as u64));
        }
        bot.tokens -= 1.0;
        if let Some(chat) = self.chat_buckets.get_mut(&chat_id) {
            chat.tokens -= 1.0;
        }
        if group_limited && let Some(group) = self.group_buckets.get_mut(&chat_id) {
            group.tokens -= 1.0;
        }
        Ok(())
    }

    pub(crate) fn new_file_id(&mut self, kind: &str, url: &str) -> String {
        let id = format!("SIM{kind}{:08}", self.next_file);
        self.next_file += 1;
        self.files
            .insert(id.clone(), (kind.to_owned(), url.to_owned()));
        id
    }
}

/// A Message inside another (reply_to_message) carries no reply_to_message of its own.
pub(crate) fn nested(raw: &Value) -> Value {
    let mut value = raw.clone();
    if let Some(object) = value.as_object_mut() {
        object.remove("reply_to_message");
    }
    value
}

/// Entities Telegram finds in a user's plain text: a leading bot command and @mentions.
fn user_entities(text: &str, _bot_username: &str) -> Vec<Value> {
    let mut entities = Vec::new();
    let mut utf16 = 0usize;
    let mut at_word_start = true;
    for (index, c) in text.char_indices() {
        if at_word_start && (c == '/' || c == '@') {
            let word: String = text[index..]
                .chars()
                .take_while(|ch| !ch.is_whitespace())
                .collect();
            let body_len = word
                .chars()
                .skip(1)
                .take_while(|ch| ch.is_ascii_alphanumeric() || *ch == '_' || *ch == '@')
                .count();
            if body_len > 0 {
                let kind = if c == '/' { "bot_command" } else { "mention" };
                let length: usize = word.chars().take(body_len + 1).map(char::len_utf16).sum();
                if kind == "mention" || index == 0 {
                    entities.push(json!({"type": kind, "offset": utf16, "length": length}));
                }
            }
        }
        at_word_start = c.is_whitespace();
        utf16 += c.len_utf16();
    }
    entities
}
