//! Microsoft Teams on loopback: the Bot Connector a bot calls, the token endpoint it gets its
//! access tokens from, and the Bot Framework side that POSTs activities to the bot.
//!
//! [`TeamsSimulator::start`] binds `127.0.0.1` and serves (platform-apis-wave2 §12):
//! - `POST /botframework.com/oauth2/v2.0/token`: client credentials (`client_id` = the app id,
//!   `client_secret`, `scope=https://api.botframework.com/.default`) → `{"token_type":"Bearer",
//!   "expires_in", "access_token"}`; a wrong secret is 401 `invalid_client` (AADSTS7000215).
//! - `POST /v3/conversations/{id}/activities` (send) and `…/activities/{activityId}` (reply) →
//!   201 `ResourceResponse {"id"}`; `PUT …/activities/{activityId}` (update, the whole
//!   activity) → 200; `DELETE …/activities/{activityId}` → 200. A channel thread is addressed
//!   as `{channel id};messageid={root}`. Every call needs `Authorization: Bearer <token>` from
//!   the token endpoint (else 401 `{"message":"Authorization has been denied for this
//!   request."}`); refusals are `{"error":{"code","message"}}`.
//! - Teams streaming in 1:1 chats (bots/streaming-ux.md): a `typing` activity with text and a
//!   `streaminfo` entity (`streamType` `informative`|`streaming`, `streamSequence` 1) → 201
//!   `{"id": streamId}` (400 "Start streaming activities should include text" without text);
//!   more `typing` activities with `streamId` and a greater `streamSequence` → 202 `{}`; an
//!   out-of-order one → 202 with `ContentStreamSequenceOrderPreConditionFailed`, dropped; the
//!   `message` with `streamType: final` and no sequence ends it. 403 `ContentStreamNotAllowed`
//!   outside 1:1 chats, on a completed stream, past the total streaming time (2 minutes), for
//!   a message too large, and after the person pressed Stop ([`TeamsSimulator::cancel_stream`]).
//!   At most one streaming request a second per stream (429 otherwise).
//! - Rate limits per bot per conversation on sends: 7/1 s, 8/2 s, 60/30 s, 1800/3600 s → 429
//!   with `Retry-After` (seconds).
//! - `GET /v1/.well-known/openidconfiguration` and the JWKS it names (keys with
//!   `endorsements`). Every activity for the bot is POSTed to its endpoint
//!   ([`TeamsSimulator::set_endpoint`]) with `Authorization: Bearer <JWT>` signed by that key:
//!   `iss` `https://api.botframework.com`, `aud` the app id, `serviceurl` the service URL.
//!   An attempt answered other than 2xx in time is made again after each of `retry_delays`,
//!   then given up (the Bot Framework's schedule is not in the material read; a retry is what
//!   exercises the bot's dedupe).
//!
//! Teams never delivers the bot's own activities back to it. Tests play people
//! ([`TeamsSimulator::person_writes`]), break things ([`TeamsSimulator::inject`]) and judge from
//! the platform's own record ([`TeamsSimulator::activities`], [`TeamsSimulator::calls`],
//! [`TeamsSimulator::deliveries`]).
//!
//! Invariants: a refused call has no effect; a call that took effect is in the record whether
//! or not its answer reached the client.

mod http;
pub mod keys;
mod sender;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use state::Inner;
pub use state::{MAX_MESSAGE_BYTES, SEND_LIMITS};

/// The token endpoint's path (as on `login.microsoftonline.com`).
pub const TOKEN_PATH: &str = "/botframework.com/oauth2/v2.0/token";

/// How a simulator is set up.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// The bot's Microsoft App ID (the `aud` of its inbound tokens, its `client_id`).
    pub app_id: String,
    /// The app's client secret the token endpoint accepts.
    pub app_password: String,
    /// How long issued access tokens are accepted (`expires_in`).
    pub token_lifetime: Duration,
    /// The per-conversation send limits are enforced.
    pub rate_limits: bool,
    /// The least time between two requests of one stream (Teams: one a second).
    pub stream_min_interval: Duration,
    /// How long a stream may take from its start to its final (Teams: two minutes).
    pub stream_max_duration: Duration,
    /// How long the bot may take to answer an activity before the attempt counts as failed.
    pub answer_deadline: Duration,
    /// The waits before each further attempt of an unanswered activity; then it is given up.
    pub retry_delays: Vec<Duration>,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("app_id", &self.app_id)
            .field("rate_limits", &self.rate_limits)
            .field("stream_min_interval", &self.stream_min_interval)
            .field("stream_max_duration", &self.stream_max_duration)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            app_id: "8d3c4f2a-6b1e-4c5d-9a7f-0e2b3c4d5e6f".to_owned(),
            app_password: "simulator~client~secret".to_owned(),
            token_lifetime: Duration::from_secs(3_599),
            rate_limits: true,
            stream_min_interval: Duration::from_secs(1),
            stream_max_duration: Duration::from_secs(120),
            answer_deadline: Duration::from_secs(15),
            retry_delays: vec![Duration::from_millis(500), Duration::from_secs(5)],
        }
    }
}

/// The kind of a conversation (`conversation.conversationType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationKind {
    /// A one-on-one chat between a person and the bot (`personal`).
    Personal,
    /// A group chat (`groupChat`).
    GroupChat,
    /// A team's channel (`channel`): posts, each a thread of replies.
    Channel,
}

/// A person, the bot under test, or another bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimUser {
    /// `29:…` (a person), `28:…` (a bot).
    pub id: String,
    /// Shown name.
    pub name: String,
    /// The person's Entra object id (empty for a bot).
    pub aad_object_id: String,
    /// A bot (`role: bot`).
    pub bot: bool,
}

/// Where a stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    /// Taking content.
    Streaming,
    /// Ended by its final message.
    Final,
    /// The person pressed Stop.
    CancelledByUser,
    /// Its total streaming time passed.
    TimedOut,
}

/// A stream of the bot, as Teams holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimStream {
    /// The stream id (= its activity id).
    pub id: String,
    /// Where it is.
    pub state: StreamState,
    /// The last `streamSequence` taken.
    pub sequence: u64,
    /// Informative texts, in order.
    pub informative: Vec<String>,
    /// Streamed texts, in order (each the whole text so far).
    pub streamed: Vec<String>,
    pub(crate) started: Instant,
    pub(crate) last_request: Instant,
    /// Out-of-order requests dropped.
    pub dropped: u32,
}

/// One activity in a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimActivity {
    /// The activity id.
    pub id: String,
    /// The conversation (a channel's id without `;messageid=`).
    pub conversation: String,
    /// In a channel, the root of its thread.
    pub thread: Option<String>,
    /// Who wrote it.
    pub from: SimUser,
    /// Written by the bot under test (through the connector).
    pub from_bot_under_test: bool,
    /// The text now shown (a stream's: its last streamed text, then its final).
    pub text: String,
    /// `replyToId`.
    pub reply_to_id: Option<String>,
    /// The stream, when it began as one.
    pub stream: Option<SimStream>,
    /// Deleted: invisible, kept in the record.
    pub deleted: bool,
    /// How many times it was updated (PUT).
    pub updates: u32,
}

impl SimActivity {
    /// A message people see as a sent message: not deleted, and not a stream short of its final.
    pub fn is_final_message(&self) -> bool {
        !self.deleted
            && self
                .stream
                .as_ref()
                .is_none_or(|s| s.state == StreamState::Final)
    }
}

/// A connector operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The token endpoint.
    Token,
    /// `POST …/activities` of a message.
    Send,
    /// `POST …/activities` of a plain `typing` indicator (no stream).
    Typing,
    /// `POST …/activities/{id}`.
    Reply,
    /// A streaming `typing` activity (start or continue).
    Stream,
    /// A stream's final `message`.
    StreamFinal,
    /// `PUT …/activities/{id}`.
    Update,
    /// `DELETE …/activities/{id}`.
    Delete,
}

/// One call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// The operation.
    pub op: Op,
    /// The request path, percent-decoded.
    pub path: String,
    /// The JSON body (`Null` when none).
    pub body: Value,
    /// HTTP status answered (or that would have been, when the answer was lost).
    pub status: u16,
    /// `error.code` of a refusal (or of a 202 that dropped the activity).
    pub error_code: Option<String>,
    /// Whether the answer reached the client.
    pub answered: bool,
    /// The activity the call created (a send's, a reply's, a stream start's).
    pub created: Option<String>,
}

/// One attempt to deliver an activity to the bot.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The queued event's id (`{conversation}|{activity id}`).
    pub event_id: String,
    /// 0 for the first attempt.
    pub attempt: u32,
    /// The status answered; `None`: no answer in time, or no connection.
    pub status: Option<u16>,
}

/// What an injected fault does to the call it meets.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// The call takes effect, then the connection is cut before the answer.
    LoseAnswer,
    /// HTTP 500/502/503 in the error envelope, no effect.
    ServerError(u16),
    /// HTTP 429 `Retry-After: secs`, no effect.
    RateLimited(u64),
    /// Any refusal in the error envelope, no effect.
    Error {
        /// HTTP status.
        status: u16,
        /// `error.code`.
        code: String,
        /// `error.message`.
        message: String,
    },
}

impl FaultKind {
    /// A refusal with `status`, `code` and `message`.
    pub fn error(status: u16, code: &str, message: &str) -> FaultKind {
        FaultKind::Error {
            status,
            code: code.to_owned(),
            message: message.to_owned(),
        }
    }
}

/// A fault waiting for a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Only calls of this operation meet it (`None`: any).
    pub op: Option<Op>,
    /// Matching calls let through before it strikes.
    pub after: u32,
    /// How many calls it strikes.
    pub times: u32,
    /// What it does.
    pub kind: FaultKind,
}

impl Fault {
    /// `kind` on the next call of `op`.
    pub fn on(op: Op, kind: FaultKind) -> Fault {
        Fault {
            op: Some(op),
            after: 0,
            times: 1,
            kind,
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

/// A running simulated Teams. Dropping it leaves the server running until
/// [`TeamsSimulator::stop`] or the runtime ends.
#[derive(Debug, Clone)]
pub struct TeamsSimulator {
    inner: Arc<Inner>,
}

impl TeamsSimulator {
    /// Starts an empty Teams with the bot under test.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<TeamsSimulator> {
        Ok(TeamsSimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops the server and the activity sender.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// `http://127.0.0.1:<port>/`: the `serviceUrl` of every activity.
    pub fn service_url(&self) -> String {
        self.inner.service_url()
    }

    /// The token endpoint.
    pub fn token_url(&self) -> String {
        format!("http://{}{TOKEN_PATH}", self.inner.addr)
    }

    /// The OpenID configuration naming the signing keys.
    pub fn openid_url(&self) -> String {
        format!("http://{}{}", self.inner.addr, keys::OPENID_PATH)
    }

    /// The bot's app id.
    pub fn app_id(&self) -> String {
        self.inner.config.app_id.clone()
    }

    /// The app's client secret.
    pub fn app_password(&self) -> String {
        self.inner.world().app_password.clone()
    }

    /// A new client secret (the old one is refused from now on; tokens issued stay valid).
    pub fn rotate_password(&self, password: &str) {
        self.inner.world().app_password = password.to_owned();
    }

    /// Revokes every token issued so far (the connector answers 401 to them).
    pub fn revoke_tokens(&self) -> usize {
        let mut world = self.inner.world();
        let live = world.tokens.iter().filter(|t| !t.revoked).count();
        for token in &mut world.tokens {
            token.revoked = true;
        }
        live
    }

    /// Token requests answered so far.
    pub fn token_requests(&self) -> u32 {
        self.inner.world().token_requests
    }

    /// The bot under test (`28:<app id>`).
    pub fn bot(&self) -> SimUser {
        self.inner.world().bot.clone()
    }

    /// Where activities are POSTed from now on (`None`: nowhere; they wait).
    pub fn set_endpoint(&self, url: Option<&str>) {
        self.inner.world().endpoint_url = url.map(str::to_owned);
        self.inner.events_changed.notify_one();
    }

    /// A person (created once per name).
    pub fn person(&self, name: &str) -> SimUser {
        self.inner.world().person(name)
    }

    /// Another bot (created once per name). Teams itself does not deliver one bot's messages
    /// to another; [`TeamsSimulator::bot_writes`] exists for the receiver's bot-author path.
    pub fn other_bot(&self, name: &str) -> SimUser {
        self.inner.world().other_bot(name)
    }

    /// `person`'s one-on-one chat with the bot, the bot installed by them (a
    /// `conversationUpdate` is queued).
    pub fn personal_chat(&self, person: &SimUser) -> String {
        let url = self.service_url();
        let mut world = self.inner.world();
        let id = world.create_conversation(ConversationKind::Personal, &person.name);
        world.add_bot(&id, person, &url);
        drop(world);
        self.inner.events_changed.notify_one();
        id
    }

    /// A team channel or group chat with `members`, the bot added by the first of them.
    pub fn conversation(&self, kind: ConversationKind, name: &str, members: &[SimUser]) -> String {
        let url = self.service_url();
        let mut world = self.inner.world();
        let id = world.create_conversation(kind, name);
        if let Some(by) = members.first() {
            world.add_bot(&id, by, &url);
        }
        drop(world);
        self.inner.events_changed.notify_one();
        id
    }

    /// The bot is removed from `conversation`: its calls there answer 403
    /// `BotNotInConversationRoster`.
    pub fn remove_bot(&self, conversation: &str) -> bool {
        self.inner.world().remove_bot(conversation)
    }

    /// `person` writes `text` in `conversation` (in a channel: a new post, or a reply in the
    /// thread of `root`); the bot is @mentioned where Teams requires it. Its activity is
    /// queued for the bot. `None` when there is no such conversation.
    pub fn person_writes(
        &self,
        conversation: &str,
        person: &SimUser,
        text: &str,
        root: Option<&str>,
    ) -> Option<SimActivity> {
        let url = self.service_url();
        let written = self
            .inner
            .world()
            .write(conversation, person, text, root, &url);
        self.inner.events_changed.notify_one();
        written
    }

    /// Another bot writes `text` (its activity has `from.role: bot`).
    pub fn bot_writes(&self, conversation: &str, bot: &SimUser, text: &str) -> Option<SimActivity> {
        self.person_writes(conversation, bot, text, None)
    }

    /// The person presses Stop on stream `stream_id`: its next request is refused 403
    /// "Content stream was cancelled by user".
    pub fn cancel_stream(&self, stream_id: &str) -> bool {
        self.inner.world().cancel_stream(stream_id)
    }

    /// Queues event `event_id` again (a redelivery), acknowledged or not.
    pub fn redeliver(&self, event_id: &str) -> bool {
        let mut world = self.inner.world();
        let Some(event) = world.events.iter_mut().find(|e| e.id == event_id) else {
            return false;
        };
        if event.in_flight {
            event.redeliver = true;
        } else {
            event.acked = false;
            event.given_up = false;
            event.next_at = Instant::now();
        }
        drop(world);
        self.inner.events_changed.notify_one();
        true
    }

    /// The next delivery goes out but its answer is never read: it is sent again.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_next_delivery = true;
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

    /// The queued body of event `event_id` (`{conversation}|{activity id}`).
    pub fn event(&self, event_id: &str) -> Option<Value> {
        self.inner
            .world()
            .events
            .iter()
            .find(|e| e.id == event_id)
            .map(|e| e.body.clone())
    }

    /// The activity the bot receives for `activity` a person wrote.
    pub fn event_of(&self, activity: &SimActivity) -> Option<Value> {
        self.event(&format!("{}|{}", activity.conversation, activity.id))
    }

    /// Events neither acknowledged with a 2xx nor given up.
    pub fn pending_events(&self) -> usize {
        self.inner
            .world()
            .events
            .iter()
            .filter(|e| !e.acked && !e.given_up)
            .count()
    }

    /// Events given up after the last attempt.
    pub fn given_up_events(&self) -> Vec<String> {
        self.inner
            .world()
            .events
            .iter()
            .filter(|e| e.given_up)
            .map(|e| e.id.clone())
            .collect()
    }

    /// Waits until every queued event was acknowledged or given up, up to `deadline`.
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

    /// Makes a call meet `fault`.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// Every activity ever in `conversation`, deleted ones and streams included, oldest first.
    pub fn activities(&self, conversation: &str) -> Vec<SimActivity> {
        self.inner
            .world()
            .activities
            .iter()
            .filter(|a| a.conversation == conversation)
            .cloned()
            .collect()
    }

    /// The bot's activities people can see in `conversation` (messages, and streams, finished
    /// or not), oldest first.
    pub fn bot_visible(&self, conversation: &str) -> Vec<SimActivity> {
        self.activities(conversation)
            .into_iter()
            .filter(|a| a.from_bot_under_test && !a.deleted)
            .collect()
    }

    /// Every activity of the bot in every conversation, deleted ones included.
    pub fn every_bot_activity(&self) -> Vec<SimActivity> {
        self.inner
            .world()
            .activities
            .iter()
            .filter(|a| a.from_bot_under_test)
            .cloned()
            .collect()
    }

    /// Every call, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every delivery attempt, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner.world().deliveries.clone()
    }
}
