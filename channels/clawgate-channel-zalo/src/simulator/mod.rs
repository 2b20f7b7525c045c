//! The Zalo Official Account platform on loopback: the OA API, the OAuth token endpoint and
//! the webhook sender (platform-apis-wave2 §9.1).
//!
//! [`ZaloSimulator::start`] binds `127.0.0.1` and serves, on one port for both hosts:
//!
//! - `POST /v3.0/oa/message/cs` (consultation text, `access_token` header) answering
//!   `{"error":0,"message":"Success","data":{"message_id","user_id"}}`, and every failure as
//!   **HTTP 200** with `{"error":<negative>,"message":…}`: `-216` for a missing, unknown or
//!   expired access token, `-230` outside the person's 7-day interaction window, `-201` for
//!   bad parameters (unknown user, empty or over-long text), and whatever a test injects.
//! - `GET /v2.0/oa/getoa` (the OA's profile).
//! - `POST /v4/oa/access_token` (form `app_id`, `grant_type=refresh_token|authorization_code`,
//!   `refresh_token` or `code`; header `secret_key`) answering `{access_token, refresh_token,
//!   expires_in}`. The refresh token **rotates**: the one sent is spent, and sending it again
//!   fails. An access token keeps working until its own expiry.
//!
//! Every accepted text is echoed as an `oa_send_text` webhook carrying its `msg_id`; people's
//! texts arrive as `user_send_text`. Webhooks are signed with `X-ZEvent-Signature: mac=<hex
//! sha256(app_id + body + timestamp + OA secret key)>` over the exact bytes posted, and a
//! delivery not answered 200 within `answer_deadline` (Zalo: about 2 s) is posted again on
//! `retry_delays` (Zalo: 30 s, 5 min, 15 min, 30 min, 1 h), then given up.
//!
//! Tests play the people ([`ZaloSimulator::person_writes`]) and the OA's admin
//! ([`ZaloSimulator::authorize`]), break things ([`ZaloSimulator::inject`],
//! [`ZaloSimulator::lose_next_token_answer`], [`ZaloSimulator::expire_access_tokens`],
//! [`ZaloSimulator::close_window`]) and judge from the platform's own record
//! ([`ZaloSimulator::sent`], [`ZaloSimulator::calls`], [`ZaloSimulator::deliveries`]).
//!
//! Invariants: a refused call has no effect; a message that was accepted is in
//! [`ZaloSimulator::sent`] whether or not its answer reached the client; a refresh that was
//! carried out spent its refresh token whether or not its answer reached the client.

mod http;
mod state;
mod webhook;

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
    /// The Zalo app's id.
    pub app_id: String,
    /// The app's secret key (the token endpoint's `secret_key` header).
    pub app_secret: String,
    /// The OA secret key every webhook is signed with.
    pub oa_secret_key: String,
    /// The OA's id.
    pub oa_id: String,
    /// How long an access token works (Zalo: about 25 hours).
    pub access_lifetime: Duration,
    /// How long a person's last interaction keeps consultation messages open (7 days).
    pub window: Duration,
    /// Every accepted text is echoed as an `oa_send_text` webhook.
    pub echo_sends: bool,
    /// How long the webhook URL may take to answer before the attempt counts as failed.
    pub answer_deadline: Duration,
    /// The waits before each next attempt of an unanswered delivery; once used up, the
    /// delivery is given up.
    pub retry_delays: Vec<Duration>,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets, even on a test platform.
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("app_id", &self.app_id)
            .field("oa_id", &self.oa_id)
            .field("retry_delays", &self.retry_delays)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            app_id: "3319209841127388821".to_owned(),
            app_secret: "KxRq7bL1vN9sT3uW5yZ2".to_owned(),
            oa_secret_key: "Yb2M8fQ1cX4kV7nP0sR3".to_owned(),
            oa_id: "579745863508352884".to_owned(),
            access_lifetime: Duration::from_secs(90_000),
            window: Duration::from_secs(7 * 24 * 3600),
            echo_sends: true,
            answer_deadline: Duration::from_secs(2),
            retry_delays: [30, 300, 900, 1800, 3600]
                .into_iter()
                .map(Duration::from_secs)
                .collect(),
        }
    }
}

/// One message the OA sent, as Zalo holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMessage {
    /// Its `message_id` (the echo's `msg_id`).
    pub msg_id: String,
    /// The recipient's user id.
    pub user_id: String,
    /// The text.
    pub text: String,
    /// When Zalo accepted it (ms, Unix time).
    pub at_ms: u64,
}

/// One message a person wrote to the OA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimInbound {
    /// Its `msg_id`.
    pub msg_id: String,
    /// The person's user id.
    pub user_id: String,
    /// The text.
    pub text: String,
}

/// One call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `GET` or `POST`.
    pub method: String,
    /// The path (`/v3.0/oa/message/cs`).
    pub path: String,
    /// The JSON body, or the form fields as an object (`Null` for a GET).
    pub body: Value,
    /// The HTTP status answered (or that would have been, for a lost answer).
    pub status: u16,
    /// The `error` code answered (0: success).
    pub error: i64,
    /// The answer was written (`false`: an injected lost answer).
    pub answered: bool,
}

/// One webhook delivery and its attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The delivery's number (for [`ZaloSimulator::replay`]).
    pub id: usize,
    /// The event posted.
    pub body: Value,
    /// The HTTP status of each attempt; 0: no connection or no answer in time.
    pub attempts: Vec<u16>,
    /// A 200 arrived.
    pub acked: bool,
    /// No more attempts will be made.
    pub given_up: bool,
}

/// What an injected fault does to a send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// Refused with this `error` code and message (HTTP 200); nothing is sent.
    Refuse(i64, String),
    /// The message is accepted (and echoed), then the connection closes without an answer.
    LoseAnswer,
    /// A non-Zalo answer (a proxy's HTML page) with this status; nothing is sent.
    ServerError(u16),
    /// HTTP 503 with a Zalo error body (`-500`, "try again"); nothing is sent.
    Unavailable,
}

impl FaultKind {
    /// Refused with Zalo's words for `code`.
    pub fn code(code: i64) -> FaultKind {
        let message = match code {
            -32 => "App has exceeded the request limit",
            -201 => "Parameters are invalid",
            -213 => "User has not followed OA",
            -216 => "Access token is invalid",
            -230 => "User has not interacted with the OA in the past 7 days",
            _ => "Unknown error",
        };
        FaultKind::Refuse(code, message.to_owned())
    }
}

/// A fault on `POST /v3.0/oa/message/cs` sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub(crate) kind: FaultKind,
    pub(crate) after: u32,
    pub(crate) times: u32,
    pub(crate) to: Option<String>,
}

impl Fault {
    /// The next send meets `kind`.
    pub fn new(kind: FaultKind) -> Fault {
        Fault {
            kind,
            after: 0,
            times: 1,
            to: None,
        }
    }

    /// Refused with Zalo's answer for `code`.
    pub fn code(code: i64) -> Fault {
        Fault::new(FaultKind::code(code))
    }

    /// After `sends` more sends go through.
    pub fn after(mut self, sends: u32) -> Fault {
        self.after = sends;
        self
    }

    /// Only sends to `user_id` meet it (and count towards `after`).
    pub fn to(mut self, user_id: &str) -> Fault {
        self.to = Some(user_id.to_owned());
        self
    }

    /// For `times` sends in a row.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times.max(1);
        self
    }
}

/// A running simulator; stops when dropped (or by [`ZaloSimulator::stop`]).
pub struct ZaloSimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ZaloSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZaloSimulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl ZaloSimulator {
    /// Starts a simulator set up by `config`.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<ZaloSimulator> {
        Ok(ZaloSimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops serving and sending.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// The OA API base URL (`http://127.0.0.1:<port>`), the channel's `api_base`; the OAuth
    /// endpoint is served there too (`oauth_base`).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The app's id.
    pub fn app_id(&self) -> String {
        self.inner.config.app_id.clone()
    }

    /// The app's secret key.
    pub fn app_secret(&self) -> String {
        self.inner.config.app_secret.clone()
    }

    /// The OA secret key webhooks are signed with.
    pub fn oa_secret_key(&self) -> String {
        self.inner.config.oa_secret_key.clone()
    }

    /// The OA's id.
    pub fn oa_id(&self) -> String {
        self.inner.config.oa_id.clone()
    }

    /// The OA's admin authorizes the app: a fresh refresh token (what the OAuth consent and
    /// the code exchange hand the operator).
    pub fn authorize(&self) -> String {
        self.inner.world().new_refresh_token()
    }

    /// An authorization code the token endpoint exchanges once (`grant_type=
    /// authorization_code`) for a fresh pair.
    pub fn authorization_code(&self) -> String {
        self.inner.world().new_code()
    }

    /// The refresh tokens not yet spent (the operator's view of which authorization is live).
    pub fn live_refresh_tokens(&self) -> usize {
        self.inner.world().live_refresh_tokens()
    }

    /// Where webhooks go; `None` stops sending (deliveries wait).
    pub fn set_webhook_url(&self, url: Option<&str>) {
        self.inner.world().webhook_url = url.map(str::to_owned);
        self.inner.wake.notify_one();
    }

    /// Person `user_id` writes `text` to the OA: the message and its `user_send_text`
    /// webhook; their interaction window opens. Returns its `msg_id`.
    pub fn person_writes(&self, user_id: &str, text: &str) -> String {
        let msg_id = self.inner.world().person_writes(user_id, text);
        self.inner.wake.notify_one();
        msg_id
    }

    /// `user_id` interacted with the OA just now, without a webhook (before the test began).
    pub fn open_window(&self, user_id: &str) {
        self.inner.world().interacted(user_id);
    }

    /// `user_id`'s last interaction is older than the window (as 8 days of silence).
    pub fn close_window(&self, user_id: &str) {
        self.inner.world().close_window(user_id);
    }

    /// Posts any event, signed, as a delivery of its own.
    pub fn deliver_raw(&self, body: Value) -> usize {
        let id = self.inner.world().enqueue(body);
        self.inner.wake.notify_one();
        id
    }

    /// Posts delivery `id`'s event again, as a new delivery.
    pub fn replay(&self, id: usize) -> Option<usize> {
        let body = self.inner.world().deliveries.get(id)?.body.clone();
        Some(self.deliver_raw(body))
    }

    /// The next webhook attempt's answer is lost: it counts as failed and is posted again.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_deliveries += 1;
    }

    /// Every access token issued so far stops working (`-216`), as at expiry.
    pub fn expire_access_tokens(&self) {
        self.inner.world().expire_access_tokens();
    }

    /// The next token refresh is carried out (the refresh token spent, a new pair issued)
    /// and its answer lost, as when the client crashes before storing it.
    pub fn lose_next_token_answer(&self) {
        self.inner.world().lose_token_answers += 1;
    }

    /// Queues a fault for sends.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// What the OA sent to `user_id`, oldest first: the platform's own record.
    pub fn sent(&self, user_id: &str) -> Vec<SimMessage> {
        self.inner
            .world()
            .sent
            .iter()
            .filter(|m| m.user_id == user_id)
            .cloned()
            .collect()
    }

    /// Everything the OA sent, oldest first.
    pub fn all_sent(&self) -> Vec<SimMessage> {
        self.inner.world().sent.clone()
    }

    /// What people wrote, oldest first.
    pub fn inbound(&self) -> Vec<SimInbound> {
        self.inner.world().inbound.clone()
    }

    /// Every call, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every webhook delivery, oldest first.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner
            .world()
            .deliveries
            .iter()
            .map(|d| d.record())
            .collect()
    }

    /// Deliveries not yet answered 200 and not given up.
    pub fn pending_deliveries(&self) -> usize {
        self.inner
            .world()
            .deliveries
            .iter()
            .filter(|d| !d.acked && !d.given_up)
            .count()
    }

    /// Waits until every delivery is answered 200 (or given up); `false` after `deadline`.
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

    /// Waits until every `oa_send_text` echo is answered 200 (or given up); `false` after
    /// `deadline`.
    pub async fn echoes_settled(&self, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let pending = self
                .inner
                .world()
                .deliveries
                .iter()
                .filter(|d| !d.acked && !d.given_up && d.body["event_name"] == "oa_send_text")
                .count();
            if pending == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ZaloSimulator {
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
        self.inner.wake.notify_one();
    }
}
