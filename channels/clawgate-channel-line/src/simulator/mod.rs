//! A LINE Messaging API channel on loopback: the API the channel uses and the webhook sender.
//!
//! [`LineSimulator::start`] binds `127.0.0.1` and serves, as platform-apis-wave2 §5 describes:
//! `POST /v2/bot/message/reply` (tokens single use, valid one minute from the webhook that
//! brought them, a redelivery's for one minute from it but never past twenty minutes after
//! the event; anything else answers 400 `Invalid reply token` and sends nothing; a retry key
//! there is refused), `POST /v2/bot/message/push` with `X-Line-Retry-Key` (a UUID; a repeat of
//! an accepted key within 24 hours answers 409 with `x-line-accepted-request-id` and the
//! original `sentMessages`), `GET /v2/bot/info`, `x-line-request-id` on every answer, one to
//! five messages per call, text up to 5000 characters, LINE's error body (`message`,
//! `details[]`), 401 for a wrong token, 429 for the rate limit and (told apart only by its
//! message) the monthly quota, and `sentMessages[].id/quoteToken`. Webhooks go to the
//! configured URL signed with `x-line-signature` (base64 HMAC-SHA256 of the body with the
//! channel secret), with `destination`, `webhookEventId` (a ULID), `deliveryContext.isRedelivery`
//! and, when the answer is not 2xx and redelivery is on, are delivered again.
//!
//! Tests play the people ([`LineSimulator::user_writes`], [`LineSimulator::member_writes`],
//! [`LineSimulator::follow`]), break things ([`LineSimulator::inject`],
//! [`LineSimulator::expire_reply_token`]) and judge from the platform's own record
//! ([`LineSimulator::messages`], [`LineSimulator::calls`], [`LineSimulator::deliveries`]).
//!
//! Invariants: a refused call (an error status, an injected refusal) sends nothing and
//! registers no retry key; a call that took effect is in [`LineSimulator::messages`] whether or
//! not its answer reached the client; message ids strictly increase.

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
    /// The channel access token this channel accepts.
    pub access_token: String,
    /// The channel secret every webhook is signed with.
    pub channel_secret: String,
    /// How long a reply token works after the webhook that brought it (LINE: one minute).
    pub reply_token_ttl: Duration,
    /// How long after its event a redelivered token can work at most (LINE: 20 minutes).
    pub reply_token_max_age: Duration,
    /// How long an accepted retry key is remembered (LINE: 24 hours).
    pub retry_key_ttl: Duration,
    /// The console's "Webhook redelivery" setting.
    pub redelivery: bool,
    /// The delays before each redelivery; after the last one the event is given up. (LINE
    /// publishes no schedule.)
    pub redelivery_delays: Vec<Duration>,
    /// How long the webhook URL may take to answer before the delivery counts as failed.
    pub webhook_timeout: Duration,
    /// Pushes allowed this month (`None`: no quota); past it pushes answer 429
    /// "You have reached your monthly limit."
    pub monthly_push_limit: Option<u32>,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Token and secret are secrets, even in a test channel.
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("redelivery", &self.redelivery)
            .field("redelivery_delays", &self.redelivery_delays)
            .field("monthly_push_limit", &self.monthly_push_limit)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            access_token: "simulator-channel-access-token".to_owned(),
            channel_secret: "8c570fa6dd201bb328f1c1eac23a96d8".to_owned(),
            reply_token_ttl: Duration::from_secs(60),
            reply_token_max_age: Duration::from_secs(20 * 60),
            retry_key_ttl: Duration::from_secs(24 * 60 * 60),
            redelivery: true,
            redelivery_delays: vec![
                Duration::from_millis(200),
                Duration::from_secs(1),
                Duration::from_secs(5),
            ],
            webhook_timeout: Duration::from_secs(5),
            monthly_push_limit: None,
        }
    }
}

/// How a message came to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A person wrote it.
    Person,
    /// The bot's reply with this token.
    Reply(String),
    /// The bot's push, under this retry key if it had one.
    Push(Option<String>),
}

/// One message as the platform holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimMessage {
    /// The message id (digits).
    pub id: String,
    /// The chat: a user id (1:1), a group id (`C…`) or a room id (`R…`).
    pub chat: String,
    /// Who wrote it: a user id, or the bot's user id.
    pub author: String,
    /// The text.
    pub text: String,
    /// Its quote token.
    pub quote_token: String,
    /// Reply, push, or a person.
    pub via: Via,
    /// `x-line-request-id` of the call that created it (bot messages).
    pub request_id: Option<String>,
}

impl SimMessage {
    /// Whether the bot sent it.
    pub fn from_bot(&self) -> bool {
        self.via != Via::Person
    }
}

/// One Messaging API call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `POST /v2/bot/message/push`, …
    pub method: String,
    /// The path.
    pub path: String,
    /// The `X-Line-Retry-Key` it carried.
    pub retry_key: Option<String>,
    /// The JSON body (`Null` when there was none or it was not JSON).
    pub body: Value,
    /// HTTP status answered (or that would have been, when the answer was lost).
    pub status: u16,
    /// The error body's `message`.
    pub error: Option<String>,
    /// Its `x-line-request-id`.
    pub request_id: String,
    /// Whether the answer reached the client.
    pub answered: bool,
}

/// One attempt to deliver a webhook.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// The `webhookEventId`s it carried.
    pub event_ids: Vec<String>,
    /// `deliveryContext.isRedelivery` of its events.
    pub is_redelivery: bool,
    /// The status the webhook URL answered; `None`: no answer in time or no connection.
    pub status: Option<u16>,
    /// The exact body posted, and its `x-line-signature`.
    pub body: String,
    /// The signature header sent.
    pub signature: String,
}

/// What an injected fault does to the call it meets.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// The call takes effect, then the connection is cut before the answer.
    LoseAnswer,
    /// HTTP `status` with a body that is not LINE's, no effect (a load balancer's page).
    ServerError(u16),
    /// LINE's 5xx with its error body, no effect.
    InternalError(u16),
    /// 429 "The API rate limit has been exceeded. Try again later.", no effect.
    RateLimited,
    /// An error status with LINE's body `{"message": …}`, no effect.
    Refuse(u16, String),
}

/// A fault waiting for a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// Only calls to this path meet it (`None`: reply and push).
    pub path: Option<String>,
    /// Calls let through before it strikes.
    pub after: u32,
    /// How many calls it strikes.
    pub times: u32,
    /// What it does.
    pub kind: FaultKind,
}

/// The reply endpoint's path.
pub const REPLY_PATH: &str = "/v2/bot/message/reply";
/// The push endpoint's path.
pub const PUSH_PATH: &str = "/v2/bot/message/push";

impl Fault {
    /// `kind` on the next reply or push.
    pub fn once(kind: FaultKind) -> Fault {
        Fault {
            path: None,
            after: 0,
            times: 1,
            kind,
        }
    }

    /// `kind` on the next call to `path`.
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
    /// The message id.
    pub message_id: String,
    /// The webhook event's `webhookEventId`.
    pub event_id: String,
    /// The event's reply token.
    pub reply_token: String,
}

/// A running simulated channel. Dropping it leaves the server running until
/// [`LineSimulator::stop`] or the runtime ends.
#[derive(Debug, Clone)]
pub struct LineSimulator {
    inner: Arc<Inner>,
}

impl LineSimulator {
    /// Starts a channel with its bot.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<LineSimulator> {
        let inner = http::start(config).await?;
        Ok(LineSimulator { inner })
    }

    /// Stops the server and the webhook sender.
    pub async fn stop(&self) {
        http::stop(&self.inner).await;
    }

    /// `http://127.0.0.1:<port>`: what a client uses as its API base.
    pub fn api_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The channel access token.
    pub fn access_token(&self) -> String {
        self.inner.config.access_token.clone()
    }

    /// The channel secret.
    pub fn channel_secret(&self) -> String {
        self.inner.config.channel_secret.clone()
    }

    /// The bot's user id (the webhooks' `destination`).
    pub fn bot_user_id(&self) -> String {
        self.inner.bot_user_id.clone()
    }

    /// Where webhooks are posted from now on (`None`: nowhere; events wait for a URL).
    pub fn set_webhook_url(&self, url: Option<&str>) {
        self.inner.world().webhook_url = url.map(str::to_owned);
        self.inner.events_changed.notify_one();
    }

    /// Turns the console's "Webhook redelivery" on or off.
    pub fn set_redelivery(&self, on: bool) {
        self.inner.world().redelivery = on;
    }

    /// A person named `name` who has added the bot as a friend (created once per name);
    /// returns the user id.
    pub fn user(&self, name: &str) -> String {
        self.inner.world().user(name)
    }

    /// A group chat with the bot and `members` (user ids); returns its id (`C…`).
    pub fn group(&self, name: &str, members: &[String]) -> String {
        self.inner.world().chat(name, 'C', members)
    }

    /// A multi-person chat with the bot and `members`; returns its id (`R…`).
    pub fn room(&self, name: &str, members: &[String]) -> String {
        self.inner.world().chat(name, 'R', members)
    }

    /// Person `user` writes `text` to the bot 1:1; the webhook event is queued.
    pub fn user_writes(&self, user: &str, text: &str) -> Written {
        let written = self.inner.world().write(user, user, text);
        self.inner.events_changed.notify_one();
        written
    }

    /// Person `user` writes `text` in group or room `chat`.
    pub fn member_writes(&self, chat: &str, user: &str, text: &str) -> Written {
        let written = self.inner.world().write(chat, user, text);
        self.inner.events_changed.notify_one();
        written
    }

    /// Person `user` adds the bot as a friend (a `follow` event, with a reply token).
    pub fn follow(&self, user: &str) -> String {
        let id = self.inner.world().follow(user, true);
        self.inner.events_changed.notify_one();
        id
    }

    /// Person `user` blocks the bot (an `unfollow` event); pushes to them then fail.
    pub fn unfollow(&self, user: &str) -> String {
        let id = self.inner.world().follow(user, false);
        self.inner.events_changed.notify_one();
        id
    }

    /// Makes a call meet `fault`.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// Reply token `token` expires now.
    pub fn expire_reply_token(&self, token: &str) -> bool {
        self.inner.world().expire_token(token)
    }

    /// Every accepted retry key is forgotten (24 hours passed).
    pub fn expire_retry_keys(&self) {
        self.inner.world().retry_keys.clear();
    }

    /// Delivers event `event_id` again now, as a redelivery.
    pub fn redeliver(&self, event_id: &str) -> bool {
        let done = self.inner.world().redeliver(event_id);
        self.inner.events_changed.notify_one();
        done
    }

    /// The next webhook delivery goes out but its answer is never read (a connection dropped
    /// under it): a failed delivery, redelivered when redelivery is on.
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_next_delivery = true;
    }

    /// The messages of chat `chat` (a user id for 1:1), oldest first.
    pub fn messages(&self, chat: &str) -> Vec<SimMessage> {
        self.inner
            .world()
            .messages
            .iter()
            .filter(|m| m.chat == chat)
            .cloned()
            .collect()
    }

    /// The bot's messages in `chat`, oldest first.
    pub fn bot_messages(&self, chat: &str) -> Vec<SimMessage> {
        self.messages(chat)
            .into_iter()
            .filter(SimMessage::from_bot)
            .collect()
    }

    /// Every message of every chat, oldest first.
    pub fn every_message(&self) -> Vec<SimMessage> {
        self.inner.world().messages.clone()
    }

    /// Every Messaging API call, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every webhook delivery attempt, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner.world().deliveries.clone()
    }

    /// Every `webhookEventId` queued so far, oldest first.
    pub fn event_ids(&self) -> Vec<String> {
        self.inner
            .world()
            .events
            .iter()
            .map(|e| e.id.clone())
            .collect()
    }

    /// The webhook event `event_id`, as first sent.
    pub fn event(&self, event_id: &str) -> Option<Value> {
        self.inner
            .world()
            .events
            .iter()
            .find(|e| e.id == event_id)
            .map(|e| e.event.clone())
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

    /// Events given up (no 2xx and no redelivery left).
    pub fn given_up_events(&self) -> Vec<String> {
        self.inner
            .world()
            .events
            .iter()
            .filter(|e| e.given_up)
            .map(|e| e.id.clone())
            .collect()
    }

    /// Waits until every queued event was acknowledged or given up, up to `deadline`; whether
    /// it got there.
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
