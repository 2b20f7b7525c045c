//! A Discord server on loopback: REST v10 and a Gateway websocket that behave like Discord's
//! (platform-apis §3), with an exact record of what landed.
//!
//! [`DiscordSimulator::start`] binds two ports on `127.0.0.1`: REST under `/api/v10/…`
//! (`Authorization: Bot <token>`, Discord's status codes and `{code, message, errors}` bodies,
//! snowflake ids, the `nonce` + `enforce_nonce` dedupe window, per-route buckets with the
//! `X-RateLimit-*` headers, 429 with `retry_after` and `global`, the invalid-request counter) and
//! the Gateway (hello, heartbeat ACK, identify with intents, READY with `session_id` and
//! `resume_gateway_url`, dispatches with `s`, RESUME replaying what was missed, invalid session,
//! reconnect, close codes). Tests play people and other bots ([`DiscordSimulator::person_writes`]),
//! break things ([`DiscordSimulator::inject`], [`DiscordSimulator::disconnect`]), move time
//! ([`DiscordSimulator::advance_clock`]) and judge from the record ([`DiscordSimulator::messages`],
//! [`DiscordSimulator::calls`]).
//!
//! Invariants: a refused call has no effect; a call that took effect is in the record whether or
//! not its answer reached the client; snowflakes increase; every event of a session has the next
//! `s`, and a resumed session receives every event after the `seq` it names, once.

mod gateway;
mod rest;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use state::Inner;
pub use state::{CallRecord, SimMessage};

/// A REST route family, for faults and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /channels/{id}/messages`.
    CreateMessage,
    /// `PATCH /channels/{id}/messages/{id}`.
    EditMessage,
    /// `DELETE /channels/{id}/messages/{id}`.
    DeleteMessage,
    /// `GET /channels/{id}/messages` and `/messages/{id}`.
    GetMessages,
    /// Everything else (`/users/@me`, `/gateway/bot`, threads, channels).
    Other,
}

/// What a faulty call meets.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Applied, then the connection is cut before the answer.
    LoseAnswer,
    /// The connection is cut before anything happens.
    Unreachable,
    /// Refused with this status, JSON `code` and `message` (nothing happens).
    Error {
        /// HTTP status.
        status: u16,
        /// Discord's JSON code.
        code: i64,
        /// Discord's text.
        message: String,
    },
    /// A 429 on the route's bucket (or the global limit) with this `retry_after`.
    RateLimited {
        /// Seconds, as a float.
        retry_after: f64,
        /// The global limit.
        global: bool,
    },
}

/// One planned fault: after `after` matching calls go through, the next one meets `kind`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Which calls it applies to (`None`: any REST call).
    pub route: Option<Route>,
    /// Matching calls let through first.
    pub after: u32,
    /// What happens.
    pub kind: FaultKind,
}

impl Fault {
    /// The next call on `route` meets `kind`.
    pub fn on(route: Route, kind: FaultKind) -> Fault {
        Fault {
            route: Some(route),
            after: 0,
            kind,
        }
    }

    /// Lets `after` matching calls through first.
    pub fn after(mut self, after: u32) -> Fault {
        self.after = after;
        self
    }
}

/// A request budget: `limit` calls per `per`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// Calls.
    pub limit: u32,
    /// Window.
    pub per: Duration,
}

impl Limit {
    /// `limit` calls per `per`.
    pub const fn new(limit: u32, per: Duration) -> Limit {
        Limit { limit, per }
    }
}

/// How a simulator is set up.
#[derive(Clone, PartialEq)]
pub struct SimulatorConfig {
    /// Where REST listens; `127.0.0.1:0` picks a free port.
    pub rest_bind: SocketAddr,
    /// Where the Gateway listens.
    pub gateway_bind: SocketAddr,
    /// How long `enforce_nonce` remembers a nonce ("the past few minutes").
    pub nonce_window: Duration,
    /// `POST /channels/{id}/messages` per channel.
    pub create_limit: Limit,
    /// `PATCH` and `DELETE` of messages per channel.
    pub edit_limit: Limit,
    /// `GET` of messages per channel.
    pub read_limit: Limit,
    /// Requests per second per bot over every route (Discord: 50).
    pub global_per_second: u32,
    /// 401/403/429 answers per 10 minutes before the client is banned for a while (Discord:
    /// 10,000 per IP).
    pub invalid_request_limit: u32,
    /// `heartbeat_interval` of the Gateway hello.
    pub heartbeat_interval: Duration,
    /// Whether bots may use the privileged MESSAGE_CONTENT intent (else identify closes 4014).
    pub message_content_allowed: bool,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatorConfig")
            .field("rest_bind", &self.rest_bind)
            .field("nonce_window", &self.nonce_window)
            .field("create_limit", &self.create_limit)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        SimulatorConfig {
            rest_bind: loopback,
            gateway_bind: loopback,
            nonce_window: Duration::from_secs(5 * 60),
            create_limit: Limit::new(5, Duration::from_secs(5)),
            edit_limit: Limit::new(5, Duration::from_secs(5)),
            read_limit: Limit::new(50, Duration::from_secs(1)),
            global_per_second: 50,
            invalid_request_limit: 10_000,
            heartbeat_interval: Duration::from_millis(41_250),
            message_content_allowed: true,
        }
    }
}

impl SimulatorConfig {
    /// Limits loose enough for fast tests (the buckets and headers still work).
    pub fn fast() -> SimulatorConfig {
        SimulatorConfig {
            create_limit: Limit::new(1_000, Duration::from_secs(1)),
            edit_limit: Limit::new(1_000, Duration::from_secs(1)),
            read_limit: Limit::new(1_000, Duration::from_secs(1)),
            global_per_second: 10_000,
            ..SimulatorConfig::default()
        }
    }
}

/// A user of the simulator: a person or a bot (with its token).
#[derive(Clone, PartialEq, Eq)]
pub struct SimUser {
    /// Snowflake.
    pub id: String,
    /// User name.
    pub username: String,
    /// A bot account.
    pub bot: bool,
    /// A bot's token.
    pub token: Option<String>,
}

impl std::fmt::Debug for SimUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimUser")
            .field("id", &self.id)
            .field("username", &self.username)
            .field("bot", &self.bot)
            .finish_non_exhaustive()
    }
}

/// Options of a message a person or another bot writes.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// The message it answers.
    pub reply_to: Option<String>,
    /// A nonce, as a client would send it.
    pub nonce: Option<String>,
}

/// The running simulator.
#[derive(Clone)]
pub struct DiscordSimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DiscordSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordSimulator")
            .field("rest", &self.inner.rest_addr.get())
            .field("gateway", &self.inner.gateway_addr.get())
            .finish_non_exhaustive()
    }
}

impl DiscordSimulator {
    /// Starts REST and the Gateway on the configured addresses, with one guild.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<DiscordSimulator> {
        let inner = Inner::new(config);
        rest::start(&inner).await?;
        gateway::start(&inner).await?;
        Ok(DiscordSimulator { inner })
    }

    /// Stops both servers and closes every socket.
    pub async fn stop(&self) {
        self.inner.stop().await;
    }

    /// `http://127.0.0.1:<port>/api/v10` — the REST base a client is given.
    pub fn api_base(&self) -> String {
        format!("http://{}/api/v10", self.inner.rest_addr())
    }

    /// `http://127.0.0.1:<port>` — for clients that add `/api/v10` themselves.
    pub fn http_origin(&self) -> String {
        format!("http://{}", self.inner.rest_addr())
    }

    /// `ws://127.0.0.1:<port>` — what `GET /gateway/bot` answers.
    pub fn gateway_url(&self) -> String {
        format!("ws://{}", self.inner.gateway_addr())
    }

    /// The guild every channel is in.
    pub fn guild_id(&self) -> String {
        self.inner.guild_id()
    }

    /// A new bot account with its token, member of the guild.
    pub fn add_bot(&self, username: &str) -> SimUser {
        self.inner.add_user(username, true)
    }

    /// A new person, member of the guild.
    pub fn add_person(&self, username: &str) -> SimUser {
        self.inner.add_user(username, false)
    }

    /// A new text channel of the guild; returns its id.
    pub fn add_channel(&self, name: &str) -> String {
        self.inner.add_channel(name, None, false)
    }

    /// A DM channel between `person` and `bot`; returns its id.
    pub fn add_dm(&self, person: &SimUser, bot: &SimUser) -> String {
        let id = self
            .inner
            .add_channel(&format!("dm-{}", person.username), None, true);
        let _ = bot;
        id
    }

    /// A public thread under `parent`; returns its id (threads are channels).
    pub fn add_thread(&self, parent: &str, name: &str) -> String {
        self.inner.add_channel(name, Some(parent.to_owned()), false)
    }

    /// Takes `permission` (`SEND_MESSAGES` → 50013, `VIEW_CHANNEL` → 50001) from `bot` in
    /// `channel`.
    pub fn deny(&self, channel: &str, bot: &SimUser, permission: &str) {
        self.inner.deny(channel, &bot.id, permission);
    }

    /// `author` writes `text` in `channel`: the message lands and every bot's session gets a
    /// `MESSAGE_CREATE`.
    pub fn person_writes(
        &self,
        channel: &str,
        author: &SimUser,
        text: &str,
        options: WriteOptions,
    ) -> SimMessage {
        self.inner.write(channel, author, text, options)
    }

    /// The visible messages of `channel`, oldest first (edits applied, deletions gone).
    pub fn messages(&self, channel: &str) -> Vec<SimMessage> {
        self.inner.messages(channel)
    }

    /// Every REST call, in order, with what the simulator answered.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.calls()
    }

    /// 401/403/429 answers counted in the current 10-minute window.
    pub fn invalid_requests(&self) -> u32 {
        self.inner.invalid_requests()
    }

    /// Plans a fault.
    pub fn inject(&self, fault: Fault) {
        self.inner.inject(fault);
    }

    /// Faults planned and not met yet.
    pub fn pending_faults(&self) -> usize {
        self.inner.pending_faults()
    }

    /// Moves the simulator's clock (nonce windows, buckets, snowflake times) forward.
    pub fn advance_clock(&self, by: Duration) {
        self.inner.advance_clock(by);
    }

    /// Drops `bot`'s Gateway connections without a close frame (its session stays resumable).
    /// Returns how many were dropped.
    pub fn disconnect(&self, bot: &SimUser) -> usize {
        self.inner.gateway_command(&bot.id, gateway::Command::Drop)
    }

    /// Closes `bot`'s Gateway connections with `code` (4004, 4014, 4009 …).
    pub fn close(&self, bot: &SimUser, code: u16) -> usize {
        self.inner
            .gateway_command(&bot.id, gateway::Command::Close(code))
    }

    /// Sends `bot` op 7 Reconnect.
    pub fn request_reconnect(&self, bot: &SimUser) -> usize {
        self.inner
            .gateway_command(&bot.id, gateway::Command::Reconnect)
    }

    /// Sends `bot` op 9 Invalid Session; unless `resumable`, its session is gone.
    pub fn invalidate_session(&self, bot: &SimUser, resumable: bool) -> usize {
        self.inner
            .gateway_command(&bot.id, gateway::Command::Invalidate(resumable))
    }

    /// Sends `bot`'s live sessions their message events again (a replay, as a resume from an
    /// older `seq` gets).
    pub fn replay(&self, bot: &SimUser) -> usize {
        self.inner
            .gateway_command(&bot.id, gateway::Command::Replay)
    }

    /// Live Gateway connections of `bot` that have identified or resumed.
    pub fn connected(&self, bot: &SimUser) -> usize {
        self.inner.connected(&bot.id)
    }

    /// Gateway facts per bot: identifies, resumes, heartbeats, the last intents identified.
    pub fn gateway_stats(&self, bot: &SimUser) -> GatewayStats {
        self.inner.gateway_stats(&bot.id)
    }

    /// Every dispatch `bot`'s sessions were sent, as `(session, s, t, d)`, in order.
    pub fn dispatched(&self, bot: &SimUser) -> Vec<(String, u64, String, Value)> {
        self.inner.dispatched(&bot.id)
    }
}

/// What the Gateway saw of one bot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayStats {
    /// Op 2 accepted.
    pub identifies: u32,
    /// Op 6 accepted.
    pub resumes: u32,
    /// Op 6 refused (op 9 answered).
    pub refused_resumes: u32,
    /// Op 1 received.
    pub heartbeats: u32,
    /// Intents of the last identify.
    pub intents: u64,
    /// Sessions created.
    pub sessions: u32,
}
