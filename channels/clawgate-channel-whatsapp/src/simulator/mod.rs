//! The WhatsApp Cloud API on loopback: the Graph `messages` endpoint and the webhook sender.
//!
//! [`WhatsAppSimulator::start`] binds `127.0.0.1` and serves, under any `v<major>.<minor>`
//! version, `GET /<phone-number-id>` and `POST /<phone-number-id>/messages` (text with
//! `preview_url`, media by `link`, `context.message_id` quotes, `biz_opaque_callback_data`,
//! mark-as-read and typing indicators) with Graph's error envelope (`error.message`, `type`,
//! `code`, `error_subcode`, `error_data.details`, `fbtrace_id`) and the Cloud API's codes
//! (platform-apis-wave2 §1): 190 for a bad or revoked token, 100 for a bad parameter, 131047
//! outside the person's 24-hour customer-service window (opened by their last message), and
//! whatever a test injects (throttling 4/80007/130429/131056, 131026, 131000/131016, 5xx, a
//! lost answer). Accepted messages get `wamid.` ids and their `sent` and `delivered` status
//! webhooks, carrying `biz_opaque_callback_data`.
//!
//! Webhooks go to the configured callback URL (subscribed through the `GET hub.*`
//! verification handshake, as Meta does, or set directly), signed with
//! `X-Hub-Signature-256`, and are delivered again until a 2xx arrives, on the configured
//! schedule (Meta: with decreasing frequency for up to 7 days). Tests play the people
//! ([`WhatsAppSimulator::person_writes`]), break things ([`WhatsAppSimulator::inject`],
//! [`WhatsAppSimulator::revoke_token`], [`WhatsAppSimulator::close_window`]) and judge from
//! the platform's own record ([`WhatsAppSimulator::sent`], [`WhatsAppSimulator::calls`],
//! [`WhatsAppSimulator::deliveries`]).
//!
//! Invariants: a refused call has no effect; a message that was accepted is in
//! [`WhatsAppSimulator::sent`] whether or not its answer reached the client; every webhook
//! is signed over the exact bytes posted.

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
    /// The access token the Graph API accepts.
    pub token: String,
    /// The app secret every webhook is signed with.
    pub app_secret: String,
    /// The business phone number's id.
    pub phone_number_id: String,
    /// The business number as shown (digits).
    pub display_phone_number: String,
    /// The WhatsApp Business Account id (`entry[].id`).
    pub waba_id: String,
    /// How long a person's message keeps the customer-service window open (24 h).
    pub window: Duration,
    /// A free-form send outside the window is refused at once (131047 in the answer); when
    /// `false` it is accepted and fails afterwards in a `failed` status webhook, as Meta
    /// reports some sends.
    pub window_refused_synchronously: bool,
    /// Accepted messages get a `delivered` status after their `sent` one.
    pub auto_delivered: bool,
    /// How long the callback URL may take to answer before the attempt counts as failed.
    pub answer_deadline: Duration,
    /// The waits before each next attempt of an unanswered delivery (the last one repeats).
    pub retry_delays: Vec<Duration>,
    /// A delivery is given up this long after it was first due (Meta: 7 days).
    pub give_up_after: Duration,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Token and secret are secrets, even on a test platform.
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("phone_number_id", &self.phone_number_id)
            .field("window", &self.window)
            .field("retry_delays", &self.retry_delays)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: "EAAGsimulatedSystemUserToken".to_owned(),
            app_secret: "0f1e2d3c4b5a69788796a5b4c3d2e1f0".to_owned(),
            phone_number_id: "106540352242922".to_owned(),
            display_phone_number: "15550783881".to_owned(),
            waba_id: "102290129340398".to_owned(),
            window: Duration::from_secs(24 * 3600),
            window_refused_synchronously: true,
            auto_delivered: true,
            answer_deadline: Duration::from_secs(10),
            retry_delays: vec![
                Duration::from_secs(15),
                Duration::from_secs(60),
                Duration::from_secs(300),
                Duration::from_secs(3600),
            ],
            give_up_after: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// One message the business sent, as WhatsApp holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// Its `wamid.…`.
    pub wamid: String,
    /// The recipient's `wa_id`.
    pub to: String,
    /// `text`, `image`, `document`, `audio`, `video`.
    pub kind: String,
    /// The text body (or a media caption).
    pub text: Option<String>,
    /// A media message's `link`.
    pub link: Option<String>,
    /// `text.preview_url` as sent.
    pub preview_url: bool,
    /// The quoted message (`context.message_id`).
    pub context: Option<String>,
    /// `biz_opaque_callback_data` as sent.
    pub callback_data: Option<String>,
    /// The newest status: `sent`, `delivered`, `read` or `failed`.
    pub status: String,
}

/// One message a person wrote to the business.
#[derive(Debug, Clone, PartialEq)]
pub struct SimInbound {
    /// Its `wamid.…`.
    pub wamid: String,
    /// The person's `wa_id`.
    pub from: String,
    /// The text.
    pub text: String,
    /// Marked read by the business.
    pub read: bool,
}

/// One Graph call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `GET` or `POST`.
    pub method: String,
    /// The path after the version (`/106540352242922/messages`).
    pub path: String,
    /// The JSON body (`Null` for a GET).
    pub body: Value,
    /// The HTTP status answered (or that would have been, for a lost answer).
    pub status: u16,
    /// The Graph error code of a refusal.
    pub code: Option<i64>,
    /// The answer was written (`false`: an injected lost answer).
    pub answered: bool,
}

/// One webhook delivery and its attempts.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The delivery's number (for [`WhatsAppSimulator::replay`]).
    pub id: usize,
    /// The notification posted.
    pub body: Value,
    /// The HTTP status of each attempt; 0: no connection or no answer in time.
    pub attempts: Vec<u16>,
    /// A 2xx arrived.
    pub acked: bool,
    /// No more attempts will be made.
    pub given_up: bool,
}

/// A Graph error a fault answers with.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphFault {
    /// The HTTP status.
    pub status: u16,
    /// `error.code`.
    pub code: i64,
    /// `error.error_subcode`.
    pub subcode: Option<i64>,
    /// `error.message`.
    pub message: String,
    /// `error.error_data.details`.
    pub details: Option<String>,
}

impl GraphFault {
    /// The Cloud API's own answer for `code` (messages as Meta words them; HTTP statuses as
    /// Meta sends them, which for throttling is 400 or 429 depending on the path).
    pub fn code(code: i64) -> GraphFault {
        let (status, message, details): (u16, &str, Option<&str>) = match code {
            2 => (503, "(#2) Service temporarily unavailable", None),
            4 => (400, "(#4) Application request limit reached", None),
            10 => (
                403,
                "(#10) Application does not have permission for this action",
                None,
            ),
            100 => (400, "(#100) Invalid parameter", None),
            190 => (
                401,
                "Error validating access token: Session has expired",
                None,
            ),
            368 => (
                400,
                "(#368) Temporarily blocked for policies violations",
                None,
            ),
            80_007 => (400, "(#80007) Rate limit issues", None),
            130_429 => (
                400,
                "(#130429) Rate limit hit",
                Some("Cloud API message throughput has been reached."),
            ),
            131_000 => (
                500,
                "(#131000) Something went wrong",
                Some("Message failed to send due to an unknown error."),
            ),
            131_016 => (
                503,
                "(#131016) Service unavailable",
                Some("A service is temporarily unavailable."),
            ),
            131_026 => (
                400,
                "(#131026) Message undeliverable",
                Some("Unable to deliver message."),
            ),
            131_047 => (
                400,
                "(#131047) Re-engagement message",
                Some(
                    "Message failed to send because more than 24 hours have passed since the \
                     customer last replied to this number.",
                ),
            ),
            131_048 => (
                400,
                "(#131048) Spam rate limit hit",
                Some(
                    "Message failed to send because there are restrictions on how many messages \
                     can be sent from this phone number.",
                ),
            ),
            131_056 => (
                400,
                "(#131056) (Business Account, Consumer Account) pair rate limit hit",
                Some(
                    "Message failed to send because there were too many messages sent from this \
                     phone number to the same phone number in a short period of time.",
                ),
            ),
            _ => (400, "(#131009) Parameter value is not valid", None),
        };
        GraphFault {
            status,
            code,
            subcode: (code == 190).then_some(463),
            message: message.to_owned(),
            details: details.map(str::to_owned),
        }
    }

    /// The same error under another HTTP status (throttling arrives as 429 on some paths).
    pub fn with_status(mut self, status: u16) -> GraphFault {
        self.status = status;
        self
    }
}

/// What an injected fault does to a send.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// Refused with this Graph error; nothing is sent.
    Refuse(GraphFault),
    /// The message is accepted, then the connection closes without an answer.
    LoseAnswer,
    /// A non-Graph answer (a proxy's HTML page) with this status; nothing is sent.
    ServerError(u16),
    /// The message is accepted (`wamid` answered) and then fails with this code in a `failed`
    /// status webhook.
    FailAsync(i64),
}

/// A fault on `POST …/messages` sends (not mark-as-read).
#[derive(Debug, Clone, PartialEq)]
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

    /// Refused with the Cloud API's answer for `code`.
    pub fn code(code: i64) -> Fault {
        Fault::new(FaultKind::Refuse(GraphFault::code(code)))
    }

    /// After `sends` more sends go through.
    pub fn after(mut self, sends: u32) -> Fault {
        self.after = sends;
        self
    }

    /// Only sends to `wa_id` meet it (and count towards `after`).
    pub fn to(mut self, wa_id: &str) -> Fault {
        self.to = Some(wa_id.to_owned());
        self
    }

    /// For `times` sends in a row.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times.max(1);
        self
    }
}

/// A running simulator; stops when dropped (or by [`WhatsAppSimulator::stop`]).
pub struct WhatsAppSimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for WhatsAppSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhatsAppSimulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl WhatsAppSimulator {
    /// Starts a simulator set up by `config`.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<WhatsAppSimulator> {
        Ok(WhatsAppSimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops serving and sending.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// The Graph base URL (`http://127.0.0.1:<port>`), the channel's `api_base`.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The access token it accepts.
    pub fn token(&self) -> String {
        self.inner.config.token.clone()
    }

    /// The app secret the webhooks are signed with.
    pub fn app_secret(&self) -> String {
        self.inner.config.app_secret.clone()
    }

    /// The business phone number's id.
    pub fn phone_number_id(&self) -> String {
        self.inner.config.phone_number_id.clone()
    }

    /// Where webhooks go; `None` stops sending (deliveries wait).
    pub fn set_webhook_url(&self, url: Option<&str>) {
        self.inner.world().webhook_url = url.map(str::to_owned);
        self.inner.wake.notify_one();
    }

    /// Configures the callback URL as Meta does: `GET url?hub.mode=subscribe&
    /// hub.verify_token=…&hub.challenge=…` must answer 200 with the challenge; only then do
    /// webhooks go there. The error says what the endpoint answered.
    pub async fn subscribe(&self, url: &str, verify_token: &str) -> Result<(), String> {
        webhook::verify(&self.inner, url, verify_token).await?;
        self.set_webhook_url(Some(url));
        Ok(())
    }

    /// Person `wa_id` (shown as `name`) writes `text`: the message and its webhook; the
    /// person's window opens. Returns its `wamid`.
    pub fn person_writes(&self, wa_id: &str, name: &str, text: &str) -> String {
        self.person_writes_quoting(wa_id, name, text, None)
    }

    /// As [`Self::person_writes`], quoting `context` (a message of the business).
    pub fn person_writes_quoting(
        &self,
        wa_id: &str,
        name: &str,
        text: &str,
        context: Option<&str>,
    ) -> String {
        let wamid = self.inner.world().person_writes(wa_id, name, text, context);
        self.inner.wake.notify_one();
        wamid
    }

    /// Several messages of `wa_id` in one webhook delivery (Meta batches under load).
    pub fn person_writes_batch(&self, wa_id: &str, name: &str, texts: &[&str]) -> Vec<String> {
        let wamids = self.inner.world().person_writes_batch(wa_id, name, texts);
        self.inner.wake.notify_one();
        wamids
    }

    /// Person `wa_id` reads the business's message `wamid`: a `read` status webhook.
    pub fn person_reads(&self, wamid: &str) -> bool {
        let read = self.inner.world().person_reads(wamid);
        self.inner.wake.notify_one();
        read
    }

    /// Posts any notification, signed, as a delivery of its own (batches, other fields).
    pub fn deliver_raw(&self, body: Value) -> usize {
        let id = self.inner.world().enqueue(body);
        self.inner.wake.notify_one();
        id
    }

    /// Delivers delivery `id`'s notification again, as a new delivery (Meta resends to every
    /// subscribed app and after lost answers).
    pub fn replay(&self, id: usize) -> Option<usize> {
        let body = self.inner.world().deliveries.get(id)?.body.clone();
        Some(self.deliver_raw(body))
    }

    /// Opens `wa_id`'s window as if they had written just now, without a webhook (their message
    /// predates the test).
    pub fn open_window(&self, wa_id: &str) {
        self.inner
            .world()
            .windows
            .insert(wa_id.to_owned(), std::time::Instant::now());
    }

    /// The next webhook attempt's answer is lost (read by nobody): it counts as failed and is
    /// delivered again, as when Meta's connection to the callback URL drops.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_deliveries += 1;
    }

    /// The customer-service window of `wa_id` closes (as 24 hours after their last message).
    pub fn close_window(&self, wa_id: &str) {
        self.inner.world().windows.remove(wa_id);
    }

    /// The access token stops working (190, subcode 463).
    pub fn revoke_token(&self) {
        self.inner.world().token_revoked = true;
    }

    /// Queues a fault for sends.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// What the business sent to `wa_id`, oldest first: the platform's own record.
    pub fn sent(&self, wa_id: &str) -> Vec<SimMessage> {
        self.inner
            .world()
            .sent
            .iter()
            .filter(|m| m.to == wa_id)
            .cloned()
            .collect()
    }

    /// Everything the business sent, oldest first.
    pub fn all_sent(&self) -> Vec<SimMessage> {
        self.inner.world().sent.clone()
    }

    /// What people wrote, oldest first.
    pub fn inbound(&self) -> Vec<SimInbound> {
        self.inner.world().inbound.clone()
    }

    /// Every Graph call, oldest first.
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

    /// Deliveries not yet answered 2xx and not given up.
    pub fn pending_deliveries(&self) -> usize {
        self.inner
            .world()
            .deliveries
            .iter()
            .filter(|d| !d.acked && !d.given_up)
            .count()
    }

    /// Waits until every status delivery is answered 2xx (or given up); `false` after
    /// `deadline`.
    pub async fn statuses_settled(&self, deadline: Duration) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            let pending = self
                .inner
                .world()
                .deliveries
                .iter()
                .filter(|d| !d.acked && !d.given_up && d.body.to_string().contains("\"statuses\""))
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

    /// Waits until every delivery is answered 2xx (or given up); `false` after `deadline`.
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

impl Drop for WhatsAppSimulator {
    fn drop(&mut self) {
        self.inner.shutdown.send_replace(true);
        self.inner.wake.notify_one();
    }
}
