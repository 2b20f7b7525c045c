//! The WebSocket feed: one connection per bot, resumed across disconnects and restarts.
//!
//! - Connect to `/api/v4/websocket` with the bot token in `Authorization`; a resume adds the
//!   durable `connection_id` and `sequence_number` (the first `seq` not yet recorded by the
//!   engine; never a `connection_id` with `sequence_number=0`).
//! - The server resumes silently (no `hello`, the missed events from `sequence_number` on, out of
//!   its 128-event dead queue) or starts a fresh connection (a `hello` with a new
//!   `connection_id`): then the posts missed are re-fetched over REST
//!   (`GET /channels/{id}/posts?since=`, every channel of the bot's teams and DMs) from the
//!   last recorded `create_at`, and handed over as `posted` events (the engine dedupes by post id).
//! - The durable record (value `websocket` of the account's state in the gateway's store) holds
//!   the connection id, the next `seq` below which
//!   everything is recorded, the `create_at` up to which every post is recorded, and whether a
//!   re-fetch is still owed: a fresh connection's posts written before it existed are in no dead
//!   queue, so a gateway stopped mid re-fetch that then resumes that connection re-fetches first.
//! - A `seq` gap (an event lost on the way) reconnects, which resumes from the durable `seq`.
//! - Each run takes the stored record as its own and writes it compare-and-set against the
//!   version it last read or wrote: a feed still running after another gateway took the account
//!   over finds the value changed, keeps the new holder's record and stops writing it.

use std::collections::BTreeMap;
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
use futures_util::StreamExt;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tracing::{debug, info, warn};

use crate::adapter::BotCell;
use crate::client::{Api, CallError};
use crate::wire::{Event, Post, PostList};

/// The value the connection's record is kept in.
const RECORD: &str = "websocket";

/// The file an earlier release kept the record of channel `name` in, in the gateway's state
/// directory.
pub(crate) fn legacy_record_file(name: &str) -> String {
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
    format!("mattermost-{sanitized}-socket.json")
}

/// Imports the record an earlier release kept for channel `name`, once (see
/// [`ChannelState::import_values`]: a stored record wins). A file that is not a record is set
/// aside unread, as that release ignored it too (the feed connects afresh).
pub(crate) async fn import_legacy_record(
    state: &ChannelState,
    legacy: &LegacyFiles,
    name: &str,
) -> Result<(), ImportError> {
    let file = legacy_record_file(name);
    let imported = state
        .import_values(legacy, &file, |bytes| {
            Ok(match serde_json::from_slice::<SocketRecord>(bytes) {
                Ok(record) => Some((RECORD, record)),
                Err(error) => {
                    warn!(file, %error, "not a Mattermost WebSocket record; set aside unread");
                    None
                }
            })
        })
        .await?;
    if imported.written > 0 {
        info!(
            channel = name,
            "the Mattermost WebSocket record of an earlier release was imported"
        );
    }
    Ok(())
}

/// The durable part of a connection.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketRecord {
    /// `hello`'s `connection_id`.
    pub connection_id: String,
    /// The first `seq` not yet recorded (what a resume asks for).
    pub sequence_number: i64,
    /// Every post created up to this time (server ms) is recorded.
    pub create_at: i64,
    /// The re-fetch this connection began with has not recorded every post yet.
    #[serde(default)]
    pub refetch_owed: bool,
}

#[derive(Debug, Default)]
struct Tracker {
    record: Option<SocketRecord>,
    /// The last `seq` received on this connection.
    last_seen: i64,
    /// `seq` → `create_at` of posts handed to the engine and not acked yet.
    pending: BTreeMap<i64, i64>,
    /// Post id → `create_at` of re-fetched posts handed over and not acked yet.
    fetched: BTreeMap<String, i64>,
    /// The highest `create_at` acked.
    acked_create_at: i64,
    established: bool,
    /// A re-fetch is handing posts over.
    refetching: bool,
}

impl Tracker {
    fn safe(&self) -> (i64, i64) {
        let seq = self
            .pending
            .first_key_value()
            .map_or(self.last_seen + 1, |(seq, _)| *seq);
        let create_at = self
            .pending
            .values()
            .chain(self.fetched.values())
            .min()
            .map_or(self.acked_create_at, |c| (c - 1).min(self.acked_create_at));
        (seq, create_at)
    }
}

/// What this feed last read or wrote of the stored record.
#[derive(Debug, Default)]
struct Kept {
    /// The record as stored.
    record: Option<SocketRecord>,
    /// The stored value's version (`None`: nothing stored).
    version: Option<i64>,
    /// Another gateway wrote the record since: it holds the account, its record stays.
    superseded: bool,
}

#[derive(Debug)]
struct Sockets {
    state: ChannelState,
    tracker: Mutex<Tracker>,
    /// Held while writing: each write takes the newest snapshot under it, so writes land in
    /// order and a stale one never overwrites a newer one.
    kept: tokio::sync::Mutex<Kept>,
}

impl Sockets {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The record kept in `state` (see [`Sockets::reload`]).
    async fn load(state: ChannelState) -> Result<Sockets, StateError> {
        let sockets = Sockets {
            state,
            tracker: Mutex::default(),
            kept: tokio::sync::Mutex::default(),
        };
        sockets.reload().await?;
        Ok(sockets)
    }

    /// Takes the stored record as this feed's, at the start of each run: a run starts when this
    /// gateway holds the account (again), and whoever held it before left the connection to
    /// resume and the version to write over. One this build cannot read is left to a fresh
    /// connection (as a record the server no longer knows would be); a store that cannot be
    /// read is an error, as starting afresh would skip the posts written while the gateway was
    /// down.
    async fn reload(&self) -> Result<(), StateError> {
        let mut kept = self.kept.lock().await;
        // Read untyped, so a value of another shape still gives the version to write over.
        let stored = self.state.value::<Value>(RECORD).await?;
        let version = stored.as_ref().map(|s| s.version);
        let record = stored.and_then(|s| {
            serde_json::from_value::<SocketRecord>(s.value)
                .map_err(|error| {
                    warn!(%error, "the kept Mattermost WebSocket record cannot be read; connecting afresh");
                })
                .ok()
        });
        *kept = Kept {
            record: record.clone(),
            version,
            superseded: false,
        };
        *self.lock() = Tracker {
            last_seen: record.as_ref().map_or(-1, |r| r.sequence_number - 1),
            acked_create_at: record.as_ref().map_or(0, |r| r.create_at),
            record,
            ..Tracker::default()
        };
        Ok(())
    }

    /// Moves the record to the safe mark (under the tracker's lock).
    fn settle(t: &mut Tracker) -> Option<SocketRecord> {
        let (seq, create_at) = t.safe();
        let record = t.record.as_mut()?;
        record.sequence_number = seq;
        record.create_at = record.create_at.max(create_at);
        Some(record.clone())
    }

    /// Writes the safe mark when it changed, unless another gateway wrote the record since this
    /// feed last read or wrote it.
    async fn persist(&self) {
        let mut kept = self.kept.lock().await;
        if kept.superseded {
            return;
        }
        let Some(record) = Self::settle(&mut self.lock()) else {
            return;
        };
        if kept.record.as_ref() == Some(&record) {
            return;
        }
        let expected = kept
            .version
            .map_or(ValueExpectation::Absent, ValueExpectation::Version);
        match self.state.swap(RECORD, expected, &record).await {
            Ok(Swapped::Written(version)) => {
                kept.record = Some(record);
                kept.version = Some(version);
            }
            Ok(Swapped::Conflict(_)) => Self::superseded(&mut kept, &self.state),
            // A conflict too: ours always encodes, so the store refused the expectation and
            // held a value of another shape (written by another version of the channel).
            Err(error) if matches!(error.kind(), StateErrorKind::Shape { .. }) => {
                Self::superseded(&mut kept, &self.state);
            }
            Err(error) => {
                warn!(%error, "could not keep the Mattermost WebSocket record; a restart resumes from an older mark or re-fetches");
            }
        }
    }

    /// Another gateway wrote the record: it holds the account now (this one stalled or has not
    /// stopped its feed yet). Its record is what the next takeover must resume from, so this
    /// feed stops writing; it keeps its connection, as ending the run would only start it again
    /// on the other gateway's record until the lease tells this gateway to stop.
    fn superseded(kept: &mut Kept, state: &ChannelState) {
        kept.superseded = true;
        warn!(
            scope = %state.scope(),
            "another gateway wrote the Mattermost WebSocket record since this feed last did: it \
             holds the account now; its record is kept, and this feed no longer writes it"
        );
    }

    /// [`Sockets::persist`] from code that cannot wait (an ack), on the runtime.
    fn persist_soon(self: &Arc<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let sockets = self.clone();
            runtime.spawn(async move { sockets.persist().await });
        }
    }

    async fn seen(&self, seq: i64, pending_create_at: Option<i64>) {
        let write = {
            let mut t = self.lock();
            t.last_seen = t.last_seen.max(seq);
            match pending_create_at {
                Some(at) => {
                    t.pending.insert(seq, at);
                    false
                }
                None => t.pending.is_empty(),
            }
        };
        if write {
            self.persist().await;
        }
    }

    fn acked(self: &Arc<Self>, seq: i64) {
        {
            let mut t = self.lock();
            if let Some(at) = t.pending.remove(&seq) {
                t.acked_create_at = t.acked_create_at.max(at);
            }
        }
        self.persist_soon();
    }

    fn fetched(&self, post_id: &str, create_at: i64) {
        self.lock().fetched.insert(post_id.to_owned(), create_at);
    }

    fn fetched_acked(self: &Arc<Self>, post_id: &str) {
        {
            let mut t = self.lock();
            if let Some(at) = t.fetched.remove(post_id) {
                t.acked_create_at = t.acked_create_at.max(at);
            }
            Self::settle_refetch(&mut t);
        }
        self.persist_soon();
    }

    fn refetch_started(&self) {
        self.lock().refetching = true;
    }

    async fn refetch_finished(&self) {
        {
            let mut t = self.lock();
            t.refetching = false;
            Self::settle_refetch(&mut t);
        }
        self.persist().await;
    }

    /// The owed re-fetch is paid once it handed everything over and all of it is recorded.
    fn settle_refetch(t: &mut Tracker) {
        if !t.refetching
            && t.fetched.is_empty()
            && let Some(record) = t.record.as_mut()
        {
            record.refetch_owed = false;
        }
    }

    /// Where to resume, from the safe mark: unacked events come again in the replay.
    fn resume_point(&self) -> Option<SocketRecord> {
        let mut t = self.lock();
        let (seq, create_at) = t.safe();
        t.pending.clear();
        t.fetched.clear();
        t.refetching = false;
        t.last_seen = seq - 1;
        if let Some(record) = t.record.as_mut() {
            record.sequence_number = seq;
            record.create_at = record.create_at.max(create_at);
        }
        t.record.clone()
    }

    /// A fresh connection: `seq` starts over after its hello. With no record before it (the
    /// first start) nothing was missed, so no re-fetch is owed.
    async fn fresh(&self, connection_id: &str, now_create_at: i64) -> i64 {
        let since = self.start_fresh(connection_id, now_create_at);
        // Durable before the re-fetch hands anything over: a stop in the middle of it leaves
        // the debt recorded.
        self.persist().await;
        since
    }

    fn start_fresh(&self, connection_id: &str, now_create_at: i64) -> i64 {
        let mut t = self.lock();
        let refetch_owed = t.record.is_some();
        let since = t.record.as_ref().map_or(now_create_at, |r| r.create_at);
        // What was handed over and not acked comes again in the re-fetch.
        t.pending.clear();
        t.fetched.clear();
        t.refetching = false;
        t.last_seen = 0;
        t.established = true;
        t.acked_create_at = since;
        t.record = Some(SocketRecord {
            connection_id: connection_id.to_owned(),
            sequence_number: 1,
            create_at: since,
            refetch_owed,
        });
        since
    }
}

struct SeqAck {
    sockets: Arc<Sockets>,
    seq: i64,
}

impl TransportAck for SeqAck {
    fn ack(&self) {
        self.sockets.acked(self.seq);
    }

    fn nack(&self, reason: &str) {
        // Left pending: the durable mark stays below it, so a resume replays it.
        debug!(
            seq = self.seq,
            reason, "the engine could not take a Mattermost event"
        );
    }
}

/// A re-fetched post has no `seq`: it is acked by its id.
struct FetchAck {
    sockets: Arc<Sockets>,
    post_id: String,
}

impl TransportAck for FetchAck {
    fn ack(&self) {
        self.sockets.fetched_acked(&self.post_id);
    }

    fn nack(&self, reason: &str) {
        // Left pending: the recorded create_at stays below it, so the next re-fetch has it.
        debug!(post = %self.post_id, reason, "the engine could not take a re-fetched Mattermost post");
    }
}

/// A pseudo-random fraction in [0, 1) for the reconnect backoff: the standard library's
/// randomly keyed hasher, so no clock is read for it.
fn jitter() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    f64::from(u32::try_from(bits % 1_000_000).unwrap_or(0)) / 1_000_000.0
}

enum End {
    Reconnect,
    Fatal(SourceError),
    Stopped,
}

/// How far before the recorded `create_at` a re-fetch starts: posts are stamped before their
/// insert commits, so one can become visible after a later one; the overlap is deduplicated by
/// post id.
const REFETCH_OVERLAP_MS: i64 = 5_000;

/// The WebSocket of one bot.
pub(crate) struct SocketSource {
    name: String,
    api: Api,
    bot: Arc<BotCell>,
    sockets: Arc<Sockets>,
}

impl std::fmt::Debug for SocketSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketSource")
            .field("name", &self.name)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

fn transient(message: String) -> SourceError {
    SourceError::new(DeliveryFailureKind::Transient, message)
}

impl SocketSource {
    /// The feed of channel `name`, keeping its record in `state`.
    pub(crate) async fn new(
        name: &str,
        api: Api,
        bot: Arc<BotCell>,
        state: ChannelState,
    ) -> Result<SocketSource, StateError> {
        Ok(SocketSource {
            name: name.to_owned(),
            api,
            bot,
            sockets: Arc::new(Sockets::load(state).await?),
        })
    }

    fn socket_url(&self, resume: Option<&SocketRecord>) -> String {
        let server = self.api.server();
        let base = if let Some(rest) = server.strip_prefix("https://") {
            format!("wss://{rest}")
        } else {
            format!("ws://{}", server.trim_start_matches("http://"))
        };
        let mut url = format!("{base}/api/v4/websocket");
        if let Some(r) = resume.filter(|r| !r.connection_id.is_empty() && r.sequence_number > 0) {
            url.push_str(&format!(
                "?connection_id={}&sequence_number={}",
                r.connection_id, r.sequence_number
            ));
        }
        url
    }

    /// The bot's id and username, if not known yet.
    async fn learn_bot(&self) -> Result<(), SourceError> {
        if self.bot.id().is_some() {
            return Ok(());
        }
        let me = self
            .api
            .call(Method::GET, "/users/me", None)
            .await
            .map_err(|e| e.into_source_error("get users/me"))?;
        if let (Some(id), Some(name)) = (me["id"].as_str(), me["username"].as_str()) {
            self.bot.set(id, name);
        }
        Ok(())
    }

    async fn connect_once(
        &self,
        sink: &Arc<dyn EventSink>,
        resume: Option<SocketRecord>,
    ) -> Result<End, SourceError> {
        self.learn_bot().await?;
        let url = self.socket_url(resume.as_ref());
        let mut request = url
            .as_str()
            .into_client_request()
            .map_err(|e| transient(format!("Mattermost WebSocket {url}: {e}")))?;
        let auth = format!("Bearer {}", self.api.token().expose());
        request.headers_mut().insert(
            "authorization",
            auth.parse().map_err(|_| {
                SourceError::new(
                    DeliveryFailureKind::Auth,
                    "the bot token is not a valid header value",
                )
            })?,
        );
        // A handshake that never completes must not hold the feed.
        let connecting = tokio::time::timeout(
            self.api.timeout(),
            tokio_tungstenite::connect_async(request),
        )
        .await
        .map_err(|_| transient("Mattermost WebSocket: the handshake timed out".to_owned()))?;
        let (socket, _) = match connecting {
            Ok(connected) => connected,
            Err(tokio_tungstenite::tungstenite::Error::Http(response))
                if response.status().as_u16() == 401 =>
            {
                return Ok(End::Fatal(SourceError::new(
                    DeliveryFailureKind::Auth,
                    "Mattermost refused the bot token on the WebSocket (401): check the variable token_env names",
                )));
            }
            Err(e) => return Err(transient(format!("Mattermost WebSocket: {e}"))),
        };
        let (_tx, mut rx) = socket.split();
        // A resume gets no hello, so an owed re-fetch is paid now (a hello that does come
        // re-fetches again; the engine dedupes by post id).
        if let Some(r) = resume.as_ref().filter(|r| r.refetch_owed) {
            info!(channel = %self.name, connection = %r.connection_id, "resuming a Mattermost WebSocket whose re-fetch was cut short: re-fetching first");
            self.refetch(sink, r.create_at).await?;
        }
        let asked = resume.map(|r| r.connection_id).unwrap_or_default();
        loop {
            let frame = tokio::select! {
                () = sink.stopped() => return Ok(End::Stopped),
                frame = rx.next() => frame,
            };
            let text = match frame {
                Some(Ok(Frame::Text(text))) => text.to_string(),
                Some(Ok(Frame::Close(_))) | None => return Ok(End::Reconnect),
                Some(Ok(_)) => continue,
                Some(Err(e)) => {
                    info!(channel = %self.name, error = %e, "the Mattermost WebSocket dropped: resuming");
                    return Ok(End::Reconnect);
                }
            };
            let Ok(event) = serde_json::from_str::<Event>(&text) else {
                warn!(channel = %self.name, "an unreadable WebSocket frame");
                continue;
            };
            let Some(seq) = event.seq else {
                // A `seq_reply` answer to an action: nothing to track.
                continue;
            };
            if event.event == "hello" {
                let id = event.data["connection_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let had_record = self.sockets.lock().record.is_some();
                // A first start listens from now, by the gateway's clock.
                let now = self.sockets.state.now_ms();
                let since = self.sockets.fresh(&id, now).await;
                if had_record {
                    info!(channel = %self.name, asked = %asked, got = %id, "a fresh Mattermost WebSocket connection: re-fetching what was missed");
                    self.refetch(sink, since).await?;
                } else {
                    info!(channel = %self.name, connection = %id, "Mattermost WebSocket connected");
                }
                continue;
            }
            let expected = self.sockets.lock().last_seen + 1;
            if seq != expected {
                warn!(channel = %self.name, seq, expected, "a gap in the WebSocket's seq: reconnecting to resume");
                return Ok(End::Reconnect);
            }
            self.sockets.lock().established = true;
            if event.event == "posted" {
                let create_at = event.post().map_or(0, |p| p.create_at);
                self.sockets.seen(seq, Some(create_at)).await;
                let ack = Arc::new(SeqAck {
                    sockets: self.sockets.clone(),
                    seq,
                });
                let raw: Value = serde_json::from_str(&text).unwrap_or_default();
                sink.deliver(PushedEvent::new(raw, ack)).await;
            } else {
                self.sockets.seen(seq, None).await;
            }
        }
    }

    /// The posts of every channel of the bot created after `since`, handed over in order.
    async fn refetch(&self, sink: &Arc<dyn EventSink>, recorded: i64) -> Result<(), SourceError> {
        let since = recorded.saturating_sub(REFETCH_OVERLAP_MS);
        let call = |path: String| async move {
            self.api
                .call(Method::GET, &path, None)
                .await
                .map_err(|e: CallError| e.into_source_error("re-fetch posts"))
        };
        let teams = call("/users/me/teams".into()).await?;
        let mut channels: Vec<(String, String)> = Vec::new();
        for team in teams.as_array().into_iter().flatten() {
            let Some(team) = team["id"].as_str() else {
                continue;
            };
            let list = call(format!("/users/me/teams/{team}/channels")).await?;
            for c in list.as_array().into_iter().flatten() {
                if let (Some(id), Some(kind)) = (c["id"].as_str(), c["type"].as_str())
                    && !channels.iter().any(|(known, _)| known == id)
                {
                    channels.push((id.to_owned(), kind.to_owned()));
                }
            }
        }
        let mut missed: Vec<(Post, String)> = Vec::new();
        for (channel, kind) in &channels {
            let answer = call(format!("/channels/{channel}/posts?since={since}")).await?;
            let list: PostList = serde_json::from_value(answer).unwrap_or_default();
            missed.extend(
                list.posts
                    .into_values()
                    .filter(|p| p.create_at > since && p.delete_at == 0)
                    .map(|p| (p, kind.clone())),
            );
        }
        missed.sort_by_key(|(p, _)| p.create_at);
        self.sockets.refetch_started();
        info!(channel = %self.name, posts = missed.len(), since, "re-fetched missed Mattermost posts");
        for (post, kind) in missed {
            let create_at = post.create_at;
            let channel_id = post.channel_id.clone();
            let raw = json!({
                "event": "posted",
                "data": {
                    "post": serde_json::to_string(&post).unwrap_or_default(),
                    "channel_type": kind,
                },
                "broadcast": { "channel_id": channel_id },
            });
            self.sockets.fetched(&post.id, create_at);
            let ack = Arc::new(FetchAck {
                sockets: self.sockets.clone(),
                post_id: post.id.clone(),
            });
            sink.deliver(PushedEvent::new(raw, ack)).await;
        }
        self.sockets.refetch_finished().await;
        Ok(())
    }
}

#[async_trait]
impl PushedFeed for SocketSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        self.sockets.reload().await.map_err(|e| {
            transient(format!(
                "the Mattermost WebSocket record cannot be read: {e}"
            ))
        })?;
        let mut backoff = Duration::from_millis(500);
        loop {
            let resume = self.sockets.resume_point();
            self.sockets.lock().established = false;
            // Stopping ends the connection wherever it is (a re-fetch included: what was not
            // acked is fetched again next time).
            let once = tokio::select! {
                () = sink.stopped() => End::Stopped,
                once = self.connect_once(&sink, resume) => match once {
                    Ok(end) => end,
                    Err(error) if error.kind == DeliveryFailureKind::Auth => End::Fatal(error),
                    Err(error) => {
                        warn!(channel = %self.name, error = %error.message, "Mattermost WebSocket connection failed");
                        End::Reconnect
                    }
                },
            };
            match once {
                End::Stopped => {
                    // The acks taken since the last write: kept before the feed ends.
                    self.sockets.persist().await;
                    return Ok(());
                }
                End::Fatal(error) => {
                    self.sockets.persist().await;
                    return Err(error);
                }
                End::Reconnect => {}
            }
            let connected = self.sockets.lock().established;
            let wait = backoff.mul_f64(0.5 + jitter() / 2.0);
            tokio::select! {
                () = sink.stopped() => {
                    self.sockets.persist().await;
                    return Ok(());
                }
                () = tokio::time::sleep(wait) => {}
            }
            backoff = if connected {
                Duration::from_millis(500)
            } else {
                (backoff * 2).min(Duration::from_secs(30))
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_durable_mark_stays_below_the_oldest_unacked_event() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = || clawgate_conformance::channel_state(dir.path(), "mattermost", "default");
        let sockets = Arc::new(Sockets::load(state()).await.expect("load"));
        sockets.fresh("conn", 100).await;
        sockets.seen(1, Some(110)).await;
        sockets.seen(2, Some(120)).await;
        sockets.acked(2);
        assert_eq!(sockets.lock().safe(), (1, 109));
        sockets.acked(1);
        assert_eq!(sockets.lock().safe(), (3, 120));
        sockets.persist().await;
        let reloaded = Sockets::load(state()).await.expect("reload");
        let record = reloaded.lock().record.clone().expect("record");
        assert_eq!(record.connection_id, "conn");
        assert_eq!(record.sequence_number, 3);
        assert_eq!(record.create_at, 120);
    }
}
