//! The QQ Bot platform on loopback: the bot API, the access-token endpoint and the HTTP
//! callback sender (platform-apis-wave2 §14).
//!
//! [`QqSimulator::start`] binds `127.0.0.1` and serves, on one port for both hosts:
//!
//! - `POST /app/getAppAccessToken` `{appId, clientSecret}` → `{access_token, expires_in}`
//!   (`expires_in` a string of seconds). The same token comes back until its last 60 s; then a
//!   new one, the old one working until its own expiry. A wrong pair answers
//!   `{code: 100016, message}`.
//! - `POST /v2/users/{openid}/messages`, `POST /v2/groups/{group_openid}/messages` with
//!   `Authorization: QQBot <token>`: `{id, timestamp}`. With `msg_id` a **passive** reply: QQ
//!   acts on a `(msg_id, msg_seq)` pair once, and a repeat answers HTTP 400 **40054005**
//!   ("消息被去重，请检查请求msgseq"), no id; the answered message must be one the person or
//!   group sent, at most `c2c_window` (60 min) / `group_window` (5 min) ago (else 40034005 /
//!   40034128), with fewer than `max_replies` (5) replies so far (else 304103). Without
//!   `msg_id` an **active** message, at most `active_quota` (4) a month per user or group
//!   (else 22009); no dedupe.
//! - C2C `stream: {state, id, index, reset}`: the first chunk (no `id`) opens a stream message
//!   and its answer's `id` names it; later chunks append their content (`reset`: replace it),
//!   with `index` one above the last; `state: 10` finishes it. A stream idle longer than
//!   `stream_idle` is closed: a chunk for it answers 40054010. Groups cannot stream.
//! - `POST …/files` `{file_type, url | file_data, srv_send_msg}` → `{file_uuid, file_info, ttl}`
//!   (voice, `file_type: 3`, must be SILK: `file_data` starting with `#!SILK_V3`).
//! - `DELETE …/messages/{id}`: a recall (`{}`); an unknown or recalled message answers 40054011.
//!
//! Every failure is an HTTP error status with `{code, message, err_code, trace_id}` and an
//! `X-Tps-trace-ID` header; an unknown or expired token answers 401 `11241`.
//!
//! People's messages reach the callback URL as signed dispatches (`op: 0`,
//! `C2C_MESSAGE_CREATE` / `GROUP_AT_MESSAGE_CREATE`, `X-Signature-Ed25519` over
//! `X-Signature-Timestamp` + body with the key seeded by the secret). A dispatch not answered
//! `{"op": 12, "d": 0}` within `answer_deadline` is pushed again on `retry_delays`, then given
//! up. [`QqSimulator::validate_url`] sends the op 13 URL validation and checks the answer.
//!
//! Tests play the people ([`QqSimulator::person_writes`], [`QqSimulator::member_writes`]),
//! break things ([`QqSimulator::inject`], [`QqSimulator::age_inbound`],
//! [`QqSimulator::expire_tokens`], [`QqSimulator::cut_next_delivery`]) and judge from the
//! platform's own record ([`QqSimulator::messages`], [`QqSimulator::calls`],
//! [`QqSimulator::deliveries`]).
//!
//! Invariants: a refused call has no effect; a message that was accepted is in the record
//! whether or not its answer reached the client.

mod callback;
mod http;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use state::Inner;
pub use state::SimChat;

/// How a simulator is set up.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// The bot's AppID.
    pub app_id: String,
    /// The bot's AppSecret (token endpoint, callback signatures).
    pub secret: String,
    /// How long an access token works (QQ: 7200 s).
    pub token_lifetime: Duration,
    /// How long a C2C message can be answered passively (60 min).
    pub c2c_window: Duration,
    /// How long a group message can be answered passively (5 min).
    pub group_window: Duration,
    /// Passive replies per inbound message (QQ's pages say 5, a 2026 note 4 for C2C).
    pub max_replies: u32,
    /// Active messages per user or group a month (4).
    pub active_quota: u32,
    /// A stream with no chunk for this long is closed.
    pub stream_idle: Duration,
    /// How long the callback URL may take to answer before the attempt counts as failed.
    pub answer_deadline: Duration,
    /// The waits before each next attempt of an unacknowledged dispatch; once used up, it is
    /// given up.
    pub retry_delays: Vec<Duration>,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("app_id", &self.app_id)
            .field("retry_delays", &self.retry_delays)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            app_id: "102005981".to_owned(),
            secret: "dGhpc2lzbm90YXJlYWxzZWNyZXQ".to_owned(),
            token_lifetime: Duration::from_secs(7_200),
            c2c_window: Duration::from_secs(3_600),
            group_window: Duration::from_secs(300),
            max_replies: 5,
            active_quota: 4,
            stream_idle: Duration::from_secs(30),
            answer_deadline: Duration::from_secs(3),
            retry_delays: [5, 30, 60, 300]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
        }
    }
}

/// One message the bot sent, as QQ holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMessage {
    /// Its id.
    pub id: String,
    /// Where it went.
    pub chat: SimChat,
    /// `msg_type` (0 text, 7 media).
    pub msg_type: u64,
    /// Its text (a stream's text so far); for media, the file's description.
    pub text: String,
    /// The answered message, for a passive reply.
    pub reply_to: Option<String>,
    /// The `msg_seq` it was sent under.
    pub msg_seq: Option<u64>,
    /// A stream message: `Some(finished)`.
    pub stream: Option<bool>,
    /// The media's `file_type` and source (`url` or `data:<n bytes>`), for `msg_type` 7.
    pub media: Option<(u64, String)>,
    /// Recalled.
    pub recalled: bool,
}

impl SimMessage {
    /// Still visible, and not a stream that is still being written.
    pub fn is_final(&self) -> bool {
        !self.recalled && self.stream != Some(false)
    }
}

/// One message a person (or group member) wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimInbound {
    /// Its id (`d.id`, the `msg_id` replies answer).
    pub msg_id: String,
    /// Where it was written.
    pub chat: SimChat,
    /// Who wrote it (`user_openid` or `member_openid`).
    pub author: String,
    /// The text.
    pub text: String,
}

/// One call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `GET`, `POST`, `DELETE`.
    pub method: String,
    /// The path.
    pub path: String,
    /// The JSON body (`Null` without one; the token request without its secret).
    pub body: Value,
    /// The HTTP status answered (or that would have been, for a lost answer).
    pub status: u16,
    /// The error `code` answered (0: success).
    pub code: i64,
    /// The answer was written (`false`: an injected lost answer).
    pub answered: bool,
}

/// One callback dispatch and its attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// Its number (for [`QqSimulator::replay`]).
    pub id: usize,
    /// The payload posted.
    pub body: Value,
    /// The HTTP status of each attempt (0: no connection, no answer in time, or not an
    /// `{"op": 12, "d": 0}` answer).
    pub attempts: Vec<u16>,
    /// Acknowledged.
    pub acked: bool,
    /// No more attempts will be made.
    pub given_up: bool,
}

/// What an injected fault does to a message send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Refused with this HTTP status, code and message; nothing is sent.
    Refuse(u16, i64, String),
    /// The message is accepted, then the connection closes without an answer.
    LoseAnswer,
    /// A non-QQ answer (a proxy's page) with this status; nothing is sent.
    ServerError(u16),
}

/// A fault on `POST …/messages`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub(crate) kind: FaultKind,
    pub(crate) after: u32,
    pub(crate) times: u32,
    pub(crate) to: Option<String>,
    pub(crate) streams: bool,
}

impl Fault {
    /// The next message send meets `kind` (stream chunks are left alone unless
    /// [`Fault::streams`]).
    pub fn new(kind: FaultKind) -> Fault {
        Fault {
            kind,
            after: 0,
            times: 1,
            to: None,
            streams: false,
        }
    }

    /// After `sends` more sends go through.
    pub fn after(mut self, sends: u32) -> Fault {
        self.after = sends;
        self
    }

    /// Only sends to this user or group meet it (and count towards `after`).
    pub fn to(mut self, chat_id: &str) -> Fault {
        self.to = Some(chat_id.to_owned());
        self
    }

    /// For `times` sends in a row.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times.max(1);
        self
    }

    /// Stream chunks meet it too (and only they count).
    pub fn streams(mut self) -> Fault {
        self.streams = true;
        self
    }
}

/// A running simulator; stops when dropped (or by [`QqSimulator::stop`]).
pub struct QqSimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for QqSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QqSimulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl QqSimulator {
    /// Starts a simulator set up by `config`.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<QqSimulator> {
        Ok(QqSimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops serving and sending.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// The API base URL (`http://127.0.0.1:<port>`), the channel's `api_base`; the token
    /// endpoint is served there too (`token_base`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The bot's AppID.
    pub fn app_id(&self) -> String {
        self.inner.config.app_id.clone()
    }

    /// The bot's AppSecret.
    pub fn secret(&self) -> String {
        self.inner.config.secret.clone()
    }

    /// Where callbacks go; `None` stops sending (dispatches wait).
    pub fn set_callback_url(&self, url: Option<&str>) {
        self.inner.world().callback_url = url.map(str::to_owned);
        self.inner.wake.notify_one();
    }

    /// Person `openid` writes `text` to the bot (C2C): the message and its dispatch. Returns
    /// its `msg_id`.
    pub fn person_writes(&self, openid: &str, text: &str) -> String {
        let msg_id = self
            .inner
            .world()
            .writes(SimChat::User(openid.to_owned()), openid, text);
        self.inner.wake.notify_one();
        msg_id
    }

    /// Person `openid` wrote `text` to the bot before the test began: the message exists
    /// (its reply window open) but no dispatch is sent. Returns the dispatch payload the bot
    /// would have received, for a test to hand to the channel's receiver.
    pub fn person_wrote_earlier(&self, openid: &str, text: &str) -> Value {
        let mut world = self.inner.world();
        world.writes(SimChat::User(openid.to_owned()), openid, text);
        world
            .deliveries
            .pop()
            .map(|d| d.body)
            .unwrap_or(Value::Null)
    }

    /// Member `member` of group `group` @-mentions the bot with `text`. Returns its `msg_id`.
    pub fn member_writes(&self, group: &str, member: &str, text: &str) -> String {
        let msg_id = self
            .inner
            .world()
            .writes(SimChat::Group(group.to_owned()), member, text);
        self.inner.wake.notify_one();
        msg_id
    }

    /// Inbound message `msg_id` was written `age` ago (to close its passive window).
    pub fn age_inbound(&self, msg_id: &str, age: Duration) {
        self.inner.world().age_inbound(msg_id, age);
    }

    /// Every open stream's last chunk was `age` ago (a stalled stream).
    pub fn age_streams(&self, age: Duration) {
        self.inner.world().age_streams(age);
    }

    /// Every token issued so far stops working (401 11241).
    pub fn expire_tokens(&self) {
        self.inner.world().expire_tokens();
    }

    /// Queues a fault for message sends.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// Posts any payload, signed, as a dispatch of its own.
    pub fn deliver_raw(&self, body: Value) -> usize {
        let id = self.inner.world().enqueue(body);
        self.inner.wake.notify_one();
        id
    }

    /// Pushes dispatch `id`'s payload again, as a new dispatch.
    pub fn replay(&self, id: usize) -> Option<usize> {
        let body = self.inner.world().deliveries.get(id)?.body.clone();
        Some(self.deliver_raw(body))
    }

    /// The next callback attempt's answer is lost: it counts as failed and is pushed again.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_deliveries += 1;
    }

    /// Sends the op 13 URL validation to `url` and checks the answer's signature with the
    /// bot's key; `Err` says what was wrong.
    pub async fn validate_url(&self, url: &str) -> Result<(), String> {
        callback::validate(&self.inner, url).await
    }

    /// What the bot sent to `chat`, oldest first (recalled ones included, marked).
    pub fn messages(&self, chat: &SimChat) -> Vec<SimMessage> {
        self.inner
            .world()
            .messages
            .iter()
            .filter(|m| &m.chat == chat)
            .cloned()
            .collect()
    }

    /// Everything the bot sent, oldest first.
    pub fn all_messages(&self) -> Vec<SimMessage> {
        self.inner.world().messages.clone()
    }

    /// What people wrote, oldest first.
    pub fn inbound(&self) -> Vec<SimInbound> {
        self.inner.world().inbound.clone()
    }

    /// Every call, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Active messages sent to `chat_id` this month.
    pub fn active_sent(&self, chat_id: &str) -> u32 {
        self.inner.world().active_sent(chat_id)
    }

    /// Every dispatch, oldest first.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner
            .world()
            .deliveries
            .iter()
            .map(|d| d.record())
            .collect()
    }

    /// Dispatches not yet acknowledged and not given up.
    pub fn pending_deliveries(&self) -> usize {
        self.inner
            .world()
            .deliveries
            .iter()
            .filter(|d| !d.acked && !d.given_up)
            .count()
    }

    /// Waits until every dispatch is acknowledged (or given up); `false` after `deadline`.
    pub async fn deliveries_settled(&self, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if self.pending_deliveries() == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for QqSimulator {
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
        self.inner.wake.notify_one();
    }
}
