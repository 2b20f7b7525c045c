//! The inbound feed: one Eyre channel subscribed to the `chat` agent (DMs) and the `channels`
//! agent (group channels), read as server-sent events.
//!
//! - Each diff is handed to the engine with a transport ack; Eyre's ack is cumulative
//!   (`{"action": "ack", "event-id": N}` clears every event up to N), so the feed acks only up
//!   to the highest event below which everything is recorded. Replies to our own subscribe
//!   requests and `quit`s are acked when read.
//! - Unacked events stay queued in the channel and come again with the next `GET` — after a
//!   dropped stream, a ship restart, or a gateway restart: the channel's uid and subscriptions
//!   are kept in the gateway's store (the account's value [`CHANNEL_VALUE`]), so a restarted
//!   gateway, or another one taking the account over, reads the same channel. The engine
//!   dedupes what comes twice.
//! - Before a diff is handed over, the participated threads are brought up to date with the
//!   store, so the receiver counts a thread another gateway recorded.
//! - A `quit` ends a subscription (Eyre kicks the subscriptions of a clogged channel): the feed
//!   subscribes again. A reaped channel (404) is replaced by a new one with fresh
//!   subscriptions; what the old one held unacked is lost (\[obs\]: no backfill is done).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::state::{ChannelState, ImportError, LegacyFiles, StateError};
use clawgate_channel_sdk::{EventSink, PushedEvent, PushedFeed, SourceError, TransportAck};
use clawgate_types::DeliveryFailureKind;
use clawgate_types::clock::Clock;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::airlock::fresh_uid;
use crate::eyre::{ChannelEvent, Eyre, EyreError};
use crate::threads::ParticipatedThreads;

/// The subscriptions the feed holds: `(app, path)`. \[obs\] Tlon's firehoses.
pub const SUBSCRIPTIONS: &[(&str, &str)] = &[("chat", "/v3"), ("channels", "/v4")];

/// The name of the feed's [`ChannelRecord`] in the account's state.
pub const CHANNEL_VALUE: &str = "eyre-channel";

/// The file an earlier release kept the [`ChannelRecord`] in (in the state directory),
/// imported once.
pub const CHANNEL_FILE: &str = "eyre-channel.json";

/// The durable part of the feed: which channel, and which subscription id is which agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelRecord {
    /// The channel's uid.
    pub uid: String,
    /// Subscription id → `(app, path)`.
    pub subscriptions: BTreeMap<u64, (String, String)>,
    /// The next action id.
    pub next_id: u64,
}

#[derive(Debug, Default)]
struct Tracker {
    /// Diffs handed over and not acked by the engine.
    pending: BTreeSet<u64>,
    /// The highest event id read on this stream.
    seen: u64,
    /// The highest event id acked to Eyre.
    acked: u64,
}

impl Tracker {
    fn safe(&self) -> u64 {
        self.pending
            .first()
            .map_or(self.seen, |first| first.saturating_sub(1))
    }
}

struct Shared {
    eyre: Arc<Eyre>,
    timeout: Duration,
    uid: Mutex<String>,
    tracker: Mutex<Tracker>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// Acks up to the safe mark, when it moved.
    fn advance(self: &Arc<Self>) {
        let to = {
            let mut t = lock(&self.tracker);
            let safe = t.safe();
            if safe <= t.acked {
                return;
            }
            t.acked = safe;
            safe
        };
        let uid = lock(&self.uid).clone();
        let this = self.clone();
        tokio::spawn(async move {
            let ack = json!([{ "action": "ack", "event-id": to }]);
            if let Err(error) = this.eyre.put(&uid, &ack, this.timeout).await {
                debug!(%uid, %error, "ack failed; the events come again");
            }
        });
    }
}

struct EventAck {
    shared: Arc<Shared>,
    id: u64,
}

impl TransportAck for EventAck {
    fn ack(&self) {
        lock(&self.shared.tracker).pending.remove(&self.id);
        self.shared.advance();
    }

    fn nack(&self, reason: &str) {
        // Left unacked: Eyre replays it with the next stream.
        debug!(event = self.id, %reason, "event not taken; it comes again");
    }
}

/// The Eyre subscription feed of one account.
pub struct EyreSource {
    name: String,
    eyre: Arc<Eyre>,
    state: Option<ChannelState>,
    threads: Option<Arc<ParticipatedThreads>>,
    clock: Arc<dyn Clock>,
    timeout: Duration,
}

impl std::fmt::Debug for EyreSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EyreSource")
            .field("name", &self.name)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Imports the `eyre-channel.json` an earlier release wrote into `state`, once (see
/// [`ChannelState::import_values`]: a record already in the store wins); true when the file held
/// a record. A file that is not a record is set aside unread (the feed opens a new channel, as
/// the earlier release did).
pub async fn import_channel_record(
    state: &ChannelState,
    legacy: &LegacyFiles,
) -> Result<bool, ImportError> {
    let imported = state
        .import_values(legacy, CHANNEL_FILE, |bytes| {
            Ok(match serde_json::from_slice::<ChannelRecord>(bytes) {
                Ok(record) => Some((CHANNEL_VALUE, record)),
                Err(error) => {
                    warn!(%error, "{CHANNEL_FILE} of an earlier release is not a channel record; set aside");
                    None
                }
            })
        })
        .await?;
    if imported.written > 0 {
        info!("the {CHANNEL_FILE} of an earlier release was taken into the gateway's store");
    }
    Ok(imported.written + imported.kept > 0)
}

enum Ended {
    Stopped,
    Dropped,
    /// The store could not be read: read again after a growing pause.
    StoreFailed,
}

impl EyreSource {
    /// The feed of channel `name`, keeping its channel record in `state` (in memory only when
    /// `None`); new channels are named by `clock` (the gateway's).
    pub fn new(
        name: &str,
        eyre: Arc<Eyre>,
        state: Option<ChannelState>,
        clock: Arc<dyn Clock>,
        timeout: Duration,
    ) -> EyreSource {
        EyreSource {
            name: name.to_owned(),
            eyre,
            state,
            threads: None,
            clock,
            timeout,
        }
    }

    /// Brings `threads` up to date with the store before each diff is handed over.
    #[must_use]
    pub fn with_threads(mut self, threads: Arc<ParticipatedThreads>) -> EyreSource {
        self.threads = Some(threads);
        self
    }

    async fn load(&self) -> Result<Option<ChannelRecord>, StateError> {
        let Some(state) = &self.state else {
            return Ok(None);
        };
        Ok(state
            .value::<ChannelRecord>(CHANNEL_VALUE)
            .await?
            .map(|v| v.value))
    }

    async fn save(&self, record: &ChannelRecord) {
        let Some(state) = &self.state else {
            return;
        };
        if let Err(error) = state.put(CHANNEL_VALUE, record).await {
            warn!(channel = %self.name, %error, "could not keep the Eyre channel record; a restart opens a new channel");
        }
    }

    async fn forget(&self) {
        if let Some(state) = &self.state
            && let Err(error) = state.delete(CHANNEL_VALUE).await
        {
            warn!(channel = %self.name, %error, "could not forget the reaped Eyre channel; a restart finds it gone and opens a new one");
        }
    }

    /// A new channel with both subscriptions.
    async fn open(&self) -> Result<ChannelRecord, EyreError> {
        let mut record = ChannelRecord {
            uid: fresh_uid(
                &format!(
                    "clawgate-{}-feed",
                    self.name.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
                ),
                self.clock.as_ref(),
            ),
            subscriptions: BTreeMap::new(),
            next_id: 1,
        };
        let mut actions = Vec::new();
        for (app, path) in SUBSCRIPTIONS {
            let id = record.next_id;
            record.next_id += 1;
            record
                .subscriptions
                .insert(id, ((*app).to_owned(), (*path).to_owned()));
            actions.push(json!({ "id": id, "action": "subscribe", "ship": self.our_bare(), "app": app, "path": path }));
        }
        // Kept before the PUT: a gateway killed right after it reads the same channel again
        // (never made: its GET is a 404, and a new one is opened).
        self.save(&record).await;
        self.eyre
            .put(&record.uid, &Value::Array(actions), self.timeout)
            .await?;
        info!(channel = %self.name, uid = %record.uid, "opened an Eyre channel with the chat and channels subscriptions");
        Ok(record)
    }

    fn our_bare(&self) -> String {
        // The subscription's ship is our own (the agents run on our ship).
        self.eyre.our().trim_start_matches('~').to_owned()
    }

    /// Subscribes again to what `quit`.
    async fn resubscribe(&self, record: &mut ChannelRecord, quit: u64) -> Result<(), EyreError> {
        let Some((app, path)) = record.subscriptions.remove(&quit) else {
            return Ok(());
        };
        let id = record.next_id;
        record.next_id += 1;
        let action = json!([{ "id": id, "action": "subscribe", "ship": self.our_bare(), "app": app, "path": path }]);
        record.subscriptions.insert(id, (app.clone(), path.clone()));
        self.save(record).await;
        info!(channel = %self.name, %app, %path, "subscription quit; subscribed again");
        self.eyre.put(&record.uid, &action, self.timeout).await
    }

    async fn read(
        &self,
        record: &mut ChannelRecord,
        sink: &Arc<dyn EventSink>,
        shared: &Arc<Shared>,
    ) -> Result<Ended, EyreError> {
        let mut stream = self.eyre.stream(&record.uid, self.timeout).await?;
        {
            let mut t = lock(&shared.tracker);
            t.pending.clear();
            t.seen = t.acked;
        }
        loop {
            let next = tokio::select! {
                () = sink.stopped() => return Ok(Ended::Stopped),
                next = stream.next() => next,
            };
            let ChannelEvent { id, data } = match next {
                Ok(Some(event)) => event,
                Ok(None) => return Ok(Ended::Dropped),
                Err(error) => {
                    debug!(channel = %self.name, %error, "the event stream broke");
                    return Ok(Ended::Dropped);
                }
            };
            let subscription = data.get("id").and_then(Value::as_u64).unwrap_or_default();
            let response = data
                .get("response")
                .and_then(Value::as_str)
                .unwrap_or_default();
            {
                let mut t = lock(&shared.tracker);
                if id <= t.seen && t.seen > 0 {
                    // Already read on this stream.
                    continue;
                }
                t.seen = id;
                if response == "diff" {
                    t.pending.insert(id);
                }
            }
            match response {
                "diff" => {
                    let Some((app, _)) = record.subscriptions.get(&subscription).cloned() else {
                        // A diff of a subscription we no longer hold.
                        lock(&shared.tracker).pending.remove(&id);
                        shared.advance();
                        continue;
                    };
                    let raw = json!({
                        "app": app, "mark": data.get("mark").cloned().unwrap_or(Value::Null),
                        "event": data.get("json").cloned().unwrap_or(Value::Null),
                    });
                    if let Some(threads) = &self.threads
                        && let Err(error) = threads.catch_up().await
                    {
                        // Not handed over: the stream is read again (Eyre replays what was
                        // not acked) once the store answers.
                        warn!(channel = %self.name, %error, "the participated threads could not be read; reading the stream again");
                        return Ok(Ended::StoreFailed);
                    }
                    let ack = Arc::new(EventAck {
                        shared: shared.clone(),
                        id,
                    });
                    sink.deliver(PushedEvent::new(raw, ack)).await;
                }
                "quit" => {
                    self.resubscribe(record, subscription).await?;
                    shared.advance();
                }
                "subscribe" => {
                    if let Some(err) = data.get("err") {
                        warn!(channel = %self.name, subscription, error = %err, "the ship refused a subscription");
                    }
                    shared.advance();
                }
                _ => shared.advance(),
            }
        }
    }
}

#[async_trait]
impl PushedFeed for EyreSource {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        let mut backoff = Duration::from_millis(100);
        let mut record = self.load().await.map_err(|e| {
            SourceError::new(
                DeliveryFailureKind::Transient,
                format!("the Eyre channel record could not be read: {e}"),
            )
        })?;
        loop {
            let mut current = match record.take() {
                Some(record) => record,
                None => match self.open().await {
                    Ok(record) => record,
                    Err(EyreError::LoginRefused { .. }) => {
                        return Err(SourceError::new(
                            DeliveryFailureKind::Auth,
                            "the ship refused the login code",
                        ));
                    }
                    Err(error) => {
                        return Err(SourceError::new(
                            DeliveryFailureKind::Transient,
                            error.to_string(),
                        ));
                    }
                },
            };
            let shared = Arc::new(Shared {
                eyre: self.eyre.clone(),
                timeout: self.timeout,
                uid: Mutex::new(current.uid.clone()),
                tracker: Mutex::new(Tracker::default()),
            });
            let ended = self.read(&mut current, &sink, &shared).await;
            match ended {
                Ok(Ended::Stopped) => return Ok(()),
                Ok(Ended::Dropped) => {
                    backoff = Duration::from_millis(100);
                    record = Some(current);
                }
                Ok(Ended::StoreFailed) => record = Some(current),
                Err(EyreError::Reaped { .. }) => {
                    warn!(channel = %self.name, uid = %current.uid, "the Eyre channel was reaped; opening a new one (what it held unacked is lost)");
                    self.forget().await;
                    continue;
                }
                Err(EyreError::LoginRefused { .. }) => {
                    return Err(SourceError::new(
                        DeliveryFailureKind::Auth,
                        "the ship refused the login code",
                    ));
                }
                Err(error) => {
                    debug!(channel = %self.name, %error, "the event stream could not be read");
                    record = Some(current);
                }
            }
            tokio::select! {
                () = sink.stopped() => return Ok(()),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}
