//! Twitch chat on loopback: TMI (Twitch's IRC dialect) over plain TCP and over WebSocket, and
//! Helix `POST /helix/chat/messages`, with Twitch's chat rules and an exact record of what
//! landed.
//!
//! [`TwitchSimulator::start`] binds three listeners on `127.0.0.1`: IRC over TCP
//! ([`TwitchSimulator::irc_port`]), IRC over WebSocket ([`TwitchSimulator::irc_ws_url`], what
//! browser clients and `tmi.js` use) and Helix ([`TwitchSimulator::helix_base`]). Tests play the
//! people ([`TwitchSimulator::person_writes`]), moderate ([`TwitchSimulator::set_moderator`],
//! [`TwitchSimulator::set_slow_mode`], bans, timeouts, AutoMod terms), break things on purpose
//! ([`TwitchSimulator::inject`]) and drive the clock ([`TwitchSimulator::advance_clock`]).
//!
//! The rules, as `platform-apis-wave2.md` §8 gives them:
//! - `PASS oauth:<token>` + `NICK <login>`; `justinfan…` logs in anonymously (read only). A bad
//!   token: `NOTICE * :Login authentication failed`, then the link closes.
//! - `CAP REQ :twitch.tv/tags twitch.tv/commands` → `CAP * ACK`; tags and `USERSTATE`/`ROOMSTATE`
//!   only for connections that asked.
//! - Our own `PRIVMSG` is never echoed to the connection that sent it; it gets a `USERSTATE`
//!   with the message's `id` instead. A dropped message is a `NOTICE` with `msg-id`
//!   (`msg_duplicate` within 30 s, `msg_ratelimit` past 20 / 30 s or 100 / 30 s for the
//!   broadcaster, moderators and VIPs, `msg_slowmode`, `msg_banned`, `msg_timedout`,
//!   `msg_rejected` for AutoMod or a bad reply parent).
//! - Helix answers a dropped message with 200, `is_sent: false` and the same `drop_reason`
//!   codes; errors are `{"error","status","message"}`; every answer carries `Ratelimit-Limit`,
//!   `Ratelimit-Remaining` and `Ratelimit-Reset`, and an empty points bucket answers 429.
//!   `broadcaster_id` and `sender_id` may be query parameters or body fields. The same endpoint
//!   is served at `/mock/chat/messages`, and `oauth2/validate` at `/auth/validate`: the layout
//!   of twitch-cli's mock API, which client libraries can be pointed at.
//!
//! Choices where Twitch documents nothing (each marked in the code): a message over 500
//! characters is refused (Helix 400; IRC `msg_rejected`); a message sent through Helix is
//! relayed to every IRC connection in the channel, the sender's own included.
//!
//! Invariant: a message is in [`TwitchSimulator::messages`] if and only if Twitch would show it,
//! whether or not the answer reached the client.

mod helix;
mod irc;
pub(crate) mod state;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use state::{Out, Posted, State};
use tokio::task::JoinHandle;

/// How a simulator is set up.
#[derive(Clone, PartialEq, Eq)]
pub struct SimulatorConfig {
    /// The bot's login (IRC nick).
    pub bot_login: String,
    /// The bot's user id (Helix `sender_id`).
    pub bot_user_id: String,
    /// The bot's OAuth token (IRC `PASS oauth:<token>`, Helix `Bearer <token>`).
    pub bot_token: String,
    /// The application's client id (Helix `Client-Id`).
    pub client_id: String,
    /// Channels that exist from the start (broadcaster logins).
    pub channels: Vec<String>,
    /// Whether the chat rate limits apply.
    pub rate_limits: bool,
    /// Messages per 30 s for a normal user (Twitch: 20).
    pub rate_limit: u32,
    /// Messages per 30 s for the broadcaster, moderators and VIPs (Twitch: 100).
    pub elevated_rate_limit: u32,
    /// Helix points per minute (Twitch: 800).
    pub helix_points_per_minute: u32,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a secret even in a simulator: it is never printed.
        f.debug_struct("SimulatorConfig")
            .field("bot_login", &self.bot_login)
            .field("bot_user_id", &self.bot_user_id)
            .field("channels", &self.channels)
            .field("rate_limits", &self.rate_limits)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bot_login: "clawgate_bot".into(),
            bot_user_id: "900001".into(),
            bot_token: "simulatedbottoken0123456789".into(),
            client_id: "simulatedclientid".into(),
            channels: vec!["clawchan".into()],
            rate_limits: true,
            rate_limit: 20,
            elevated_rate_limit: 100,
            helix_points_per_minute: 800,
        }
    }
}

/// A user of the simulated Twitch.
#[derive(Clone, PartialEq, Eq)]
pub struct SimUser {
    /// The user id.
    pub id: String,
    /// The login (lowercase).
    pub login: String,
    /// The display name.
    pub display_name: String,
    /// The user's OAuth token (for a client logging in as this user).
    pub token: String,
}

impl std::fmt::Debug for SimUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimUser")
            .field("id", &self.id)
            .field("login", &self.login)
            .finish_non_exhaustive()
    }
}

/// How a message reached the chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A `PRIVMSG` on an IRC connection.
    Irc,
    /// Helix `POST /helix/chat/messages`.
    Helix,
    /// [`TwitchSimulator::person_writes`].
    Control,
}

/// One message in a channel, as Twitch keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMessage {
    /// The message id (a UUID, as Twitch's).
    pub id: String,
    /// The channel (broadcaster login, no `#`).
    pub channel: String,
    /// Who sent it.
    pub sender_login: String,
    /// Their user id.
    pub sender_id: String,
    /// Their display name.
    pub display_name: String,
    /// The text.
    pub text: String,
    /// The message it replies to: id, sender login, text.
    pub reply_parent: Option<(String, String, String)>,
    /// The `client-nonce` tag the sender gave.
    pub client_nonce: Option<String>,
    /// How it was sent.
    pub via: Via,
    /// `tmi-sent-ts`.
    pub sent_ts_ms: u64,
    /// When it was posted, on the simulator's clock.
    pub posted_at: Instant,
}

/// One attempt to post, with what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// How it was tried.
    pub via: Via,
    /// Who tried.
    pub sender: String,
    /// Where.
    pub channel: String,
    /// What.
    pub text: String,
    /// What came of it.
    pub outcome: AttemptOutcome,
}

/// What came of a post.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// It landed with this id.
    Sent(String),
    /// A chat rule dropped it (`msg-id` / `drop_reason.code`).
    Dropped(String),
}

/// What the next matching call meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Helix answers this status with a Helix error body; nothing is posted.
    HelixError {
        /// HTTP status.
        status: u16,
        /// The body's `message`.
        message: String,
    },
    /// Helix posts the message, then the connection breaks before the body arrives.
    HelixLoseAnswer,
    /// Helix answers 200 `is_sent: false` with this drop reason; nothing is posted.
    HelixDrop {
        /// `drop_reason.code`.
        code: String,
        /// `drop_reason.message`.
        message: String,
    },
    /// The next `PRIVMSG` is dropped with a `NOTICE` of this `msg-id`.
    IrcDrop {
        /// The `msg-id`.
        msg_id: String,
        /// The notice's text.
        message: String,
    },
    /// The next `PRIVMSG` is posted, then its connection closes before anything else is
    /// answered.
    IrcCutAfterPost,
}

impl FaultKind {
    fn via(&self) -> Via {
        match self {
            FaultKind::HelixError { .. }
            | FaultKind::HelixLoseAnswer
            | FaultKind::HelixDrop { .. } => Via::Helix,
            FaultKind::IrcDrop { .. } | FaultKind::IrcCutAfterPost => Via::Irc,
        }
    }
}

/// A fault and when it strikes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// What happens.
    pub kind: FaultKind,
    /// Calls of its transport let through first.
    pub after: u32,
    /// How many calls meet it.
    pub times: u32,
}

impl Fault {
    /// The next call of the fault's transport meets `kind`.
    pub fn once(kind: FaultKind) -> Fault {
        Fault {
            kind,
            after: 0,
            times: 1,
        }
    }

    /// After `after` calls go through.
    pub fn after(mut self, after: u32) -> Fault {
        self.after = after;
        self
    }

    /// `times` calls in a row.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times.max(1);
        self
    }
}

pub(crate) struct Inner {
    pub(crate) state: Mutex<State>,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
}

impl Inner {
    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A running simulator; stopped when dropped or with [`TwitchSimulator::stop`].
pub struct TwitchSimulator {
    inner: Arc<Inner>,
    irc: SocketAddr,
    ws: SocketAddr,
    http: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for TwitchSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwitchSimulator")
            .field("irc", &self.irc)
            .field("ws", &self.ws)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl TwitchSimulator {
    /// Binds the three listeners on free loopback ports and starts serving.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<TwitchSimulator> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::new(config)),
            shutdown: tokio::sync::watch::channel(false).0,
        });
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let irc_listener = tokio::net::TcpListener::bind(loopback).await?;
        let ws_listener = tokio::net::TcpListener::bind(loopback).await?;
        let http_listener = tokio::net::TcpListener::bind(loopback).await?;
        let (irc, ws, http) = (
            irc_listener.local_addr()?,
            ws_listener.local_addr()?,
            http_listener.local_addr()?,
        );
        let tasks = vec![
            tokio::spawn(irc::serve_tcp(inner.clone(), irc_listener)),
            tokio::spawn(irc::serve_ws(inner.clone(), ws_listener)),
            tokio::spawn(helix::serve(inner.clone(), http_listener)),
        ];
        Ok(TwitchSimulator {
            inner,
            irc,
            ws,
            http,
            tasks,
        })
    }

    /// The TMI port (plain TCP on 127.0.0.1).
    pub fn irc_port(&self) -> u16 {
        self.irc.port()
    }

    /// TMI over WebSocket: `ws://127.0.0.1:<port>`.
    pub fn irc_ws_url(&self) -> String {
        format!("ws://{}", self.ws)
    }

    /// The WebSocket port.
    pub fn irc_ws_port(&self) -> u16 {
        self.ws.port()
    }

    /// Helix: `http://127.0.0.1:<port>/helix`.
    pub fn helix_base(&self) -> String {
        format!("http://{}/helix", self.http)
    }

    /// The HTTP port of Helix.
    pub fn helix_port(&self) -> u16 {
        self.http.port()
    }

    /// The configuration the simulator runs with.
    pub fn config(&self) -> SimulatorConfig {
        self.inner.state().config.clone()
    }

    /// A person (created on first use; the same login gives the same user).
    pub fn person(&self, login: &str) -> SimUser {
        self.inner.state().add_user(login)
    }

    /// Creates a channel (its broadcaster's login); returns its room id.
    pub fn add_channel(&self, login: &str) -> String {
        self.inner.state().add_channel(login)
    }

    /// The room id of `channel`.
    pub fn room_id(&self, channel: &str) -> Option<String> {
        let channel = normal(channel);
        self.inner.state().rooms.get(&channel).map(|r| r.id.clone())
    }

    /// `user` writes `text` into `channel` (a reply to `reply_to` if given); relayed to every
    /// connection there. No chat rule is asked: a person's message always lands.
    pub fn person_writes(
        &self,
        channel: &str,
        user: &SimUser,
        text: &str,
        reply_to: Option<&str>,
    ) -> SimMessage {
        let channel = normal(channel);
        let mut state = self.inner.state();
        state.add_channel(&channel);
        state.add_user(&user.login);
        let saved = std::mem::replace(&mut state.config.rate_limits, false);
        let posted = state.post(&user.login, &channel, text, reply_to, None, Via::Control);
        state.config.rate_limits = saved;
        match posted {
            Posted::Sent(message) => {
                state.relay(&message, None);
                *message
            }
            Posted::Dropped { code, message } => {
                panic!("a person's message was dropped ({code}: {message}): a test bug")
            }
        }
    }

    /// Makes `login` a moderator of `channel` (or not); its connections get a fresh `USERSTATE`.
    pub fn set_moderator(&self, channel: &str, login: &str, moderator: bool) {
        let (channel, login) = (normal(channel), normal(login));
        let mut state = self.inner.state();
        if let Some(room) = state.rooms.get_mut(&channel) {
            if moderator {
                room.moderators.insert(login.clone());
            } else {
                room.moderators.remove(&login);
            }
        }
        irc::send_userstate_to(&state, &channel, &login, None);
    }

    /// Makes `login` a VIP of `channel` (or not).
    pub fn set_vip(&self, channel: &str, login: &str, vip: bool) {
        let (channel, login) = (normal(channel), normal(login));
        let mut state = self.inner.state();
        if let Some(room) = state.rooms.get_mut(&channel) {
            if vip {
                room.vips.insert(login.clone());
            } else {
                room.vips.remove(&login);
            }
        }
        irc::send_userstate_to(&state, &channel, &login, None);
    }

    /// Slow mode: one message per `secs` for normal users (0: off); a `ROOMSTATE` goes out.
    pub fn set_slow_mode(&self, channel: &str, secs: u64) {
        let channel = normal(channel);
        let mut state = self.inner.state();
        if let Some(room) = state.rooms.get_mut(&channel) {
            room.slow_secs = secs;
        }
        irc::send_roomstate(&state, &channel, Some(&format!("slow={secs}")));
    }

    /// Bans `login` from `channel` (or lifts the ban).
    pub fn ban(&self, channel: &str, login: &str, banned: bool) {
        let (channel, login) = (normal(channel), normal(login));
        if let Some(room) = self.inner.state().rooms.get_mut(&channel) {
            if banned {
                room.banned.insert(login);
            } else {
                room.banned.remove(&login);
            }
        }
    }

    /// Times `login` out of `channel` for `secs`.
    pub fn timeout(&self, channel: &str, login: &str, secs: u64) {
        let (channel, login) = (normal(channel), normal(login));
        let mut state = self.inner.state();
        let until = state.now() + Duration::from_secs(secs);
        if let Some(room) = state.rooms.get_mut(&channel) {
            room.timed_out.insert(login, until);
        }
    }

    /// AutoMod holds every message containing `term` in `channel`.
    pub fn automod_hold(&self, channel: &str, term: &str) {
        let channel = normal(channel);
        if let Some(room) = self.inner.state().rooms.get_mut(&channel) {
            room.held_terms.push(term.to_owned());
        }
    }

    /// Queues a fault.
    pub fn inject(&self, fault: Fault) {
        self.inner.state().faults.push(fault);
    }

    /// Faults still queued.
    pub fn pending_faults(&self) -> usize {
        self.inner.state().faults.len()
    }

    /// Moves the simulated clock (the 30 s windows, slow mode, timeouts) forward.
    pub fn advance_clock(&self, by: Duration) {
        self.inner.state().advance(by);
    }

    /// The messages of `channel`, oldest first: the platform's record of what landed.
    pub fn messages(&self, channel: &str) -> Vec<SimMessage> {
        let channel = normal(channel);
        self.inner
            .state()
            .rooms
            .get(&channel)
            .map(|r| r.messages.clone())
            .unwrap_or_default()
    }

    /// Every post attempt, in order.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.inner.state().attempts.clone()
    }

    /// The channels `login`'s connections are in (one entry per connection and channel).
    pub fn joined(&self, login: &str) -> Vec<String> {
        let login = normal(login);
        self.inner
            .state()
            .conns
            .values()
            .filter(|c| c.login.as_deref() == Some(login.as_str()))
            .flat_map(|c| c.joined.iter().cloned())
            .collect()
    }

    /// How many connections are logged in as `login`.
    pub fn connections(&self, login: &str) -> usize {
        let login = normal(login);
        self.inner
            .state()
            .conns
            .values()
            .filter(|c| c.login.as_deref() == Some(login.as_str()))
            .count()
    }

    /// `PING :tmi.twitch.tv` to every connection.
    pub fn ping_all(&self) {
        for conn in self.inner.state().conns.values() {
            conn.send("PING :tmi.twitch.tv");
        }
    }

    /// `PONG`s received from `login`'s connections.
    pub fn pongs(&self, login: &str) -> u64 {
        let login = normal(login);
        self.inner
            .state()
            .conns
            .values()
            .filter(|c| c.login.as_deref() == Some(login.as_str()))
            .map(|c| c.pongs)
            .sum()
    }

    /// `:tmi.twitch.tv RECONNECT` to every connection, then each is closed (Twitch's restart).
    pub fn reconnect_all(&self) {
        for conn in self.inner.state().conns.values() {
            conn.send(":tmi.twitch.tv RECONNECT");
            let _ = conn.tx.send(Out::Close);
        }
    }

    /// Closes `login`'s connections without a word (a network cut).
    pub fn cut(&self, login: &str) {
        let login = normal(login);
        for conn in self.inner.state().conns.values() {
            if conn.login.as_deref() == Some(login.as_str()) {
                let _ = conn.tx.send(Out::Close);
            }
        }
    }

    /// Stops the listeners and closes every connection.
    pub async fn stop(mut self) {
        self.shutdown();
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }

    fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        for conn in self.inner.state().conns.values() {
            let _ = conn.tx.send(Out::Close);
        }
    }
}

impl Drop for TwitchSimulator {
    fn drop(&mut self) {
        self.shutdown();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A channel or login as the simulator keys it: lowercase, no `#`.
fn normal(name: &str) -> String {
    name.trim_start_matches('#').to_ascii_lowercase()
}
