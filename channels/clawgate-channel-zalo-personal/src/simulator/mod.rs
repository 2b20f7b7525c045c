//! Zalo Web on loopback, as zca-js 2.2.0 sends and expects it (platform-apis-wave2 §10;
//! zca-js `src/apis/login.ts`, `sendMessage.ts`, `listen.ts`, `src/utils.ts`).
//!
//! [`ZaloWebSimulator::start`] binds `127.0.0.1` and serves, on one port for every host:
//!
//! - `GET /api/login/getLoginInfo`: the `signkey` checked (MD5 of `zsecure` + `getlogininfo` +
//!   the parameter values in key order), the `params` decrypted with the key derived from
//!   `zcid`/`zcid_ext`, the IMEI inside `zcid` and `params` compared with the account's, and
//!   the session cookie (`zpw_sek`) checked. The answer's `data` is the encrypted
//!   `{error_code: 0, data: {uid, zpw_enk, zpw_service_map_v3, zpw_ws}}`; every login gets a
//!   fresh session key. The service map and `zpw_ws` point at this simulator.
//! - `GET /api/login/getServerInfo` (signed): `{data: {setttings: {features: {socket: {
//!   ping_interval, retries, close_and_retry_codes, rotate_error_codes}, sharefile}}}}`
//!   (`setttings` with three t's, as zca-js says Zalo spells it).
//! - `POST /api/message/sms` (`toid`) and `/api/group/sendmsg` (`grid`), form `params`
//!   encrypted with a session key: the message lands with a fresh `msgId` and the request's
//!   `clientId` as its `cliMsgId`, and the answer is `{error_code: 0, data: <encrypted
//!   {error_code: 0, data: {msgId}}>}`. A refusal is HTTP 200 with a non-zero `error_code`.
//! - `GET /ws`: the listener. The cookie is checked (401 without it). The first frame is
//!   (1, 1, 1) `{"key": <base64 AES-GCM key>}`; pings (1, 2, 1) are counted. Messages go out as
//!   (1, 501, 0) / (1, 521, 0) frames of `encrypt` 2 (zlib, AES-GCM, base64), people's and the
//!   account's own (`uidFrom` "0", every landed send: what `selfListen` shows). **One listener
//!   per account**: a new connection sends the open one a (1, 3000, 0) frame and closes it
//!   with code 3000. Messages written while no listener is open are not pushed later (no
//!   catch-up); they are recorded as missed.
//!
//! Error codes (`error_code` values) are the simulator's own: Zalo Web's are not public.
//!
//! Tests play people ([`ZaloWebSimulator::person_writes`],
//! [`ZaloWebSimulator::member_writes`]), another session ([`ZaloWebSimulator::kick`]), break
//! things ([`ZaloWebSimulator::inject`], [`ZaloWebSimulator::drop_sockets`],
//! [`ZaloWebSimulator::redeliver`]) and judge from the simulator's own record
//! ([`ZaloWebSimulator::landed`], [`ZaloWebSimulator::inbound`]).
//!
//! Invariants: a refused send has no effect; a landed message is in
//! [`ZaloWebSimulator::landed`] whether or not its answer reached the client.

mod server;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::wire::{self, SessionKey, cmd};

/// How a simulator is set up.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Where to listen; `127.0.0.1:0` picks a free port.
    pub bind: SocketAddr,
    /// The account's user id.
    pub uid: String,
    /// The value of the account's `zpw_sek` session cookie.
    pub session_cookie: String,
    /// The IMEI of the account's browser session.
    pub imei: String,
    /// The listener's ping interval (server settings; Zalo's is about 3 minutes).
    pub ping_interval: Duration,
    /// The longest text accepted (the simulator's own limit: Zalo's is not published).
    pub max_text_chars: usize,
    /// The host the login's service map names (`None`: this simulator's own URL). Zalo's are
    /// `https://<service>.chat.zalo.me`-like hosts; a client whose cookies are scoped to
    /// `zalo.me` (zca-js) is pointed at one of those and maps it back to the simulator.
    pub service_base: Option<String>,
}

impl std::fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatorConfig")
            .field("bind", &self.bind)
            .field("uid", &self.uid)
            .finish_non_exhaustive()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        SimulatorConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            uid: "4300000000000000001".into(),
            session_cookie: format!("sek-{}", random_hex(16)),
            imei: format!("{}-{}", random_hex(8), random_hex(32)),
            ping_interval: Duration::from_secs(1),
            max_text_chars: 4_000,
            service_base: None,
        }
    }
}

/// What a fault does to a send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// HTTP 200 with this `error_code` and message; nothing lands.
    Refuse(i64, String),
    /// This HTTP status; nothing lands.
    ServerError(u16),
    /// The message lands (and is echoed), but the answer is cut off mid-way.
    LoseAnswer,
}

/// A fault for the next sends.
#[derive(Debug, Clone)]
pub struct Fault {
    kind: FaultKind,
    after: u32,
    times: u32,
}

impl Fault {
    /// `kind` for the next send.
    pub fn new(kind: FaultKind) -> Fault {
        Fault {
            kind,
            after: 0,
            times: 1,
        }
    }

    /// Only after `sends` more sends went through.
    pub fn after(mut self, sends: u32) -> Fault {
        self.after = sends;
        self
    }

    /// For this many sends.
    pub fn times(mut self, times: u32) -> Fault {
        self.times = times;
        self
    }
}

/// A message in a conversation, as the simulator recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimMessage {
    /// Zalo's `msgId`.
    pub msg_id: String,
    /// The client's `clientId` (`cliMsgId`).
    pub cli_msg_id: String,
    /// Who wrote it (the account's uid for ours).
    pub from: String,
    /// `true` for a group.
    pub group: bool,
    /// The person (for a direct chat with the account) or the group.
    pub thread: String,
    /// The text.
    pub text: String,
    /// Its answer reached the client (`false`: an injected lost answer).
    pub answered: bool,
}

/// A person's message and where it went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimInbound {
    /// The message.
    pub message: SimMessage,
    /// The listener connection it was pushed to; `None`: none was open (missed).
    pub pushed_to: Option<u64>,
}

/// Counts of the listener's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketStats {
    /// Listener connections ever opened.
    pub opened: u64,
    /// Open now.
    pub open: u64,
    /// Closed because a newer one opened (code 3000).
    pub kicked: u64,
    /// Dropped without a close frame (network faults).
    pub dropped: u64,
    /// Pings received.
    pub pings: u64,
    /// Logins served.
    pub logins: u64,
}

pub(crate) enum Out {
    Frame(Vec<u8>),
    Close(u16),
    Drop,
}

pub(crate) struct Socket {
    pub(crate) id: u64,
    pub(crate) cipher_key: String,
    pub(crate) tx: mpsc::UnboundedSender<Out>,
}

pub(crate) struct State {
    pub(crate) config: SimulatorConfig,
    pub(crate) base: String,
    pub(crate) sessions: Vec<SessionKey>,
    pub(crate) sockets: Vec<Socket>,
    pub(crate) next_socket: u64,
    pub(crate) next_msg: u64,
    pub(crate) landed: Vec<SimMessage>,
    pub(crate) inbound: Vec<SimInbound>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) stats: SocketStats,
    /// Payloads pushed per connection, for redeliveries.
    pub(crate) pushed: Vec<(bool, Value)>,
}

pub(crate) struct Inner {
    pub(crate) state: Mutex<State>,
    pub(crate) task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Random lower-case hex of `len` characters.
pub(crate) fn random_hex(len: usize) -> String {
    let mut out = String::new();
    while out.len() < len {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(out.len());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(len);
    out
}

pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(i);
        let bytes = h.finish().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    out
}

/// The platform's own clock (the simulator stands for Zalo, not for the gateway).
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl State {
    /// The TMessage of `m` as the listener pushes it to the account.
    fn listener_message(&self, m: &SimMessage) -> Value {
        let ours = m.from == self.config.uid;
        let (from, to) = match (ours, m.group) {
            (true, _) => ("0".to_owned(), m.thread.clone()),
            (false, false) => (m.from.clone(), "0".to_owned()),
            (false, true) => (m.from.clone(), m.thread.clone()),
        };
        json!({
            "actionId": m.msg_id, "msgId": m.msg_id, "cliMsgId": m.cli_msg_id,
            "msgType": "webchat", "uidFrom": from, "idTo": to, "dName": if ours { "" } else { "Person" },
            "ts": now_ms().to_string(), "status": 1, "content": m.text, "notify": "1", "ttl": 0,
            "userId": "0", "uin": "0", "cmd": if m.group { 521 } else { 501 }, "st": 3, "at": 5,
            "realMsgId": "0",
        })
    }

    /// Pushes `m` to the open listener; its connection id.
    fn push(&mut self, m: &SimMessage) -> Option<u64> {
        let msg = self.listener_message(m);
        let payload = if m.group {
            json!({ "error_code": 0, "data": { "groupMsgs": [msg] } })
        } else {
            json!({ "error_code": 0, "data": { "msgs": [msg] } })
        };
        self.pushed.push((m.group, payload.clone()));
        self.send_payload(m.group, &payload)
    }

    fn send_payload(&mut self, group: bool, payload: &Value) -> Option<u64> {
        let socket = self.sockets.last()?;
        let body =
            wire::encode_event(payload, &socket.cipher_key, random_bytes(), random_bytes()).ok()?;
        let command = if group {
            cmd::GROUP_MESSAGES
        } else {
            cmd::USER_MESSAGES
        };
        socket
            .tx
            .send(Out::Frame(wire::encode_frame(1, command, 0, &body)))
            .ok()?;
        Some(socket.id)
    }

    fn next_msg_id(&mut self) -> String {
        self.next_msg += 1;
        (7_000_000_000_000 + self.next_msg).to_string()
    }
}

/// Zalo Web on loopback.
#[derive(Clone)]
pub struct ZaloWebSimulator {
    inner: Arc<Inner>,
    addr: SocketAddr,
}

impl std::fmt::Debug for ZaloWebSimulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZaloWebSimulator")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl ZaloWebSimulator {
    /// Binds and serves.
    pub async fn start(config: SimulatorConfig) -> std::io::Result<ZaloWebSimulator> {
        let listener = tokio::net::TcpListener::bind(config.bind).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                config,
                base: format!("http://{addr}"),
                sessions: Vec::new(),
                sockets: Vec::new(),
                next_socket: 0,
                next_msg: 0,
                landed: Vec::new(),
                inbound: Vec::new(),
                faults: Vec::new(),
                stats: SocketStats::default(),
                pushed: Vec::new(),
            }),
            task: Mutex::new(None),
        });
        let task = tokio::spawn(server::serve(listener, inner.clone()));
        *inner
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(task);
        Ok(ZaloWebSimulator { inner, addr })
    }

    /// The login host (`login_base`), `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The account's user id.
    pub fn uid(&self) -> String {
        self.inner.lock().config.uid.clone()
    }

    /// The `Cookie` header of the account's browser session.
    pub fn cookie(&self) -> String {
        format!(
            "zpw_sek={}; zpsid=z{}",
            self.inner.lock().config.session_cookie,
            random_hex(8)
        )
    }

    /// The account's IMEI.
    pub fn imei(&self) -> String {
        self.inner.lock().config.imei.clone()
    }

    /// Person `from` writes `text` to the account; the message's `msgId`.
    pub fn person_writes(&self, from: &str, text: &str) -> String {
        self.write(from, false, from, text)
    }

    /// `from` writes `text` in group `group`; the message's `msgId`.
    pub fn member_writes(&self, group: &str, from: &str, text: &str) -> String {
        self.write(from, true, group, text)
    }

    fn write(&self, from: &str, group: bool, thread: &str, text: &str) -> String {
        let mut state = self.inner.lock();
        let msg_id = state.next_msg_id();
        let message = SimMessage {
            msg_id: msg_id.clone(),
            cli_msg_id: now_ms().to_string(),
            from: from.to_owned(),
            group,
            thread: thread.to_owned(),
            text: text.to_owned(),
            answered: true,
        };
        let pushed_to = state.push(&message);
        state.inbound.push(SimInbound { message, pushed_to });
        msg_id
    }

    /// Pushes a message from `from` sealed with a key that is not the connection's (a forged
    /// or corrupted frame); its `msgId`. Not recorded as a person's message.
    pub fn push_forged(&self, from: &str, text: &str) -> Option<String> {
        let mut state = self.inner.lock();
        let msg_id = state.next_msg_id();
        let message = SimMessage {
            msg_id: msg_id.clone(),
            cli_msg_id: now_ms().to_string(),
            from: from.to_owned(),
            group: false,
            thread: from.to_owned(),
            text: text.to_owned(),
            answered: true,
        };
        let payload =
            json!({ "error_code": 0, "data": { "msgs": [state.listener_message(&message)] } });
        let socket = state.sockets.last()?;
        let wrong_key = wire::b64(&random_bytes::<32>());
        let body = wire::encode_event(&payload, &wrong_key, random_bytes(), random_bytes()).ok()?;
        socket
            .tx
            .send(Out::Frame(wire::encode_frame(
                1,
                cmd::USER_MESSAGES,
                0,
                &body,
            )))
            .ok()?;
        Some(msg_id)
    }

    /// Pushes every message pushed so far again, on the open listener.
    pub fn redeliver(&self) -> usize {
        let mut state = self.inner.lock();
        let pushed = state.pushed.clone();
        pushed
            .iter()
            .filter(|(group, payload)| state.send_payload(*group, payload).is_some())
            .count()
    }

    /// The raw event the channel's listener hands over for message `msg_id` (what the
    /// receiver normalizes).
    pub fn raw_event(&self, msg_id: &str) -> Option<Value> {
        let state = self.inner.lock();
        let m = state
            .inbound
            .iter()
            .map(|i| &i.message)
            .chain(&state.landed)
            .find(|m| m.msg_id == msg_id)?;
        Some(json!({
            "thread": if m.group { "group" } else { "user" },
            "message": state.listener_message(m),
        }))
    }

    /// Another Zalo Web session of the account opens its listener: the open one gets the
    /// (1, 3000, 0) frame and close code 3000.
    pub fn kick(&self) {
        let mut state = self.inner.lock();
        let sockets = std::mem::take(&mut state.sockets);
        for socket in sockets {
            let _ = socket.tx.send(Out::Frame(wire::encode_frame(
                1,
                cmd::DUPLICATE,
                0,
                &json!({}),
            )));
            let _ = socket
                .tx
                .send(Out::Close(wire::close::DUPLICATE_CONNECTION));
            state.stats.kicked += 1;
        }
        state.stats.open = 0;
    }

    /// Drops every listener connection without a close frame (a network fault).
    pub fn drop_sockets(&self) -> usize {
        let mut state = self.inner.lock();
        let sockets = std::mem::take(&mut state.sockets);
        let n = sockets.len();
        for socket in sockets {
            let _ = socket.tx.send(Out::Drop);
        }
        state.stats.dropped += n as u64;
        state.stats.open = 0;
        n
    }

    /// Makes the next sends fail as `fault` says.
    pub fn inject(&self, fault: Fault) {
        self.inner.lock().faults.push(fault);
    }

    /// Every message the account sent that landed, oldest first.
    pub fn landed(&self) -> Vec<SimMessage> {
        self.inner.lock().landed.clone()
    }

    /// The account's messages that landed in `thread`, oldest first.
    pub fn landed_in(&self, thread: &str) -> Vec<SimMessage> {
        self.landed()
            .into_iter()
            .filter(|m| m.thread == thread)
            .collect()
    }

    /// People's messages, oldest first, and where each was pushed.
    pub fn inbound(&self) -> Vec<SimInbound> {
        self.inner.lock().inbound.clone()
    }

    /// The listener's counts.
    pub fn socket_stats(&self) -> SocketStats {
        self.inner.lock().stats
    }

    /// Waits until a listener is open (with a deadline); `false` when none opened.
    pub async fn listening(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.inner.lock().stats.open > 0 {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the listener opened `count` connections in all (with a deadline).
    pub async fn opened(&self, count: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let stats = self.inner.lock().stats;
            if stats.opened >= count && stats.open > 0 {
                return true;
            }
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops serving (open connections end).
    pub fn stop(&self) {
        self.drop_sockets();
        if let Some(task) = self
            .inner
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            task.abort();
        }
    }
}
