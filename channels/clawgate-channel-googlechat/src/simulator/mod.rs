//! Google Chat on loopback: the Chat REST API's `spaces.messages` methods and the HTTP event
//! sender of a Chat app.
//!
//! [`GoogleChatSimulator::start`] binds `127.0.0.1` and serves, under `/v1/`:
//! `POST spaces/{space}/messages` (`requestId`: a known id answers the message it created;
//! `messageId`: `client-…`, ≤ 63 characters of `[a-z0-9-]`, unique per space, `ALREADY_EXISTS`
//! when reused; `messageReplyOption` with its fallbacks, `thread.name` / `thread.threadKey`),
//! `GET` / `PATCH` (`updateMask`, `allowMissing`) / `DELETE spaces/{space}/messages/{message}`
//! (a server id or a client-assigned one), and `GET spaces/{space}/messages` (list). Answers are
//! Message resources; refusals are Google's `{"error": {"code", "message", "status"}}`. Every
//! call needs `Authorization: Bearer <access token>`. Writes count against a per-space quota of
//! 60 a minute (429 `RESOURCE_EXHAUSTED`). Messages over 32,000 bytes are refused.
//!
//! Events (`MESSAGE`, `ADDED_TO_SPACE`, `REMOVED_FROM_SPACE`) are POSTed to the endpoint URL
//! with a bearer JWT signed by the simulator's key, whose public half is served as a JWKS
//! ([`GoogleChatSimulator::jwks_url`]) and as x509 certificates
//! ([`GoogleChatSimulator::x509_url`]).
//!
//! Tests play people and other apps ([`GoogleChatSimulator::person_writes`],
//! [`GoogleChatSimulator::bot_writes`]), break things ([`GoogleChatSimulator::inject`]) and
//! judge from the platform's own record ([`GoogleChatSimulator::messages`],
//! [`GoogleChatSimulator::calls`], [`GoogleChatSimulator::deliveries`]).
//!
//! The OAuth token endpoint ([`GoogleChatSimulator::token_uri`]) grants service accounts
//! registered with [`GoogleChatSimulator::register_service_account`] access tokens for their
//! signed assertions; the API accepts them until they expire or are revoked.
//!
//! Invariants: a refused call has no effect; a call that took effect is in the record whether
//! or not its answer reached the client.

mod events;
mod http;
pub mod keys;
mod oauth;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use state::Inner;

pub use oauth::{
    GOOGLE_TOKEN_URI, TEST_SERVICE_ACCOUNT_KEY_ID, TEST_SERVICE_ACCOUNT_PRIVATE_KEY,
    TEST_SERVICE_ACCOUNT_PUBLIC_KEY, TokenFault, TokenRecord,
};
pub use state::{MAX_MESSAGE_BYTES, SPACE_WRITES_PER_MINUTE};

/// How a simulator is set up.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// An OAuth access token the API accepts as `Authorization: Bearer …` for ever (beside
    /// the ones the token endpoint issues).
    pub access_token: String,
    /// How long the tokens the token endpoint issues are accepted (Google's: an hour).
    pub token_lifetime: Duration,
    /// The `aud` of every event token (the Cloud project number, or the endpoint URL).
    pub audience: String,
    /// The per-space write quota (60 a minute) is enforced.
    pub rate_limits: bool,
    /// How long the endpoint may take to answer an event before the attempt counts as failed.
    pub answer_deadline: Duration,
    /// The waits before each further attempt of an unanswered event; then it is given up.
    pub retry_delays: Vec<Duration>,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("audience", &self.audience)
            .field("token_lifetime", &self.token_lifetime)
            .field("rate_limits", &self.rate_limits)
            .field("answer_deadline", &self.answer_deadline)
            .field("retry_delays", &self.retry_delays)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            access_token: "ya29.simulator-access-token".to_owned(),
            token_lifetime: Duration::from_secs(3_600),
            audience: "123456789012".to_owned(),
            rate_limits: true,
            answer_deadline: Duration::from_secs(30),
            retry_delays: vec![Duration::from_millis(500), Duration::from_secs(5)],
        }
    }
}

/// The kind of a space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpaceKind {
    /// A named space with several members (`spaceType: SPACE`, legacy `type: ROOM`).
    Room,
    /// A direct message between one person and the app (`DIRECT_MESSAGE`, `type: DM`).
    DirectMessage,
}

/// A user: a person, the app, or another app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimUser {
    /// `users/{id}`.
    pub name: String,
    /// Shown name.
    pub display_name: String,
    /// `type: BOT` (an app) rather than `HUMAN`.
    pub bot: bool,
}

/// One message as the platform holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// `spaces/{space}/messages/{id}` (`{id}` the client-assigned one when given).
    pub name: String,
    /// `spaces/{space}`.
    pub space: String,
    /// `spaces/{space}/threads/{thread}`.
    pub thread: String,
    /// The `threadKey` it was created with.
    pub thread_key: Option<String>,
    /// It landed as a reply in an existing thread.
    pub thread_reply: bool,
    /// Who wrote it.
    pub sender: SimUser,
    /// The text now shown.
    pub text: String,
    /// `clientAssignedMessageId`.
    pub client_id: Option<String>,
    /// `createTime`.
    pub create_time: String,
    /// `lastUpdateTime` after an edit.
    pub last_update_time: Option<String>,
    /// How many times it was patched.
    pub edits: u32,
    /// Deleted: invisible, kept in the record.
    pub deleted: bool,
    /// Written by the app under test (through the API).
    pub from_app: bool,
    /// The `requestId` it was created under.
    pub request_id: Option<String>,
}

/// A REST method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `spaces.messages.create`.
    Create,
    /// `spaces.messages.get`.
    Get,
    /// `spaces.messages.patch`.
    Patch,
    /// `spaces.messages.delete`.
    Delete,
    /// `spaces.messages.list`.
    List,
}

/// One API call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// The method.
    pub op: Op,
    /// The request path.
    pub path: String,
    /// The query string's pairs.
    pub query: Vec<(String, String)>,
    /// The JSON body (`Null` when none).
    pub body: Value,
    /// HTTP status answered (or that would have been, when the answer was lost).
    pub status: u16,
    /// `error.status` of a refusal.
    pub error_status: Option<String>,
    /// Whether the answer reached the client.
    pub answered: bool,
}

impl CallRecord {
    /// The value of query parameter `key`.
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// One attempt to deliver an event to the endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The event's id in the queue (a message event: the message's name).
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
    /// HTTP 500 `INTERNAL` or 503 `UNAVAILABLE` in Google's envelope, no effect.
    ServerError(u16),
    /// HTTP `status` with a body that is not Google's (a proxy's page), no effect.
    NotGoogle(u16),
    /// HTTP 429 `RESOURCE_EXHAUSTED` (the per-space quota's answer), no effect.
    RateLimited,
    /// Any refusal in Google's envelope, no effect.
    Error {
        /// HTTP status and `error.code`.
        code: u16,
        /// `error.status` (`PERMISSION_DENIED`, …).
        status: &'static str,
        /// `error.message`.
        message: String,
    },
}

impl FaultKind {
    /// A refusal with `code`, `status` and `message`.
    pub fn error(code: u16, status: &'static str, message: &str) -> FaultKind {
        FaultKind::Error {
            code,
            status,
            message: message.to_owned(),
        }
    }
}

/// A fault waiting for a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Only calls of this method meet it (`None`: any).
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

/// A running simulated Google Chat. Dropping it leaves the server running until
/// [`GoogleChatSimulator::stop`] or the runtime ends.
#[derive(Debug, Clone)]
pub struct GoogleChatSimulator {
    inner: Arc<Inner>,
}

impl GoogleChatSimulator {
    /// Starts an empty Google Chat with the app under test.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<GoogleChatSimulator> {
        Ok(GoogleChatSimulator {
            inner: http::start(config).await?,
        })
    }

    /// Stops the server and the event sender.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// `http://127.0.0.1:<port>/`: the API base (`…/v1/spaces/…` below it).
    pub fn api_url(&self) -> String {
        format!("http://{}/", self.inner.addr)
    }

    /// The JWKS of the event signing key.
    pub fn jwks_url(&self) -> String {
        format!("http://{}{}", self.inner.addr, keys::JWKS_PATH)
    }

    /// The x509 certificate map of the event signing key.
    pub fn x509_url(&self) -> String {
        format!("http://{}{}", self.inner.addr, keys::X509_PATH)
    }

    /// The access token the API accepts.
    pub fn access_token(&self) -> String {
        self.inner.config.access_token.clone()
    }

    /// The token endpoint (`POST`, the JWT-bearer grant): a key file's `token_uri`.
    pub fn token_uri(&self) -> String {
        format!("http://{}{}", self.inner.addr, oauth::TOKEN_PATH)
    }

    /// Registers public key `key_id` (RSA, PEM: SPKI or PKCS#1) of service account
    /// `client_email`: assertions it signs are granted tokens. False when the PEM is no RSA
    /// public key.
    pub fn register_service_account(
        &self,
        client_email: &str,
        key_id: &str,
        public_key_pem: &str,
    ) -> bool {
        self.inner
            .world()
            .oauth
            .register(client_email, key_id, public_key_pem)
    }

    /// Registers [`TEST_SERVICE_ACCOUNT_PUBLIC_KEY`] for `client_email` and returns the JSON key
    /// file of that account, `token_uri` this simulator's, as the Cloud console downloads it.
    pub fn add_test_service_account(&self, client_email: &str) -> String {
        let key_id = TEST_SERVICE_ACCOUNT_KEY_ID;
        self.register_service_account(client_email, key_id, TEST_SERVICE_ACCOUNT_PUBLIC_KEY);
        serde_json::json!({
            "type": "service_account",
            "project_id": "clawgate-simulator",
            "private_key_id": key_id,
            "private_key": TEST_SERVICE_ACCOUNT_PRIVATE_KEY,
            "client_email": client_email,
            "client_id": "100000000000000000002",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": self.token_uri(),
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "universe_domain": "googleapis.com",
        })
        .to_string()
    }

    /// Deletes key `key_id` of `client_email`: its assertions are refused `invalid_grant`.
    pub fn delete_service_account_key(&self, client_email: &str, key_id: &str) -> bool {
        self.inner.world().oauth.delete_key(client_email, key_id)
    }

    /// Tokens issued from now on are accepted for `lifetime` (`expires_in` says so).
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.inner.world().oauth.lifetime = lifetime;
    }

    /// Revokes every token issued so far (the Chat API answers 401 `UNAUTHENTICATED` to them);
    /// returns how many were still live.
    pub fn revoke_tokens(&self) -> usize {
        self.inner.world().oauth.revoke_all()
    }

    /// The next token requests meet `faults`, in order.
    pub fn inject_token_faults(&self, faults: impl IntoIterator<Item = TokenFault>) {
        self.inner.world().oauth.faults.extend(faults);
    }

    /// Every token request, in order.
    pub fn token_requests(&self) -> Vec<TokenRecord> {
        self.inner.world().oauth.records.clone()
    }

    /// Tokens issued to `client_email` so far.
    pub fn tokens_issued(&self, client_email: &str) -> usize {
        self.inner.world().oauth.issued_to(client_email)
    }

    /// The audience of the event tokens.
    pub fn audience(&self) -> String {
        self.inner.config.audience.clone()
    }

    /// The app under test, as its messages name their sender.
    pub fn app(&self) -> SimUser {
        self.inner.world().app.clone()
    }

    /// Where events are POSTed from now on (`None`: nowhere; they wait).
    pub fn set_endpoint_url(&self, url: Option<&str>) {
        self.inner.world().endpoint_url = url.map(str::to_owned);
        self.inner.events_changed.notify_one();
    }

    /// A person (created once per display name).
    pub fn person(&self, display_name: &str) -> SimUser {
        self.inner.world().person(display_name)
    }

    /// Another Chat app (created once per display name).
    pub fn other_bot(&self, display_name: &str) -> SimUser {
        self.inner.world().other_bot(display_name)
    }

    /// A space; `added_by` adds the app to it (an `ADDED_TO_SPACE` event). Returns its name.
    pub fn create_space(
        &self,
        display_name: &str,
        kind: SpaceKind,
        added_by: Option<&SimUser>,
    ) -> String {
        let mut world = self.inner.world();
        let space = world.create_space(display_name, kind);
        if let Some(by) = added_by {
            world.set_app_member(&space, true, by);
        }
        drop(world);
        self.inner.events_changed.notify_one();
        space
    }

    /// The direct message between `person` and the app (created once, the app added by them).
    pub fn dm(&self, person: &SimUser) -> String {
        let mut world = self.inner.world();
        let space = world.dm(person);
        world.set_app_member(&space, true, person);
        drop(world);
        self.inner.events_changed.notify_one();
        space
    }

    /// `by` removes the app from `space` (a `REMOVED_FROM_SPACE` event); its calls there are
    /// refused with `PERMISSION_DENIED` from then on.
    pub fn remove_app(&self, space: &str, by: &SimUser) -> bool {
        let done = self.inner.world().set_app_member(space, false, by);
        self.inner.events_changed.notify_one();
        done
    }

    /// `person` writes `text` in `space` (in `thread` when given); its `MESSAGE` event is
    /// queued. `None` when there is no such space.
    pub fn person_writes(
        &self,
        space: &str,
        person: &SimUser,
        text: &str,
        thread: Option<&str>,
    ) -> Option<SimMessage> {
        let message = self.inner.world().write(space, person, text, thread, None);
        self.inner.events_changed.notify_one();
        message
    }

    /// Another app posts `text`, with `client_id` as its client-assigned id when given (another
    /// gateway's marked message carries its marker there). The app under test receives its
    /// `MESSAGE` event like a person's (the sender's `type` is `BOT`).
    pub fn bot_writes(
        &self,
        space: &str,
        bot: &SimUser,
        text: &str,
        client_id: Option<&str>,
    ) -> Option<SimMessage> {
        let message = self.inner.world().write(space, bot, text, None, client_id);
        self.inner.events_changed.notify_one();
        message
    }

    /// Queues event `event_id` again (a redelivery), acknowledged or not.
    pub fn redeliver(&self, event_id: &str) -> bool {
        let mut world = self.inner.world();
        let Some(event) = world.events.iter_mut().find(|e| e.id == event_id) else {
            return false;
        };
        event.acked = false;
        event.given_up = false;
        event.next_at = std::time::Instant::now();
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

    /// The body of event `event_id`.
    pub fn event(&self, event_id: &str) -> Option<Value> {
        self.inner
            .world()
            .events
            .iter()
            .find(|e| e.id == event_id)
            .map(|e| e.body.clone())
    }

    /// Events neither acknowledged with a 2xx nor given up.
    pub fn unacknowledged_events(&self) -> usize {
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
            if self.unacknowledged_events() == 0 {
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

    /// The visible messages of `space`, oldest first.
    pub fn messages(&self, space: &str) -> Vec<SimMessage> {
        self.inner
            .world()
            .all_messages(space)
            .into_iter()
            .filter(|m| !m.deleted)
            .collect()
    }

    /// Every message ever written in `space`, deleted ones included.
    pub fn all_messages(&self, space: &str) -> Vec<SimMessage> {
        self.inner.world().all_messages(space)
    }

    /// The visible messages of every space.
    pub fn every_message(&self) -> Vec<SimMessage> {
        self.inner.world().every_message()
    }

    /// The message resource of `message`, as the API shows it.
    pub fn resource(&self, message: &SimMessage) -> Value {
        let world = self.inner.world();
        message.resource(&world.space_resource(&message.space))
    }

    /// Every API call, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every delivery attempt, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner.world().deliveries.clone()
    }
}
