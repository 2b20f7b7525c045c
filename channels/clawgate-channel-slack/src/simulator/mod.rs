//! A Slack workspace on loopback: the Web API (`/api/<method>`) and the Events API sender.
//!
//! [`SlackSimulator::start`] binds `127.0.0.1` and serves the Web API methods the channel uses
//! with Slack's envelope (`ok`, `error`, `warning`), its error codes, `ts` values unique per
//! channel (`"1700000000.000100"`), per-channel posting limits (HTTP 429 + `Retry-After`,
//! error `ratelimited`), message `metadata`, history and thread replies, edits, deletes and
//! the streaming methods with their states. Events (`message` and its `message_changed` /
//! `message_deleted` subtypes) are posted to the configured request URL, signed with the
//! signing secret (`X-Slack-Signature`, `X-Slack-Request-Timestamp`) and retried with
//! `X-Slack-Retry-Num` / `X-Slack-Retry-Reason` when the answer is late or not 2xx.
//!
//! Tests play the people and other bots ([`SlackSimulator::person_writes`],
//! [`SlackSimulator::bot_writes`]), break things ([`SlackSimulator::inject`],
//! [`SlackSimulator::revoke_token`]) and judge from the workspace's own record
//! ([`SlackSimulator::messages`], [`SlackSimulator::calls`], [`SlackSimulator::deliveries`]).
//!
//! Invariants: a refused call (an `ok: false` answer, a 429, an injected error) has no effect;
//! a call that took effect is in [`SlackSimulator::messages`] whether or not its answer reached
//! the client; `ts` values strictly increase per channel.

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
    /// The bot token (`xoxb-…`) this workspace accepts.
    pub bot_token: String,
    /// The app's signing secret: every event delivery is signed with it.
    pub signing_secret: String,
    /// Per-channel posting limit: about one `chat.postMessage` per second with a burst of
    /// three, refused with HTTP 429, `Retry-After` and error `ratelimited`.
    pub rate_limits: bool,
    /// How long the request URL may take to answer before the delivery counts as timed out
    /// (Slack: 3 s).
    pub ack_deadline: Duration,
    /// The delays before retries 1, 2 and 3 (Slack: near-immediately, ~1 min, ~5 min).
    pub retry_delays: [Duration; 3],
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Token and secret are secrets, even in a test workspace.
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("rate_limits", &self.rate_limits)
            .field("ack_deadline", &self.ack_deadline)
            .field("retry_delays", &self.retry_delays)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            bot_token: "xoxb-1-simulator-bot-token".to_owned(),
            signing_secret: "8f742231b10e8888abcd99yyyzzz85a5".to_owned(),
            rate_limits: true,
            ack_deadline: Duration::from_secs(3),
            retry_delays: [
                Duration::from_millis(500),
                Duration::from_secs(60),
                Duration::from_secs(300),
            ],
        }
    }
}

/// The kind of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationKind {
    /// A public channel (`C…`, `channel_type: "channel"`).
    Public,
    /// A private channel (`G…`, `channel_type: "group"`).
    Private,
    /// A direct message with one person (`D…`, `channel_type: "im"`).
    Im,
}

/// The simulator's bot user, and other members of the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimBot {
    /// Its user id (`U…`).
    pub user_id: String,
    /// Its bot id (`B…`).
    pub bot_id: String,
    /// Its app id (`A…`).
    pub app_id: String,
    /// Display name.
    pub name: String,
}

/// One message as the workspace holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// The conversation id.
    pub channel: String,
    /// Its `ts`.
    pub ts: String,
    /// The thread parent's `ts` (replies only).
    pub thread_ts: Option<String>,
    /// The author's user id.
    pub user: String,
    /// Set when an app posted it.
    pub bot_id: Option<String>,
    /// The text now shown.
    pub text: String,
    /// `{"event_type", "event_payload"}`, as posted.
    pub metadata: Option<Value>,
    /// How many times it was edited (`chat.update`, stream appends do not count).
    pub edits: u32,
    /// Deleted: no longer visible, kept in the record.
    pub deleted: bool,
    /// Native stream state: `Some(true)` while streaming, `Some(false)` once stopped.
    pub streaming: Option<bool>,
    /// The person stopped the stream from Slack's UI (appends answer `stopped_by_user`).
    pub stopped_by_user: bool,
    /// Posted by the simulator's own bot (the client under test).
    pub from_self: bool,
}

/// One Web API call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `chat.postMessage`, …
    pub method: String,
    /// The decoded arguments (JSON and form bodies alike).
    pub args: Value,
    /// HTTP status answered (or that would have been, when the answer was lost).
    pub status: u16,
    /// The `error` of an `ok: false` answer.
    pub error: Option<String>,
    /// Whether the answer reached the client.
    pub answered: bool,
}

/// One attempt to deliver an event to the request URL.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The envelope's `event_id`.
    pub event_id: String,
    /// 0 for the first attempt, 1..=3 for retries (`X-Slack-Retry-Num`).
    pub retry_num: u32,
    /// `X-Slack-Retry-Reason` of a retry.
    pub retry_reason: Option<String>,
    /// The status the request URL answered; `None`: no answer in time or no connection.
    pub status: Option<u16>,
}

/// What an injected fault does to the call it meets.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// The call takes effect, then the connection is cut before the answer.
    LoseAnswer,
    /// HTTP `status` with a non-Slack body, no effect (a load balancer's error page).
    ServerError(u16),
    /// HTTP 429 with `Retry-After: secs` and `ratelimited`, no effect.
    RateLimited(u64),
    /// `ok: false` with `error`, HTTP 200, no effect.
    Error(String),
}

/// A fault waiting for a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Only calls of this method meet it (`None`: any method but `auth.test`).
    pub method: Option<String>,
    /// Calls let through before it strikes.
    pub after: u32,
    /// How many calls it strikes.
    pub times: u32,
    /// What it does.
    pub kind: FaultKind,
}

impl Fault {
    /// `kind` on the next call of any method.
    pub fn once(kind: FaultKind) -> Fault {
        Fault {
            method: None,
            after: 0,
            times: 1,
            kind,
        }
    }

    /// `kind` on the next call of `method`.
    pub fn on(method: &str, kind: FaultKind) -> Fault {
        Fault {
            method: Some(method.to_owned()),
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

/// A running simulated workspace. Dropping it leaves the server running until
/// [`SlackSimulator::stop`] or the runtime ends.
#[derive(Debug, Clone)]
pub struct SlackSimulator {
    inner: Arc<Inner>,
}

impl SlackSimulator {
    /// Starts a workspace with its bot user and one person, `U0PERSON` ("ada").
    pub async fn start(config: SimulatorConfig) -> std::io::Result<SlackSimulator> {
        let inner = http::start(config).await?;
        Ok(SlackSimulator { inner })
    }

    /// Stops the server and the event sender.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// `http://127.0.0.1:<port>/api/`: what a client uses as its Web API base.
    pub fn api_url(&self) -> String {
        format!("http://{}/api/", self.inner.addr)
    }

    /// The bot token.
    pub fn token(&self) -> String {
        self.inner.config.bot_token.clone()
    }

    /// The signing secret.
    pub fn signing_secret(&self) -> String {
        self.inner.config.signing_secret.clone()
    }

    /// The workspace's `team_id`.
    pub fn team_id(&self) -> String {
        state::TEAM_ID.to_owned()
    }

    /// The bot the token belongs to.
    pub fn bot(&self) -> SimBot {
        self.inner.world().self_bot.clone()
    }

    /// Where events are posted from now on (`None`: nowhere; events are kept and sent once a
    /// URL is set).
    pub fn set_request_url(&self, url: Option<&str>) {
        self.inner.world().request_url = url.map(str::to_owned);
        self.inner.events_changed.notify_one();
    }

    /// A person of the workspace named `name` (created once per name); returns the user id.
    pub fn person(&self, name: &str) -> String {
        self.inner.world().person(name)
    }

    /// Another app's bot user (created once per name).
    pub fn other_bot(&self, name: &str) -> SimBot {
        self.inner.world().other_bot(name)
    }

    /// A conversation; the bot is a member when `bot_member`. Returns its id.
    pub fn create_conversation(
        &self,
        name: &str,
        kind: ConversationKind,
        bot_member: bool,
    ) -> String {
        self.inner
            .world()
            .create_conversation(name, kind, bot_member)
    }

    /// The direct message between the bot and person `user` (created once).
    pub fn dm(&self, user: &str) -> String {
        self.inner.world().dm(user)
    }

    /// Archives a conversation: posts answer `is_archived`.
    pub fn archive(&self, channel: &str) {
        self.inner.world().archive(channel);
    }

    /// Person `user` writes `text` in `channel` (in the thread of `thread_ts` when given); the
    /// `message` event is queued for the request URL. Returns the message.
    pub fn person_writes(
        &self,
        channel: &str,
        user: &str,
        text: &str,
        thread_ts: Option<&str>,
    ) -> SimMessage {
        let message = self
            .inner
            .world()
            .write(channel, user, None, text, thread_ts, None);
        self.inner.events_changed.notify_one();
        message
    }

    /// Another app's bot posts `text` (with `metadata` when given) in `channel`.
    pub fn bot_writes(
        &self,
        channel: &str,
        bot: &SimBot,
        text: &str,
        thread_ts: Option<&str>,
        metadata: Option<Value>,
    ) -> SimMessage {
        let message =
            self.inner
                .world()
                .write(channel, &bot.user_id, Some(bot), text, thread_ts, metadata);
        self.inner.events_changed.notify_one();
        message
    }

    /// Person `user` edits their message: a `message_changed` event is queued.
    pub fn person_edits(&self, channel: &str, ts: &str, text: &str) -> bool {
        let done = self.inner.world().person_edits(channel, ts, text);
        self.inner.events_changed.notify_one();
        done
    }

    /// A person's message is deleted: a `message_deleted` event is queued.
    pub fn person_deletes(&self, channel: &str, ts: &str) -> bool {
        let done = self.inner.world().person_deletes(channel, ts);
        self.inner.events_changed.notify_one();
        done
    }

    /// The person stops a native stream from Slack's UI.
    pub fn stop_stream_by_user(&self, channel: &str, ts: &str) {
        self.inner.world().stop_stream_by_user(channel, ts);
    }

    /// Sends the event of an earlier one again under a new `event_id`, without retry headers
    /// (Slack has been seen to do this). Returns the new id.
    pub fn resend_event(&self, event_id: &str) -> Option<String> {
        let id = self.inner.world().resend_event(event_id);
        self.inner.events_changed.notify_one();
        id
    }

    /// Delivers event `event_id` again as Slack's next retry (`X-Slack-Retry-Num` one up,
    /// reason `http_timeout`): what Slack does when it never saw an answer, acked or not.
    pub fn redeliver(&self, event_id: &str) -> bool {
        let done = self.inner.world().redeliver(event_id);
        self.inner.events_changed.notify_one();
        done
    }

    /// The next delivery attempt goes out but its answer is never read (a connection dropped
    /// under it): Slack retries it.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_next_delivery = true;
    }

    /// Every `event_id` queued so far, oldest first.
    pub fn event_ids(&self) -> Vec<String> {
        self.inner
            .world()
            .events
            .iter()
            .map(|e| e.id.clone())
            .collect()
    }

    /// The envelope of event `event_id`, as posted.
    pub fn event(&self, event_id: &str) -> Option<Value> {
        self.inner
            .world()
            .events
            .iter()
            .find(|e| e.id == event_id)
            .map(|e| e.body.clone())
    }

    /// Events not yet acknowledged with a 2xx (and not given up).
    pub fn unacknowledged_events(&self) -> usize {
        self.inner
            .world()
            .events
            .iter()
            .filter(|e| !e.acked && !e.given_up)
            .count()
    }

    /// Events given up after the last retry.
    pub fn given_up_events(&self) -> Vec<String> {
        self.inner
            .world()
            .events
            .iter()
            .filter(|e| e.given_up)
            .map(|e| e.id.clone())
            .collect()
    }

    /// Makes a call meet `fault`.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// Revokes the token: every call answers `token_revoked`.
    pub fn revoke_token(&self) {
        self.inner.world().revoked = true;
    }

    /// Closes the edit window of a message: `chat.update` answers `edit_window_closed`.
    pub fn close_edit_window(&self, channel: &str, ts: &str) {
        self.inner.world().close_edit_window(channel, ts);
    }

    /// The visible messages of `channel` (thread replies included), oldest first.
    pub fn messages(&self, channel: &str) -> Vec<SimMessage> {
        self.inner
            .world()
            .all_messages(channel)
            .into_iter()
            .filter(|m| !m.deleted)
            .collect()
    }

    /// Every message ever posted in `channel`, deleted ones included.
    pub fn all_messages(&self, channel: &str) -> Vec<SimMessage> {
        self.inner.world().all_messages(channel)
    }

    /// The visible messages of every conversation.
    pub fn every_message(&self) -> Vec<SimMessage> {
        self.inner.world().every_message()
    }

    /// Every Web API call, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every delivery attempt, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner.world().deliveries.clone()
    }

    /// Waits until every queued event was acknowledged or given up, up to `deadline`; whether
    /// it got there.
    pub async fn events_settled(&self, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if self.unacknowledged_events() == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
