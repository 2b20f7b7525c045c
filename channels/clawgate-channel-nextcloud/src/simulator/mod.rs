//! Nextcloud Talk on loopback: the OCS chat API (a user with an app password), the bot API,
//! and the bot webhook sender, as platform-apis-wave2 §6 describes them.
//!
//! [`NextcloudSimulator::start`] binds `127.0.0.1` and serves, under `/ocs/v2.php`:
//!
//! - `GET /cloud/user`, `GET /cloud/capabilities` (spreed features `bots-v1`, `edit-messages`,
//!   `chat-reference-id`; `config.chat.max-length` 32000);
//! - `GET /apps/spreed/api/v4/room`: the user's conversations;
//! - `GET /apps/spreed/api/v1/chat/{token}`: `lookIntoFuture=1` returns the messages after
//!   `lastKnownMessageId` (ascending, `limit` ≤ 200) and long-polls up to `timeout` (≤ 60) s,
//!   answering **304** with no body when nothing came; `lookIntoFuture=0` pages history
//!   backwards; `X-Chat-Last-Given` names the page's last id;
//! - `POST …/chat/{token}` `{message, referenceId?, replyTo?, silent?}` → 201 with the message
//!   (`id`, `referenceId`, `timestamp` in seconds); 400 empty, 403 read-only, 404 not a
//!   participant, 412 lobby, 413 over `max-length`;
//! - `PUT …/chat/{token}/{id}` `{message}` (edit, **24 h**) and `DELETE …/chat/{token}/{id}`
//!   (**6 h**): 200 (202 when a bot is enabled in the conversation) with a system message whose
//!   `parent` is the message; 400 when too old, 403 not the author, 405 not a comment;
//! - `POST …/bot/{token}/message` `{message, referenceId?, replyTo?, silent?}` with
//!   `X-Nextcloud-Talk-Bot-Random` (≥ 32 characters) and `X-Nextcloud-Talk-Bot-Signature` =
//!   hex HMAC-SHA256(secret, random ‖ **message**): **201, no id**; 401 not verified (or the bot
//!   not enabled here), 400 empty, 413 too long. A bot's message shows with
//!   `actorType: "bots"`.
//!
//! Every answer is the OCS envelope `{"ocs":{"meta":{status,statuscode,message},"data"}}`; an
//! unauthenticated call is 401 with statuscode 997. A person writing into a conversation where
//! the bot is enabled fires the bot's webhook: one POST of the Activity Streams event
//! (`X-Nextcloud-Talk-Random`, `X-Nextcloud-Talk-Signature` = hex HMAC(secret, random ‖ body),
//! `X-Nextcloud-Talk-Backend`), a 5-second timeout and **no retry**; anything but 200/202 is
//! recorded as dropped. Bots' messages fire no webhook. Enabling and disabling the bot sends
//! `Join` and `Leave`.
//!
//! It records every call (with whether its answer was written) and every webhook delivery,
//! and injects faults ([`Fault`]): refusals with Talk's statuses and lost answers (the server
//! acts, the connection is cut before the answer). The clock can be moved forward
//! ([`NextcloudSimulator::advance_clock`]) to reach the edit and delete windows.

mod http;
mod webhook;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::sign;

/// How a simulator is set up.
#[derive(Debug, Clone)]
pub struct SimulatorConfig {
    /// Where to listen.
    pub bind: SocketAddr,
    /// The Talk user the app password belongs to.
    pub user: String,
    /// Its display name.
    pub user_display_name: String,
    /// The app password.
    pub app_password: String,
    /// The installed bot's name.
    pub bot_name: String,
    /// The bot's shared secret (40-128 characters).
    pub bot_secret: String,
    /// `spreed.config.chat.max-length`.
    pub max_length: usize,
    /// How long a webhook delivery waits for its answer (Talk: 5 s).
    pub webhook_timeout: Duration,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            user: "clawgate".into(),
            user_display_name: "Clawgate".into(),
            app_password: "QmXkT-9fZc2-Wp4Lr-Hs7Nd-Yv3Ej".into(),
            bot_name: "clawgate-bot".into(),
            bot_secret: "5ecret-of-the-talk-bot-0123456789abcdefghijklmnopqrstuv".into(),
            max_length: 32_000,
            webhook_timeout: Duration::from_secs(5),
        }
    }
}

/// What kind of conversation (Talk's room `type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomType {
    /// 1: a one-to-one conversation.
    OneToOne,
    /// 2: a group conversation.
    Group,
    /// 3: a public conversation.
    Public,
}

impl RoomType {
    fn code(self) -> u8 {
        match self {
            RoomType::OneToOne => 1,
            RoomType::Group => 2,
            RoomType::Public => 3,
        }
    }
}

/// One conversation.
#[derive(Debug, Clone)]
pub struct SimRoom {
    /// The conversation token.
    pub token: String,
    /// Its name.
    pub name: String,
    /// Its type.
    pub kind: RoomType,
    /// Whether the bot is enabled in it.
    pub bot_enabled: bool,
    /// Read-only (sends are 403).
    pub read_only: bool,
    /// The lobby is on for the user (sends are 412).
    pub lobby: bool,
    /// Whether the simulator's user is a participant.
    pub user_joined: bool,
}

/// One chat message as the server keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// The message id (unique, increasing across conversations).
    pub id: i64,
    /// The conversation token.
    pub token: String,
    /// `users`, `bots`, `guests`, … (`""` never).
    pub actor_type: String,
    /// The actor's id.
    pub actor_id: String,
    /// The actor's display name.
    pub actor_display_name: String,
    /// Its text (edited in place).
    pub message: String,
    /// What the sender gave (`""` when nothing).
    pub reference_id: String,
    /// Seconds, on the simulator's clock.
    pub timestamp: i64,
    /// `comment`, `comment_deleted`, `system`.
    pub message_type: String,
    /// The system message identifier (`""` for a written message).
    pub system_message: String,
    /// The affected message of an edit/delete system message.
    pub parent: Option<i64>,
    /// When it was last edited (seconds).
    pub last_edit: Option<i64>,
}

impl SimMessage {
    /// The OCS chat message object.
    pub fn to_json(&self) -> Value {
        let mut m = json!({
            "id": self.id,
            "token": self.token,
            "actorType": self.actor_type,
            "actorId": self.actor_id,
            "actorDisplayName": self.actor_display_name,
            "timestamp": self.timestamp,
            "message": self.message,
            "messageParameters": [],
            "systemMessage": self.system_message,
            "messageType": self.message_type,
            "isReplyable": self.message_type == "comment",
            "referenceId": self.reference_id,
            "reactions": {},
            "expirationTimestamp": 0,
            "markdown": true,
        });
        if let Some(at) = self.last_edit {
            m["lastEditTimestamp"] = json!(at);
        }
        m
    }
}

/// Which call a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `POST …/bot/{token}/message`.
    BotSend,
    /// `POST …/chat/{token}`.
    ChatSend,
    /// `PUT …/chat/{token}/{id}`.
    Edit,
    /// `DELETE …/chat/{token}/{id}`.
    Delete,
    /// `GET …/chat/{token}` (poll or history).
    ChatRead,
}

/// What a faulted call meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Refused with this HTTP status and Talk's envelope; nothing is done.
    Refuse(u16),
    /// The server acts; the connection is cut before the answer.
    LoseAnswer,
    /// A slow server: the answer is computed, then held this long before it is written (a
    /// chat read's page is what the server saw when the call arrived).
    Stall(Duration),
}

/// A fault for calls of `op` (any when `None`), after `after` of them went through, `times`
/// times.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Which calls.
    pub op: Option<Op>,
    /// What they meet.
    pub kind: FaultKind,
    /// Calls let through first.
    pub after: u32,
    /// How many calls meet it.
    pub times: u32,
}

impl Fault {
    /// One call of `op` meets `kind`.
    pub fn new(op: Option<Op>, kind: FaultKind) -> Fault {
        Fault {
            op,
            kind,
            after: 0,
            times: 1,
        }
    }

    /// After `after` calls went through.
    #[must_use]
    pub fn after(mut self, after: u32) -> Fault {
        self.after = after;
        self
    }

    /// `times` calls meet it.
    #[must_use]
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times.max(1);
        self
    }
}

/// One API call.
#[derive(Debug, Clone)]
pub struct CallRecord {
    /// HTTP method.
    pub method: String,
    /// Path.
    pub path: String,
    /// The op, when it is one of the faultable calls.
    pub op: Option<Op>,
    /// The status answered (or that would have been, for a lost answer).
    pub status: u16,
    /// Whether the answer was written.
    pub answered: bool,
    /// The referenceId sent, if any.
    pub reference_id: Option<String>,
}

/// One webhook delivery.
#[derive(Debug, Clone)]
pub struct DeliveryRecord {
    /// Its index.
    pub id: usize,
    /// Where it went.
    pub url: String,
    /// The exact body.
    pub body: String,
    /// `X-Nextcloud-Talk-Random`.
    pub random: String,
    /// `X-Nextcloud-Talk-Signature`.
    pub signature: String,
    /// The answer's status (0: none within the timeout, or a cut connection).
    pub status: u16,
    /// Whether the attempt is over.
    pub done: bool,
    /// How long the answer took (ms), once done.
    pub elapsed_ms: u64,
}

impl DeliveryRecord {
    /// Talk keeps only 200 and 202 as delivered; anything else is dropped (no retry).
    pub fn dropped(&self) -> bool {
        self.done && !matches!(self.status, 200 | 202)
    }

    /// The event's message id (`object.id`), when it is a message.
    pub fn message_id(&self) -> Option<i64> {
        serde_json::from_str::<Value>(&self.body)
            .ok()?
            .pointer("/object/id")?
            .as_i64()
    }
}

pub(crate) struct Delivery {
    pub(crate) record: DeliveryRecord,
}

pub(crate) struct World {
    pub(crate) rooms: Vec<SimRoom>,
    pub(crate) messages: Vec<SimMessage>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) bot_url: Option<String>,
    pub(crate) cut_deliveries: u32,
    pub(crate) next_id: i64,
    pub(crate) clock_offset_s: i64,
}

impl World {
    pub(crate) fn now_s(&self) -> i64 {
        now_s() + self.clock_offset_s
    }

    pub(crate) fn room(&self, token: &str) -> Option<&SimRoom> {
        self.rooms.iter().find(|r| r.token == token)
    }

    /// Posts a message; its id.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn post(
        &mut self,
        token: &str,
        actor_type: &str,
        actor_id: &str,
        display: &str,
        text: &str,
        reference_id: &str,
        system: &str,
        parent: Option<i64>,
    ) -> SimMessage {
        self.next_id += 1;
        let message = SimMessage {
            id: self.next_id,
            token: token.to_owned(),
            actor_type: actor_type.to_owned(),
            actor_id: actor_id.to_owned(),
            actor_display_name: display.to_owned(),
            message: text.to_owned(),
            reference_id: reference_id.to_owned(),
            timestamp: self.now_s(),
            message_type: if system.is_empty() {
                "comment"
            } else {
                "system"
            }
            .to_owned(),
            system_message: system.to_owned(),
            parent,
            last_edit: None,
        };
        self.messages.push(message.clone());
        message
    }

    /// Takes the fault a call of `op` meets now, if any.
    pub(crate) fn fault(&mut self, op: Op) -> Option<FaultKind> {
        let index = self
            .faults
            .iter()
            .position(|f| f.op.is_none_or(|o| o == op))?;
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
}

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    world: Mutex<World>,
    /// Bumped on every new message (wakes long polls).
    pub(crate) news: tokio::sync::watch::Sender<u64>,
    pub(crate) http: reqwest::Client,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    fn new(config: SimulatorConfig, addr: SocketAddr) -> Inner {
        Inner {
            config,
            addr,
            world: Mutex::new(World {
                rooms: Vec::new(),
                messages: Vec::new(),
                calls: Vec::new(),
                deliveries: Vec::new(),
                faults: Vec::new(),
                bot_url: None,
                cut_deliveries: 0,
                // Message ids of a server in use are large.
                next_id: 18_200,
                clock_offset_s: 0,
            }),
            news: tokio::sync::watch::channel(0).0,
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
            shutdown: tokio::sync::watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn wake(&self) {
        self.news.send_modify(|n| *n += 1);
    }

    /// The bot's actor id as Talk shows it (`bot-` and a hash).
    pub(crate) fn bot_actor_id(&self) -> String {
        format!("bot-{}", &sign::reference_id(&self.config.bot_name)[..40])
    }
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A conversation token as Talk makes them (8 lower-case letters and digits).
fn token(seed: i64) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut state = u64::try_from(seed)
        .unwrap_or(1)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        | 1;
    (0..8)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ALPHABET[usize::try_from(state % ALPHABET.len() as u64).unwrap_or(0)] as char
        })
        .collect()
}

/// A running simulator; stops when dropped (or by [`NextcloudSimulator::stop`]).
pub struct NextcloudSimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for NextcloudSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextcloudSimulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl NextcloudSimulator {
    /// Starts a simulator set up by `config`.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<NextcloudSimulator> {
        Ok(NextcloudSimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops serving.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// The server's base URL (`http://127.0.0.1:<port>`), the channel's `base_url`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The configuration.
    pub fn config(&self) -> &SimulatorConfig {
        &self.inner.config
    }

    /// The bot's actor id on its messages.
    pub fn bot_actor_id(&self) -> String {
        self.inner.bot_actor_id()
    }

    /// A new conversation `name` the user is in (with Talk's `conversation_created` system
    /// message).
    pub fn add_conversation(&self, name: &str, kind: RoomType) -> SimRoom {
        let mut world = self.inner.world();
        let seed = world.next_id * 31 + world.rooms.len() as i64;
        let room = SimRoom {
            token: token(seed),
            name: name.to_owned(),
            kind,
            bot_enabled: false,
            read_only: false,
            lobby: false,
            user_joined: true,
        };
        world.rooms.push(room.clone());
        let user = self.inner.config.user.clone();
        let display = self.inner.config.user_display_name.clone();
        world.post(
            &room.token,
            "users",
            &user,
            &display,
            "You created the conversation",
            "",
            "conversation_created",
            None,
        );
        drop(world);
        self.inner.wake();
        room
    }

    /// A conversation by token.
    pub fn conversation(&self, token: &str) -> Option<SimRoom> {
        self.inner.world().room(token).cloned()
    }

    /// Changes a conversation (read-only, lobby, membership).
    pub fn update_conversation(&self, token: &str, change: impl FnOnce(&mut SimRoom)) {
        if let Some(room) = self
            .inner
            .world()
            .rooms
            .iter_mut()
            .find(|r| r.token == token)
        {
            change(room);
        }
    }

    /// Where the bot's webhooks go; `None`: nowhere.
    pub fn set_bot_url(&self, url: Option<&str>) {
        self.inner.world().bot_url = url.map(str::to_owned);
    }

    /// A moderator enables the bot in `token` (Talk sends it `Join`).
    pub fn enable_bot(&self, token: &str) {
        self.set_bot(token, true);
    }

    /// A moderator removes the bot from `token` (Talk sends it `Leave`).
    pub fn disable_bot(&self, token: &str) {
        self.set_bot(token, false);
    }

    fn set_bot(&self, token: &str, enabled: bool) {
        let mut world = self.inner.world();
        let Some(room) = world.rooms.iter_mut().find(|r| r.token == token) else {
            return;
        };
        if room.bot_enabled == enabled {
            return;
        }
        room.bot_enabled = enabled;
        let name = room.name.clone();
        if let Some(url) = world.bot_url.clone() {
            let bot = &self.inner.config.bot_name;
            let event = json!({
                "type": if enabled { "Join" } else { "Leave" },
                "actor": { "type": "Application", "id": format!("bots/{bot}"), "name": bot },
                "object": { "type": "Collection", "id": token, "name": name },
            });
            webhook::enqueue(&self.inner, &mut world, url, event.to_string());
        }
    }

    /// Person `actor_id` (a Nextcloud user) writes `text` into `token`: the message, and the
    /// bot's webhook (one attempt) when the bot is enabled there and has a URL.
    pub fn person_writes(&self, token: &str, actor_id: &str, display: &str, text: &str) -> i64 {
        let mut world = self.inner.world();
        let message = world.post(token, "users", actor_id, display, text, "", "", None);
        let room = world.room(token).cloned();
        if let (Some(room), Some(url)) = (room, world.bot_url.clone())
            && room.bot_enabled
        {
            let event = json!({
                "type": "Create",
                "actor": { "type": "Person", "id": format!("users/{actor_id}"), "name": display },
                "object": {
                    "type": "Note",
                    "id": message.id,
                    "name": "message",
                    "content": json!({ "message": text, "parameters": [] }).to_string(),
                    "mediaType": "text/markdown",
                },
                "target": { "type": "Collection", "id": token, "name": room.name },
            });
            webhook::enqueue(&self.inner, &mut world, url, event.to_string());
        }
        drop(world);
        self.inner.wake();
        message.id
    }

    /// Another bot writes `text` into `token` (`actorType: "bots"`; bots wake no bots).
    pub fn other_bot_writes(&self, token: &str, bot: &str, text: &str) -> i64 {
        let mut world = self.inner.world();
        let id = world
            .post(
                token,
                "bots",
                &format!("bot-{bot}"),
                bot,
                text,
                "",
                "",
                None,
            )
            .id;
        drop(world);
        self.inner.wake();
        id
    }

    /// Every message of `token`, oldest first.
    pub fn messages(&self, token: &str) -> Vec<SimMessage> {
        self.inner
            .world()
            .messages
            .iter()
            .filter(|m| m.token == token)
            .cloned()
            .collect()
    }

    /// Every message, oldest first: the server's own record.
    pub fn all_messages(&self) -> Vec<SimMessage> {
        self.inner.world().messages.clone()
    }

    /// The visible texts the installed bot wrote into `token`, oldest first.
    pub fn bot_texts(&self, token: &str) -> Vec<String> {
        let bot = self.inner.bot_actor_id();
        self.messages(token)
            .into_iter()
            .filter(|m| m.actor_type == "bots" && m.actor_id == bot && m.message_type == "comment")
            .map(|m| m.message)
            .collect()
    }

    /// The visible (not deleted) texts the user wrote into `token`, oldest first.
    pub fn user_texts(&self, token: &str) -> Vec<String> {
        let user = self.inner.config.user.clone();
        self.messages(token)
            .into_iter()
            .filter(|m| {
                m.actor_type == "users" && m.actor_id == user && m.message_type == "comment"
            })
            .map(|m| m.message)
            .collect()
    }

    /// Every API call, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every webhook delivery, oldest first.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner
            .world()
            .deliveries
            .iter()
            .map(|d| d.record.clone())
            .collect()
    }

    /// Sends delivery `id` again (same body, a fresh random and signature) as a new delivery —
    /// Talk itself never does; a proxy might. Its id.
    pub fn replay(&self, id: usize) -> Option<usize> {
        let mut world = self.inner.world();
        let record = world.deliveries.get(id)?.record.clone();
        Some(webhook::enqueue(
            &self.inner,
            &mut world,
            record.url,
            record.body,
        ))
    }

    /// POSTs `body` to `url` with the given headers as they are (a forged or hand-made event).
    pub fn deliver_raw(&self, url: &str, body: &str, random: &str, signature: &str) -> usize {
        let mut world = self.inner.world();
        webhook::enqueue_signed(
            &self.inner,
            &mut world,
            url.to_owned(),
            body.to_owned(),
            random.to_owned(),
            signature.to_owned(),
        )
    }

    /// The next delivery's answer is not read: it counts as failed (status 0) and dropped.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_deliveries += 1;
    }

    /// Waits until every delivery has finished; `false` after `deadline`.
    pub async fn deliveries_settled(&self, deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        loop {
            if self.inner.world().deliveries.iter().all(|d| d.record.done) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Queues a fault.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// Moves the server's clock forward (message timestamps, the edit and delete windows).
    pub fn advance_clock(&self, by: Duration) {
        self.inner.world().clock_offset_s += i64::try_from(by.as_secs()).unwrap_or(i64::MAX);
    }

    /// Per message id, how many visible messages of the user carry each referenceId.
    pub fn reference_counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for m in self.inner.world().messages.iter() {
            if !m.reference_id.is_empty() && m.system_message.is_empty() {
                *counts.entry(m.reference_id.clone()).or_default() += 1;
            }
        }
        counts
    }
}

impl Drop for NextcloudSimulator {
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
    }
}
