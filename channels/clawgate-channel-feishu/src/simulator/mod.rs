//! A Feishu / Lark app on loopback: the Open Platform calls the channel makes and the event
//! callbacks it receives, as platform-apis-wave2 §13 describes.
//!
//! [`FeishuSimulator::start`] binds `127.0.0.1` and serves:
//! - `POST /open-apis/auth/v3/tenant_access_token/internal`: `{app_id, app_secret}` →
//!   `{code: 0, tenant_access_token, expire}` (seconds left; a token with more than 30 minutes
//!   left is handed out again); a wrong secret answers HTTP 400 `{code: 10014, msg: "app secret
//!   invalid"}`. Every other call needs `Authorization: Bearer <token>`: missing → 99991661,
//!   unknown or expired → 99991663 (HTTP 400).
//! - `GET /open-apis/bot/v3/info`.
//! - `POST /open-apis/im/v1/messages?receive_id_type=…` and `POST …/messages/{id}/reply`
//!   (`reply_in_thread` opens or joins the answered message's thread), with `uuid` (≤ 50
//!   characters) dedupe for one hour: **a repeat answers code 0 with the message the first
//!   request created** and creates nothing (the facts leave the duplicate's answer unverified;
//!   this is the simulator's decision, see the README; the `uuid` is checked before the
//!   content, also unverified). `GET`, `PUT` (text/post), `PATCH` (cards) and `DELETE` (recall)
//!   of `…/messages/{id}`; `GET /open-apis/im/v1/messages` listing a chat's
//!   (or a thread's) history, paged (`page_size` ≤ 50, `page_token`, `has_more`).
//! - CardKit: `POST /open-apis/cardkit/v1/cards`, `PUT …/cards/{id}/elements/{element}/content`
//!   (strictly increasing `sequence`), `PATCH …/cards/{id}/settings`, `PUT …/cards/{id}`; once
//!   streaming is closed (by the app, the platform's timeout, or a test) element updates answer
//!   300309 and a full card update still works.
//! - Failures in the body: `{code, msg}` with `code ≠ 0`, some under HTTP 200 (230020); the
//!   frequency limit is HTTP 429 `code 99991400` with `x-ogw-ratelimit-limit` and
//!   `x-ogw-ratelimit-reset`.
//!
//! Events are POSTed to the request URL as `{"encrypt"}` (AES-256-CBC, key SHA-256 of the
//! Encrypt Key) with `X-Lark-Request-Timestamp`, `X-Lark-Request-Nonce` and `X-Lark-Signature`,
//! in the schema 2.0 envelope. One not answered 200 within the callback timeout (3 s) is pushed
//! again after each of the redelivery delays (15 s, 5 min, 1 h, 6 h; compressible), then given
//! up; [`FeishuSimulator::redeliver`] and [`FeishuSimulator::repush`] push an acknowledged one
//! again (delivery is at least once).
//!
//! Invariants: a refused call changes nothing; a call that took effect is in the record whether
//! or not its answer reached the client.

mod events;
mod http;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use state::Inner;

/// How a simulator is set up.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// The app's App ID.
    pub app_id: String,
    /// The app's App Secret.
    pub app_secret: String,
    /// The Encrypt Key events are encrypted and signed with.
    pub encrypt_key: String,
    /// The Verification Token carried in every event.
    pub verification_token: String,
    /// How long a tenant access token lives (Feishu: 7200 s).
    pub token_ttl: Duration,
    /// How long a `uuid` dedupes (Feishu: one hour).
    pub uuid_ttl: Duration,
    /// How long a card stays in streaming mode before the platform closes it (Feishu: 10 min).
    pub streaming_timeout: Duration,
    /// How long a callback may take to answer (Feishu: 3 s).
    pub callback_timeout: Duration,
    /// The delays before each re-push (Feishu: 15 s, 5 min, 1 h, 6 h).
    pub redelivery_delays: Vec<Duration>,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets, even in a test app.
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("app_id", &self.app_id)
            .field("redelivery_delays", &self.redelivery_delays)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            app_id: "cli_a1b2c3d4e5f60718".to_owned(),
            app_secret: "simulator-app-secret-0123456789ab".to_owned(),
            encrypt_key: "simulator-encrypt-key".to_owned(),
            verification_token: "simulator-verification-token".to_owned(),
            token_ttl: Duration::from_secs(7_200),
            uuid_ttl: Duration::from_secs(3_600),
            streaming_timeout: Duration::from_secs(600),
            callback_timeout: Duration::from_secs(3),
            redelivery_delays: vec![
                Duration::from_secs(15),
                Duration::from_secs(300),
                Duration::from_secs(3_600),
                Duration::from_secs(6 * 3_600),
            ],
        }
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Author {
    /// A person, by open id.
    Person(String),
    /// The app's bot.
    Bot,
}

/// One message as the platform holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// `om_…`.
    pub message_id: String,
    /// `oc_…`.
    pub chat_id: String,
    /// The thread it is in (`omt_…`).
    pub thread_id: Option<String>,
    /// The message it answers.
    pub parent_id: Option<String>,
    /// Who wrote it.
    pub author: Author,
    /// `text`, `post`, `interactive`, …
    pub msg_type: String,
    /// The content as sent (a JSON string).
    pub content: String,
    /// What it shows now: the text, a post's text, a card's markdown (a card entity's current
    /// text, for a streaming card).
    pub text: String,
    /// The card entity it shows, for `{"type":"card"}` content.
    pub card_id: Option<String>,
    /// Whether that card is still streaming.
    pub streaming: bool,
    /// Recalled.
    pub deleted: bool,
    /// Edited at least once.
    pub updated: bool,
    /// The `uuid` it was sent under.
    pub uuid: Option<String>,
}

impl SimMessage {
    /// Whether the bot sent it.
    pub fn from_bot(&self) -> bool {
        self.author == Author::Bot
    }
}

/// One Open Platform call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `POST`, `PUT`, …
    pub method: String,
    /// The path.
    pub path: String,
    /// The query string.
    pub query: String,
    /// The JSON body (`Null` when there was none).
    pub body: Value,
    /// HTTP status answered (or that would have been, when the answer was lost).
    pub status: u16,
    /// The answer's `code`.
    pub code: i64,
    /// Whether the answer reached the client.
    pub answered: bool,
}

/// One attempt to deliver an event.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The event's `header.event_id` (or the challenge, for a URL verification).
    pub event_id: String,
    /// 1 for the first push.
    pub attempt: u32,
    /// The status the request URL answered; `None`: no answer in time or no connection.
    pub status: Option<u16>,
    /// The exact body posted (`{"encrypt": …}`).
    pub body: String,
    /// `X-Lark-Request-Timestamp`.
    pub timestamp: String,
    /// `X-Lark-Request-Nonce`.
    pub nonce: String,
    /// `X-Lark-Signature`.
    pub signature: String,
}

/// What an injected fault does to the call it meets.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// The call takes effect, then the connection is cut before the answer.
    LoseAnswer,
    /// HTTP `status` with a body that is not Feishu's (a gateway's page), no effect.
    ServerError(u16),
    /// HTTP 500 with Feishu's body (`code 1500`, internal error), no effect.
    InternalError,
    /// HTTP 429 `code 99991400` with `x-ogw-ratelimit-reset: seconds`, no effect.
    RateLimited(u64),
    /// HTTP 400 `code 230020` (the in-API frequency limit), no effect.
    ChatRateLimited,
    /// HTTP `status` with `{code, msg}`, no effect.
    Refuse(u16, i64, String),
}

/// A fault waiting for a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Only calls whose path starts with this meet it (`None`: message create and reply).
    pub path: Option<String>,
    /// Calls let through before it strikes.
    pub after: u32,
    /// How many calls it strikes.
    pub times: u32,
    /// What it does.
    pub kind: FaultKind,
}

/// The path messages are created at.
pub const MESSAGES_PATH: &str = "/open-apis/im/v1/messages";
/// The prefix of every CardKit path.
pub const CARDS_PATH: &str = "/open-apis/cardkit/v1/cards";

impl Fault {
    /// `kind` on the next message create or reply.
    pub fn once(kind: FaultKind) -> Fault {
        Fault {
            path: None,
            after: 0,
            times: 1,
            kind,
        }
    }

    /// `kind` on the next call whose path starts with `path`.
    pub fn on(path: &str, kind: FaultKind) -> Fault {
        Fault {
            path: Some(path.to_owned()),
            ..Fault::once(kind)
        }
    }

    /// After `n` matching calls went through.
    pub fn after(mut self, n: u32) -> Fault {
        self.after = n;
        self
    }

    /// On `n` consecutive matching calls.
    pub fn times(mut self, n: u32) -> Fault {
        self.times = n;
        self
    }
}

/// What a person's message produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// `om_…`.
    pub message_id: String,
    /// The event's `header.event_id`.
    pub event_id: String,
    /// The chat.
    pub chat_id: String,
}

/// A running simulated app. Dropping it leaves the server running until
/// [`FeishuSimulator::stop`] or the runtime ends.
#[derive(Debug, Clone)]
pub struct FeishuSimulator {
    inner: Arc<Inner>,
}

impl FeishuSimulator {
    /// Starts an app with its bot.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<FeishuSimulator> {
        Ok(FeishuSimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops the server and the event sender.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// `http://127.0.0.1:<port>`: what a client uses as its API base (its domain).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The configuration it runs with (secrets included: tests hand them to the channel).
    pub fn config(&self) -> &SimulatorConfig {
        &self.inner.config
    }

    /// The bot's open id.
    pub fn bot_open_id(&self) -> String {
        self.inner.bot_open_id.clone()
    }

    /// Where events are posted from now on (`None`: nowhere; events wait).
    pub fn set_callback_url(&self, url: Option<&str>) {
        self.inner.world().callback_url = url.map(str::to_owned);
        self.inner.changed.notify_one();
    }

    /// A person (created once per name); their open id.
    pub fn person(&self, name: &str) -> String {
        self.inner.world().person(name)
    }

    /// The p2p chat of person `name` with the bot; its chat id.
    pub fn p2p(&self, name: &str) -> String {
        self.inner.world().p2p(name)
    }

    /// A group with the bot and these people (by name); its chat id.
    pub fn group(&self, name: &str, members: &[&str]) -> String {
        self.inner.world().group(name, members)
    }

    /// Removes the bot from a chat: sends there answer 230002.
    pub fn remove_bot(&self, chat_id: &str) {
        self.inner.world().remove_bot(chat_id);
    }

    /// Person `name` writes `text` in chat `chat_id` (their p2p chat or a group).
    pub fn writes(&self, chat_id: &str, name: &str, text: &str) -> Written {
        let written = self.inner.world().write(chat_id, name, text, None, "user");
        self.inner.changed.notify_one();
        written
    }

    /// Person `name` answers message `parent` in its thread.
    pub fn writes_in_thread(&self, parent: &str, name: &str, text: &str) -> Option<Written> {
        let chat = self.message(parent)?.chat_id;
        let written = self
            .inner
            .world()
            .write(&chat, name, text, Some(parent), "user");
        self.inner.changed.notify_one();
        Some(written)
    }

    /// Another app's bot named `name` writes `text` in a group.
    pub fn other_bot_writes(&self, chat_id: &str, name: &str, text: &str) -> Written {
        let written = self.inner.world().write(chat_id, name, text, None, "app");
        self.inner.changed.notify_one();
        written
    }

    /// Makes a call meet `fault`.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// The platform closes card `card_id`'s streaming mode now (as its timeout does).
    pub fn close_streaming(&self, card_id: &str) -> bool {
        self.inner.world().close_streaming(card_id)
    }

    /// Every `uuid` is forgotten (the hour passed).
    pub fn expire_uuids(&self) {
        self.inner.world().uuids.clear();
    }

    /// Every tenant access token expires now.
    pub fn expire_tokens(&self) {
        self.inner.world().tokens.clear();
    }

    /// Event `event_id` is pushed again now, the same event id and body.
    pub fn redeliver(&self, event_id: &str) -> bool {
        let done = self.inner.world().redeliver(event_id);
        self.inner.changed.notify_one();
        done
    }

    /// The message of event `event_id` is pushed again under a new event id.
    pub fn repush(&self, event_id: &str) -> Option<String> {
        let id = self.inner.world().repush(event_id);
        self.inner.changed.notify_one();
        id
    }

    /// The next event delivery goes out but its answer is never read.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_next_delivery = true;
    }

    /// Sends the URL verification request to the callback URL; the challenge it answered.
    pub async fn verify_url(&self) -> Option<String> {
        events::verify_url(&self.inner).await
    }

    /// The message `message_id`, as it shows now.
    pub fn message(&self, message_id: &str) -> Option<SimMessage> {
        let world = self.inner.world();
        world
            .messages
            .iter()
            .find(|m| m.message_id == message_id)
            .map(|m| world.shown(m))
    }

    /// The messages of chat `chat_id`, oldest first, recalled ones included.
    pub fn messages(&self, chat_id: &str) -> Vec<SimMessage> {
        let world = self.inner.world();
        world
            .messages
            .iter()
            .filter(|m| m.chat_id == chat_id)
            .map(|m| world.shown(m))
            .collect()
    }

    /// The bot's messages in `chat_id` that are not recalled, oldest first.
    pub fn bot_messages(&self, chat_id: &str) -> Vec<SimMessage> {
        self.messages(chat_id)
            .into_iter()
            .filter(|m| m.from_bot() && !m.deleted)
            .collect()
    }

    /// Every message of every chat, oldest first.
    pub fn every_message(&self) -> Vec<SimMessage> {
        let world = self.inner.world();
        world.messages.iter().map(|m| world.shown(m)).collect()
    }

    /// Every Open Platform call, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every event delivery attempt, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner.world().deliveries.clone()
    }

    /// The plaintext of event `event_id` (the schema 2.0 envelope).
    pub fn event(&self, event_id: &str) -> Option<Value> {
        self.inner
            .world()
            .events
            .iter()
            .find(|e| e.id == event_id)
            .map(|e| e.plain.clone())
    }

    /// Every event id queued so far, oldest first.
    pub fn event_ids(&self) -> Vec<String> {
        self.inner
            .world()
            .events
            .iter()
            .map(|e| e.id.clone())
            .collect()
    }

    /// Events neither answered 200 nor given up.
    pub fn pending_events(&self) -> usize {
        self.inner
            .world()
            .events
            .iter()
            .filter(|e| !e.acked && !e.given_up)
            .count()
    }

    /// Events given up (no 200 and no re-push left).
    pub fn given_up_events(&self) -> Vec<String> {
        self.inner
            .world()
            .events
            .iter()
            .filter(|e| e.given_up)
            .map(|e| e.id.clone())
            .collect()
    }

    /// Waits until every queued event was answered 200 or given up, up to `deadline`.
    pub async fn events_settled(&self, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if self.pending_events() == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
