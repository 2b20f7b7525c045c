//! The one TMI (Twitch IRC) connection of an account, shared by the sender and the inbound feed.
//!
//! A supervisor task owns the socket: it logs in (`CAP REQ :twitch.tv/tags twitch.tv/commands`,
//! `PASS oauth:…`, `NICK`), joins the configured channels, learns each channel's room id
//! (`ROOMSTATE room-id`, Helix's `broadcaster_id`) and our badges there (`USERSTATE`: the rate
//! limit), answers `PING`s, hands every `PRIVMSG` to the feed, and reconnects with backoff (at
//! once after Twitch's `RECONNECT`). An IRC send writes the `PRIVMSG` followed by `PING :cg<n>`:
//! Twitch handles a connection's lines in order, so its `PONG` says the line was processed, a
//! `NOTICE` with a `msg-id` before it says it was dropped, and the `USERSTATE` it sends for an
//! accepted message carries the message's `id`. A link that drops between the write and the
//! `PONG` leaves the outcome unknown.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_sdk::{EventSink, NoTransportAck, PushedEvent, Secret, SendError};
use clawgate_types::DeliveryFailureKind;
use clawgate_types::clock::Clock;
use irc_proto::{CapSubCommand, Command, Message};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, info, warn};

use crate::limits::drop_error;

/// Everything the supervisor needs to connect.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionConfig {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) login: String,
    pub(crate) token: Secret,
    /// Channel logins, lowercase, without `#`.
    pub(crate) channels: Vec<String>,
    pub(crate) connect_timeout: Duration,
    pub(crate) answer_timeout: Duration,
    pub(crate) keepalive: Duration,
    pub(crate) backoff_min: Duration,
    pub(crate) backoff_max: Duration,
}

/// The link as the sender and the feed see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LinkState {
    Down(Option<String>),
    Up {
        session: u64,
    },
    /// Twitch refused the login: no reconnect will help.
    Refused(String),
}

struct Request {
    channel: String,
    line: String,
    deadline: Instant,
    reply: oneshot::Sender<Result<String, SendError>>,
}

/// What the connection learnt of each channel.
#[derive(Debug, Default, Clone)]
pub(crate) struct ChannelFacts {
    pub(crate) room_id: Option<String>,
    /// Broadcaster, moderator or VIP here (100 messages / 30 s).
    pub(crate) elevated: bool,
    pub(crate) joined: bool,
}

struct Shared {
    config: ConnectionConfig,
    state: watch::Sender<LinkState>,
    requests: mpsc::Sender<Request>,
    inbox: Mutex<Option<mpsc::Receiver<Request>>>,
    sink: Mutex<Option<Arc<dyn EventSink>>>,
    held: tokio::sync::Mutex<VecDeque<serde_json::Value>>,
    facts: Mutex<BTreeMap<String, ChannelFacts>>,
    /// Bumped whenever `facts` changes.
    facts_changed: watch::Sender<u64>,
    started: std::sync::Once,
    /// Synthetic receipt ids: when the connection was made (ms on the gateway's clock) and a
    /// counter.
    epoch_ms: i64,
    counter: AtomicU64,
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
            .field("login", &self.shared.config.login)
            .field("state", &*self.shared.state.borrow())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn not_sent(why: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::Transient, why)
}

impl Connection {
    /// A connection (not started) whose receipt ids are dated by `clock`.
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
            facts: Mutex::new(BTreeMap::new()),
            facts_changed: watch::channel(0).0,
            started: std::sync::Once::new(),
            epoch_ms,
            counter: AtomicU64::new(0),
            shutdown: shutdown.clone(),
        });
        Connection {
            shared,
            _alive: Arc::new(AliveGuard(shutdown)),
        }
    }

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

    pub(crate) fn login(&self) -> &str {
        &self.shared.config.login
    }

    /// Whether `channel` is one of those this account joins.
    pub(crate) fn configured(&self, channel: &str) -> bool {
        self.shared.config.channels.iter().any(|c| c == channel)
    }

    /// What is known of `channel` now.
    pub(crate) fn facts(&self, channel: &str) -> ChannelFacts {
        lock(&self.shared.facts)
            .get(channel)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits up to `wait` for the room id of `channel` (learnt from `ROOMSTATE` after the join).
    pub(crate) async fn room_id(&self, channel: &str, wait: Duration) -> Result<String, SendError> {
        self.ensure_started();
        let mut changed = self.shared.facts_changed.subscribe();
        let mut state = self.state();
        let found = tokio::time::timeout(wait, async {
            loop {
                if let LinkState::Refused(reason) = &*state.borrow_and_update() {
                    return Err(refused(reason));
                }
                if let Some(id) = self.facts(channel).room_id {
                    return Ok(id);
                }
                tokio::select! {
                    _ = changed.changed() => {}
                    _ = state.changed() => {}
                }
            }
        })
        .await;
        match found {
            Ok(result) => result,
            Err(_) => Err(not_sent(format!(
                "#{channel}'s room id is not known within {wait:?}: the bot has not joined it \
                 (add it to `channels`, check the login works)"
            ))),
        }
    }

    /// Waits up to `wait` until the link is up and every one of `channels` is joined (its
    /// `ROOMSTATE` seen on this connection); returns the connection's number.
    pub(crate) async fn wait_joined(&self, channels: &[String], wait: Duration) -> Option<u64> {
        self.ensure_started();
        let mut changed = self.shared.facts_changed.subscribe();
        let mut state = self.state();
        tokio::time::timeout(wait, async {
            loop {
                let up = match &*state.borrow_and_update() {
                    LinkState::Up { session } => Some(*session),
                    LinkState::Refused(_) => return None,
                    LinkState::Down(_) => None,
                };
                if let Some(session) = up
                    && channels.iter().all(|c| self.facts(c).joined)
                {
                    return Some(session);
                }
                tokio::select! {
                    _ = changed.changed() => {}
                    _ = state.changed() => {}
                }
            }
        })
        .await
        .ok()
        .flatten()
    }

    pub(crate) async fn attach(&self, sink: Arc<dyn EventSink>) {
        let mut held = self.shared.held.lock().await;
        *lock(&self.shared.sink) = Some(sink.clone());
        while let Some(event) = held.pop_front() {
            sink.deliver(PushedEvent::new(event, Arc::new(NoTransportAck)))
                .await;
        }
    }

    pub(crate) fn detach(&self) {
        *lock(&self.shared.sink) = None;
    }

    /// Writes `line` (a PRIVMSG into `channel`) once the link is up (waiting at most `wait`)
    /// and returns the message's id once Twitch processed it.
    pub(crate) async fn send_line(
        &self,
        channel: &str,
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
            Some(LinkState::Refused(reason)) => return Err(refused(&reason)),
            Some(_) => {}
            None => {
                return Err(not_sent(format!(
                    "not connected to Twitch chat within {wait:?}"
                )));
            }
        }
        let (reply, answer) = oneshot::channel();
        let request = Request {
            channel: channel.to_owned(),
            line,
            deadline,
            reply,
        };
        if self.shared.requests.send(request).await.is_err() {
            return Err(not_sent("the Twitch chat connection has stopped"));
        }
        answer.await.unwrap_or_else(|_| {
            Err(SendError::after_io(
                DeliveryFailureKind::Unknown,
                "the Twitch chat connection stopped while the message was being written",
            ))
        })
    }
}

fn refused(reason: &str) -> SendError {
    SendError::before_io(
        DeliveryFailureKind::Auth,
        format!(
            "Twitch chat refused the login: {reason}; check the token (chat:read, chat:edit) and the login"
        ),
    )
}

enum Ended {
    Retry(String),
    /// Twitch asked us to reconnect (`RECONNECT`): at once, no backoff.
    Reconnect,
    Refused(String),
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
        let wait = match ended {
            Ended::Shutdown => return,
            Ended::Reconnect => {
                info!(login = %shared.config.login, "Twitch asked for a reconnect");
                shared
                    .state
                    .send_replace(LinkState::Down(Some("RECONNECT".into())));
                Duration::ZERO
            }
            Ended::Retry(reason) => {
                warn!(login = %shared.config.login, reason, "Twitch chat connection lost; reconnecting");
                shared.state.send_replace(LinkState::Down(Some(reason)));
                if started.elapsed() > shared.config.backoff_max * 2 {
                    backoff = shared.config.backoff_min;
                }
                let wait = backoff;
                backoff = (backoff * 2).min(shared.config.backoff_max);
                wait
            }
            Ended::Refused(reason) => {
                warn!(login = %shared.config.login, reason, "Twitch chat refused the login");
                shared.state.send_replace(LinkState::Refused(reason));
                shared.config.backoff_max
            }
        };
        for facts in lock(&shared.facts).values_mut() {
            facts.joined = false;
        }
        shared.facts_changed.send_modify(|n| *n += 1);
        while let Ok(request) = inbox.try_recv() {
            let _ = request.reply.send(Err(not_sent(
                "the Twitch chat connection dropped before the message was written",
            )));
        }
        let wake = tokio::time::sleep(wait);
        tokio::pin!(wake);
        loop {
            tokio::select! {
                () = &mut wake => break,
                _ = shutdown.wait_for(|s| *s) => return,
                request = inbox.recv() => match request {
                    Some(request) => {
                        let _ = request.reply.send(Err(not_sent("not connected to Twitch chat")));
                    }
                    None => return,
                },
            }
        }
    }
}

struct InFlight {
    request: Request,
    token: String,
    written_at: Instant,
    refusal: Option<SendError>,
    /// The `id` of the `USERSTATE` Twitch sent for the accepted message.
    id: Option<String>,
}

async fn write(half: &mut OwnedWriteHalf, lines: &[&str]) -> std::io::Result<()> {
    let mut bytes = Vec::new();
    for line in lines {
        bytes.extend_from_slice(line.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    half.write_all(&bytes).await
}

fn tag<'a>(message: &'a Message, key: &str) -> Option<&'a str> {
    message
        .tags
        .as_ref()?
        .iter()
        .find(|t| t.0 == key)
        .and_then(|t| t.1.as_deref())
}

/// The channel a `#channel` argument names (lowercase, no `#`).
fn channel_of(arg: &str) -> String {
    arg.trim_start_matches('#').to_ascii_lowercase()
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
            Ok(Err(error)) => return Ended::Retry(format!("connecting to {address}: {error}")),
            Err(_) => return Ended::Retry(format!("connecting to {address} timed out")),
        };
    let _ = stream.set_nodelay(true);
    let (read, mut half) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let login_lines = [
        "CAP REQ :twitch.tv/tags twitch.tv/commands".to_owned(),
        format!("PASS oauth:{}", config.token.expose()),
        format!("NICK {}", config.login),
    ];
    let refs: Vec<&str> = login_lines.iter().map(String::as_str).collect();
    if let Err(error) = write(&mut half, &refs).await {
        return Ended::Retry(format!("writing the login: {error}"));
    }
    let deadline = Instant::now() + config.connect_timeout * 2;
    let (mut acked, mut welcomed) = (false, false);
    while !(acked && welcomed) {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let line = match tokio::time::timeout(remaining, lines.next_line()).await {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) => return Ended::Retry("Twitch closed the link during login".into()),
            Ok(Err(error)) => return Ended::Retry(format!("reading: {error}")),
            Err(_) => return Ended::Retry("the login timed out".into()),
        };
        let Ok(message) = line.parse::<Message>() else {
            continue;
        };
        match &message.command {
            Command::CAP(_, CapSubCommand::ACK, ..) => acked = true,
            Command::CAP(_, CapSubCommand::NAK, ..) => {
                return Ended::Refused(
                    "the server refused twitch.tv/tags and twitch.tv/commands: not Twitch chat?"
                        .into(),
                );
            }
            Command::NOTICE(target, text) if target == "*" => {
                return Ended::Refused(text.clone());
            }
            Command::PING(server, _) => {
                if let Err(error) = write(&mut half, &[&format!("PONG :{server}")]).await {
                    return Ended::Retry(format!("writing: {error}"));
                }
            }
            Command::Response(irc_proto::Response::RPL_ENDOFMOTD, _) => welcomed = true,
            _ => {}
        }
    }
    info!(server = %address, login = %config.login, "logged in to Twitch chat");
    for channel in &config.channels {
        if let Err(error) = write(&mut half, &[&format!("JOIN #{channel}")]).await {
            return Ended::Retry(format!("joining: {error}"));
        }
    }
    shared.state.send_replace(LinkState::Up { session });
    run(shared, inbox, &mut lines, &mut half).await
}

async fn run(
    shared: &Arc<Shared>,
    inbox: &mut mpsc::Receiver<Request>,
    lines: &mut tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    half: &mut OwnedWriteHalf,
) -> Ended {
    let config = &shared.config;
    let mut in_flight: Option<InFlight> = None;
    let mut fences = 0u64;
    let mut last_heard = Instant::now();
    let mut pinged = false;
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
                    Ok(None) => break Ended::Retry("Twitch closed the link".into()),
                    Err(error) => break Ended::Retry(format!("reading: {error}")),
                };
                last_heard = Instant::now();
                pinged = false;
                let Ok(message) = line.parse::<Message>() else {
                    debug!(line, "unparsable TMI line");
                    continue;
                };
                match &message.command {
                    Command::PING(server, _) => {
                        if let Err(error) = write(half, &[&format!("PONG :{server}")]).await {
                            break Ended::Retry(format!("writing: {error}"));
                        }
                    }
                    Command::PONG(a, b) => {
                        let token = b.as_deref().unwrap_or(a);
                        if in_flight.as_ref().is_some_and(|f| f.token == token) {
                            let Some(done) = in_flight.take() else { continue };
                            let result = match (done.refusal, done.id) {
                                (Some(error), _) => Err(error),
                                (None, Some(id)) => Ok(id),
                                (None, None) => Ok(synthetic_receipt(shared)),
                            };
                            let _ = done.request.reply.send(result);
                        }
                    }
                    Command::NOTICE(target, text) => {
                        if let (Some(flight), Some(msg_id)) = (in_flight.as_mut(), tag(&message, "msg-id"))
                            && channel_of(target) == flight.request.channel
                            && msg_id.starts_with("msg_")
                        {
                            flight.refusal.get_or_insert_with(|| drop_error(msg_id, text, "IRC"));
                        } else {
                            debug!(line, "Twitch notice");
                        }
                    }
                    Command::PRIVMSG(..) => deliver(shared, &line).await,
                    Command::Raw(command, args) => match command.as_str() {
                        "RECONNECT" => break Ended::Reconnect,
                        "ROOMSTATE" => {
                            let channel = args.first().map(|a| channel_of(a)).unwrap_or_default();
                            if let Some(id) = tag(&message, "room-id") {
                                let mut facts = lock(&shared.facts);
                                let entry = facts.entry(channel).or_default();
                                entry.room_id = Some(id.to_owned());
                                entry.joined = true;
                                drop(facts);
                                shared.facts_changed.send_modify(|n| *n += 1);
                            }
                        }
                        "USERSTATE" => {
                            let channel = args.first().map(|a| channel_of(a)).unwrap_or_default();
                            let badges = tag(&message, "badges").unwrap_or_default();
                            let elevated = channel == config.login
                                || tag(&message, "mod") == Some("1")
                                || badges.split(',').any(|b| {
                                    ["broadcaster/", "moderator/", "vip/"].iter().any(|p| b.starts_with(p))
                                });
                            lock(&shared.facts).entry(channel.clone()).or_default().elevated = elevated;
                            shared.facts_changed.send_modify(|n| *n += 1);
                            if let (Some(flight), Some(id)) = (in_flight.as_mut(), tag(&message, "id"))
                                && flight.request.channel == channel
                            {
                                flight.id = Some(id.to_owned());
                            }
                        }
                        _ => {}
                    },
                    _ => {}
                }
            }
            request = inbox.recv(), if in_flight.is_none() => {
                let Some(request) = request else { break Ended::Shutdown };
                if request.reply.is_closed() {
                    continue;
                }
                if Instant::now() > request.deadline {
                    let _ = request.reply.send(Err(not_sent("the message waited too long for the Twitch chat connection")));
                    continue;
                }
                fences += 1;
                let token = format!("cg{fences}");
                let ping = format!("PING :{token}");
                let written = write(half, &[&request.line, &ping]).await;
                let flight = InFlight { request, token, written_at: Instant::now(), refusal: None, id: None };
                if let Err(error) = written {
                    unknown(flight, &format!("the connection failed while writing: {error}"));
                    break Ended::Retry(format!("writing: {error}"));
                }
                in_flight = Some(flight);
            }
            () = tokio::time::sleep_until(next_timer.into()) => {
                let now = Instant::now();
                if answer_due.is_some_and(|due| now >= due) {
                    if let Some(flight) = in_flight.take() {
                        unknown(flight, "Twitch did not answer after the message was written");
                    }
                    break Ended::Retry("Twitch stopped answering".into());
                }
                if now >= keepalive_due {
                    if pinged {
                        break Ended::Retry(format!("nothing from Twitch for {:?}", config.keepalive * 2));
                    }
                    pinged = true;
                    if let Err(error) = write(half, &["PING :keepalive"]).await {
                        break Ended::Retry(format!("writing: {error}"));
                    }
                }
            }
        }
    };
    if let Some(flight) = in_flight.take() {
        unknown(
            flight,
            "the connection dropped after the message was written, before Twitch's answer",
        );
    }
    let _ = half.shutdown().await;
    ended
}

fn synthetic_receipt(shared: &Arc<Shared>) -> String {
    let n = shared.counter.fetch_add(1, Ordering::Relaxed) + 1;
    format!("twitch-irc-{}-{n}", shared.epoch_ms)
}

fn unknown(flight: InFlight, why: &str) {
    let _ = flight.request.reply.send(Err(SendError::after_io(
        DeliveryFailureKind::Unknown,
        why.to_owned(),
    )));
}

const MAX_HELD: usize = 1000;

async fn deliver(shared: &Arc<Shared>, line: &str) {
    let event = crate::receive::inbound_event(line, &shared.config.login);
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
                warn!("no Twitch feed is running: dropping the oldest held message");
            }
            held.push_back(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_receipts_are_dated_by_the_gateways_clock() {
        let config = ConnectionConfig {
            host: "127.0.0.1".into(),
            port: 6667,
            login: "claw".into(),
            token: Secret::new("token"),
            channels: Vec::new(),
            connect_timeout: Duration::from_secs(1),
            answer_timeout: Duration::from_secs(1),
            keepalive: Duration::from_secs(1),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(1),
        };
        let clock = clawgate_types::clock::ManualClock::new(1_234_567);
        let connection = Connection::new(config, &clock);
        assert_eq!(
            synthetic_receipt(&connection.shared),
            "twitch-irc-1234567-1"
        );
    }
}
