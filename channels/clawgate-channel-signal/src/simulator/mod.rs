//! signal-cli's JSON-RPC daemon on loopback, for tests.
//!
//! [`SignalSimulator::start`] binds `127.0.0.1` twice, as `signal-cli daemon --tcp … --http …`
//! does: line-delimited JSON-RPC 2.0 over TCP (requests, answers and `receive` notifications on
//! one connection) and HTTP (`POST /api/v1/rpc`, one request per POST; `GET /api/v1/check`).
//! It is a multi-account daemon: every account-bound method needs `account` in its params
//! (`-32602` "Method requires valid account parameter" / "Specified account does not exist"
//! otherwise). What it follows (platform-apis-wave2 §2):
//!
//! - `send` with `recipient` (string or array) or `groupId`, `message`,
//!   `quoteTimestamp`/`quoteAuthor`, `editTimestamp`, `mentions` (`start:length:number`):
//!   the answer is `{"timestamp", "results": [{recipientAddress: {uuid, number}, type, …}]}`,
//!   one result per recipient (every other member of a group), `type` one of `SUCCESS`,
//!   `NETWORK_FAILURE`, `UNREGISTERED_FAILURE`, `IDENTITY_FAILURE`, `RATE_LIMIT_FAILURE`
//!   (with `retryAfterSeconds`). A send no recipient took is a JSON-RPC error whose
//!   `data.response` carries the same results: `-5` rate limit, `-4` untrusted identity, `-3`
//!   network (IO) failure, `-1` (user error) for unregistered recipients; other user errors
//!   ("No recipients given", "No message given", an unknown group, bad mention syntax) are
//!   `-1`, malformed params `-32602`, unknown methods `-32601`, unparsable lines `-32700`.
//! - The timestamp is the message's id and the daemon picks it: the current millisecond,
//!   made unique within the process (a retried send is a new message with a new timestamp).
//! - A text over 2000 UTF-8 bytes goes out truncated to 2000 bytes with the whole text as a
//!   `text/x-signal-plain` attachment ([`Landed::long_text`]).
//! - `--receive-mode=manual` (the default here): what arrives for an account waits in its
//!   queue until a TCP connection calls `subscribeReceive` (answer: the subscription id);
//!   then each message goes out once as `{"method": "receive", "params": {"subscription", "result":
//!   {"envelope", "account"}}}` and is gone from the queue (signal-cli acknowledged it to the
//!   Signal server). `unsubscribeReceive` ends it. [`ReceiveMode::OnStart`] models the
//!   default mode: messages are pushed to every open connection as `{"envelope", "account"}`
//!   params, and lost when none is open; `subscribeReceive` is refused.
//! - Envelopes: `dataMessage` (with `groupInfo`, `quote`, `mentions`, `remoteDelete`),
//!   `editMessage{targetSentTimestamp, dataMessage}`, `syncMessage.sentMessage` (a linked
//!   device of our own account sent something), `receiptMessage`, `typingMessage`.
//!
//! Tests play the people ([`SignalSimulator::person_writes`] and friends), break things
//! ([`SignalSimulator::inject`], [`SignalSimulator::untrust`], [`SignalSimulator::drop_subscribers`])
//! and judge from the daemon's own record of what went out ([`SignalSimulator::landed`]).
//! Invariants: a refused send has no effect and leaves no record; an applied send is in
//! [`SignalSimulator::landed`] whether or not its answer reached the client.

mod rpc;
mod transport;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Longest message body signal-cli sends inline (`ServiceConfig.MAX_MESSAGE_SIZE_BYTES`).
pub const MAX_BODY_BYTES: usize = 2_000;

/// How the daemon hands incoming messages to clients (`--receive-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReceiveMode {
    /// `manual`: queued until a client calls `subscribeReceive`.
    #[default]
    Manual,
    /// `on-start`: pushed to whoever is connected, lost when nobody is.
    OnStart,
}

/// How a simulator is set up.
#[derive(Debug, Clone)]
pub struct SimulatorConfig {
    /// The accounts (phone numbers) registered on the daemon.
    pub accounts: Vec<String>,
    /// `--receive-mode`.
    pub receive_mode: ReceiveMode,
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            accounts: vec!["+15550001111".to_owned()],
            receive_mode: ReceiveMode::Manual,
        }
    }
}

/// What one `send` call meets instead of its normal answer.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    /// The send is applied and lands, and the connection closes before the answer is written.
    LoseAnswer,
    /// Every recipient fails with `NETWORK_FAILURE` (a `-3` IO error): nothing lands.
    NetworkFailure,
    /// Every recipient fails with `RATE_LIMIT_FAILURE` and this `retryAfterSeconds` (`-5`).
    RateLimit {
        /// Seconds until the Signal server takes messages again.
        retry_after_seconds: u64,
    },
    /// Every recipient fails with `IDENTITY_FAILURE` (`-4`): their safety number changed.
    UntrustedIdentity,
    /// Every recipient fails with `UNREGISTERED_FAILURE` (`-1`).
    Unregistered,
    /// A plain JSON-RPC error with this code and message (no results).
    Error {
        /// The JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
}

/// A fault for the next `send` calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    kind: FaultKind,
    after: u32,
    times: u32,
}

impl Fault {
    /// `kind`, for the next send.
    pub fn new(kind: FaultKind) -> Fault {
        Fault {
            kind,
            after: 0,
            times: 1,
        }
    }

    /// Lets `n` sends through first.
    pub fn after(mut self, n: u32) -> Fault {
        self.after = n;
        self
    }

    /// Hits `n` sends in a row.
    pub fn times(mut self, n: u32) -> Fault {
        self.times = n.max(1);
        self
    }
}

/// One message the daemon sent for an account: the platform's record of what landed.
#[derive(Debug, Clone, PartialEq)]
pub struct Landed {
    /// The sending account.
    pub account: String,
    /// Its id with the account: the timestamp the daemon chose.
    pub timestamp: u64,
    /// The 1:1 recipient's number.
    pub recipient: Option<String>,
    /// The group it went to.
    pub group_id: Option<String>,
    /// The body as it went out (at most [`MAX_BODY_BYTES`]).
    pub body: String,
    /// The whole text, when it was longer and went as a long-text attachment.
    pub long_text: Option<String>,
    /// `(quoteTimestamp, quoteAuthor)` of a reply.
    pub quote: Option<(u64, String)>,
    /// The timestamp of the message this one edits.
    pub edit_of: Option<u64>,
    /// `mentions` as given (`start:length:number`).
    pub mentions: Vec<String>,
    /// The recipients it reached (`SUCCESS`).
    pub delivered_to: Vec<String>,
}

impl Landed {
    /// The text a reader sees: the long text when there is one.
    pub fn text(&self) -> &str {
        self.long_text.as_deref().unwrap_or(&self.body)
    }
}

/// A person (a Signal user other than our accounts).
#[derive(Debug, Clone)]
struct Person {
    uuid: String,
    name: String,
    registered: bool,
    trusted: bool,
}

struct Subscriber {
    id: u64,
    account: Option<String>,
    tx: mpsc::UnboundedSender<Outbound>,
}

/// What a connection writes besides its answers.
#[derive(Debug)]
pub(crate) enum Outbound {
    /// A notification line.
    Line(String),
    /// Close the connection (a dropped socket).
    Close,
}

#[derive(Default)]
struct AccountState {
    uuid: String,
    /// Messages waiting for a subscriber (manual mode).
    queue: VecDeque<Value>,
}

pub(crate) struct State {
    mode: ReceiveMode,
    accounts: BTreeMap<String, AccountState>,
    people: BTreeMap<String, Person>,
    groups: BTreeMap<String, (String, BTreeSet<String>)>,
    last_timestamp: u64,
    faults: Vec<Fault>,
    landed: Vec<Landed>,
    /// Every message handed to a client (`receive` notifications), oldest first.
    handed: Vec<Value>,
    /// Messages that arrived in on-start mode with nobody listening.
    lost: Vec<Value>,
    subscribers: Vec<Subscriber>,
    /// Open TCP connections (on-start mode pushes to all of them).
    connections: BTreeMap<u64, mpsc::UnboundedSender<Outbound>>,
    next_subscription: u64,
    next_connection: u64,
    calls: Vec<(String, Value)>,
    /// Notification lines to write right after the current answer.
    followups: Vec<String>,
    /// Sends applied whose answer was never written ([`FaultKind::LoseAnswer`]).
    dropped_answers: usize,
}

/// A stable fake UUID for a number (Signal's ACI of that person).
fn uuid_for(number: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in number.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let h = format!("{hash:016x}{:016x}", hash.rotate_left(29) ^ 0x5bd1_e995);
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or_default()
}

impl State {
    /// signal-cli's `getNextMessageTimestamp()`: now, or one past the last one.
    fn next_timestamp(&mut self) -> u64 {
        self.last_timestamp = now_ms().max(self.last_timestamp + 1);
        self.last_timestamp
    }

    fn person(&mut self, number: &str) -> &mut Person {
        self.people
            .entry(number.to_owned())
            .or_insert_with(|| Person {
                uuid: uuid_for(number),
                name: String::new(),
                registered: true,
                trusted: true,
            })
    }

    fn take_fault(&mut self) -> Option<FaultKind> {
        let fault = self.faults.first_mut()?;
        if fault.after > 0 {
            fault.after -= 1;
            return None;
        }
        let kind = fault.kind.clone();
        fault.times -= 1;
        if fault.times == 0 {
            self.faults.remove(0);
        }
        Some(kind)
    }

    /// An envelope from `source` arrives for `account`: pushed, queued or lost by the mode.
    fn arrive(&mut self, account: &str, envelope: Value) -> Value {
        let item = json!({ "envelope": envelope, "account": account });
        match self.mode {
            ReceiveMode::Manual => {
                let subscriber = self
                    .subscribers
                    .iter()
                    .position(|s| s.account.as_deref().is_none_or(|a| a == account));
                let delivered = subscriber.is_some_and(|n| {
                    let s = &self.subscribers[n];
                    s.tx.send(Outbound::Line(notification(Some(s.id), &item)))
                        .is_ok()
                });
                if delivered {
                    self.handed.push(item.clone());
                } else if let Some(state) = self.accounts.get_mut(account) {
                    state.queue.push_back(item.clone());
                }
            }
            ReceiveMode::OnStart => {
                let line = notification(None, &item);
                let mut any = false;
                self.connections.retain(|_, tx| {
                    let ok = tx.send(Outbound::Line(line.clone())).is_ok();
                    any |= ok;
                    ok
                });
                if any {
                    self.handed.push(item.clone());
                } else {
                    // Acknowledged to the Signal server already: gone for good.
                    self.lost.push(item.clone());
                }
            }
        }
        item
    }

    fn source_fields(&mut self, number: &str) -> serde_json::Map<String, Value> {
        let person = self.person(number).clone();
        let mut fields = serde_json::Map::new();
        fields.insert("source".into(), json!(number));
        fields.insert("sourceNumber".into(), json!(number));
        fields.insert("sourceUuid".into(), json!(person.uuid));
        fields.insert("sourceName".into(), json!(person.name));
        fields.insert("sourceDevice".into(), json!(1));
        fields
    }

    fn envelope(&mut self, from: &str, timestamp: u64, body_key: &str, body: Value) -> Value {
        let mut envelope = self.source_fields(from);
        envelope.insert("timestamp".into(), json!(timestamp));
        envelope.insert("serverReceivedTimestamp".into(), json!(timestamp + 3));
        envelope.insert("serverDeliveredTimestamp".into(), json!(timestamp + 5));
        envelope.insert(body_key.into(), body);
        Value::Object(envelope)
    }
}

/// A `receive` notification line: manual mode wraps the item in its subscription.
fn notification(subscription: Option<u64>, item: &Value) -> String {
    let params = match subscription {
        Some(id) => json!({ "subscription": id, "result": item }),
        None => item.clone(),
    };
    json!({ "jsonrpc": "2.0", "method": "receive", "params": params }).to_string()
}

pub(crate) struct Shared {
    state: Mutex<State>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A signal-cli daemon on loopback. Dropping it stops its listeners.
pub struct SignalSimulator {
    shared: Arc<Shared>,
    tcp: SocketAddr,
    http: SocketAddr,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for SignalSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignalSimulator")
            .field("tcp", &self.tcp)
            .field("http", &self.http)
            .finish_non_exhaustive()
    }
}

impl Drop for SignalSimulator {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl SignalSimulator {
    /// Binds both listeners on `127.0.0.1:0` and serves until dropped.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<SignalSimulator> {
        SignalSimulator::start_on("127.0.0.1:0", "127.0.0.1:0", config).await
    }

    /// Binds the TCP and HTTP listeners on the given addresses (a fixed port lets a restarted
    /// daemon come back where its clients look for it).
    pub async fn start_on(
        tcp: &str,
        http: &str,
        config: SimulatorConfig,
    ) -> std::io::Result<SignalSimulator> {
        let accounts = config
            .accounts
            .iter()
            .map(|a| {
                (
                    a.clone(),
                    AccountState {
                        uuid: uuid_for(a),
                        queue: VecDeque::new(),
                    },
                )
            })
            .collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: config.receive_mode,
                accounts,
                people: BTreeMap::new(),
                groups: BTreeMap::new(),
                last_timestamp: 0,
                faults: Vec::new(),
                landed: Vec::new(),
                handed: Vec::new(),
                lost: Vec::new(),
                subscribers: Vec::new(),
                connections: BTreeMap::new(),
                next_subscription: 0,
                next_connection: 0,
                calls: Vec::new(),
                followups: Vec::new(),
                dropped_answers: 0,
            }),
        });
        let tcp_listener = tokio::net::TcpListener::bind(tcp).await?;
        let http_listener = tokio::net::TcpListener::bind(http).await?;
        let tcp = tcp_listener.local_addr()?;
        let http = http_listener.local_addr()?;
        let tasks = vec![
            tokio::spawn(transport::serve_tcp(tcp_listener, shared.clone())),
            tokio::spawn(transport::serve_http(http_listener, shared.clone())),
        ];
        Ok(SignalSimulator {
            shared,
            tcp,
            http,
            tasks,
        })
    }

    /// `host:port` of the JSON-RPC TCP socket (`daemon --tcp`).
    pub fn tcp_addr(&self) -> SocketAddr {
        self.tcp
    }

    /// `http://…/api/v1/rpc` (`daemon --http`).
    pub fn rpc_url(&self) -> String {
        format!("http://{}/api/v1/rpc", self.http)
    }

    /// The first account (the one most tests use).
    pub fn account(&self) -> String {
        self.shared
            .lock()
            .accounts
            .keys()
            .next()
            .cloned()
            .unwrap_or_default()
    }

    /// The ACI (UUID) of an account or person.
    pub fn uuid_of(&self, number: &str) -> String {
        let mut state = self.shared.lock();
        if let Some(account) = state.accounts.get(number) {
            return account.uuid.clone();
        }
        state.person(number).uuid.clone()
    }

    /// Names a person (their profile name, `sourceName`).
    pub fn set_name(&self, number: &str, name: &str) {
        name.clone_into(&mut self.shared.lock().person(number).name);
    }

    /// `number` is not (or no longer) on Signal: sends to it fail `UNREGISTERED_FAILURE`.
    pub fn unregister(&self, number: &str) {
        self.shared.lock().person(number).registered = false;
    }

    /// `number`'s safety number changed: sends to it fail `IDENTITY_FAILURE` until trusted.
    pub fn untrust(&self, number: &str) {
        self.shared.lock().person(number).trusted = false;
    }

    /// `signal-cli trust`: sends to `number` go through again.
    pub fn trust(&self, number: &str) {
        self.shared.lock().person(number).trusted = true;
    }

    /// A group with `members` (people's numbers; our accounts are members too).
    pub fn create_group(&self, group_id: &str, name: &str, members: &[&str]) {
        let members = members.iter().map(|m| (*m).to_owned()).collect();
        self.shared
            .lock()
            .groups
            .insert(group_id.to_owned(), (name.to_owned(), members));
    }

    /// Queues a fault for the coming `send` calls.
    pub fn inject(&self, fault: Fault) {
        self.shared.lock().faults.push(fault);
    }

    /// `from` writes `text` to `account` 1:1; returns the `{envelope, account}` item.
    pub fn person_writes(&self, account: &str, from: &str, text: &str) -> Value {
        let mut state = self.shared.lock();
        let timestamp = state.next_timestamp();
        let data = json!({ "timestamp": timestamp, "message": text, "expiresInSeconds": 0,
            "viewOnce": false });
        let envelope = state.envelope(from, timestamp, "dataMessage", data);
        state.arrive(account, envelope)
    }

    /// `from` writes `text` into group `group_id` (every account in it receives it).
    pub fn person_writes_in_group(
        &self,
        account: &str,
        from: &str,
        group_id: &str,
        text: &str,
    ) -> Value {
        let mut state = self.shared.lock();
        let timestamp = state.next_timestamp();
        let data = json!({ "timestamp": timestamp, "message": text, "expiresInSeconds": 0,
            "viewOnce": false, "groupInfo": { "groupId": group_id, "type": "DELIVER" } });
        let envelope = state.envelope(from, timestamp, "dataMessage", data);
        state.arrive(account, envelope)
    }

    /// `from` replies to (`quote_author`, `quote_timestamp`) 1:1.
    pub fn person_replies(
        &self,
        account: &str,
        from: &str,
        quote_author: &str,
        quote_timestamp: u64,
        text: &str,
    ) -> Value {
        let mut state = self.shared.lock();
        let timestamp = state.next_timestamp();
        let author_uuid = uuid_for(quote_author);
        let data = json!({ "timestamp": timestamp, "message": text, "expiresInSeconds": 0,
            "viewOnce": false, "quote": { "id": quote_timestamp, "author": quote_author,
            "authorNumber": quote_author, "authorUuid": author_uuid, "text": "",
            "attachments": [] } });
        let envelope = state.envelope(from, timestamp, "dataMessage", data);
        state.arrive(account, envelope)
    }

    /// `from` edits their message `target_timestamp` to `text`.
    pub fn person_edits(
        &self,
        account: &str,
        from: &str,
        target_timestamp: u64,
        text: &str,
    ) -> Value {
        let mut state = self.shared.lock();
        let timestamp = state.next_timestamp();
        let edit = json!({ "targetSentTimestamp": target_timestamp, "dataMessage": {
            "timestamp": timestamp, "message": text, "expiresInSeconds": 0, "viewOnce": false } });
        let envelope = state.envelope(from, timestamp, "editMessage", edit);
        state.arrive(account, envelope)
    }

    /// `from` deletes their message `target_timestamp` for everyone.
    pub fn person_deletes(&self, account: &str, from: &str, target_timestamp: u64) -> Value {
        let mut state = self.shared.lock();
        let timestamp = state.next_timestamp();
        let data =
            json!({ "timestamp": timestamp, "remoteDelete": { "timestamp": target_timestamp } });
        let envelope = state.envelope(from, timestamp, "dataMessage", data);
        state.arrive(account, envelope)
    }

    /// Another device linked to `account` sent `text` to `destination`: the account receives
    /// the `syncMessage.sentMessage` copy (from itself).
    pub fn linked_device_sends(&self, account: &str, destination: &str, text: &str) -> Value {
        let mut state = self.shared.lock();
        let timestamp = state.next_timestamp();
        let dest_uuid = state.person(destination).uuid.clone();
        let sync = json!({ "sentMessage": { "destination": destination,
            "destinationNumber": destination, "destinationUuid": dest_uuid,
            "timestamp": timestamp, "message": text, "expiresInSeconds": 0, "viewOnce": false } });
        let mut envelope = serde_json::Map::new();
        let uuid = state
            .accounts
            .get(account)
            .map(|a| a.uuid.clone())
            .unwrap_or_default();
        envelope.insert("source".into(), json!(account));
        envelope.insert("sourceNumber".into(), json!(account));
        envelope.insert("sourceUuid".into(), json!(uuid));
        envelope.insert("sourceName".into(), json!(""));
        envelope.insert("sourceDevice".into(), json!(2));
        envelope.insert("timestamp".into(), json!(timestamp));
        envelope.insert("syncMessage".into(), sync);
        state.arrive(account, Value::Object(envelope))
    }

    /// `from`'s phone confirms delivery (or reading) of our messages `timestamps`.
    pub fn person_receipt(
        &self,
        account: &str,
        from: &str,
        timestamps: &[u64],
        read: bool,
    ) -> Value {
        let mut state = self.shared.lock();
        let when = state.next_timestamp();
        let receipt = json!({ "when": when, "isDelivery": !read, "isRead": read,
            "isViewed": false, "timestamps": timestamps });
        let envelope = state.envelope(from, when, "receiptMessage", receipt);
        state.arrive(account, envelope)
    }

    /// `from` starts typing.
    pub fn person_types(&self, account: &str, from: &str) -> Value {
        let mut state = self.shared.lock();
        let timestamp = state.next_timestamp();
        let typing = json!({ "action": "STARTED", "timestamp": timestamp });
        let envelope = state.envelope(from, timestamp, "typingMessage", typing);
        state.arrive(account, envelope)
    }

    /// Pushes every message handed out so far again to the current subscribers (signal-cli
    /// receiving an envelope again whose acknowledgement the Signal server missed).
    pub fn redeliver_all(&self) -> usize {
        let mut state = self.shared.lock();
        let handed = state.handed.clone();
        let mut sent = 0;
        for item in &handed {
            let account = item["account"].as_str().unwrap_or_default();
            if let Some(s) = state
                .subscribers
                .iter()
                .find(|s| s.account.as_deref().is_none_or(|a| a == account))
                && s.tx
                    .send(Outbound::Line(notification(Some(s.id), item)))
                    .is_ok()
            {
                sent += 1;
            }
        }
        state.handed.extend(handed.into_iter().take(sent));
        sent
    }

    /// Closes every subscribed connection (the daemon restarting, a socket cut).
    pub fn drop_subscribers(&self) -> usize {
        let mut state = self.shared.lock();
        let subscribers = std::mem::take(&mut state.subscribers);
        for s in &subscribers {
            let _ = s.tx.send(Outbound::Close);
        }
        subscribers.len()
    }

    /// The number of live subscriptions.
    pub fn subscriptions(&self) -> usize {
        let mut state = self.shared.lock();
        state.subscribers.retain(|s| !s.tx.is_closed());
        state.subscribers.len()
    }

    /// Open TCP connections.
    pub fn connections(&self) -> usize {
        let mut state = self.shared.lock();
        state.connections.retain(|_, tx| !tx.is_closed());
        state.connections.len()
    }

    /// Messages waiting for a subscriber on `account`.
    pub fn queued(&self, account: &str) -> usize {
        self.shared
            .lock()
            .accounts
            .get(account)
            .map_or(0, |a| a.queue.len())
    }

    /// Every `receive` item handed to a client, oldest first (redeliveries included).
    pub fn handed(&self) -> Vec<Value> {
        self.shared.lock().handed.clone()
    }

    /// Messages lost in on-start mode because nobody was connected.
    pub fn lost(&self) -> Vec<Value> {
        self.shared.lock().lost.clone()
    }

    /// Every message the daemon sent, oldest first.
    pub fn landed(&self) -> Vec<Landed> {
        self.shared.lock().landed.clone()
    }

    /// What landed in a conversation: to a person's number or a group id.
    pub fn landed_in(&self, conversation: &str) -> Vec<Landed> {
        self.landed()
            .into_iter()
            .filter(|l| {
                l.recipient.as_deref() == Some(conversation)
                    || l.group_id.as_deref() == Some(conversation)
            })
            .collect()
    }

    /// Sends that landed and whose answer was never written (injected lost answers that hit).
    pub fn dropped_answers(&self) -> usize {
        self.shared.lock().dropped_answers
    }

    /// Every call's method and params, oldest first.
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.shared.lock().calls.clone()
    }
}
