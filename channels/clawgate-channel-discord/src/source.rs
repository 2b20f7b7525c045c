//! The Gateway feed: one websocket session per bot, resumed across disconnects and restarts.
//!
//! - Connect to `GET /gateway/bot`'s URL (or the session's `resume_gateway_url`), read hello,
//!   heartbeat every `heartbeat_interval` (the first after a random fraction of it, as Discord
//!   asks), and close as a zombie when an ACK does not come before the next beat.
//! - Identify with GUILDS, GUILD_MESSAGES, DIRECT_MESSAGES and MESSAGE_CONTENT; or RESUME with
//!   the session id and the durable `seq`.
//! - The durable `seq` is the highest sequence number below which every event is acked by the
//!   engine (recorded durably): it is kept with the session id in the account's state in the
//!   gateway's store (value `gateway-session`), so a restarted gateway resumes and Discord
//!   replays what was not recorded (the engine dedupes the rest by message id).
//! - Each run takes the stored session as its own and writes it compare-and-set against the
//!   version it last read or wrote: a feed still running after another gateway took the account
//!   over finds the value changed, keeps the new holder's session and stops writing it.
//! - Op 7 and ordinary drops resume; op 9 resumes or identifies anew as its `d` says; close codes
//!   4004 (token), 4013/4014 (intents) end the feed with an error naming what to fix; reconnects
//!   back off from 1 s to 60 s with jitter.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::state::{Swapped, ValueExpectation};
use clawgate_channel_sdk::{
    ChannelState, EventSink, ImportError, LegacyFiles, PushedEvent, PushedFeed, SourceError,
    StateError, StateErrorKind, TransportAck,
};
use clawgate_types::DeliveryFailureKind;
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Frame;
use tracing::{debug, info, warn};

use crate::adapter::BotCell;
use crate::client::Rest;
use crate::wire::{GatewayBot, GatewayPayload, intents, op};

/// The intents identified with.
pub const INTENTS: u64 =
    intents::GUILDS | intents::GUILD_MESSAGES | intents::DIRECT_MESSAGES | intents::MESSAGE_CONTENT;

/// The value the session is kept in (`null` once the feed identifies anew: a delete would start
/// the versions over, and a superseded feed expecting version 1 could then write again).
const SESSION: &str = "gateway-session";

/// The file an earlier release kept the session of channel `name` in, in the gateway's state
/// directory.
pub(crate) fn legacy_session_file(name: &str) -> String {
    let sanitized: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("discord-{sanitized}-session.json")
}

/// Imports the session an earlier release kept for channel `name`, once (see
/// [`ChannelState::import_values`]: a stored session wins). A file that is not a session is set
/// aside unread, as that release ignored it too (the feed identifies anew).
pub(crate) async fn import_legacy_session(
    state: &ChannelState,
    legacy: &LegacyFiles,
    name: &str,
) -> Result<(), ImportError> {
    let file = legacy_session_file(name);
    let imported = state
        .import_values(legacy, &file, |bytes| {
            Ok(match serde_json::from_slice::<SessionRecord>(bytes) {
                Ok(record) => Some((SESSION, record)),
                Err(error) => {
                    warn!(file, %error, "not a Discord session; set aside unread");
                    None
                }
            })
        })
        .await?;
    if imported.written > 0 {
        info!(
            channel = name,
            "the Discord session of an earlier release was imported"
        );
    }
    Ok(())
}

/// The durable part of a session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// READY's `session_id`.
    pub session_id: String,
    /// READY's `resume_gateway_url`.
    pub resume_gateway_url: String,
    /// Every event up to this `s` is recorded by the engine.
    pub seq: u64,
}

/// Sequence numbers received and not yet acked, and the durable mark.
#[derive(Debug, Default)]
struct Tracker {
    record: Option<SessionRecord>,
    /// The last `s` received (heartbeats carry it).
    last_seen: u64,
    /// `s` of MESSAGE_CREATEs handed to the engine and not acked yet.
    pending: BTreeSet<u64>,
    /// The current connection reached READY or RESUMED (the reconnect backoff starts over).
    established: bool,
}

impl Tracker {
    /// The durable mark: everything below the oldest unacked event.
    fn safe_seq(&self) -> u64 {
        self.pending
            .first()
            .map_or(self.last_seen, |first| first.saturating_sub(1))
    }
}

/// What this feed last read or wrote of the stored session.
#[derive(Debug, Default)]
struct Kept {
    /// The session as stored (`None`: none to resume).
    record: Option<SessionRecord>,
    /// The stored value's version (`None`: nothing stored).
    version: Option<i64>,
    /// Another gateway wrote the session since: it holds the account, its session stays.
    superseded: bool,
}

#[derive(Debug)]
struct Sessions {
    state: ChannelState,
    tracker: Mutex<Tracker>,
    /// Held while writing: each write takes the newest snapshot under it, so writes land in
    /// order and a stale one never overwrites a newer one.
    kept: tokio::sync::Mutex<Kept>,
}

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The session kept in `state` (see [`Sessions::reload`]).
    async fn load(state: ChannelState) -> Result<Sessions, StateError> {
        let sessions = Sessions {
            state,
            tracker: Mutex::default(),
            kept: tokio::sync::Mutex::default(),
        };
        sessions.reload().await?;
        Ok(sessions)
    }

    /// Takes the stored session as this feed's, at the start of each run: a run starts when
    /// this gateway holds the account (again), and whoever held it before left the session to
    /// resume and the version to write over. One this build cannot read is left to a new
    /// identify, as a session Discord no longer knows would be; a store that cannot be read is
    /// an error, as identifying anew would skip the events that came while the gateway was down.
    async fn reload(&self) -> Result<(), StateError> {
        let mut kept = self.kept.lock().await;
        // Read untyped, so a value of another shape still gives the version to write over.
        let stored = self.state.value::<Value>(SESSION).await?;
        let version = stored.as_ref().map(|s| s.version);
        let record = stored.and_then(|s| {
            serde_json::from_value::<Option<SessionRecord>>(s.value)
                .map_err(|error| {
                    warn!(%error, "the kept Discord session cannot be read; identifying anew");
                })
                .ok()
                .flatten()
        });
        *kept = Kept {
            record: record.clone(),
            version,
            superseded: false,
        };
        let mut t = self.lock();
        *t = Tracker {
            last_seen: record.as_ref().map_or(0, |r| r.seq),
            record,
            ..Tracker::default()
        };
        Ok(())
    }

    /// Moves the session's `seq` to the safe mark and writes it when it changed, unless another
    /// gateway wrote it since this feed last read or wrote it.
    async fn persist(&self) {
        let mut kept = self.kept.lock().await;
        if kept.superseded {
            return;
        }
        let record = {
            let mut t = self.lock();
            let safe = t.safe_seq();
            if let Some(record) = t.record.as_mut() {
                record.seq = safe;
            }
            t.record.clone()
        };
        if kept.record == record {
            return;
        }
        let expected = kept
            .version
            .map_or(ValueExpectation::Absent, ValueExpectation::Version);
        match self.state.swap(SESSION, expected, &record).await {
            Ok(Swapped::Written(version)) => {
                kept.record = record;
                kept.version = Some(version);
            }
            Ok(Swapped::Conflict(_)) => Self::superseded(&mut kept, &self.state),
            // A conflict too: ours always encodes, so the store refused the expectation and
            // held a value of another shape (written by another version of the channel).
            Err(error) if matches!(error.kind(), StateErrorKind::Shape { .. }) => {
                Self::superseded(&mut kept, &self.state);
            }
            Err(error) => {
                warn!(%error, "could not keep the Discord session; a restart resumes from an older seq or identifies anew");
            }
        }
    }

    /// Another gateway wrote the session: it holds the account now (this one stalled or has
    /// not stopped its feed yet). Its session is what the next takeover must resume, so this
    /// feed stops writing; it keeps its connection, as ending the run would only start it
    /// again on the other gateway's session until the lease tells this gateway to stop.
    fn superseded(kept: &mut Kept, state: &ChannelState) {
        kept.superseded = true;
        warn!(
            scope = %state.scope(),
            "another gateway wrote the Discord session since this feed last did: it holds the \
             account now; its session is kept, and this feed no longer writes it"
        );
    }

    /// [`Sessions::persist`] from code that cannot wait (an ack), on the runtime.
    fn persist_soon(self: &Arc<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let sessions = self.clone();
            runtime.spawn(async move { sessions.persist().await });
        }
    }

    async fn forget(&self) {
        {
            let mut t = self.lock();
            t.record = None;
            t.pending.clear();
            t.last_seen = 0;
        }
        self.persist().await;
    }

    async fn started(&self, record: SessionRecord) {
        {
            let mut t = self.lock();
            t.established = true;
            t.last_seen = record.seq;
            t.pending.clear();
            t.record = Some(record);
        }
        self.persist().await;
    }

    async fn seen(&self, seq: u64, pending: bool) {
        let write = {
            let mut t = self.lock();
            t.last_seen = t.last_seen.max(seq);
            if pending {
                t.pending.insert(seq);
            }
            !pending && t.pending.is_empty()
        };
        if write {
            self.persist().await;
        }
    }

    fn acked(self: &Arc<Self>, seq: u64) {
        self.lock().pending.remove(&seq);
        self.persist_soon();
    }

    /// The session to resume, from the safe mark: events not acked yet are replayed by the
    /// resume, so they are no longer pending here.
    fn resume_point(&self) -> Option<SessionRecord> {
        let mut t = self.lock();
        let safe = t.safe_seq();
        t.pending.clear();
        t.last_seen = safe;
        if let Some(record) = t.record.as_mut() {
            record.seq = safe;
        }
        t.record.clone()
    }
}

struct SeqAck {
    sessions: Arc<Sessions>,
    seq: u64,
}

impl TransportAck for SeqAck {
    fn ack(&self) {
        self.sessions.acked(self.seq);
    }

    fn nack(&self, reason: &str) {
        // Left pending: the durable mark stays below it, so a resume replays it.
        debug!(
            seq = self.seq,
            reason, "the engine could not take a Discord event"
        );
    }
}

/// A pseudo-random fraction in [0, 1) (heartbeat and backoff jitter need no more): the
/// standard library's randomly keyed hasher, so no clock is read for it.
fn jitter() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    f64::from(u32::try_from(bits % 1_000_000).unwrap_or(0)) / 1_000_000.0
}

/// Why a connection ended.
enum End {
    /// Resume on the next connection.
    Resume,
    /// Identify anew (after a short wait, as Discord asks after op 9).
    Identify,
    /// Fatal: stop the feed.
    Fatal(SourceError),
    /// The gateway stops.
    Stopped,
}

/// The Gateway websocket of one bot.
pub(crate) struct GatewaySource {
    name: String,
    rest: Rest,
    bot: Arc<BotCell>,
    sessions: Arc<Sessions>,
    intents: u64,
}

impl std::fmt::Debug for GatewaySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewaySource")
            .field("name", &self.name)
            .field("rest", &self.rest)
            .finish_non_exhaustive()
    }
}

impl GatewaySource {
    /// The feed of channel `name`, keeping its session in `state`.
    pub(crate) async fn new(
        name: &str,
        rest: Rest,
        bot: Arc<BotCell>,
        state: ChannelState,
    ) -> Result<GatewaySource, StateError> {
        Ok(GatewaySource {
            name: name.to_owned(),
            rest,
            bot,
            sessions: Arc::new(Sessions::load(state).await?),
            intents: INTENTS,
        })
    }

    async fn gateway_url(&self) -> Result<String, SourceError> {
        let answer = self
            .rest
            .call(Method::GET, "GET /gateway/bot", "", "/gateway/bot", None)
            .await
            .map_err(|e| e.into_source_error("get gateway"))?
            .unwrap_or_default();
        let bot: GatewayBot = serde_json::from_value(answer).map_err(|e| {
            SourceError::new(
                DeliveryFailureKind::Transient,
                format!("GET /gateway/bot: {e}"),
            )
        })?;
        Ok(bot.url)
    }

    /// One connection, from connect to its end.
    async fn connect_once(
        &self,
        sink: &Arc<dyn EventSink>,
        resume: Option<SessionRecord>,
    ) -> Result<End, SourceError> {
        let base = match &resume {
            Some(record) => record.resume_gateway_url.clone(),
            None => self.gateway_url().await?,
        };
        let url = format!("{}/?v=10&encoding=json", base.trim_end_matches('/'));
        let (socket, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .map_err(|e| {
                SourceError::new(
                    DeliveryFailureKind::Transient,
                    format!("Discord Gateway {base}: {e}"),
                )
            })?;
        let (mut tx, mut rx) = socket.split();
        let hello = tokio::time::timeout(Duration::from_secs(30), rx.next())
            .await
            .ok()
            .flatten()
            .and_then(Result::ok)
            .and_then(|f| f.into_text().ok())
            .and_then(|t| serde_json::from_str::<GatewayPayload>(&t).ok())
            .filter(|p| p.op == op::HELLO)
            .ok_or_else(|| {
                SourceError::new(DeliveryFailureKind::Transient, "the Gateway sent no hello")
            })?;
        let interval = Duration::from_millis(
            hello.d["heartbeat_interval"]
                .as_u64()
                .unwrap_or(41_250)
                .max(100),
        );
        let token = self.rest.token().expose().to_owned();
        let start = match &resume {
            Some(record) => json!({ "op": op::RESUME, "d": {
                "token": token, "session_id": record.session_id, "seq": record.seq } }),
            None => json!({ "op": op::IDENTIFY, "d": {
                "token": token, "intents": self.intents,
                "properties": { "os": std::env::consts::OS, "browser": "clawgate", "device": "clawgate" } } }),
        };
        let send_error = |e: tokio_tungstenite::tungstenite::Error| {
            SourceError::new(
                DeliveryFailureKind::Transient,
                format!("Discord Gateway: {e}"),
            )
        };
        tx.send(Frame::Text(start.to_string().into()))
            .await
            .map_err(send_error)?;
        let mut beat = tokio::time::Instant::now() + interval.mul_f64(jitter());
        let mut acked = true;
        loop {
            tokio::select! {
                () = sink.stopped() => {
                    let _ = tx.send(Frame::Close(None)).await;
                    return Ok(End::Stopped);
                }
                () = tokio::time::sleep_until(beat) => {
                    if !acked {
                        warn!(channel = %self.name, "no heartbeat ACK from the Discord Gateway: reconnecting");
                        return Ok(End::Resume);
                    }
                    let seq = self.sessions.lock().last_seen;
                    let d = if seq == 0 { Value::Null } else { json!(seq) };
                    tx.send(Frame::Text(json!({ "op": op::HEARTBEAT, "d": d }).to_string().into())).await.map_err(send_error)?;
                    acked = false;
                    beat = tokio::time::Instant::now() + interval;
                }
                frame = rx.next() => {
                    let text = match frame {
                        Some(Ok(Frame::Text(text))) => text.to_string(),
                        Some(Ok(Frame::Close(close))) => {
                            let code = close.as_ref().map_or(1000, |c| u16::from(c.code));
                            return Ok(self.closed(code, close.map(|c| c.reason.to_string()).unwrap_or_default()));
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => {
                            info!(channel = %self.name, error = %e, "the Discord Gateway connection dropped: resuming");
                            return Ok(End::Resume);
                        }
                        None => return Ok(End::Resume),
                    };
                    let Ok(payload) = serde_json::from_str::<GatewayPayload>(&text) else {
                        warn!(channel = %self.name, "an unreadable Gateway payload");
                        continue;
                    };
                    match payload.op {
                        op::HEARTBEAT_ACK => acked = true,
                        op::HEARTBEAT => beat = tokio::time::Instant::now(),
                        op::RECONNECT => return Ok(End::Resume),
                        op::INVALID_SESSION => {
                            return Ok(if payload.d.as_bool() == Some(true) { End::Resume } else { End::Identify });
                        }
                        op::DISPATCH => self.dispatch(sink, payload).await,
                        _ => {}
                    }
                }
            }
        }
    }

    fn closed(&self, code: u16, reason: String) -> End {
        let fatal = |what: &str| {
            End::Fatal(SourceError::new(
                if code == 4004 {
                    DeliveryFailureKind::Auth
                } else {
                    DeliveryFailureKind::Permission
                },
                format!("the Discord Gateway closed the connection ({code} {reason}): {what}"),
            ))
        };
        match code {
            4004 => fatal("the bot token was refused; check the variable token_env names"),
            4013 | 4014 => fatal(
                "enable the Message Content intent for the bot (Developer Portal → Bot → Privileged Gateway Intents)",
            ),
            4010..=4012 => fatal("the shard setup is invalid"),
            // Session gone: a new one.
            4007 | 4009 => End::Identify,
            _ => End::Resume,
        }
    }

    async fn dispatch(&self, sink: &Arc<dyn EventSink>, payload: GatewayPayload) {
        let seq = payload.s.unwrap_or(0);
        match payload.t.as_deref() {
            Some("READY") => {
                if let Some(id) = payload.d["user"]["id"].as_str() {
                    self.bot.set(id);
                }
                let record = SessionRecord {
                    session_id: payload.d["session_id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    resume_gateway_url: payload.d["resume_gateway_url"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    seq,
                };
                info!(channel = %self.name, session = %record.session_id, "Discord Gateway session ready");
                self.sessions.started(record).await;
            }
            Some("MESSAGE_CREATE") => {
                self.sessions.seen(seq, true).await;
                let ack = Arc::new(SeqAck {
                    sessions: self.sessions.clone(),
                    seq,
                });
                sink.deliver(PushedEvent::new(payload.d, ack)).await;
            }
            Some("RESUMED") => {
                info!(channel = %self.name, "Discord Gateway session resumed");
                self.sessions.lock().established = true;
                self.sessions.seen(seq, false).await;
            }
            _ => self.sessions.seen(seq, false).await,
        }
    }
}

#[async_trait]
impl PushedFeed for GatewaySource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        self.sessions.reload().await.map_err(|e| {
            SourceError::new(
                DeliveryFailureKind::Transient,
                format!("the Discord session cannot be read: {e}"),
            )
        })?;
        let mut backoff = Duration::from_secs(1);
        loop {
            let resume = self.sessions.resume_point();
            self.sessions.lock().established = false;
            let end = match self.connect_once(&sink, resume).await {
                Ok(end) => end,
                Err(error) => {
                    warn!(channel = %self.name, error = %error.message, "Discord Gateway connection failed");
                    End::Resume
                }
            };
            match end {
                End::Stopped => {
                    // The acks taken since the last write: kept before the feed ends.
                    self.sessions.persist().await;
                    return Ok(());
                }
                End::Fatal(error) => {
                    self.sessions.persist().await;
                    return Err(error);
                }
                End::Identify => self.sessions.forget().await,
                End::Resume => {}
            }
            let connected = self.sessions.lock().established;
            let wait = backoff.mul_f64(0.5 + jitter() / 2.0);
            tokio::select! {
                () = sink.stopped() => {
                    self.sessions.persist().await;
                    return Ok(());
                }
                () = tokio::time::sleep(wait) => {}
            }
            backoff = if connected {
                Duration::from_secs(1)
            } else {
                (backoff * 2).min(Duration::from_secs(60))
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_durable_seq_stays_below_the_oldest_unacked_event() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = || clawgate_conformance::channel_state(dir.path(), "discord", "default");
        let sessions = Arc::new(Sessions::load(state()).await.expect("load"));
        sessions
            .started(SessionRecord {
                session_id: "a".into(),
                resume_gateway_url: "ws://x".into(),
                seq: 1,
            })
            .await;
        sessions.seen(2, true).await;
        sessions.seen(3, true).await;
        sessions.acked(3);
        assert_eq!(sessions.lock().safe_seq(), 1);
        sessions.acked(2);
        assert_eq!(sessions.lock().safe_seq(), 3);
        sessions.persist().await;
        let reloaded = Sessions::load(state()).await.expect("reload");
        assert_eq!(reloaded.lock().record.as_ref().map(|r| r.seq), Some(3));
    }
}
