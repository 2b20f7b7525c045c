//! The one connection of an IRC account, shared by the sender and the inbound feed.
//!
//! A supervisor task owns the socket: it connects, registers ([`crate::register`]), joins the
//! configured channels, answers `PING`s, hands every `PRIVMSG`/`NOTICE` to the feed's sink, and
//! reconnects with backoff (rejoining) when the link drops. The sender does not touch the
//! socket: it queues one line at a time with a reply channel. The supervisor writes it through
//! the flood-control bucket followed by `PING :cg<n>`; the server handles a client's lines in
//! order, so its `PONG :cg<n>` says the line was processed, and an error numeric for the target
//! before it (404, 401…) says it was refused. When the server granted IRCv3 `echo-message` and
//! `labeled-response`, the line goes as `@label=cg<n> PRIVMSG …` instead, without the PING: the
//! server's echo of it carrying that label (alone or in a labeled `BATCH`) is the receipt, with
//! the echo's `msgid` as the message id; a labeled error numeric is the refusal, a labeled `ACK`
//! says it was processed without an echo. Either way, a link that drops after the line was
//! written and before the answer leaves the outcome unknown.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_sdk::{EventSink, NoTransportAck, PushedEvent, SendError};
use clawgate_types::DeliveryFailureKind;
use clawgate_types::clock::Clock;
use irc_proto::{Command, Message, Prefix, Response};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::flood::{FloodPolicy, TokenBucket};
use crate::line::planned_prefix_len;
use crate::register::{Auth, RegisterError, Registration, Step};

/// Everything the supervisor needs to connect.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionConfig {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The nick first, then the alternates tried on 433.
    pub(crate) nicks: Vec<String>,
    pub(crate) user: String,
    pub(crate) realname: String,
    pub(crate) auth: Auth,
    pub(crate) channels: Vec<String>,
    pub(crate) flood: FloodPolicy,
    pub(crate) connect_timeout: Duration,
    /// How long a written line may wait for the server's `PONG` before its outcome is unknown.
    pub(crate) answer_timeout: Duration,
    /// A `PING` of ours after this much silence; the link is dead after twice as much.
    pub(crate) keepalive: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
}

/// The link as the sender and the feed see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkState {
    /// Not registered (yet, or any more); the reason of the last drop, if any.
    Down(Option<String>),
    /// Registered and joined.
    Up {
        /// Which connection this is (1, 2, … for each successful registration).
        session: u64,
        /// Our nick on this connection.
        nick: String,
    },
    /// The server refused our credentials or settings: no reconnect will help.
    Refused(String),
}

/// A line the sender asks to be written.
struct Request {
    target: String,
    line: String,
    /// Not written after this: the sender gave up waiting and reported "not sent".
    deadline: Instant,
    reply: oneshot::Sender<Result<String, SendError>>,
}

/// Mutable facts the supervisor shares.
#[derive(Debug, Default)]
struct Facts {
    /// Our `nick!user@host` as the server relays it, once seen in our own `JOIN`.
    prefix: Option<String>,
    joined: BTreeSet<String>,
    /// The capabilities granted on the current connection (a reconnect may land on a server
    /// that grants fewer).
    caps: BTreeSet<String>,
}

pub(crate) struct Shared {
    config: ConnectionConfig,
    state: watch::Sender<LinkState>,
    requests: mpsc::Sender<Request>,
    inbox: Mutex<Option<mpsc::Receiver<Request>>>,
    sink: Mutex<Option<Arc<dyn EventSink>>>,
    /// Lines received while no feed runs (the sender connected first), handed over when one
    /// starts, in order; bounded.
    held: tokio::sync::Mutex<VecDeque<serde_json::Value>>,
    facts: Mutex<Facts>,
    started: std::sync::Once,
    /// Receipt and event ids: when the connection was made (ms on the gateway's clock) and a
    /// counter.
    epoch_ms: i64,
    counter: AtomicU64,
    /// Lines relayed inbound, for event ids.
    inbound_seq: AtomicU64,
    /// Set when the last handle is dropped: the supervisor stops.
    shutdown: watch::Sender<bool>,
}

/// A handle on the account's connection.
#[derive(Clone)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
    _alive: Arc<AliveGuard>,
}

struct AliveGuard(watch::Sender<bool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field(
                "server",
                &format!("{}:{}", self.shared.config.host, self.shared.config.port),
            )
            .field("state", &*self.shared.state.borrow())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Connection {
    /// A connection (not started) whose ids are dated by `clock`.
    pub(crate) fn new(config: ConnectionConfig, clock: &dyn Clock) -> Connection {
        let (requests, inbox) = mpsc::channel(64);
        let (shutdown, _) = watch::channel(false);
        let epoch_ms = clock.now_ms();
        let shared = Arc::new(Shared {
            config,
            state: watch::channel(LinkState::Down(None)).0,
            requests,
            inbox: Mutex::new(Some(inbox)),
            sink: Mutex::new(None),
            held: tokio::sync::Mutex::new(VecDeque::new()),
            facts: Mutex::new(Facts::default()),
            started: std::sync::Once::new(),
            epoch_ms,
            counter: AtomicU64::new(0),
            inbound_seq: AtomicU64::new(0),
            shutdown: shutdown.clone(),
        });
        Connection {
            shared,
            _alive: Arc::new(AliveGuard(shutdown)),
        }
    }

    /// Starts the supervisor on the current runtime (once).
    pub(crate) fn ensure_started(&self) {
        self.shared.started.call_once(|| {
            let shared = self.shared.clone();
            let inbox = lock(&shared.inbox).take();
            if let Some(inbox) = inbox {
                tokio::spawn(supervise(shared, inbox));
            }
        });
    }

    pub(crate) fn state(&self) -> watch::Receiver<LinkState> {
        self.shared.state.subscribe()
    }

    /// Our `nick!user@host` as the server relays it, once seen in our own `JOIN`.
    pub(crate) fn prefix(&self) -> Option<String> {
        lock(&self.shared.facts).prefix.clone()
    }

    /// The channels we are in now (lowercase), as the server confirmed our `JOIN`s.
    pub(crate) fn joined(&self) -> Vec<String> {
        lock(&self.shared.facts).joined.iter().cloned().collect()
    }

    /// The IRCv3 capabilities the server granted on the current connection.
    pub(crate) fn capabilities(&self) -> Vec<String> {
        lock(&self.shared.facts).caps.iter().cloned().collect()
    }

    /// The length of our `nick!user@host` as the server relays it, when known.
    pub(crate) fn prefix_len(&self) -> Option<usize> {
        lock(&self.shared.facts).prefix.as_ref().map(String::len)
    }

    /// The prefix length to render lines for: the one seen, with the longest of our nicks in
    /// it (a reconnect may land on an alternate); before one was seen, the longest possible.
    pub(crate) fn planned_prefix_len(&self) -> usize {
        let config = &self.shared.config;
        let longest = config.nicks.iter().map(String::len).max().unwrap_or(0);
        match &lock(&self.shared.facts).prefix {
            Some(prefix) => {
                let nick = prefix.split('!').next().map_or(0, str::len);
                prefix.len() - nick + longest
            }
            None => planned_prefix_len(&"n".repeat(longest), &config.user),
        }
    }

    /// Hands inbound lines to `sink` (the running feed's), those held meanwhile first.
    pub(crate) async fn attach(&self, sink: Arc<dyn EventSink>) {
        let mut held = self.shared.held.lock().await;
        *lock(&self.shared.sink) = Some(sink.clone());
        while let Some(event) = held.pop_front() {
            sink.deliver(PushedEvent::new(event, Arc::new(NoTransportAck)))
                .await;
        }
    }

    /// Stops handing lines to the feed's sink (they are held until the next one).
    pub(crate) fn detach(&self) {
        *lock(&self.shared.sink) = None;
    }

    /// Writes `line` (a PRIVMSG to `target`) once the link is up (waiting at most `wait`) and
    /// returns its synthetic receipt id once the server processed it.
    pub(crate) async fn send_line(
        &self,
        target: &str,
        line: String,
        wait: Duration,
    ) -> Result<String, SendError> {
        self.ensure_started();
        let deadline = Instant::now() + wait;
        let mut state = self.state();
        let up = tokio::time::timeout(
            wait,
            state.wait_for(|s| matches!(s, LinkState::Up { .. } | LinkState::Refused(_))),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|s| s.clone());
        match up {
            Some(LinkState::Refused(reason)) => {
                return Err(SendError::before_io(
                    DeliveryFailureKind::Auth,
                    format!("the IRC server refused this account: {reason}"),
                ));
            }
            Some(_) => {}
            None => {
                let reason = match &*self.shared.state.borrow() {
                    LinkState::Down(Some(reason)) => format!(": {reason}"),
                    _ => String::new(),
                };
                return Err(SendError::before_io(
                    DeliveryFailureKind::Transient,
                    format!("not connected to the IRC server within {wait:?}{reason}"),
                ));
            }
        }
        let (reply, answer) = oneshot::channel();
        let request = Request {
            target: target.to_owned(),
            line,
            deadline,
            reply,
        };
        if self.shared.requests.send(request).await.is_err() {
            return Err(SendError::before_io(
                DeliveryFailureKind::Transient,
                "the IRC connection has stopped",
            ));
        }
        answer.await.unwrap_or_else(|_| {
            // The supervisor ended with the line in hand: it may have been written.
            Err(SendError::after_io(
                DeliveryFailureKind::Unknown,
                "the IRC connection stopped while the line was being written",
            ))
        })
    }
}

/// Why a connection ended.
enum Ended {
    /// Dropped or failed: reconnect after a backoff.
    Retry(String),
    /// Refused for good: wait for an operator.
    Refused(String),
    /// The last handle is gone.
    Shutdown,
}

async fn supervise(shared: Arc<Shared>, mut inbox: mpsc::Receiver<Request>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut backoff = shared.config.backoff_min;
    let mut session = 0u64;
    loop {
        let started = Instant::now();
        session += 1;
        let ended = tokio::select! {
            ended = connect_once(&shared, &mut inbox, session) => ended,
            _ = shutdown.wait_for(|s| *s) => Ended::Shutdown,
        };
        if matches!(ended, Ended::Shutdown) {
            return;
        }
        let wait = match ended {
            Ended::Retry(reason) => {
                warn!(server = %shared.config.host, reason, "IRC connection lost; reconnecting");
                shared.state.send_replace(LinkState::Down(Some(reason)));
                next_backoff(&mut backoff, started, &shared.config)
            }
            Ended::Refused(reason) => {
                warn!(server = %shared.config.host, reason, "the IRC server refused the account");
                shared.state.send_replace(LinkState::Refused(reason));
                shared.config.backoff_max
            }
            Ended::Shutdown => return,
        };
        {
            let mut facts = lock(&shared.facts);
            facts.joined.clear();
            facts.caps.clear();
        }
        // Lines queued while the link was going down were never written.
        fail_queued(&mut inbox);
        let wake = tokio::time::sleep(wait);
        tokio::pin!(wake);
        loop {
            tokio::select! {
                () = &mut wake => break,
                _ = shutdown.wait_for(|s| *s) => return,
                request = inbox.recv() => match request {
                    Some(request) => not_written(request, "not connected to the IRC server"),
                    None => return,
                },
            }
        }
    }
}

/// The next backoff: doubled after a short-lived connection, back to the minimum after one
/// that lasted.
fn next_backoff(backoff: &mut Duration, started: Instant, config: &ConnectionConfig) -> Duration {
    if started.elapsed() > config.backoff_max * 2 {
        *backoff = config.backoff_min;
    }
    let wait = *backoff;
    *backoff = (*backoff * 2).min(config.backoff_max);
    wait
}

fn not_written(request: Request, why: &str) {
    let _ = request.reply.send(Err(SendError::before_io(
        DeliveryFailureKind::Transient,
        why.to_owned(),
    )));
}

fn fail_queued(inbox: &mut mpsc::Receiver<Request>) {
    while let Ok(request) = inbox.try_recv() {
        not_written(
            request,
            "the IRC connection dropped before the line was written",
        );
    }
}

/// A line written and waiting for the server's `PONG` (or, labeled, its echo).
struct InFlight {
    request: Request,
    /// The PING token, or the label.
    token: String,
    written_at: Instant,
    refusal: Option<SendError>,
    /// The reference of the labeled `BATCH` that answers it, once opened.
    batch: Option<String>,
    /// The `msgid` of its echo inside that batch.
    echo: Option<String>,
}

struct Writer {
    half: OwnedWriteHalf,
    bucket: TokenBucket,
}

impl Writer {
    /// Writes `lines` together once the bucket has room for all of them (the server's lines
    /// wait in the socket meanwhile: the bucket holds a line back for seconds at most).
    async fn write(&mut self, lines: &[&str]) -> std::io::Result<()> {
        let lens: Vec<usize> = lines.iter().map(|l| l.len() + 2).collect();
        loop {
            let wait = self.bucket.wait_for(&lens, Instant::now());
            if wait.is_zero() {
                break;
            }
            tokio::time::sleep(wait).await;
        }
        self.bucket.take(&lens, Instant::now());
        let mut bytes = Vec::with_capacity(lens.iter().sum());
        for line in lines {
            bytes.extend_from_slice(line.as_bytes());
            bytes.extend_from_slice(b"\r\n");
        }
        self.half.write_all(&bytes).await
    }
}

fn io_retry(what: &str, error: &std::io::Error) -> Ended {
    Ended::Retry(format!("{what}: {error}"))
}

async fn connect_once(
    shared: &Arc<Shared>,
    inbox: &mut mpsc::Receiver<Request>,
    session: u64,
) -> Ended {
    let config = &shared.config;
    let address = format!("{}:{}", config.host, config.port);
    let stream =
        match tokio::time::timeout(config.connect_timeout, TcpStream::connect(&address)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => return io_retry(&format!("connecting to {address}"), &error),
            Err(_) => return Ended::Retry(format!("connecting to {address} timed out")),
        };
    let _ = stream.set_nodelay(true);
    let (read, write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let mut writer = Writer {
        half: write,
        bucket: TokenBucket::new(config.flood, Instant::now()),
    };

    // Registration.
    let mut registration = Registration::start(
        config.nicks.clone(),
        &config.user,
        &config.realname,
        config.auth.clone(),
    );
    let register_deadline = Instant::now() + config.connect_timeout.max(Duration::from_secs(5)) * 3;
    let nick = loop {
        for line in registration.take_output() {
            if let Err(error) = writer.write(&[&line]).await {
                return io_retry("writing registration", &error);
            }
        }
        let remaining = register_deadline.saturating_duration_since(Instant::now());
        let line = match tokio::time::timeout(remaining, lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => {
                return Ended::Retry("the server closed the link during registration".into());
            }
            Ok(Err(error)) => return io_retry("reading", &error),
            Err(_) => return Ended::Retry("registration timed out".into()),
        };
        let Ok(message) = line.parse::<Message>() else {
            continue;
        };
        if let Command::PING(server, _) = &message.command {
            if let Err(error) = writer.write(&[&format!("PONG :{server}")]).await {
                return io_retry("writing", &error);
            }
            continue;
        }
        match registration.on_message(&message) {
            Ok(Step::Continue) => {}
            Ok(Step::Done(nick)) => break nick,
            Err(error @ (RegisterError::Refused(_) | RegisterError::Unsupported(_))) => {
                return Ended::Refused(error.to_string());
            }
            Err(error @ RegisterError::NicksTaken(_)) => return Ended::Retry(error.to_string()),
        }
    };
    let caps = registration.granted().clone();
    info!(server = %address, nick, ?caps, "registered on IRC");
    lock(&shared.facts).caps = caps;
    for channel in &config.channels {
        if let Err(error) = writer.write(&[&format!("JOIN {channel}")]).await {
            return io_retry("joining", &error);
        }
    }
    shared.state.send_replace(LinkState::Up {
        session,
        nick: nick.clone(),
    });
    run(shared, inbox, &mut lines, &mut writer, nick).await
}

/// The main loop of a registered connection.
async fn run(
    shared: &Arc<Shared>,
    inbox: &mut mpsc::Receiver<Request>,
    lines: &mut tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    writer: &mut Writer,
    mut nick: String,
) -> Ended {
    let config = &shared.config;
    let mut in_flight: Option<InFlight> = None;
    let mut fences = 0u64;
    let mut last_heard = Instant::now();
    let mut pinged = false;
    let (echoes, labeled) = {
        let caps = &lock(&shared.facts).caps;
        let echoes = caps.contains("echo-message");
        (echoes, echoes && caps.contains("labeled-response"))
    };
    let ended = loop {
        let answer_due = in_flight
            .as_ref()
            .map(|f| f.written_at + config.answer_timeout);
        let keepalive_due = last_heard + config.keepalive * if pinged { 2 } else { 1 };
        let next_timer = answer_due.map_or(keepalive_due, |d| d.min(keepalive_due));
        tokio::select! {
            line = lines.next_line() => {
                let line = match line {
                    Ok(Some(line)) => line,
                    Ok(None) => break Ended::Retry("the server closed the link".into()),
                    Err(error) => break io_retry("reading", &error),
                };
                last_heard = Instant::now();
                pinged = false;
                let Ok(message) = line.parse::<Message>() else {
                    debug!(line, "unparsable IRC line");
                    continue;
                };
                if labeled
                    && let Some(flight) = in_flight.as_mut()
                    && let Some(result) =
                        labeled_answer(flight, &message, &nick, || shared_receipt(shared))
                {
                    if let Some(done) = in_flight.take() {
                        let _ = done.request.reply.send(result);
                    }
                    continue;
                }
                match &message.command {
                    Command::PING(server, _) => {
                        if let Err(error) = writer.write(&[&format!("PONG :{server}")]).await {
                            break io_retry("writing", &error);
                        }
                    }
                    Command::PONG(a, b) => {
                        let token = b.as_deref().unwrap_or(a);
                        if in_flight.as_ref().is_some_and(|f| f.token == token) {
                            let Some(done) = in_flight.take() else { continue };
                            let result = match done.refusal {
                                Some(error) => Err(error),
                                None => Ok(shared_receipt(shared)),
                            };
                            let _ = done.request.reply.send(result);
                        }
                    }
                    Command::ERROR(reason) => break Ended::Retry(format!("the server closed the link: {reason}")),
                    Command::NICK(new) if is_us(&message, &nick) => new.clone_into(&mut nick),
                    Command::JOIN(channels, _, _) if is_us(&message, &nick) => {
                        let mut facts = lock(&shared.facts);
                        if let Some(prefix) = &message.prefix {
                            facts.prefix = Some(prefix.to_string());
                        }
                        facts.joined.insert(channels.to_ascii_lowercase());
                    }
                    Command::KICK(channel, who, _) if who.eq_ignore_ascii_case(&nick) => {
                        lock(&shared.facts).joined.remove(&channel.to_ascii_lowercase());
                        // Back in, unless a ban or key keeps us out (the numeric is logged).
                        if config.channels.iter().any(|c| c.eq_ignore_ascii_case(channel))
                            && let Err(error) = writer.write(&[&format!("JOIN {channel}")]).await
                        {
                            break io_retry("rejoining", &error);
                        }
                    }
                    // With echo-message, a line of our own nick is the echo of one we sent.
                    Command::PRIVMSG(..) | Command::NOTICE(..) if echoes && is_us(&message, &nick) => {
                        debug!(line, "our own echo");
                    }
                    Command::PRIVMSG(..) | Command::NOTICE(..) => deliver(shared, &line, &nick).await,
                    Command::Response(code, args) => {
                        if !labeled
                            && let Some(flight) = in_flight.as_mut()
                            && let Some(error) = refusal(*code, args, &flight.request.target)
                        {
                            flight.refusal.get_or_insert(error);
                        } else if code.is_error() {
                            debug!(line, "IRC error numeric");
                        }
                    }
                    _ => {}
                }
            }
            request = inbox.recv(), if in_flight.is_none() => {
                let Some(request) = request else { break Ended::Shutdown };
                if request.reply.is_closed() {
                    continue;
                }
                if Instant::now() > request.deadline {
                    not_written(request, "the line waited too long for the IRC connection");
                    continue;
                }
                fences += 1;
                let token = format!("cg{fences}");
                let written = if labeled {
                    writer.write(&[&format!("@label={token} {}", request.line)]).await
                } else {
                    let ping = format!("PING :{token}");
                    writer.write(&[&request.line, &ping]).await
                };
                let flight = InFlight {
                    request,
                    token,
                    written_at: Instant::now(),
                    refusal: None,
                    batch: None,
                    echo: None,
                };
                if let Err(error) = written {
                    unknown(flight, &format!("the connection failed while writing: {error}"));
                    break io_retry("writing", &error);
                }
                in_flight = Some(flight);
            }
            () = tokio::time::sleep_until(next_timer.into()) => {
                let now = Instant::now();
                if answer_due.is_some_and(|due| now >= due) {
                    if let Some(flight) = in_flight.take() {
                        unknown(flight, "the server did not answer after the line was written");
                    }
                    break Ended::Retry("the server stopped answering".into());
                }
                if now >= keepalive_due {
                    if pinged {
                        break Ended::Retry(format!("no data from the server for {:?}", config.keepalive * 2));
                    }
                    pinged = true;
                    if let Err(error) = writer.write(&["PING :keepalive"]).await {
                        break io_retry("writing", &error);
                    }
                }
            }
        }
    };
    if let Some(flight) = in_flight.take() {
        unknown(
            flight,
            "the connection dropped after the line was written, before the server's answer",
        );
    }
    let _ = writer.half.shutdown().await;
    ended
}

fn shared_receipt(shared: &Arc<Shared>) -> String {
    let n = shared.counter.fetch_add(1, Ordering::Relaxed) + 1;
    format!("irc-{}-{n}", shared.epoch_ms)
}

fn tag<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .tags
        .as_ref()?
        .iter()
        .find(|t| t.0 == name)
        .map(|t| t.1.as_deref().unwrap_or_default())
}

/// What a line says about the labeled line in flight: its outcome when it settles it.
fn labeled_answer(
    flight: &mut InFlight,
    message: &Message,
    nick: &str,
    synthetic: impl Fn() -> String,
) -> Option<Result<String, SendError>> {
    let receipt = |msgid: Option<&str>| {
        msgid
            .filter(|m| !m.is_empty())
            .map_or_else(&synthetic, str::to_owned)
    };
    let echo = matches!(message.command, Command::PRIVMSG(..) | Command::NOTICE(..))
        && is_us(message, nick);
    if tag(message, "label") == Some(flight.token.as_str()) {
        return match &message.command {
            Command::BATCH(reference, _, _) if reference.starts_with('+') => {
                flight.batch = Some(reference[1..].to_owned());
                None
            }
            _ if echo => Some(Ok(receipt(tag(message, "msgid")))),
            _ if error_numeric(message).is_some() => {
                labeled_refusal(message, &flight.request.target).map(Err)
            }
            // `ACK` (processed, nothing to say: a filter may have eaten it) or a lone
            // non-error numeric: processed, as a PONG would say.
            _ => Some(Ok(receipt(None))),
        };
    }
    let batch = flight.batch.as_deref()?;
    if let Command::BATCH(reference, _, _) = &message.command
        && reference.strip_prefix('-') == Some(batch)
    {
        return Some(match flight.refusal.take() {
            Some(error) => Err(error),
            None => Ok(receipt(flight.echo.as_deref())),
        });
    }
    if tag(message, "batch") == Some(batch) {
        if echo {
            flight.echo = tag(message, "msgid").map(str::to_owned);
        } else if let Some(error) = labeled_refusal(message, &flight.request.target) {
            flight.refusal.get_or_insert(error);
        }
    }
    None
}

/// An error numeric (4xx/5xx), known to `irc-proto` or not (it parses numerics it has no name
/// for as raw commands): its code and arguments.
fn error_numeric(message: &Message) -> Option<(u16, &[String])> {
    match &message.command {
        Command::Response(code, args) if code.is_error() => Some((*code as u16, args)),
        Command::Raw(command, args) if command.len() == 3 => {
            let code: u16 = command.parse().ok()?;
            (400..600)
                .contains(&code)
                .then_some((code, args.as_slice()))
        }
        _ => None,
    }
}

/// A labeled error numeric answers our line for sure: the classified refusal, or else a
/// permission refusal naming the numeric (nothing was relayed either way).
fn labeled_refusal(message: &Message, target: &str) -> Option<SendError> {
    let (code, args) = error_numeric(message)?;
    let known = match &message.command {
        Command::Response(response, _) => refusal(*response, args, target),
        _ => None,
    };
    Some(known.unwrap_or_else(|| {
        SendError::before_io(
            DeliveryFailureKind::Permission,
            format!(
                "the IRC server refused the line ({code}): {}",
                args.last().map_or("", String::as_str)
            ),
        )
        .with_platform_code(code.to_string())
    }))
}

fn unknown(flight: InFlight, why: &str) {
    let _ = flight.request.reply.send(Err(SendError::after_io(
        DeliveryFailureKind::Unknown,
        why.to_owned(),
    )));
}

fn is_us(message: &Message, nick: &str) -> bool {
    matches!(&message.prefix, Some(Prefix::Nickname(n, _, _)) if n.eq_ignore_ascii_case(nick))
}

/// The refusal an error numeric means for a PRIVMSG to `target`, if it is about it.
fn refusal(code: Response, args: &[String], target: &str) -> Option<SendError> {
    let about = args.get(1).is_some_and(|a| a.eq_ignore_ascii_case(target));
    let text = args.last().cloned().unwrap_or_default();
    let kind = match code {
        Response::ERR_CANNOTSENDTOCHAN if about => DeliveryFailureKind::Permission,
        Response::ERR_NOSUCHNICK | Response::ERR_NOSUCHCHANNEL if about => {
            DeliveryFailureKind::NotFound
        }
        Response::ERR_TOOMANYTARGETS if about => DeliveryFailureKind::InvalidPayload,
        Response::ERR_NORECIPIENT | Response::ERR_NOTEXTTOSEND => {
            DeliveryFailureKind::InvalidPayload
        }
        _ => return None,
    };
    Some(
        SendError::before_io(kind, format!("the IRC server refused the line: {text}"))
            .with_platform_code((code as u16).to_string()),
    )
}

/// How many lines are held while no feed runs; older ones are dropped past it.
const MAX_HELD: usize = 1000;

/// Hands one inbound line to the feed's sink, or holds it until a feed runs.
async fn deliver(shared: &Arc<Shared>, line: &str, nick: &str) {
    let seq = shared.inbound_seq.fetch_add(1, Ordering::Relaxed) + 1;
    let id = format!("{}-{seq}", shared.epoch_ms);
    let event = crate::receive::inbound_event(line, nick, &id);
    let mut held = shared.held.lock().await;
    let sink = lock(&shared.sink).clone();
    match sink {
        Some(sink) => {
            sink.deliver(PushedEvent::new(event, Arc::new(NoTransportAck)))
                .await;
        }
        None => {
            if held.len() == MAX_HELD {
                held.pop_front();
                warn!("no IRC feed is running: dropping the oldest held line");
            }
            held.push_back(event);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn flight(token: &str, target: &str) -> InFlight {
        let (reply, _) = oneshot::channel();
        InFlight {
            request: Request {
                target: target.to_owned(),
                line: format!("PRIVMSG {target} :x"),
                deadline: Instant::now(),
                reply,
            },
            token: token.to_owned(),
            written_at: Instant::now(),
            refusal: None,
            batch: None,
            echo: None,
        }
    }

    /// Feeds lines (as InspIRCd 3.15 writes them) to the labeled line in flight; the outcome
    /// of the line that settles it, and how many lines that took.
    fn settle(flight: &mut InFlight, lines: &[&str]) -> Option<(usize, Result<String, SendError>)> {
        lines.iter().enumerate().find_map(|(n, line)| {
            let message: Message = line.parse().unwrap();
            labeled_answer(flight, &message, "bot", || "synthetic".to_owned()).map(|r| (n, r))
        })
    }

    #[test]
    fn a_labeled_echo_alone_or_in_a_batch_is_the_receipt_with_its_msgid() {
        let mut f = flight("cg1", "#room");
        let (n, result) = settle(
            &mut f,
            &[
                // Someone else's line and another label's echo settle nothing.
                "@time=2026-12-01T21:23:15.985Z;msgid=199~1~9 :ada!ada@h PRIVMSG #room :hi",
                "@msgid=199~1~8;label=cg0 :bot!bot@h PRIVMSG #room :old",
                "@time=2026-12-01T21:23:15.985Z;msgid=199~1796160178~0;label=cg1;\
                 inspircd.org/echo :bot!bot@127.0.0.1 PRIVMSG #room :hello one",
            ],
        )
        .unwrap();
        assert_eq!((n, result.unwrap()), (2, "199~1796160178~0".to_owned()));

        let mut f = flight("cg2", "ada");
        let (n, result) = settle(
            &mut f,
            &[
                "@time=x;label=cg2 :irc.test BATCH +1 :labeled-response",
                "@time=x;batch=1 :irc.test 301 bot ada :gone fishing",
                "@time=x;msgid=199~1~10;inspircd.org/echo;batch=1 :bot!bot@h PRIVMSG ada :x",
                "@time=x :irc.test BATCH :-1",
            ],
        )
        .unwrap();
        assert_eq!((n, result.unwrap()), (3, "199~1~10".to_owned()));
    }

    #[test]
    fn labeled_numerics_refuse_and_a_labeled_ack_is_processed() {
        let mut f = flight("cg3", "#room");
        let (_, result) = settle(
            &mut f,
            &["@label=cg3 :irc.test 404 bot #room :You cannot send messages to this channel"],
        )
        .unwrap();
        let error = result.unwrap_err();
        assert_eq!(error.kind, DeliveryFailureKind::Permission);
        assert_eq!(error.platform_code.as_deref(), Some("404"));
        assert_eq!(error.side_effect, clawgate_channel_sdk::SideEffect::None);

        let mut f = flight("cg4", "nobody");
        let (_, result) = settle(
            &mut f,
            &["@label=cg4 :irc.test 401 bot nobody :No such nick"],
        )
        .unwrap();
        assert_eq!(result.unwrap_err().kind, DeliveryFailureKind::NotFound);

        // An error numeric the classifier does not know still answers our line.
        let mut f = flight("cg5", "#room");
        let (_, result) = settle(
            &mut f,
            &[
                "@label=cg5 :irc.test BATCH +7 :labeled-response",
                "@batch=7 :irc.test 489 bot #room :You're not on that channel",
                "@time=x :irc.test BATCH :-7",
            ],
        )
        .unwrap();
        let error = result.unwrap_err();
        assert_eq!(error.kind, DeliveryFailureKind::Permission);
        assert_eq!(error.platform_code.as_deref(), Some("489"));

        let mut f = flight("cg6", "#room");
        let (_, result) = settle(&mut f, &["@label=cg6 :irc.test ACK"]).unwrap();
        assert_eq!(result.unwrap(), "synthetic");
    }

    #[test]
    fn error_numerics_about_the_target_are_refusals_of_their_class() {
        let args = |t: &str| vec!["bot".to_owned(), t.to_owned(), "Cannot send".to_owned()];
        let e = refusal(Response::ERR_CANNOTSENDTOCHAN, &args("#c"), "#C").unwrap();
        assert_eq!(e.kind, DeliveryFailureKind::Permission);
        assert_eq!(e.side_effect, clawgate_channel_sdk::SideEffect::None);
        let e = refusal(Response::ERR_NOSUCHNICK, &args("ada"), "ada").unwrap();
        assert_eq!(e.kind, DeliveryFailureKind::NotFound);
        assert!(refusal(Response::ERR_NOSUCHNICK, &args("bob"), "ada").is_none());
        assert!(refusal(Response::RPL_WELCOME, &args("ada"), "ada").is_none());
    }

    #[test]
    fn synthetic_receipts_are_dated_by_the_gateways_clock() {
        let config = ConnectionConfig {
            host: "127.0.0.1".into(),
            port: 6667,
            nicks: vec!["claw".into()],
            user: "claw".into(),
            realname: "claw".into(),
            auth: Auth::None,
            channels: Vec::new(),
            flood: FloodPolicy::default(),
            connect_timeout: Duration::from_secs(1),
            answer_timeout: Duration::from_secs(1),
            keepalive: Duration::from_secs(1),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(1),
        };
        let clock = clawgate_types::clock::ManualClock::new(1_234_567);
        let connection = Connection::new(config, &clock);
        assert_eq!(shared_receipt(&connection.shared), "irc-1234567-1");
        assert_eq!(shared_receipt(&connection.shared), "irc-1234567-2");
    }
}
