//! The workspace: conversations, messages, `ts` values, limits, faults, the call record and
//! the event queue; and the Web API methods acting on it (platform-apis §2.1–2.4).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use super::{
    CallRecord, ConversationKind, DeliveryRecord, Fault, SimBot, SimMessage, SimulatorConfig,
};

pub(crate) const TEAM_ID: &str = "T0SIM0001";
const APP_ID: &str = "A0SIM0001";
/// The deprecated verification token every envelope still carries.
const VERIFICATION_TOKEN: &str = "simulated-verification-token";
/// `text` longer than this is truncated with the warning `message_truncated`.
const MAX_POST_TEXT: usize = 40_000;
/// `chat.update` refuses longer text with `msg_too_long`.
const MAX_UPDATE_TEXT: usize = 4_000;
const MAX_MARKDOWN_TEXT: usize = 12_000;
/// How long the sender waits between looks at the queue when nothing wakes it.
pub(crate) const QUEUE_TICK: Duration = Duration::from_millis(25);
/// Posting burst per channel, refilled at one message per second.
const POST_BURST: f64 = 3.0;

/// A refusal: the HTTP status and Slack's `error` code.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) error: String,
    pub(crate) retry_after: Option<u64>,
}

fn refuse(error: &str) -> ApiError {
    ApiError {
        status: 200,
        error: error.to_owned(),
        retry_after: None,
    }
}

/// One queued event and where its delivery stands.
#[derive(Debug, Clone)]
pub(crate) struct QueuedEvent {
    pub(crate) id: String,
    pub(crate) body: Value,
    pub(crate) acked: bool,
    pub(crate) given_up: bool,
    pub(crate) in_flight: bool,
    /// The retry the next attempt is (0: the first delivery).
    pub(crate) retry_num: u32,
    pub(crate) retry_reason: Option<String>,
    pub(crate) next_at: Instant,
}

#[derive(Debug)]
struct Conversation {
    name: String,
    kind: ConversationKind,
    bot_member: bool,
    archived: bool,
    messages: Vec<SimMessage>,
    edit_closed: Vec<String>,
    /// Posting tokens and when they were counted.
    bucket: (f64, Instant),
}

#[derive(Debug)]
pub(crate) struct World {
    pub(crate) self_bot: SimBot,
    people: BTreeMap<String, String>,
    bots: BTreeMap<String, SimBot>,
    conversations: BTreeMap<String, Conversation>,
    dms: BTreeMap<String, String>,
    next_id: u64,
    last_ts_micros: u64,
    pub(crate) faults: Vec<Fault>,
    pub(crate) revoked: bool,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<DeliveryRecord>,
    pub(crate) events: Vec<QueuedEvent>,
    pub(crate) request_url: Option<String>,
    pub(crate) cut_next_delivery: bool,
    rate_limits: bool,
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
            self_bot: SimBot {
                user_id: "U0BOT0001".into(),
                bot_id: "B0BOT0001".into(),
                app_id: APP_ID.into(),
                name: "clawgate".into(),
            },
            people: BTreeMap::new(),
            bots: BTreeMap::new(),
            conversations: BTreeMap::new(),
            dms: BTreeMap::new(),
            next_id: 1,
            last_ts_micros: 0,
            faults: Vec::new(),
            revoked: false,
            calls: Vec::new(),
            deliveries: Vec::new(),
            events: Vec::new(),
            request_url: None,
            cut_next_delivery: false,
            rate_limits: config.rate_limits,
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

/// An argument as a string: form values are strings already, JSON ones may be numbers or
/// booleans.
pub(crate) fn arg(args: &Value, key: &str) -> Option<String> {
    match args.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        other => Some(other.to_string()),
    }
}

fn flag(args: &Value, key: &str) -> bool {
    arg(args, key).is_some_and(|v| v == "true" || v == "1")
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `ts` as Slack writes it: seconds, a dot, six digits.
fn format_ts(micros: u64) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

fn parse_ts(ts: &str) -> Option<u64> {
    let (secs, frac) = ts.split_once('.')?;
    if frac.len() != 6 {
        return None;
    }
    Some(secs.parse::<u64>().ok()? * 1_000_000 + frac.parse::<u64>().ok()?)
}

/// `metadata` as posted: a JSON object, or (form mode) its JSON text; it needs an
/// `event_type` string and an `event_payload` object.
fn metadata_arg(args: &Value) -> Result<Option<Value>, ApiError> {
    let value = match args.get("metadata") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => {
            serde_json::from_str(s).map_err(|_| refuse("invalid_metadata_format"))?
        }
        Some(other) => other.clone(),
    };
    if value.as_object().is_some_and(serde_json::Map::is_empty) {
        return Ok(Some(value));
    }
    let valid = value.get("event_type").is_some_and(Value::is_string)
        && value.get("event_payload").is_some_and(Value::is_object);
    if !valid {
        return Err(refuse("invalid_metadata_schema"));
    }
    if value.to_string().len() > 8_000 {
        return Err(refuse("metadata_too_large"));
    }
    Ok(Some(value))
}

impl World {
    fn id(&mut self, prefix: char) -> String {
        self.next_id += 1;
        format!("{prefix}0SIM{:05}", self.next_id)
    }

    /// A fresh `ts`: strictly later than every earlier one in the workspace.
    fn ts(&mut self) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        self.last_ts_micros = now.max(self.last_ts_micros + 1);
        format_ts(self.last_ts_micros)
    }

    pub(crate) fn person(&mut self, name: &str) -> String {
        if let Some(id) = self.people.get(name) {
            return id.clone();
        }
        let id = self.id('U');
        self.people.insert(name.to_owned(), id.clone());
        id
    }

    pub(crate) fn other_bot(&mut self, name: &str) -> SimBot {
        if let Some(bot) = self.bots.get(name) {
            return bot.clone();
        }
        let bot = SimBot {
            user_id: self.id('U'),
            bot_id: self.id('B'),
            app_id: self.id('A'),
            name: name.to_owned(),
        };
        self.bots.insert(name.to_owned(), bot.clone());
        bot
    }

    pub(crate) fn create_conversation(
        &mut self,
        name: &str,
        kind: ConversationKind,
        bot_member: bool,
    ) -> String {
        let prefix = match kind {
            ConversationKind::Public => 'C',
            ConversationKind::Private => 'G',
            ConversationKind::Im => 'D',
        };
        let id = self.id(prefix);
        self.conversations.insert(
            id.clone(),
            Conversation {
                name: name.to_owned(),
                kind,
                bot_member,
                archived: false,
                messages: Vec::new(),
                edit_closed: Vec::new(),
                bucket: (POST_BURST, Instant::now()),
            },
        );
        id
    }

    pub(crate) fn dm(&mut self, user: &str) -> String {
        if let Some(id) = self.dms.get(user) {
            return id.clone();
        }
        let id = self.create_conversation(user, ConversationKind::Im, true);
        self.dms.insert(user.to_owned(), id.clone());
        id
    }

    pub(crate) fn archive(&mut self, channel: &str) {
        if let Some(c) = self.conversations.get_mut(channel) {
            c.archived = true;
        }
    }

    pub(crate) fn close_edit_window(&mut self, channel: &str, ts: &str) {
        if let Some(c) = self.conversations.get_mut(channel) {
            c.edit_closed.push(ts.to_owned());
        }
    }

    pub(crate) fn all_messages(&self, channel: &str) -> Vec<SimMessage> {
        self.conversations
            .get(channel)
            .map(|c| c.messages.clone())
            .unwrap_or_default()
    }

    pub(crate) fn every_message(&self) -> Vec<SimMessage> {
        self.conversations
            .values()
            .flat_map(|c| c.messages.iter().filter(|m| !m.deleted).cloned())
            .collect()
    }

    fn channel_type(kind: ConversationKind) -> &'static str {
        match kind {
            ConversationKind::Public => "channel",
            ConversationKind::Private => "group",
            ConversationKind::Im => "im",
        }
    }

    /// A message as the Web API and events show it.
    fn message_json(
        message: &SimMessage,
        self_bot: &SimBot,
        bots: &[SimBot],
        with_metadata: bool,
    ) -> Value {
        let mut json = json!({
            "type": "message",
            "user": message.user,
            "text": message.text,
            "ts": message.ts,
        });
        if let Some(thread) = &message.thread_ts {
            json["thread_ts"] = json!(thread);
        }
        if let Some(bot_id) = &message.bot_id {
            let bot = std::iter::once(self_bot)
                .chain(bots)
                .find(|b| &b.bot_id == bot_id);
            json["subtype"] = json!("bot_message");
            json["bot_id"] = json!(bot_id);
            if let Some(bot) = bot {
                json["app_id"] = json!(bot.app_id);
                json["bot_profile"] = json!({
                    "id": bot.bot_id, "app_id": bot.app_id, "name": bot.name, "team_id": TEAM_ID
                });
            }
        } else {
            json["client_msg_id"] = json!(format!("{}-{}", message.channel, message.ts));
        }
        if message.edits > 0 {
            json["edited"] = json!({ "user": message.user, "ts": message.ts });
        }
        if with_metadata
            && let Some(metadata) = message
                .metadata
                .as_ref()
                .filter(|m| m.get("event_type").is_some())
        {
            json["metadata"] = metadata.clone();
        }
        json
    }

    fn render(&self, message: &SimMessage, with_metadata: bool) -> Value {
        let bots: Vec<SimBot> = self.bots.values().cloned().collect();
        Self::message_json(message, &self.self_bot, &bots, with_metadata)
    }

    /// Queues an event callback carrying `event`.
    fn queue_event(&mut self, event: Value) -> String {
        let id = format!("Ev0SIM{:08}", self.next_id + 1);
        self.next_id += 1;
        let body = json!({
            "token": VERIFICATION_TOKEN,
            "team_id": TEAM_ID,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": id,
            "event_time": now_secs(),
            "authorizations": [{
                "enterprise_id": null, "team_id": TEAM_ID, "user_id": self.self_bot.user_id,
                "is_bot": true, "is_enterprise_install": false
            }],
            "is_ext_shared_channel": false,
            "event_context": format!("4-sim-{id}"),
        });
        self.events.push(QueuedEvent {
            id: id.clone(),
            body,
            acked: false,
            given_up: false,
            in_flight: false,
            retry_num: 0,
            retry_reason: None,
            next_at: Instant::now(),
        });
        id
    }

    fn message_event(&mut self, message: &SimMessage) {
        let Some(kind) = self.conversations.get(&message.channel).map(|c| c.kind) else {
            return;
        };
        let mut event = self.render(message, true);
        event["channel"] = json!(message.channel);
        event["event_ts"] = json!(message.ts);
        event["channel_type"] = json!(Self::channel_type(kind));
        self.queue_event(event);
    }

    /// Someone writes (a person, or another app's bot when `bot` is given).
    pub(crate) fn write(
        &mut self,
        channel: &str,
        user: &str,
        bot: Option<&SimBot>,
        text: &str,
        thread_ts: Option<&str>,
        metadata: Option<Value>,
    ) -> SimMessage {
        let ts = self.ts();
        let message = SimMessage {
            channel: channel.to_owned(),
            ts,
            thread_ts: thread_ts.map(str::to_owned),
            user: user.to_owned(),
            bot_id: bot.map(|b| b.bot_id.clone()),
            text: text.to_owned(),
            metadata,
            edits: 0,
            deleted: false,
            streaming: None,
            stopped_by_user: false,
            from_self: false,
        };
        if let Some(c) = self.conversations.get_mut(channel) {
            c.messages.push(message.clone());
        }
        self.message_event(&message);
        message
    }

    fn find_mut(&mut self, channel: &str, ts: &str) -> Option<&mut SimMessage> {
        self.conversations
            .get_mut(channel)?
            .messages
            .iter_mut()
            .find(|m| m.ts == ts && !m.deleted)
    }

    fn changed_event(&mut self, channel: &str, previous: &SimMessage, current: &SimMessage) {
        let ts = self.ts();
        let event = json!({
            "type": "message", "subtype": "message_changed", "hidden": true,
            "channel": channel, "ts": ts, "event_ts": ts,
            "message": self.render(current, true),
            "previous_message": self.render(previous, true),
        });
        self.queue_event(event);
    }

    fn deleted_event(&mut self, channel: &str, previous: &SimMessage) {
        let ts = self.ts();
        let event = json!({
            "type": "message", "subtype": "message_deleted", "hidden": true,
            "channel": channel, "ts": ts, "event_ts": ts, "deleted_ts": previous.ts,
            "previous_message": self.render(previous, true),
        });
        self.queue_event(event);
    }

    pub(crate) fn person_edits(&mut self, channel: &str, ts: &str, text: &str) -> bool {
        let Some(message) = self.find_mut(channel, ts) else {
            return false;
        };
        let previous = message.clone();
        message.text = text.to_owned();
        message.edits += 1;
        let current = message.clone();
        self.changed_event(channel, &previous, &current);
        true
    }

    pub(crate) fn person_deletes(&mut self, channel: &str, ts: &str) -> bool {
        let Some(message) = self.find_mut(channel, ts) else {
            return false;
        };
        message.deleted = true;
        let previous = message.clone();
        self.deleted_event(channel, &previous);
        true
    }

    pub(crate) fn stop_stream_by_user(&mut self, channel: &str, ts: &str) {
        if let Some(message) = self.find_mut(channel, ts) {
            message.streaming = Some(false);
            message.stopped_by_user = true;
        }
    }

    pub(crate) fn resend_event(&mut self, event_id: &str) -> Option<String> {
        let event = self.events.iter().find(|e| e.id == event_id)?.body["event"].clone();
        Some(self.queue_event(event))
    }

    pub(crate) fn redeliver(&mut self, event_id: &str) -> bool {
        let Some(event) = self.events.iter_mut().find(|e| e.id == event_id) else {
            return false;
        };
        event.acked = false;
        event.given_up = false;
        event.retry_num = (event.retry_num + 1).min(3);
        event.retry_reason = Some("http_timeout".into());
        event.next_at = Instant::now();
        true
    }

    /// The fault this call of `method` meets, if any.
    pub(crate) fn take_fault(&mut self, method: &str) -> Option<super::FaultKind> {
        let index = self.faults.iter().position(|f| {
            f.method
                .as_deref()
                .map_or(method != "auth.test", |m| m == method)
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

    /// Token check: `Authorization: Bearer`, or a `token` argument (form mode).
    pub(crate) fn authorize(&self, token: Option<&str>, expected: &str) -> Result<(), ApiError> {
        match token {
            None | Some("") => Err(refuse("not_authed")),
            Some(_) if self.revoked => Err(refuse("token_revoked")),
            Some(t) if t == expected => Ok(()),
            Some(_) => Err(refuse("invalid_auth")),
        }
    }

    /// Runs one Web API method.
    pub(crate) fn call(&mut self, method: &str, args: &Value) -> Result<Value, ApiError> {
        match method {
            "auth.test" => Ok(json!({
                "ok": true, "url": "https://sim.slack.test/", "team": "Simulated",
                "user": self.self_bot.name, "team_id": TEAM_ID,
                "user_id": self.self_bot.user_id, "bot_id": self.self_bot.bot_id,
            })),
            "chat.postMessage" => self.post_message(args),
            "chat.update" => self.update(args),
            "chat.delete" => self.delete(args),
            "conversations.history" => self.history(args),
            "conversations.replies" => self.replies(args),
            "chat.startStream" => self.start_stream(args),
            "chat.appendStream" => self.append_stream(args),
            "chat.stopStream" => self.stop_stream(args),
            _ => Err(ApiError {
                status: 404,
                error: "unknown_method".into(),
                retry_after: None,
            }),
        }
    }

    /// The conversation a post goes to: it exists, is not archived, has the bot in it.
    fn writable(&mut self, args: &Value) -> Result<String, ApiError> {
        let channel = arg(args, "channel").ok_or_else(|| refuse("channel_not_found"))?;
        let id = if let Some(name) = channel.strip_prefix('#') {
            self.conversations
                .iter()
                .find(|(_, c)| c.name == name)
                .map(|(id, _)| id.clone())
                .ok_or_else(|| refuse("channel_not_found"))?
        } else {
            channel
        };
        let conversation = self
            .conversations
            .get(&id)
            .ok_or_else(|| refuse("channel_not_found"))?;
        if conversation.archived {
            return Err(refuse("is_archived"));
        }
        if !conversation.bot_member {
            return Err(refuse("not_in_channel"));
        }
        Ok(id)
    }

    /// The per-channel posting limit: a burst, then about one per second.
    fn rate_limit(&mut self, channel: &str) -> Result<(), ApiError> {
        if !self.rate_limits {
            return Ok(());
        }
        let Some(c) = self.conversations.get_mut(channel) else {
            return Ok(());
        };
        let now = Instant::now();
        let (tokens, at) = c.bucket;
        let tokens = (tokens + now.duration_since(at).as_secs_f64()).min(POST_BURST);
        if tokens < 1.0 {
            c.bucket = (tokens, now);
            let wait = (1.0 - tokens).ceil().max(1.0) as u64;
            return Err(ApiError {
                status: 429,
                error: "ratelimited".into(),
                retry_after: Some(wait),
            });
        }
        c.bucket = (tokens - 1.0, now);
        Ok(())
    }

    /// The text of a post: `text` or `markdown_text` (not both), or blocks.
    fn content(args: &Value, max_text: usize) -> Result<(String, Vec<&'static str>), ApiError> {
        let text = arg(args, "text").filter(|t| !t.is_empty());
        let markdown = arg(args, "markdown_text").filter(|t| !t.is_empty());
        let blocks = arg(args, "blocks").filter(|b| !b.is_empty() && b != "[]");
        let mut warnings = Vec::new();
        let text = match (text, markdown) {
            (Some(_), Some(_)) => return Err(refuse("markdown_text_conflict")),
            (None, Some(_)) if blocks.is_some() => return Err(refuse("markdown_text_conflict")),
            (None, Some(m)) if m.chars().count() > MAX_MARKDOWN_TEXT => {
                return Err(refuse("invalid_arguments"));
            }
            (None, Some(m)) => m,
            (Some(t), None) => t,
            (None, None) if blocks.is_some() => String::new(),
            (None, None) => return Err(refuse("no_text")),
        };
        let text = if text.chars().count() > max_text {
            warnings.push("message_truncated");
            text.chars().take(max_text).collect()
        } else {
            text
        };
        Ok((text, warnings))
    }

    fn post_message(&mut self, args: &Value) -> Result<Value, ApiError> {
        let channel = self.writable(args)?;
        let (text, warnings) = Self::content(args, MAX_POST_TEXT)?;
        let metadata = metadata_arg(args)?;
        self.rate_limit(&channel)?;
        let thread_ts = arg(args, "thread_ts").filter(|t| !t.is_empty());
        // A reply to a reply lands in the parent's thread.
        let thread_ts = thread_ts.map(|ts| {
            self.all_messages(&channel)
                .iter()
                .find(|m| m.ts == ts)
                .and_then(|m| m.thread_ts.clone())
                .unwrap_or(ts)
        });
        let ts = self.ts();
        let message = SimMessage {
            channel: channel.clone(),
            ts: ts.clone(),
            thread_ts,
            user: self.self_bot.user_id.clone(),
            bot_id: Some(self.self_bot.bot_id.clone()),
            text,
            metadata,
            edits: 0,
            deleted: false,
            streaming: None,
            stopped_by_user: false,
            from_self: true,
        };
        if let Some(c) = self.conversations.get_mut(&channel) {
            c.messages.push(message.clone());
        }
        self.message_event(&message);
        let mut answer = json!({
            "ok": true, "channel": channel, "ts": ts, "message": self.render(&message, true),
        });
        if !warnings.is_empty() {
            answer["warning"] = json!(warnings.join(","));
            answer["response_metadata"] = json!({ "warnings": warnings });
        }
        Ok(answer)
    }

    /// The message `channel` + `ts` names, for an edit by this bot.
    fn own_message(&mut self, args: &Value, not_owned: &str) -> Result<(String, String), ApiError> {
        let channel = arg(args, "channel").ok_or_else(|| refuse("channel_not_found"))?;
        if !self.conversations.contains_key(&channel) {
            return Err(refuse("channel_not_found"));
        }
        let ts = arg(args, "ts").ok_or_else(|| refuse("message_not_found"))?;
        let self_bot = self.self_bot.bot_id.clone();
        let message = self
            .find_mut(&channel, &ts)
            .ok_or_else(|| refuse("message_not_found"))?;
        if message.bot_id.as_deref() != Some(self_bot.as_str()) {
            return Err(refuse(not_owned));
        }
        Ok((channel, ts))
    }

    fn update(&mut self, args: &Value) -> Result<Value, ApiError> {
        let (channel, ts) = self.own_message(args, "cant_update_message")?;
        if self.conversations.get(&channel).is_some_and(|c| c.archived) {
            return Err(refuse("is_archived"));
        }
        if self
            .conversations
            .get(&channel)
            .is_some_and(|c| c.edit_closed.contains(&ts))
        {
            return Err(refuse("edit_window_closed"));
        }
        let (text, _) = Self::content(args, usize::MAX)?;
        if text.chars().count() > MAX_UPDATE_TEXT {
            return Err(refuse("msg_too_long"));
        }
        let metadata = match args.get("metadata") {
            // Omitted: the old metadata stays; `{}` removes it.
            None => None,
            Some(_) => Some(metadata_arg(args)?),
        };
        let Some(message) = self.find_mut(&channel, &ts) else {
            return Err(refuse("message_not_found"));
        };
        if message.streaming == Some(true) {
            return Err(refuse("streaming_state_conflict"));
        }
        let previous = message.clone();
        message.text = text.clone();
        message.edits += 1;
        if let Some(metadata) = metadata {
            message.metadata = metadata.filter(|m| m.get("event_type").is_some());
        }
        let current = message.clone();
        self.changed_event(&channel, &previous, &current);
        Ok(json!({
            "ok": true, "channel": channel, "ts": ts, "text": text,
            "message": self.render(&current, true),
        }))
    }

    fn delete(&mut self, args: &Value) -> Result<Value, ApiError> {
        let (channel, ts) = self.own_message(args, "cant_delete_message")?;
        let Some(message) = self.find_mut(&channel, &ts) else {
            return Err(refuse("message_not_found"));
        };
        message.deleted = true;
        let previous = message.clone();
        self.deleted_event(&channel, &previous);
        Ok(json!({ "ok": true, "channel": channel, "ts": ts }))
    }

    fn readable(&self, args: &Value) -> Result<String, ApiError> {
        let channel = arg(args, "channel").ok_or_else(|| refuse("channel_not_found"))?;
        match self.conversations.get(&channel) {
            None => Err(refuse("channel_not_found")),
            Some(c) if !c.bot_member => Err(refuse("not_in_channel")),
            Some(_) => Ok(channel),
        }
    }

    /// `limit` (default 100, at most 999) and `cursor` (an offset here, opaque to clients).
    fn page(args: &Value, messages: Vec<Value>) -> Result<Value, ApiError> {
        let limit = match arg(args, "limit") {
            Some(l) => l.parse::<usize>().map_err(|_| refuse("invalid_limit"))?,
            None => 100,
        }
        .clamp(1, 999);
        let offset = match arg(args, "cursor").filter(|c| !c.is_empty()) {
            Some(c) => c
                .strip_prefix("bmV4dF9vZmZzZXQ6")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| refuse("invalid_cursor"))?,
            None => 0,
        };
        let page: Vec<Value> = messages.iter().skip(offset).take(limit).cloned().collect();
        let more = offset + page.len() < messages.len();
        let next = if more {
            format!("bmV4dF9vZmZzZXQ6{}", offset + page.len())
        } else {
            String::new()
        };
        Ok(json!({
            "ok": true, "messages": page, "has_more": more,
            "response_metadata": { "next_cursor": next },
        }))
    }

    /// Whether `ts` lies inside `oldest` / `latest` (`inclusive` keeps the bounds).
    fn in_range(args: &Value, ts: &str) -> bool {
        let inclusive = flag(args, "inclusive");
        let at = parse_ts(ts).unwrap_or(0);
        let bound = |key: &str| {
            arg(args, key)
                .and_then(|v| parse_ts(&v).or_else(|| v.parse::<u64>().ok().map(|s| s * 1_000_000)))
        };
        let after_oldest = bound("oldest").is_none_or(|o| if inclusive { at >= o } else { at > o });
        let before_latest =
            bound("latest").is_none_or(|l| if inclusive { at <= l } else { at < l });
        after_oldest && before_latest
    }

    fn history(&mut self, args: &Value) -> Result<Value, ApiError> {
        let channel = self.readable(args)?;
        let with_metadata = flag(args, "include_all_metadata");
        // Newest first; thread replies stay in their threads.
        let messages: Vec<Value> = self
            .all_messages(&channel)
            .iter()
            .rev()
            .filter(|m| !m.deleted)
            .filter(|m| m.thread_ts.as_ref().is_none_or(|t| *t == m.ts))
            .filter(|m| Self::in_range(args, &m.ts))
            .map(|m| {
                let mut json = self.render(m, with_metadata);
                let replies = self
                    .all_messages(&channel)
                    .iter()
                    .filter(|r| {
                        !r.deleted && r.thread_ts.as_deref() == Some(m.ts.as_str()) && r.ts != m.ts
                    })
                    .count();
                if replies > 0 {
                    json["thread_ts"] = json!(m.ts);
                    json["reply_count"] = json!(replies);
                }
                json
            })
            .collect();
        Self::page(args, messages)
    }

    fn replies(&mut self, args: &Value) -> Result<Value, ApiError> {
        let channel = self.readable(args)?;
        let parent = arg(args, "ts").ok_or_else(|| refuse("thread_not_found"))?;
        let with_metadata = flag(args, "include_all_metadata");
        let all = self.all_messages(&channel);
        if !all.iter().any(|m| m.ts == parent && !m.deleted) {
            return Err(refuse("thread_not_found"));
        }
        // The parent first, then its replies, oldest first.
        let messages: Vec<Value> = all
            .iter()
            .filter(|m| !m.deleted)
            .filter(|m| m.ts == parent || m.thread_ts.as_deref() == Some(parent.as_str()))
            .filter(|m| m.ts == parent || Self::in_range(args, &m.ts))
            .map(|m| {
                let mut json = self.render(m, with_metadata);
                json["thread_ts"] = json!(parent);
                json
            })
            .collect();
        Self::page(args, messages)
    }

    fn start_stream(&mut self, args: &Value) -> Result<Value, ApiError> {
        let channel = self.writable(args)?;
        // Streams answer a user request: they live in a thread.
        let thread_ts = arg(args, "thread_ts")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| refuse("invalid_arguments"))?;
        let kind = self.conversations.get(&channel).map(|c| c.kind);
        if kind != Some(ConversationKind::Im)
            && (arg(args, "recipient_user_id").is_none()
                || arg(args, "recipient_team_id").is_none())
        {
            return Err(refuse("invalid_arguments"));
        }
        let text = arg(args, "markdown_text").unwrap_or_default();
        if text.chars().count() > MAX_MARKDOWN_TEXT {
            return Err(refuse("invalid_arguments"));
        }
        let ts = self.ts();
        let message = SimMessage {
            channel: channel.clone(),
            ts: ts.clone(),
            thread_ts: Some(thread_ts),
            user: self.self_bot.user_id.clone(),
            bot_id: Some(self.self_bot.bot_id.clone()),
            text,
            metadata: None,
            edits: 0,
            deleted: false,
            streaming: Some(true),
            stopped_by_user: false,
            from_self: true,
        };
        if let Some(c) = self.conversations.get_mut(&channel) {
            c.messages.push(message);
        }
        Ok(json!({ "ok": true, "channel": channel, "ts": ts }))
    }

    /// The streaming message an append or stop names.
    fn stream(&mut self, args: &Value) -> Result<&mut SimMessage, ApiError> {
        let (channel, ts) = self.own_message(args, "message_not_owned_by_app")?;
        let message = self
            .find_mut(&channel, &ts)
            .ok_or_else(|| refuse("message_not_found"))?;
        if message.stopped_by_user {
            return Err(refuse("stopped_by_user"));
        }
        if message.streaming != Some(true) {
            return Err(refuse("message_not_in_streaming_state"));
        }
        Ok(message)
    }

    fn append_stream(&mut self, args: &Value) -> Result<Value, ApiError> {
        let text = arg(args, "markdown_text")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| refuse("invalid_arguments"))?;
        let message = self.stream(args)?;
        message.text.push_str(&text);
        Ok(json!({ "ok": true, "channel": message.channel, "ts": message.ts }))
    }

    fn stop_stream(&mut self, args: &Value) -> Result<Value, ApiError> {
        let metadata = metadata_arg(args)?;
        let message = self.stream(args)?;
        if let Some(text) = arg(args, "markdown_text") {
            message.text.push_str(&text);
        }
        message.streaming = Some(false);
        if metadata.is_some() {
            message.metadata = metadata;
        }
        let message = message.clone();
        Ok(json!({
            "ok": true, "channel": message.channel, "ts": message.ts,
            "message": self.render(&message, true),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ts_values_have_six_digits_and_parse_back() {
        assert_eq!(format_ts(1_700_000_000_000_100), "1700000000.000100");
        assert_eq!(parse_ts("1700000000.000100"), Some(1_700_000_000_000_100));
        assert_eq!(parse_ts("1700000000.1"), None);
    }
}
