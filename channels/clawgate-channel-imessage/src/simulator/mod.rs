//! A BlueBubbles server on loopback: its REST API over a chat.db-like record, and its webhooks.
//!
//! [`BlueBubblesSimulator::start`] binds `127.0.0.1` and serves what platform-apis-wave2 §3.1
//! describes (\[server-src\] unless marked):
//!
//! - auth: the server password in the query string as `password`, `guid` or `token`; without
//!   it (or wrong) 401 `{status, message:"Unauthorized", error:{type:"Authentication Error",
//!   message:"Missing server password!"}}`;
//! - `POST /api/v1/message/text {chatGuid, tempGuid, message, method}`: `method` is
//!   `apple-script` (needs `tempGuid`) or `private-api` (needs the Private API); a `tempGuid`
//!   still in flight → 400 "Message is already queued to be sent! (Temp GUID: …)"; the answer
//!   comes once the message's row exists, `{status:200, message:"Message sent!", data:
//!   <message with its real guid and our tempGuid>}`; an iMessage failure is 500 "Message Send
//!   Error" with the failed message (its `error` code set) in `data`; a request timeout is
//!   504. The in-flight set is in memory: once a send is answered (or failed) a retry with the
//!   same `tempGuid` sends again, as the real server does;
//! - `POST /api/v1/message/query {chatGuid?, after?, before?, limit, offset, sort}` and
//!   `GET /api/v1/chat/:guid/message`: rows as chat.db holds them (no `tempGuid`: chat.db has
//!   no such column);
//! - `GET /api/v1/server/info`, `GET /api/v1/message/:guid`;
//! - `POST /api/v1/message/:guid/edit` and `/unsend`: Private API only, own iMessage rows only
//!   (not SMS), within 15 minutes and at most 5 edits, within 2 minutes for an unsend
//!   (\[obs\] Apple's rules; the error answers past them are \[unverified\]); measured on the
//!   simulator's clock, which [`BlueBubblesSimulator::advance`] drives.
//!
//! Webhooks: every new row is POSTed once to the registered URL as `{type:"new-message",
//! data:<message>}`, edits and unsends as `updated-message`, failed sends as
//! `message-send-error`; no retry, no signature (fire-and-forget). **Our own sends come back**:
//! [`SimulatorConfig::echo_delay`] after the row appears, as `new-message` with `isFromMe:
//! true`, under the real guid, carrying `tempGuid` only when
//! [`SimulatorConfig::echo_carries_temp_guid`] (the real matcher finds it only sometimes).
//!
//! Faults ([`BlueBubblesSimulator::inject`]): a send error, a lost answer after the row exists,
//! a 504 after the row exists, a generic 500 with nothing done, a lost answer with no row ever
//! made. Tests play the people ([`BlueBubblesSimulator::person_writes`],
//! [`BlueBubblesSimulator::own_device_writes`]) and judge from the record
//! ([`BlueBubblesSimulator::messages`], [`BlueBubblesSimulator::calls`],
//! [`BlueBubblesSimulator::deliveries`]).
//!
//! Invariants: a refused call creates nothing (except the failed row of a send error, which
//! chat.db keeps); an accepted send is in the record whether or not its answer arrived.

mod http;
mod webhook;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How a simulator is set up.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// The server password.
    pub password: String,
    /// Whether the Private API helper is connected (edits, unsends, `private-api` sends).
    pub private_api: bool,
    /// How long after a sent message's row appears its `new-message` echo is POSTed.
    pub echo_delay: Duration,
    /// Whether echoes carry our `tempGuid`.
    pub echo_carries_temp_guid: bool,
    /// How long the server waits before answering a send (the row appears at once).
    pub answer_delay: Duration,
    /// How long a webhook receiver may take before the POST counts as failed.
    pub webhook_timeout: Duration,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("private_api", &self.private_api)
            .field("echo_delay", &self.echo_delay)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            password: "bb-sim-password 42/&".into(),
            private_api: true,
            echo_delay: Duration::from_millis(300),
            echo_carries_temp_guid: false,
            answer_delay: Duration::ZERO,
            webhook_timeout: Duration::from_secs(10),
        }
    }
}

/// A chat, as chat.db holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimChat {
    /// `iMessage;-;+15551234567`, `iMessage;+;chat…`, `SMS;-;…`.
    pub guid: String,
    /// The address or group identifier.
    pub identifier: String,
    /// `iMessage` or `SMS`.
    pub service: String,
    /// The other people's handles.
    pub participants: Vec<String>,
}

impl SimChat {
    fn is_group(&self) -> bool {
        self.guid.contains(";+;")
    }
}

/// One chat.db row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMessage {
    /// `ROWID`.
    pub rowid: i64,
    /// Its guid.
    pub guid: String,
    /// Its chat.
    pub chat_guid: String,
    /// Its text (empty once unsent).
    pub text: String,
    /// Sent from this Apple ID.
    pub is_from_me: bool,
    /// The sender's handle (`None` for our own).
    pub handle: Option<String>,
    /// Created (simulator clock, ms).
    pub date_created: u64,
    /// Last edited.
    pub date_edited: Option<u64>,
    /// Unsent.
    pub date_retracted: Option<u64>,
    /// Edits made.
    pub edits: u32,
    /// iMessage's error code (0: sent).
    pub error: i64,
    /// The `tempGuid` of the send that made it (the server's memory, not chat.db's).
    pub temp_guid: Option<String>,
}

/// One REST call as the simulator answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallRecord {
    /// `GET`, `POST`.
    pub method: String,
    /// The path.
    pub path: String,
    /// The JSON body (`Null` when none).
    pub body: Value,
    /// The HTTP status answered (or that would have been).
    pub status: u16,
    /// The answer was written (`false`: a lost answer).
    pub answered: bool,
    /// The query carried the right password.
    pub authorized: bool,
}

/// One webhook POST and how it went.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    /// Its number (for [`BlueBubblesSimulator::replay`]).
    pub id: usize,
    /// Where it went.
    pub url: String,
    /// What was posted.
    pub body: Value,
    /// The HTTP status answered; 0: no connection or no answer in time, or not finished.
    pub status: u16,
    /// Finished.
    pub done: bool,
}

/// What an injected fault does to a send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// iMessage fails it: the row is made with `error` 22, answered 500 "Message Send Error".
    SendError,
    /// The row is made (and echoed), then the connection closes without an answer.
    LoseAnswer,
    /// The row is made (and echoed), then 504: the server stopped waiting.
    Timeout,
    /// 500 "Server Error"; nothing is made.
    ServerError,
    /// The connection closes without an answer and no row is ever made (the request died
    /// before Messages took it).
    LoseRequest,
}

/// A fault on sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub(crate) kind: FaultKind,
    pub(crate) after: u32,
    pub(crate) times: u32,
}

impl Fault {
    /// The next send meets `kind`.
    pub fn new(kind: FaultKind) -> Fault {
        Fault {
            kind,
            after: 0,
            times: 1,
        }
    }

    /// After `sends` more sends go through.
    pub fn after(mut self, sends: u32) -> Fault {
        self.after = sends;
        self
    }

    /// For `times` sends in a row.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times.max(1);
        self
    }
}

/// The simulated server's state.
pub(crate) struct World {
    pub(crate) chats: Vec<SimChat>,
    pub(crate) messages: Vec<SimMessage>,
    pub(crate) calls: Vec<CallRecord>,
    pub(crate) deliveries: Vec<DeliveryRecord>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) in_flight: HashSet<String>,
    pub(crate) webhook: Option<String>,
    pub(crate) cut_deliveries: u32,
    pub(crate) pending_echoes: u32,
    pub(crate) clock_offset_ms: u64,
    next_rowid: i64,
}

impl World {
    pub(crate) fn now(&self) -> u64 {
        wall_ms().saturating_add(self.clock_offset_ms)
    }

    pub(crate) fn chat(&self, guid: &str) -> Option<&SimChat> {
        self.chats.iter().find(|c| c.guid == guid)
    }

    /// A new row.
    pub(crate) fn row(
        &mut self,
        chat_guid: &str,
        text: &str,
        is_from_me: bool,
        handle: Option<String>,
        temp_guid: Option<String>,
    ) -> SimMessage {
        self.next_rowid += 1;
        let message = SimMessage {
            rowid: self.next_rowid,
            guid: guid_for(self.next_rowid as u64),
            chat_guid: chat_guid.to_owned(),
            text: text.to_owned(),
            is_from_me,
            handle,
            date_created: self.now(),
            date_edited: None,
            date_retracted: None,
            edits: 0,
            error: 0,
            temp_guid,
        };
        self.messages.push(message.clone());
        message
    }

    /// A message as the server serializes it (`with_temp`: the send answer's `tempGuid`).
    pub(crate) fn serialize(&self, message: &SimMessage, with_temp: bool) -> Value {
        let chat = self.chat(&message.chat_guid);
        let handle = match (&message.handle, chat) {
            (Some(address), _) => Some(address.clone()),
            // Our own message in a DM: the handle is the other person.
            (None, Some(chat)) if !chat.is_group() => chat.participants.first().cloned(),
            _ => None,
        };
        let service = chat.map_or("iMessage", |c| c.service.as_str());
        let mut value = json!({
            "originalROWID": message.rowid,
            "guid": message.guid,
            "text": message.text,
            "attributedBody": null,
            "handle": handle.as_ref().map(|address| json!({
                "originalROWID": 1 + address.len() as i64,
                "address": address,
                "service": service,
                "country": "us",
                "uncanonicalizedId": null,
            })),
            "handleId": handle.as_ref().map_or(0, |a| 1 + a.len() as i64),
            "otherHandle": 0,
            "chats": chat.map(|c| vec![json!({
                "originalROWID": 1,
                "guid": c.guid,
                "style": if c.is_group() { 43 } else { 45 },
                "chatIdentifier": c.identifier,
                "isArchived": false,
                "displayName": if c.is_group() { c.identifier.clone() } else { String::new() },
            })]).unwrap_or_default(),
            "attachments": [],
            "subject": null,
            "country": null,
            "error": message.error,
            "dateCreated": message.date_created,
            "dateRead": null,
            "dateDelivered": if message.is_from_me && message.error == 0 { json!(message.date_created) } else { Value::Null },
            "isFromMe": message.is_from_me,
            "isDelayed": false,
            "isAutoReply": false,
            "isSystemMessage": false,
            "isServiceMessage": false,
            "isForward": false,
            "isArchived": false,
            "hasDdResults": false,
            "cacheRoomnames": chat.filter(|c| c.is_group()).map(|c| c.identifier.clone()),
            "isAudioMessage": false,
            "datePlayed": null,
            "itemType": 0,
            "groupTitle": null,
            "groupActionType": 0,
            "balloonBundleId": null,
            "associatedMessageGuid": null,
            "associatedMessageType": null,
            "expressiveSendStyleId": null,
            "threadOriginatorGuid": null,
            "hasPayloadData": false,
            "dateEdited": message.date_edited,
            "dateRetracted": message.date_retracted,
            "partCount": 1,
        });
        if with_temp && let Some(temp) = &message.temp_guid {
            value["tempGuid"] = json!(temp);
        }
        value
    }
}

pub(crate) struct Inner {
    pub(crate) config: SimulatorConfig,
    pub(crate) addr: SocketAddr,
    world: Mutex<World>,
    pub(crate) http: reqwest::Client,
    pub(crate) shutdown: tokio::sync::watch::Sender<bool>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    pub(crate) fn world(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(task);
        let mut tasks = self
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A message guid as Messages makes them (an uppercase UUID), from a row number.
fn guid_for(n: u64) -> String {
    let mut state = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (a, b) = (next(), next());
    format!(
        "{:08X}-{:04X}-4{:03X}-{:04X}-{:012X}",
        a >> 32,
        (a >> 16) & 0xFFFF,
        a & 0xFFF,
        0x8000 | (b >> 48) & 0x3FFF,
        b & 0xFFFF_FFFF_FFFF
    )
}

/// A running simulator; stops when [`BlueBubblesSimulator::stop`] is called or the runtime
/// ends.
pub struct BlueBubblesSimulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BlueBubblesSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlueBubblesSimulator")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

impl BlueBubblesSimulator {
    /// Starts a simulator set up by `config`.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<BlueBubblesSimulator> {
        let listener = tokio::net::TcpListener::bind(config.bind).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            config,
            addr,
            world: Mutex::new(World {
                chats: Vec::new(),
                messages: Vec::new(),
                calls: Vec::new(),
                deliveries: Vec::new(),
                faults: Vec::new(),
                in_flight: HashSet::new(),
                webhook: None,
                cut_deliveries: 0,
                pending_echoes: 0,
                clock_offset_ms: 0,
                // A Mac in use has many rows already.
                next_rowid: 48_210,
            }),
            // A connection per webhook: a POST never rides a connection an earlier listener
            // accepted (the gateway restarted in the same process, in tests).
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .connect_timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
            shutdown: tokio::sync::watch::channel(false).0,
            tasks: Mutex::new(Vec::new()),
        });
        http::serve(&inner, listener);
        Ok(BlueBubblesSimulator { inner })
    }

    /// Stops serving and sending.
    pub async fn stop(&self) {
        self.inner.shutdown.send_replace(true);
        let tasks: Vec<_> = std::mem::take(
            &mut *self
                .inner
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            task.abort();
        }
    }

    /// The server's base URL (`http://127.0.0.1:<port>`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// The server password.
    pub fn password(&self) -> String {
        self.inner.config.password.clone()
    }

    /// Where webhooks go; `None`: nowhere.
    pub fn set_webhook(&self, url: Option<&str>) {
        self.inner.world().webhook = url.map(str::to_owned);
    }

    /// The iMessage DM with `address` (made if new); its chat guid.
    pub fn dm(&self, address: &str) -> String {
        self.add_chat(
            format!("iMessage;-;{address}"),
            address,
            "iMessage",
            vec![address.to_owned()],
        )
    }

    /// The SMS chat with `address`; its chat guid.
    pub fn sms(&self, address: &str) -> String {
        self.add_chat(
            format!("SMS;-;{address}"),
            address,
            "SMS",
            vec![address.to_owned()],
        )
    }

    /// A group chat of `participants` named `name`; its chat guid.
    pub fn group(&self, name: &str, participants: &[&str]) -> String {
        let id = format!(
            "chat{}",
            100_000 + name.len() * 7919 + name.bytes().map(u64::from).sum::<u64>() as usize
        );
        self.add_chat(
            format!("iMessage;+;{id}"),
            &id,
            "iMessage",
            participants.iter().map(|p| (*p).to_owned()).collect(),
        )
    }

    fn add_chat(
        &self,
        guid: String,
        identifier: &str,
        service: &str,
        participants: Vec<String>,
    ) -> String {
        let mut world = self.inner.world();
        if world.chat(&guid).is_none() {
            world.chats.push(SimChat {
                guid: guid.clone(),
                identifier: identifier.to_owned(),
                service: service.to_owned(),
                participants,
            });
        }
        guid
    }

    /// `handle` writes `text` into `chat`: the row appears and is webhooked; its guid.
    pub fn person_writes(&self, chat: &str, handle: &str, text: &str) -> String {
        let mut world = self.inner.world();
        let message = world.row(chat, text, false, Some(handle.to_owned()), None);
        let body = json!({ "type": "new-message", "data": world.serialize(&message, false) });
        webhook::enqueue(&self.inner, &mut world, body);
        message.guid
    }

    /// The account's owner writes `text` into `chat` from another device on the same Apple
    /// ID: an `isFromMe` row that is not ours; its guid.
    pub fn own_device_writes(&self, chat: &str, text: &str) -> String {
        let mut world = self.inner.world();
        let message = world.row(chat, text, true, None, None);
        let body = json!({ "type": "new-message", "data": world.serialize(&message, false) });
        webhook::enqueue(&self.inner, &mut world, body);
        message.guid
    }

    /// Every row, oldest first.
    pub fn messages(&self) -> Vec<SimMessage> {
        self.inner.world().messages.clone()
    }

    /// What the chat shows of our own messages: sent (no error), not unsent; oldest first.
    pub fn our_texts(&self, chat: &str) -> Vec<String> {
        self.inner
            .world()
            .messages
            .iter()
            .filter(|m| {
                m.chat_guid == chat && m.is_from_me && m.error == 0 && m.date_retracted.is_none()
            })
            .map(|m| m.text.clone())
            .collect()
    }

    /// A row as the server serializes it (webhook and query shape).
    pub fn serialized(&self, guid: &str) -> Option<Value> {
        let world = self.inner.world();
        let message = world.messages.iter().find(|m| m.guid == guid)?.clone();
        Some(world.serialize(&message, false))
    }

    /// Every REST call, in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.world().calls.clone()
    }

    /// Every webhook POST, in order.
    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.inner.world().deliveries.clone()
    }

    /// Posts delivery `id` again, as a new delivery; its id.
    pub fn replay(&self, id: usize) -> Option<usize> {
        let mut world = self.inner.world();
        let body = world.deliveries.get(id)?.body.clone();
        Some(webhook::enqueue(&self.inner, &mut world, body))
    }

    /// Posts `body` to the webhook URL as the server would (a hand-made event); its id.
    pub fn deliver_raw(&self, body: Value) -> usize {
        let mut world = self.inner.world();
        webhook::enqueue(&self.inner, &mut world, body)
    }

    /// The next delivery's answer is not read: it counts as failed (status 0).
    pub fn cut_next_delivery(&self) {
        self.inner.world().cut_deliveries += 1;
    }

    /// Waits until every delivery (echoes still to come included) has finished; `false` after
    /// `deadline`.
    pub async fn deliveries_settled(&self, deadline: Duration) -> bool {
        let until = Instant::now() + deadline;
        loop {
            {
                let world = self.inner.world();
                if world.pending_echoes == 0 && world.deliveries.iter().all(|d| d.done) {
                    return true;
                }
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Queues a fault for sends.
    pub fn inject(&self, fault: Fault) {
        self.inner.world().faults.push(fault);
    }

    /// A send with `temp_guid` is in flight (an earlier request still waiting for its row)
    /// until [`Self::release`].
    pub fn hold_in_flight(&self, temp_guid: &str) {
        self.inner.world().in_flight.insert(temp_guid.to_owned());
    }

    /// The in-flight send of `temp_guid` ends.
    pub fn release(&self, temp_guid: &str) {
        self.inner.world().in_flight.remove(temp_guid);
    }

    /// Moves the simulator's clock (dates, edit and unsend windows) forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.inner.world().clock_offset_ms += ms;
    }
}
