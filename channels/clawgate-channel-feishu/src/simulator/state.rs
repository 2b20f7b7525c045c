//! The platform's state: people, chats, messages, uuids, card entities, tokens, queued events,
//! faults and the record of every call and delivery. Every API decision is made here under one
//! lock, so the record and the answer always agree.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};

use super::{
    Author, CallRecord, DeliveryRecord, Fault, FaultKind, MESSAGES_PATH, SimMessage,
    SimulatorConfig, Written,
};

/// How often the event sender looks at its queue without being told.
pub(crate) const QUEUE_TICK: Duration = Duration::from_millis(50);
/// Longest `uuid`.
const MAX_UUID: usize = 50;

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    pub(crate) bot_open_id: String,
    world: Mutex<World>,
    pub(crate) changed: Notify,
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
        let seed = addr.to_string();
        let bot_open_id = format!("ou_{}", hex_of(&seed, "bot", 32));
        let world = World {
            seed,
            config: config.clone(),
            bot_open_id: bot_open_id.clone(),
            ..World::default()
        };
        Inner {
            config,
            addr,
            bot_open_id,
            world: Mutex::new(world),
            changed: Notify::new(),
            shutdown_tx: watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `len` hex digits derived from the seed, a kind and a name.
pub(crate) fn hex_of(seed: &str, name: &str, len: usize) -> String {
    let digest = Sha256::digest(format!("{seed}/{name}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..len.min(hex.len())].to_owned()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A refusal: HTTP status and Feishu's `{code, msg}` (`code` 0 with `raw`: a non-Feishu body).
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: u16,
    pub(crate) code: i64,
    pub(crate) msg: String,
}

impl ApiError {
    pub(crate) fn new(status: u16, code: i64, msg: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            msg: msg.into(),
        }
    }
}

fn invalid_param(what: &str) -> ApiError {
    ApiError::new(
        400,
        230_001,
        format!("Your request contains an invalid request parameter, ext={what}"),
    )
}

fn validation(what: &str) -> ApiError {
    ApiError::new(400, 99_992_402, format!("field validation failed: {what}"))
}

#[derive(Debug, Clone)]
pub(crate) struct Chat {
    id: String,
    p2p_of: Option<String>,
    bot_member: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Card {
    streaming: bool,
    opened: Instant,
    sequence: i64,
    text: String,
}

#[derive(Debug, Clone)]
pub(crate) struct QueuedEvent {
    pub(crate) id: String,
    pub(crate) plain: Value,
    pub(crate) next_at: Instant,
    pub(crate) pushes: u32,
    pub(crate) acked: bool,
    pub(crate) given_up: bool,
    pub(crate) in_flight: bool,
    /// Pushed again once the attempt in flight ends.
    pub(crate) again: bool,
}

#[derive(Default)]
pub(crate) struct World {
    seed: String,
    config: SimulatorConfig,
    bot_open_id: String,
    counter: u64,
    people: HashMap<String, String>,
    chats: Vec<Chat>,
    pub(crate) messages: Vec<SimMessage>,
    create_times: HashMap<String, u64>,
    pub(crate) uuids: HashMap<String, (String, Instant)>,
    cards: HashMap<String, Card>,
    pub(crate) tokens: HashMap<String, Instant>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) events: Vec<QueuedEvent>,
    pub(crate) deliveries: Vec<DeliveryRecord>,
    pub(crate) callback_url: Option<String>,
    pub(crate) cut_next_delivery: bool,
}

/// The visible text of a content.
fn text_of(msg_type: &str, content: &Value) -> String {
    match msg_type {
        "text" => content["text"].as_str().unwrap_or_default().to_owned(),
        "post" => {
            let post = if content.get("content").is_some() {
                content.clone()
            } else {
                content
                    .as_object()
                    .and_then(|o| o.values().next().cloned())
                    .unwrap_or_default()
            };
            post["content"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|line| {
                    line.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|e| e["text"].as_str())
                        .collect::<String>()
                })
                .collect::<Vec<_>>()
                .join("\n")
        }
        "interactive" => card_text(content),
        _ => String::new(),
    }
}

/// The markdown of a card's elements.
fn card_text(card: &Value) -> String {
    card["body"]["elements"]
        .as_array()
        .or_else(|| card["elements"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|e| e["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

impl World {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn id(&mut self, prefix: &str) -> String {
        let n = self.next();
        format!(
            "{prefix}{}",
            hex_of(&self.seed, &format!("{prefix}{n}"), 32)
        )
    }

    pub(crate) fn person(&mut self, name: &str) -> String {
        if let Some(id) = self.people.get(name) {
            return id.clone();
        }
        let id = format!("ou_{}", hex_of(&self.seed, &format!("person/{name}"), 32));
        self.people.insert(name.to_owned(), id.clone());
        id
    }

    pub(crate) fn p2p(&mut self, name: &str) -> String {
        let open_id = self.person(name);
        if let Some(chat) = self
            .chats
            .iter()
            .find(|c| c.p2p_of.as_deref() == Some(&open_id))
        {
            return chat.id.clone();
        }
        let id = self.id("oc_");
        self.chats.push(Chat {
            id: id.clone(),
            p2p_of: Some(open_id),
            bot_member: true,
        });
        id
    }

    pub(crate) fn group(&mut self, _name: &str, members: &[&str]) -> String {
        for member in members {
            self.person(member);
        }
        let id = self.id("oc_");
        self.chats.push(Chat {
            id: id.clone(),
            p2p_of: None,
            bot_member: true,
        });
        id
    }

    pub(crate) fn remove_bot(&mut self, chat_id: &str) {
        for chat in self.chats.iter_mut().filter(|c| c.id == chat_id) {
            chat.bot_member = false;
        }
    }

    /// A message as it shows now.
    pub(crate) fn shown(&self, m: &SimMessage) -> SimMessage {
        let mut m = m.clone();
        if let Some(card) = m.card_id.as_ref().and_then(|id| self.cards.get(id)) {
            m.text = card.text.clone();
            m.streaming = self.card_streaming(card);
        }
        m
    }

    fn card_streaming(&self, card: &Card) -> bool {
        card.streaming && card.opened.elapsed() < self.config.streaming_timeout
    }

    pub(crate) fn close_streaming(&mut self, card_id: &str) -> bool {
        match self.cards.get_mut(card_id) {
            Some(card) => {
                card.streaming = false;
                true
            }
            None => false,
        }
    }

    /// A person (or another app's bot) writes; the event is queued.
    pub(crate) fn write(
        &mut self,
        chat_id: &str,
        name: &str,
        text: &str,
        parent: Option<&str>,
        sender_type: &str,
    ) -> Written {
        let open_id = self.person(name);
        let content = json!({ "text": text }).to_string();
        let (thread_id, root_id) = match parent {
            Some(parent) => self.thread_of(parent),
            None => (None, None),
        };
        let message_id = self.id("om_");
        let created = now_ms();
        self.create_times.insert(message_id.clone(), created);
        self.messages.push(SimMessage {
            message_id: message_id.clone(),
            chat_id: chat_id.to_owned(),
            thread_id: thread_id.clone(),
            parent_id: parent.map(str::to_owned),
            author: Author::Person(open_id.clone()),
            msg_type: "text".into(),
            content: content.clone(),
            text: text.to_owned(),
            card_id: None,
            streaming: false,
            deleted: false,
            updated: false,
            uuid: None,
        });
        let chat_type = match self.chats.iter().find(|c| c.id == chat_id) {
            Some(chat) if chat.p2p_of.is_some() => "p2p",
            _ => "group",
        };
        let mut message = json!({
            "message_id": message_id, "chat_id": chat_id, "chat_type": chat_type,
            "message_type": "text", "content": content,
            "create_time": created.to_string(), "update_time": created.to_string(),
        });
        if let Some(thread) = &thread_id {
            message["thread_id"] = json!(thread);
            message["root_id"] = json!(root_id);
            message["parent_id"] = json!(parent);
        }
        let event_id = hex_of(&self.seed, &format!("event/{message_id}/0"), 32);
        let plain = json!({
            "schema": "2.0",
            "header": {
                "event_id": event_id, "event_type": "im.message.receive_v1",
                "create_time": created.to_string(), "token": self.config.verification_token,
                "app_id": self.config.app_id, "tenant_key": "simulator-tenant",
            },
            "event": {
                "sender": {
                    "sender_id": { "open_id": open_id, "union_id": format!("on_{}", &open_id[3..]) },
                    "sender_type": sender_type, "tenant_key": "simulator-tenant",
                },
                "message": message,
            },
        });
        self.queue(&event_id, plain);
        Written {
            message_id,
            event_id,
            chat_id: chat_id.to_owned(),
        }
    }

    fn queue(&mut self, event_id: &str, plain: Value) {
        self.events.push(QueuedEvent {
            id: event_id.to_owned(),
            plain,
            next_at: Instant::now(),
            pushes: 0,
            acked: false,
            given_up: false,
            in_flight: false,
            again: false,
        });
    }

    pub(crate) fn redeliver(&mut self, event_id: &str) -> bool {
        let Some(event) = self.events.iter_mut().find(|e| e.id == event_id) else {
            return false;
        };
        if event.in_flight {
            event.again = true;
        } else {
            event.acked = false;
            event.given_up = false;
            event.next_at = Instant::now();
        }
        true
    }

    pub(crate) fn repush(&mut self, event_id: &str) -> Option<String> {
        let mut plain = self.events.iter().find(|e| e.id == event_id)?.plain.clone();
        let n = self.next();
        let id = hex_of(&self.seed, &format!("event/{event_id}/{n}"), 32);
        plain["header"]["event_id"] = json!(id);
        self.queue(&id, plain);
        Some(id)
    }

    /// The thread a reply to `parent` lands in (opened on the parent when it has none), and
    /// the thread's root.
    fn thread_of(&mut self, parent: &str) -> (Option<String>, Option<String>) {
        let existing = self
            .messages
            .iter()
            .find(|m| m.message_id == parent)
            .map(|m| (m.thread_id.clone(), m.parent_id.clone()));
        match existing {
            Some((Some(thread), _)) => {
                let root = self
                    .messages
                    .iter()
                    .find(|m| m.thread_id.as_deref() == Some(&thread) && m.parent_id.is_none())
                    .map(|m| m.message_id.clone());
                (Some(thread), root.or_else(|| Some(parent.to_owned())))
            }
            Some((None, _)) => {
                let thread = self.id("omt_");
                if let Some(m) = self.messages.iter_mut().find(|m| m.message_id == parent) {
                    m.thread_id = Some(thread.clone());
                }
                (Some(thread), Some(parent.to_owned()))
            }
            None => (None, None),
        }
    }

    // ---- tokens ----

    pub(crate) fn issue_token(&mut self, body: &Value) -> Result<Value, ApiError> {
        if body["app_id"].as_str() != Some(self.config.app_id.as_str()) {
            return Err(ApiError::new(400, 10_003, "invalid param"));
        }
        if body["app_secret"].as_str() != Some(self.config.app_secret.as_str()) {
            return Err(ApiError::new(400, 10_014, "app secret invalid"));
        }
        let now = Instant::now();
        let keep = Duration::from_secs(30 * 60);
        let reusable = self
            .tokens
            .iter()
            .filter(|(_, until)| until.saturating_duration_since(now) > keep)
            .max_by_key(|(_, until)| **until)
            .map(|(t, until)| (t.clone(), *until));
        let (token, until) = match reusable {
            Some(found) => found,
            None => {
                let token = format!("t-{}", self.id(""));
                let until = now + self.config.token_ttl;
                self.tokens.insert(token.clone(), until);
                (token, until)
            }
        };
        Ok(
            json!({ "code": 0, "msg": "ok", "tenant_access_token": token,
            "expire": until.saturating_duration_since(now).as_secs() }),
        )
    }

    pub(crate) fn check_token(&self, bearer: Option<&str>) -> Result<(), ApiError> {
        let Some(token) = bearer else {
            return Err(ApiError::new(
                400,
                99_991_661,
                "Missing access token for authorization. Please make a request with token attached.",
            ));
        };
        match self.tokens.get(token) {
            Some(until) if Instant::now() < *until => Ok(()),
            _ => Err(ApiError::new(
                400,
                99_991_663,
                "Invalid access token for authorization. Please make a request with token attached.",
            )),
        }
    }

    pub(crate) fn take_fault(&mut self, path: &str) -> Option<FaultKind> {
        let matches = |f: &Fault| match &f.path {
            Some(prefix) => path.starts_with(prefix.as_str()),
            None => path == MESSAGES_PATH || path.ends_with("/reply"),
        };
        let index = self.faults.iter().position(matches)?;
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

    // ---- messages ----

    fn data_of(&self, m: &SimMessage) -> Value {
        let created = self.create_times.get(&m.message_id).copied().unwrap_or(0);
        let sender = match &m.author {
            Author::Bot => json!({ "id": self.config.app_id, "id_type": "app_id",
                "sender_type": "app", "tenant_key": "simulator-tenant" }),
            Author::Person(open_id) => json!({ "id": open_id, "id_type": "open_id",
                "sender_type": "user", "tenant_key": "simulator-tenant" }),
        };
        let content = if m.deleted {
            json!({ "text": "This message was recalled" }).to_string()
        } else {
            m.content.clone()
        };
        let mut data = json!({
            "message_id": m.message_id, "msg_type": m.msg_type, "chat_id": m.chat_id,
            "create_time": created.to_string(), "update_time": created.to_string(),
            "deleted": m.deleted, "updated": m.updated, "sender": sender,
            "body": { "content": content },
        });
        if let Some(thread) = &m.thread_id {
            data["thread_id"] = json!(thread);
        }
        if let Some(parent) = &m.parent_id {
            data["parent_id"] = json!(parent);
            data["root_id"] = json!(parent);
        }
        data
    }

    fn check_content(
        &self,
        msg_type: &str,
        content: &str,
    ) -> Result<(Value, Option<String>), ApiError> {
        let parsed: Value = serde_json::from_str(content)
            .map_err(|_| invalid_param("content is not a JSON string"))?;
        match msg_type {
            "text" if parsed["text"].is_string() => Ok((parsed, None)),
            "post" if parsed.is_object() => Ok((parsed, None)),
            "interactive" if parsed["type"] == "card" => {
                let card_id = parsed["data"]["card_id"]
                    .as_str()
                    .filter(|id| self.cards.contains_key(*id))
                    .ok_or_else(|| invalid_param("card_id not found"))?;
                Ok((parsed.clone(), Some(card_id.to_owned())))
            }
            "interactive" if parsed.is_object() => Ok((parsed, None)),
            "text" | "post" | "interactive" => Err(invalid_param("content does not fit msg_type")),
            "share_chat" | "share_user" | "image" | "file" | "audio" | "media" | "sticker" => {
                Ok((parsed, None))
            }
            _ => Err(validation("msg_type")),
        }
    }

    fn uuid_hit(&mut self, uuid: Option<&str>) -> Result<Option<Value>, ApiError> {
        let Some(uuid) = uuid else { return Ok(None) };
        if uuid.is_empty() || uuid.chars().count() > MAX_UUID {
            return Err(validation("uuid is at most 50 characters"));
        }
        let ttl = self.config.uuid_ttl;
        self.uuids.retain(|_, (_, at)| at.elapsed() < ttl);
        let Some((message_id, _)) = self.uuids.get(uuid).cloned() else {
            return Ok(None);
        };
        let m = self
            .messages
            .iter()
            .find(|m| m.message_id == message_id)
            .cloned();
        Ok(m.map(|m| self.data_of(&m)))
    }

    fn post(
        &mut self,
        chat_id: &str,
        body: &Value,
        parent: Option<&str>,
        in_thread: bool,
    ) -> Result<Value, ApiError> {
        let msg_type = body["msg_type"]
            .as_str()
            .ok_or_else(|| validation("msg_type"))?;
        let content = body["content"]
            .as_str()
            .ok_or_else(|| validation("content"))?;
        let uuid = body["uuid"].as_str();
        if let Some(original) = self.uuid_hit(uuid)? {
            return Ok(original);
        }
        let (parsed, card_id) = self.check_content(msg_type, content)?;
        let chat = self
            .chats
            .iter()
            .find(|c| c.id == chat_id)
            .ok_or_else(|| invalid_param("invalid receive_id"))?;
        if !chat.bot_member {
            return Err(ApiError::new(
                400,
                230_002,
                "Bot/User can NOT be out of the chat.",
            ));
        }
        let (thread_id, _root) = match parent {
            Some(parent) if in_thread => self.thread_of(parent),
            Some(parent) => (
                self.messages
                    .iter()
                    .find(|m| m.message_id == parent)
                    .and_then(|m| m.thread_id.clone()),
                None,
            ),
            None => (None, None),
        };
        let message_id = self.id("om_");
        self.create_times.insert(message_id.clone(), now_ms());
        let message = SimMessage {
            message_id: message_id.clone(),
            chat_id: chat_id.to_owned(),
            thread_id,
            parent_id: parent.map(str::to_owned),
            author: Author::Bot,
            msg_type: msg_type.to_owned(),
            content: content.to_owned(),
            text: text_of(msg_type, &parsed),
            card_id,
            streaming: false,
            deleted: false,
            updated: false,
            uuid: uuid.map(str::to_owned),
        };
        if let Some(uuid) = uuid {
            self.uuids
                .insert(uuid.to_owned(), (message_id, Instant::now()));
        }
        let data = self.data_of(&message);
        self.messages.push(message);
        Ok(data)
    }

    pub(crate) fn create(
        &mut self,
        query: &HashMap<String, String>,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let kind = query.get("receive_id_type").map(String::as_str);
        let receive_id = body["receive_id"]
            .as_str()
            .ok_or_else(|| validation("receive_id"))?;
        let chat_id = match kind {
            Some("chat_id") => receive_id.to_owned(),
            Some("open_id") => {
                let chat = self
                    .chats
                    .iter()
                    .find(|c| c.p2p_of.as_deref() == Some(receive_id))
                    .map(|c| c.id.clone());
                match chat {
                    Some(chat) => chat,
                    None if self.people.values().any(|p| p == receive_id) => {
                        let name = self
                            .people
                            .iter()
                            .find(|(_, id)| *id == receive_id)
                            .map(|(n, _)| n.clone())
                            .unwrap_or_default();
                        self.p2p(&name)
                    }
                    None => return Err(invalid_param("invalid receive_id")),
                }
            }
            Some("user_id" | "union_id" | "email") => {
                return Err(invalid_param(
                    "this simulator addresses open_id and chat_id only",
                ));
            }
            _ => return Err(validation("receive_id_type")),
        };
        self.post(&chat_id, body, None, false)
    }

    pub(crate) fn reply(&mut self, parent: &str, body: &Value) -> Result<Value, ApiError> {
        let answered = self
            .messages
            .iter()
            .find(|m| m.message_id == parent)
            .cloned()
            .ok_or_else(|| invalid_param("message_id not found"))?;
        if answered.deleted {
            return Err(ApiError::new(400, 230_011, "The message was withdrawn."));
        }
        let in_thread = body["reply_in_thread"] == Value::Bool(true);
        self.post(&answered.chat_id, body, Some(parent), in_thread)
    }

    fn own_message(&mut self, message_id: &str) -> Result<&mut SimMessage, ApiError> {
        let m = self
            .messages
            .iter_mut()
            .find(|m| m.message_id == message_id)
            .ok_or_else(|| invalid_param("message_id not found"))?;
        if m.deleted {
            return Err(ApiError::new(400, 230_011, "The message was withdrawn."));
        }
        if m.author != Author::Bot {
            return Err(ApiError::new(
                400,
                230_027,
                "Lack of necessary permissions.",
            ));
        }
        Ok(m)
    }

    pub(crate) fn update(
        &mut self,
        message_id: &str,
        body: &Value,
        patch: bool,
    ) -> Result<Value, ApiError> {
        let content = body["content"]
            .as_str()
            .ok_or_else(|| validation("content"))?
            .to_owned();
        let msg_type = if patch {
            "interactive".to_owned()
        } else {
            body["msg_type"]
                .as_str()
                .ok_or_else(|| validation("msg_type"))?
                .to_owned()
        };
        let (parsed, _) = self.check_content(&msg_type, &content)?;
        let m = self.own_message(message_id)?;
        let editable = if patch {
            m.msg_type == "interactive"
        } else {
            matches!(m.msg_type.as_str(), "text" | "post")
                && matches!(msg_type.as_str(), "text" | "post")
        };
        if !editable {
            return Err(invalid_param(
                "this message type cannot be updated this way",
            ));
        }
        m.content = content;
        m.msg_type = msg_type.clone();
        m.text = text_of(&msg_type, &parsed);
        m.updated = true;
        m.card_id = None;
        let m = m.clone();
        Ok(self.data_of(&m))
    }

    /// `GET /open-apis/im/v1/messages/{id}`: `{items: [message]}`.
    pub(crate) fn get(&self, message_id: &str) -> Result<Value, ApiError> {
        let m = self
            .messages
            .iter()
            .find(|m| m.message_id == message_id)
            .ok_or_else(|| invalid_param("message_id not found"))?;
        Ok(json!({ "items": [self.data_of(m)] }))
    }

    pub(crate) fn recall(&mut self, message_id: &str) -> Result<Value, ApiError> {
        let m = self.own_message(message_id)?;
        m.deleted = true;
        Ok(json!({}))
    }

    pub(crate) fn list(&self, query: &HashMap<String, String>) -> Result<Value, ApiError> {
        let container = query
            .get("container_id")
            .ok_or_else(|| validation("container_id"))?;
        let by_thread = match query.get("container_id_type").map(String::as_str) {
            Some("chat") => false,
            Some("thread") => true,
            _ => return Err(validation("container_id_type")),
        };
        let start = query
            .get("start_time")
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
            * 1_000;
        let end = query
            .get("end_time")
            .and_then(|s| s.parse::<u64>().ok())
            .map_or(u64::MAX, |e| e.saturating_mul(1_000) + 999);
        let size = query
            .get("page_size")
            .and_then(|s| s.parse::<usize>().ok())
            .unwrap_or(20);
        if !(1..=50).contains(&size) {
            return Err(validation("page_size is 1 to 50"));
        }
        let offset = match query.get("page_token") {
            Some(token) => token
                .strip_prefix("page-")
                .and_then(|n| n.parse::<usize>().ok())
                .ok_or_else(|| invalid_param("page_token"))?,
            None => 0,
        };
        let mut items: Vec<&SimMessage> = self
            .messages
            .iter()
            .filter(|m| {
                if by_thread {
                    m.thread_id.as_deref() == Some(container.as_str())
                } else {
                    // A chat's history holds thread roots, not the replies inside threads.
                    m.chat_id == *container && (m.thread_id.is_none() || m.parent_id.is_none())
                }
            })
            .filter(|m| {
                let at = self.create_times.get(&m.message_id).copied().unwrap_or(0);
                at >= start && at <= end
            })
            .collect();
        if query.get("sort_type").map(String::as_str) == Some("ByCreateTimeDesc") {
            items.reverse();
        }
        let page: Vec<Value> = items
            .iter()
            .skip(offset)
            .take(size)
            .map(|m| self.data_of(&self.shown(m)))
            .collect();
        let has_more = offset + size < items.len();
        let mut data = json!({ "has_more": has_more, "items": page });
        if has_more {
            data["page_token"] = json!(format!("page-{}", offset + size));
        }
        Ok(data)
    }

    // ---- cards ----

    pub(crate) fn create_card(&mut self, body: &Value) -> Result<Value, ApiError> {
        if body["type"] != "card_json" {
            return Err(validation("type must be card_json"));
        }
        let card: Value = body["data"]
            .as_str()
            .and_then(|d| serde_json::from_str(d).ok())
            .ok_or_else(|| validation("data is a card JSON string"))?;
        if card["schema"] != "2.0" {
            return Err(ApiError::new(
                400,
                300_301,
                "card schema 2.0 is required for card entities",
            ));
        }
        let n = self.next();
        let card_id = format!("7{:018}", n);
        self.cards.insert(
            card_id.clone(),
            Card {
                streaming: card["config"]["streaming_mode"] == Value::Bool(true),
                opened: Instant::now(),
                sequence: 0,
                text: card_text(&card),
            },
        );
        Ok(json!({ "card_id": card_id }))
    }

    fn card(&mut self, card_id: &str, sequence: &Value) -> Result<&mut Card, ApiError> {
        let sequence = sequence.as_i64().ok_or_else(|| validation("sequence"))?;
        let card = self
            .cards
            .get_mut(card_id)
            .ok_or_else(|| ApiError::new(400, 300_300, "card not found"))?;
        if sequence <= card.sequence {
            return Err(ApiError::new(
                400,
                300_317,
                "sequence number compare failed",
            ));
        }
        card.sequence = sequence;
        Ok(card)
    }

    pub(crate) fn stream_element(
        &mut self,
        card_id: &str,
        element: &str,
        body: &Value,
    ) -> Result<Value, ApiError> {
        let content = body["content"]
            .as_str()
            .ok_or_else(|| validation("content"))?
            .to_owned();
        let timeout = self.config.streaming_timeout;
        let streaming = self
            .cards
            .get(card_id)
            .map(|c| c.streaming && c.opened.elapsed() < timeout);
        if streaming == Some(false) {
            return Err(ApiError::new(400, 300_309, "streaming mode is closed"));
        }
        if element != crate::render::CARD_ELEMENT_ID {
            return Err(ApiError::new(400, 300_302, "element not found"));
        }
        let card = self.card(card_id, &body["sequence"])?;
        card.text = content;
        Ok(json!({}))
    }

    pub(crate) fn card_settings(&mut self, card_id: &str, body: &Value) -> Result<Value, ApiError> {
        let settings: Value = body["settings"]
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| validation("settings is a JSON string"))?;
        let timeout = self.config.streaming_timeout;
        let closed = self
            .cards
            .get(card_id)
            .is_some_and(|c| !c.streaming || c.opened.elapsed() >= timeout);
        let card = self.card(card_id, &body["sequence"])?;
        if let Some(mode) = settings["config"]["streaming_mode"].as_bool() {
            if mode && closed {
                return Err(ApiError::new(400, 300_309, "streaming mode is closed"));
            }
            card.streaming = mode;
        }
        Ok(json!({}))
    }

    pub(crate) fn replace_card(&mut self, card_id: &str, body: &Value) -> Result<Value, ApiError> {
        let card_json: Value = body["card"]["data"]
            .as_str()
            .and_then(|d| serde_json::from_str(d).ok())
            .ok_or_else(|| validation("card.data is a card JSON string"))?;
        let card = self.card(card_id, &body["sequence"])?;
        card.text = card_text(&card_json);
        if card_json["config"]["streaming_mode"] != Value::Bool(true) {
            card.streaming = false;
        }
        Ok(json!({}))
    }

    pub(crate) fn bot_info(&self) -> Value {
        json!({ "code": 0, "msg": "ok", "bot": { "activate_status": 2, "app_name": "clawgate simulator",
            "avatar_url": "", "ip_white_list": [], "open_id": self.bot_open_id } })
    }

    // ---- events ----

    /// The body, timestamp, nonce and signature of a push of event `index`.
    pub(crate) fn sealed(&mut self, plain: &Value) -> (String, String, String, String) {
        let n = self.next();
        let iv_hex = hex_of(&self.seed, &format!("iv/{n}"), 32);
        let mut iv = [0u8; 16];
        for (i, b) in iv.iter_mut().enumerate() {
            *b = u8::from_str_radix(&iv_hex[i * 2..i * 2 + 2], 16).unwrap_or(0);
        }
        let encrypted =
            crate::crypto::encrypt(plain.to_string().as_bytes(), &self.config.encrypt_key, iv);
        let body = json!({ "encrypt": encrypted }).to_string();
        let timestamp = (now_ms() / 1_000).to_string();
        let nonce = hex_of(&self.seed, &format!("nonce/{n}"), 16);
        let signature = crate::crypto::sign(
            &timestamp,
            &nonce,
            &self.config.encrypt_key,
            body.as_bytes(),
        );
        (body, timestamp, nonce, signature)
    }
}
