//! A Bot API server on loopback that behaves like Telegram's.
//!
//! [`BotApiSimulator::start`] binds `127.0.0.1`, serves `/bot<token>/<method>` with the Bot API's
//! envelope, error texts, `getUpdates` long polling and webhook delivery, and keeps an exact,
//! in-memory record of what landed ([`BotApiSimulator::messages`], [`BotApiSimulator::log`]) so
//! tests judge delivery from it. Tests play the users ([`BotApiSimulator::user_writes`]), break
//! things on purpose ([`BotApiSimulator::inject`]) and drive time
//! ([`BotApiSimulator::advance_clock`]).
//!
//! ```
//! use clawgate_channel_telegram::simulator::{
//!     BotApiSimulator, Fault, FaultKind, SimUser, SimulatorConfig, WriteOptions,
//! };
//! # let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! # runtime.block_on(async {
//! let sim = BotApiSimulator::start(SimulatorConfig::default()).await?;
//! let alice = SimUser::person(1001, "Alice");
//! let chat = sim.private_chat(&alice);
//! let update = sim.user_writes(chat, &alice, "hello bot", WriteOptions::default());
//! assert_eq!(update["message"]["chat"]["type"], "private");
//! assert_eq!(sim.pending_updates(), 1);
//! // A client under test uses `{base_url}/bot{token}/<method>`; the next sendMessage takes
//! // effect but its answer is lost.
//! let _endpoint = format!("{}/bot{}/sendMessage", sim.base_url(), sim.token());
//! sim.inject(Fault::on("sendMessage", FaultKind::LoseAnswer));
//! sim.stop().await;
//! # Ok::<(), std::io::Error>(())
//! # }).unwrap();
//! ```
//!
//! Out-of-process clients drive the same functions over HTTP under `/control/…`: `POST
//! /control/private_chat`, `group`, `supergroup`, `channel`, `topic`, `write`, `edit`, `fault`,
//! `advance_clock`, `block`, `kick`, `upgrade` (JSON bodies), and `GET /control/log`,
//! `messages/{chat_id}`, `drafts/{chat_id}`, `chat_actions/{chat_id}`, `pending_updates`,
//! `webhook_deliveries`, `long_poll`. A mistake answers 400 with `{"error": "…"}`.
//!
//! Invariants: a refused call (error answer, rate limit, injected error, `Unreachable`) has no
//! effect; a call that took effect is in [`BotApiSimulator::messages`] whether or not its answer
//! reached the client; `update_id`s increase by one; every message id is unique in its chat.

mod control;
mod http;
mod markup;
mod methods;
mod state;
mod webhook;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use state::Inner;

/// How a simulator is set up.
#[derive(Clone, PartialEq)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// The one token this server accepts; the bot's user id is the part before `:`.
    pub bot_token: String,
    /// The bot's `username` (getMe, `from` of its messages).
    pub bot_username: String,
    /// Flood control: about 1 message/s per chat with a short burst, about 30/s per bot and
    /// 20/min per group, refused with 429 `Too Many Requests: retry after N`.
    pub rate_limits: bool,
    /// Whether `sendMessageDraft` is permitted for this bot.
    pub drafts_allowed: bool,
    /// The first webhook retry delay; later ones double, capped at a minute.
    pub webhook_retry_base: Duration,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: only the bot id (its public part) is shown.
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("bot_id", &state::bot_id_of(&self.bot_token))
            .field("bot_username", &self.bot_username)
            .field("rate_limits", &self.rate_limits)
            .field("drafts_allowed", &self.drafts_allowed)
            .field("webhook_retry_base", &self.webhook_retry_base)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            bot_token: "123456789:AAtest-simulator-token".to_owned(),
            bot_username: "clawgate_test_bot".to_owned(),
            rate_limits: true,
            drafts_allowed: true,
            webhook_retry_base: Duration::from_secs(1),
        }
    }
}

/// A user of the simulated Telegram (a person or another bot).
#[derive(Debug, Clone, PartialEq)]
pub struct SimUser {
    /// The user id (positive; a private chat with this user has the same id).
    pub id: i64,
    /// `first_name`.
    pub first_name: String,
    /// `username`, without `@`.
    pub username: Option<String>,
    /// Bots never see messages of other bots: a bot's writes make no update.
    pub is_bot: bool,
}

impl SimUser {
    /// A person with no username.
    pub fn person(id: i64, name: &str) -> SimUser {
        SimUser {
            id,
            first_name: name.to_owned(),
            username: None,
            is_bot: false,
        }
    }

    /// Another bot (not the simulated one).
    pub fn bot(id: i64, name: &str) -> SimUser {
        SimUser {
            id,
            first_name: name.to_owned(),
            username: Some(format!("{}_bot", name.to_lowercase().replace(' ', "_"))),
            is_bot: true,
        }
    }

    /// The same user with a username.
    pub fn with_username(mut self, username: &str) -> SimUser {
        self.username = Some(username.to_owned());
        self
    }
}

/// Where a user's message goes inside its chat.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WriteOptions {
    /// A forum topic (`message_thread_id`).
    pub thread_id: Option<i64>,
    /// The message this one replies to.
    pub reply_to: Option<i64>,
}

/// A media attachment sent by URL.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMedia {
    /// `photo`, `document`, `video`, `animation`, `audio` or `voice`.
    pub kind: String,
    /// The URL the bot passed (or the file_id it reused).
    pub url: String,
}

/// A message visible in a chat now.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// `message_id`, unique in the chat.
    pub message_id: i64,
    /// The chat it is in.
    pub chat_id: i64,
    /// Sent by the simulated bot itself.
    pub from_bot_self: bool,
    /// The sender's user id (the bot's id for its own messages; the chat id for channel posts).
    pub from_id: i64,
    /// The visible text (after entity parsing) of a text message.
    pub text: Option<String>,
    /// The visible caption of a media message.
    pub caption: Option<String>,
    /// The attachment of a media message.
    pub media: Option<SimMedia>,
    /// The forum topic.
    pub thread_id: Option<i64>,
    /// The message this one replies to.
    pub reply_to_message_id: Option<i64>,
    /// The quoted part of the replied message.
    pub quote: Option<String>,
    /// The `parse_mode` the bot sent with (last edit wins).
    pub parse_mode: Option<String>,
    /// How many times it was edited.
    pub edit_count: u32,
    /// `date` (unix seconds, simulated clock).
    pub date: i64,
    /// The Message object as the API returns it.
    pub raw: Value,
}

/// One `sendMessageDraft` call that took effect.
#[derive(Debug, Clone, PartialEq)]
pub struct SimDraft {
    /// `draft_id`.
    pub draft_id: i64,
    /// The visible draft text.
    pub text: String,
    /// When it arrived (unix seconds, simulated clock).
    pub at: i64,
}

/// One Bot API call as the server saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// The method in its canonical case (`sendMessage`), whatever case the client used.
    pub method: String,
    /// The `chat_id` parameter when it was a number.
    pub chat_id: Option<i64>,
    /// The HTTP status the call resolved to (200 on success); for an `Unreachable` fault, 0.
    pub status: u16,
    /// The error description, when the call failed.
    pub description: Option<String>,
    /// Whether an HTTP answer was written (false for `LoseAnswer` and `Unreachable`).
    pub answered: bool,
    /// The call's parameters, as strings (JSON values keep their JSON text).
    pub params: serde_json::Map<String, Value>,
}

/// A fault to inject into matching calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// The method it applies to (case-insensitive); `None` = every method.
    pub method: Option<String>,
    /// How many matching calls pass untouched first.
    pub after: u32,
    /// How many matching calls it then hits.
    pub count: u32,
    /// What happens to them.
    pub kind: FaultKind,
}

impl Fault {
    /// The next call of any method, once.
    pub fn once(kind: FaultKind) -> Fault {
        Fault {
            method: None,
            after: 0,
            count: 1,
            kind,
        }
    }

    /// The next call of `method`, once.
    pub fn on(method: &str, kind: FaultKind) -> Fault {
        Fault {
            method: Some(method.to_owned()),
            after: 0,
            count: 1,
            kind,
        }
    }

    /// Let `after` matching calls through first.
    pub fn after(mut self, after: u32) -> Fault {
        self.after = after;
        self
    }

    /// Hit `count` matching calls.
    pub fn times(mut self, count: u32) -> Fault {
        self.count = count;
        self
    }
}

/// What an injected fault does to a call.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Answer with this error; the call has no effect.
    Error {
        /// HTTP status and `error_code`.
        status: u16,
        /// `description`.
        description: String,
        /// `parameters.retry_after` (and the `Retry-After` header).
        retry_after: Option<u64>,
        /// `parameters.migrate_to_chat_id`.
        migrate_to_chat_id: Option<i64>,
    },
    /// The call takes effect, then the connection is closed without an HTTP answer.
    LoseAnswer,
    /// The connection is closed before the call takes effect.
    Unreachable,
    /// The call takes effect; the answer comes after this delay.
    Delay(Duration),
}

impl FaultKind {
    /// An error answer with no parameters.
    pub fn error(status: u16, description: &str) -> FaultKind {
        FaultKind::Error {
            status,
            description: description.to_owned(),
            retry_after: None,
            migrate_to_chat_id: None,
        }
    }

    /// Flood control: 429 `Too Many Requests: retry after N` with `retry_after` and the header.
    pub fn too_many_requests(retry_after_secs: u64) -> FaultKind {
        FaultKind::Error {
            status: 429,
            description: format!("Too Many Requests: retry after {retry_after_secs}"),
            retry_after: Some(retry_after_secs),
            migrate_to_chat_id: None,
        }
    }
}

/// One webhook POST attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookDelivery {
    /// The update delivered.
    pub update_id: i64,
    /// 1 for the first attempt of this update.
    pub attempt: u32,
    /// The HTTP status the webhook answered, or the transport error.
    pub status: Result<u16, String>,
}

/// A running simulator. Clones share the same server.
#[derive(Clone)]
pub struct BotApiSimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BotApiSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret: never printed.
        f.debug_struct("BotApiSimulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl BotApiSimulator {
    /// Binds `config.bind` and starts serving.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<BotApiSimulator> {
        let inner = http::start(config).await?;
        Ok(BotApiSimulator { inner })
    }

    /// `http://127.0.0.1:PORT`; methods are at `{base}/bot{token}/{method}`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The accepted bot token.
    pub fn token(&self) -> &str {
        &self.inner.config.bot_token
    }

    /// The bot's user id (the token's part before `:`).
    pub fn bot_user_id(&self) -> i64 {
        self.inner.bot_id
    }

    /// The private chat with `user` (its id is the user's id), created on first use.
    pub fn private_chat(&self, user: &SimUser) -> i64 {
        self.inner.with_state(|s| s.private_chat(user))
    }

    /// A new basic group (negative id, type `group`) with the bot in it.
    pub fn group(&self, title: &str) -> i64 {
        self.inner.with_state(|s| s.new_group(title))
    }

    /// A new supergroup (`-100…`, type `supergroup`), a forum when `forum`.
    pub fn supergroup(&self, title: &str, forum: bool) -> i64 {
        self.inner
            .with_state(|s| s.new_supergroup(title, forum, "supergroup"))
    }

    /// A new channel (`-100…`, type `channel`) the bot posts in.
    pub fn channel(&self, title: &str) -> i64 {
        self.inner
            .with_state(|s| s.new_supergroup(title, false, "channel"))
    }

    /// A new forum topic in `chat_id`; returns its `message_thread_id`.
    ///
    /// # Panics
    /// When `chat_id` is not a forum supergroup (a test's own mistake).
    pub fn create_topic(&self, chat_id: i64, name: &str) -> i64 {
        self.inner.with_state(|s| s.create_topic(chat_id, name))
    }

    /// `from` writes `text` into `chat_id`; returns the Update as delivered, or `Value::Null`
    /// when `from` is a bot (the message is visible, but bots never see bots).
    ///
    /// # Panics
    /// When the chat does not exist (a test's own mistake).
    pub fn user_writes(
        &self,
        chat_id: i64,
        from: &SimUser,
        text: &str,
        options: WriteOptions,
    ) -> Value {
        let update = self
            .inner
            .with_state(|s| s.user_writes(chat_id, from, text, &options));
        self.inner.updates_changed();
        update
    }

    /// The author edits their message; returns the `edited_message` Update.
    ///
    /// # Panics
    /// When the message does not exist.
    pub fn user_edits(&self, chat_id: i64, message_id: i64, text: &str) -> Value {
        let update = self
            .inner
            .with_state(|s| s.user_edits(chat_id, message_id, text));
        self.inner.updates_changed();
        update
    }

    /// Upgrades a basic group; returns the new supergroup id. Sends to the old id then fail with
    /// 400 `group chat was upgraded to a supergroup chat` and `migrate_to_chat_id`.
    /// Both chats get a service message (`migrate_to_chat_id` / `migrate_from_chat_id`).
    ///
    /// # Panics
    /// When `chat_id` is not a basic group.
    pub fn upgrade_to_supergroup(&self, chat_id: i64) -> i64 {
        let new_id = self.inner.with_state(|s| s.upgrade(chat_id));
        self.inner.updates_changed();
        new_id
    }

    /// The user blocks the bot: sends to their private chat fail with 403
    /// `bot was blocked by the user`, and the bot gets a `my_chat_member` update.
    ///
    /// # Panics
    /// When there is no private chat with `user_id`.
    pub fn block_bot(&self, user_id: i64) {
        self.inner.with_state(|s| s.block(user_id));
        self.inner.updates_changed();
    }

    /// The bot is removed from `chat_id`: sends fail with 403 (`bot was kicked from the group
    /// chat`, its supergroup variant, or `bot is not a member of the channel chat`), and the
    /// bot gets a `my_chat_member` update.
    ///
    /// # Panics
    /// When the chat does not exist.
    pub fn kick_bot(&self, chat_id: i64) {
        self.inner.with_state(|s| s.kick(chat_id));
        self.inner.updates_changed();
    }

    /// The user deletes their account: sends to their private chat fail with 403
    /// `user is deactivated`.
    ///
    /// # Panics
    /// When there is no private chat with `user_id`.
    pub fn deactivate_user(&self, user_id: i64) {
        self.inner.with_state(|s| s.deactivate(user_id));
    }

    /// The messages visible in `chat_id` now, oldest first.
    pub fn messages(&self, chat_id: i64) -> Vec<SimMessage> {
        self.inner.with_state(|s| s.messages(chat_id))
    }

    /// The `sendMessageDraft` calls that took effect in `chat_id`.
    pub fn drafts(&self, chat_id: i64) -> Vec<SimDraft> {
        self.inner.with_state(|s| s.drafts(chat_id))
    }

    /// The `sendChatAction` actions that took effect in `chat_id`.
    pub fn chat_actions(&self, chat_id: i64) -> Vec<String> {
        self.inner.with_state(|s| s.chat_actions(chat_id))
    }

    /// Every Bot API call so far, in the order they resolved.
    pub fn log(&self) -> Vec<CallRecord> {
        self.inner.with_state(|s| s.log.clone())
    }

    /// Adds a fault; faults are matched against calls in arrival order.
    pub fn inject(&self, fault: Fault) {
        self.inner.with_state(|s| s.inject(fault));
    }

    /// Moves the simulated clock forward (message dates, the 48 h delete window, the 24 h
    /// update expiry, flood-control windows).
    pub fn advance_clock(&self, by: Duration) {
        self.inner.with_state(|s| s.clock.advance(by));
        self.inner.updates_changed();
    }

    /// Updates not yet confirmed (and not expired).
    pub fn pending_updates(&self) -> usize {
        self.inner.with_state(|s| s.pending_updates())
    }

    /// Whether a getUpdates request is being held right now (for tests that must wait until
    /// their poll is parked before acting).
    pub fn holding_long_poll(&self) -> bool {
        self.inner.with_state(|s| s.long_poll.is_some())
    }

    /// Every webhook POST attempt so far.
    pub fn webhook_deliveries(&self) -> Vec<WebhookDelivery> {
        self.inner.with_state(|s| s.webhook_deliveries.clone())
    }

    /// The connection of the next webhook delivery drops after the request went out and
    /// before its answer is read: the webhook may have taken the update, the simulator does
    /// not know, and delivers it again later (as Telegram does after a network cut).
    pub fn cut_next_webhook_delivery(&self) {
        self.inner.with_state(|s| s.webhook_cuts += 1);
    }

    /// Stops serving and ends webhook delivery.
    pub async fn stop(self) {
        http::stop(&self.inner).await;
    }
}
