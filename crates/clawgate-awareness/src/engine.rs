//! The awareness engine: appends to the signal log, turns notifying events into notices,
//! consumes them, rebuilds them from durable cursors, and applies retention.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use clawgate_store::Store;
use clawgate_store::{AppendedEvent, NewSessionEvent, PruneReport, WatchCursor};
use clawgate_types::SessionKey;
use clawgate_types::clock::{Clock, SystemClock};
use tracing::{debug, warn};

use crate::error::AwarenessResult;
use crate::events::StateChange;
use crate::notice::{HeartbeatHook, NoHeartbeat, Notice, NoticeQueue};

/// How long the signal log keeps history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Events (and idle cursors) older than this are removed.
    pub max_age: Duration,
    /// At most this many events are kept across all sessions (oldest go first).
    pub max_rows: u64,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        RetentionPolicy {
            max_age: Duration::from_secs(30 * 24 * 60 * 60),
            max_rows: 50_000,
        }
    }
}

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub struct AwarenessConfig {
    pub retention: RetentionPolicy,
    /// Most events one `changesSince` answer carries.
    pub changes_limit: u32,
    /// The session name (`agent:<id>:<name>`) of an agent's main session: watchers with it are
    /// woken through the heartbeat; every other watcher sees notices on its next turn.
    pub main_session_name: String,
    /// How often the cross-process change feed checks for other processes' commits.
    pub external_poll_interval: Duration,
}

impl Default for AwarenessConfig {
    fn default() -> Self {
        AwarenessConfig {
            retention: RetentionPolicy::default(),
            changes_limit: 200,
            main_session_name: "main".into(),
            external_poll_interval: Duration::from_millis(50),
        }
    }
}

/// Which watchers this process serves (delivers notices to).
pub type ServesWatcher = Arc<dyn Fn(&SessionKey) -> bool + Send + Sync>;

/// Builds an [`Awareness`].
pub struct AwarenessBuilder {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    heartbeat: Arc<dyn HeartbeatHook>,
    config: AwarenessConfig,
    serves: ServesWatcher,
}

impl fmt::Debug for AwarenessBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AwarenessBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Reads a rebuild retries when consumes keep committing underneath it.
const MAX_REBUILD_READS: usize = 8;

impl AwarenessBuilder {
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn heartbeat(mut self, heartbeat: Arc<dyn HeartbeatHook>) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    pub fn config(mut self, config: AwarenessConfig) -> Self {
        self.config = config;
        self
    }

    /// Serve only the watchers `serves` accepts (several gateway processes on one database).
    pub fn serving(mut self, serves: ServesWatcher) -> Self {
        self.serves = serves;
        self
    }

    /// Builds the engine with an empty notice queue; call [`Awareness::rebuild_notices`] at
    /// start to bring back the notices pending before a restart.
    pub fn build(self) -> Awareness {
        Awareness {
            store: self.store,
            clock: self.clock,
            heartbeat: self.heartbeat,
            config: self.config,
            serves: self.serves,
            queue: Mutex::new(NoticeQueue::default()),
        }
    }
}

/// Session state awareness over a store.
pub struct Awareness {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
    heartbeat: Arc<dyn HeartbeatHook>,
    pub(crate) config: AwarenessConfig,
    serves: ServesWatcher,
    queue: Mutex<NoticeQueue>,
}

impl fmt::Debug for Awareness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Awareness")
            .field("config", &self.config)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Awareness {
    pub fn builder(store: Arc<dyn Store>) -> AwarenessBuilder {
        AwarenessBuilder {
            store,
            clock: Arc::new(SystemClock),
            heartbeat: Arc::new(NoHeartbeat),
            config: AwarenessConfig::default(),
            serves: Arc::new(|_| true),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn config(&self) -> &AwarenessConfig {
        &self.config
    }

    pub(crate) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    fn queue(&self) -> MutexGuard<'_, NoticeQueue> {
        lock(&self.queue)
    }

    /// Whether heartbeat wake-ups apply to this watcher (an agent's main session).
    pub fn is_main_session(&self, key: &SessionKey) -> bool {
        key.is_agent_qualified() && key.rest() == self.config.main_session_name
    }

    /// Appends a change to `session`'s signal log and queues the notices it opens.
    ///
    /// Best effort by contract: a failure is logged and `None` returned — the caller's turn
    /// goes on. A duplicate dedupe key returns the existing event and opens nothing.
    #[tracing::instrument(name = "awareness.record", skip_all, fields(session = %session, kind = ?change.kind))]
    pub async fn record(&self, session: &SessionKey, change: StateChange) -> Option<AppendedEvent> {
        self.record_racing(session, change, std::future::ready(()))
            .await
    }

    /// [`Awareness::record`], with `meanwhile` run after the append's write and before its
    /// notices are queued: where tests put a concurrent rebuild and consume.
    pub(crate) async fn record_racing(
        &self,
        session: &SessionKey,
        change: StateChange,
        meanwhile: impl std::future::Future<Output = ()>,
    ) -> Option<AppendedEvent> {
        let event = NewSessionEvent {
            session_key: session.clone(),
            kind: change.kind,
            actor_type: change.actor.actor_type,
            actor_id: change.actor.id,
            summary: change.summary,
            outcome: change.outcome,
            child_session_key: change.child_session_key,
            dedupe_key: change.dedupe_key,
            created_at: self.now(),
        };
        // Notices taken from the queue while the append is in flight are remembered: one of
        // them may be a notice this append opened (a rebuild found it first), shown already.
        let append = AppendInFlight::begin(&self.queue);
        match self.store.append_event_opening_notices(&event).await {
            Ok(result) => {
                debug!(
                    sequence = result.appended.event.sequence,
                    duplicate = result.appended.duplicate,
                    opened = result.opened.len(),
                    "signal-log event appended"
                );
                meanwhile.await;
                self.queue_notices(&result.opened, Some(append.read_at));
                Some(result.appended)
            }
            Err(error) => {
                warn!(%error, "signal-log append failed; the turn continues without it");
                None
            }
        }
    }

    /// Queues the notices of cursors that have one pending, waking main sessions (once).
    pub(crate) fn queue_cursors(&self, cursors: &[WatchCursor]) {
        self.queue_notices(cursors, None);
    }

    /// Queues the pending notices of `cursors`; with `opened_at` (an append's read of the
    /// queue), not those taken for a turn since: they were shown already.
    fn queue_notices(&self, cursors: &[WatchCursor], opened_at: Option<u64>) {
        let notices: Vec<Notice> = cursors
            .iter()
            .filter(|c| (self.serves)(&c.watcher_key))
            .filter_map(Notice::from_cursor)
            .collect();
        let to_wake = {
            let mut queue = self.queue();
            let mut wake = Vec::new();
            for notice in notices {
                let watcher = notice.watcher.clone();
                let queued = match opened_at {
                    Some(read_at) => queue.insert_opened(notice, read_at),
                    None => queue.insert(notice),
                };
                if queued && self.is_main_session(&watcher) && queue.mark_woken(&watcher) {
                    wake.push(watcher);
                }
            }
            wake
        };
        self.wake(to_wake);
    }

    fn wake(&self, watchers: Vec<SessionKey>) {
        for watcher in watchers {
            debug!(watcher = %watcher, "waking main session for a stale-state notice");
            self.heartbeat.wake(&watcher);
        }
    }

    /// The notices pending for `watcher`, without consuming them.
    pub fn pending_notices(&self, watcher: &SessionKey) -> Vec<Notice> {
        self.queue().pending(watcher)
    }

    /// Every queued notice (all served watchers).
    pub fn all_pending_notices(&self) -> Vec<Notice> {
        self.queue().all()
    }

    /// Consumes `watcher`'s pending notices at the start of its turn: returns them (for the
    /// prompt) and acknowledges each durably. Material work that arrived after a notice was
    /// queued opens exactly one new notice, seen on the following turn.
    #[tracing::instrument(name = "awareness.consume", skip_all, fields(session = %watcher))]
    pub async fn consume_notices(&self, watcher: &SessionKey) -> Vec<Notice> {
        let taken = self.queue().take(watcher);
        self.acknowledge(watcher, &taken).await;
        taken
    }

    /// Acknowledges the notices `shown` to `watcher` (read with [`Awareness::pending_notices`]
    /// and placed in a prompt the agent has received). A notice that changed or arrived since
    /// it was read stays pending for the next turn: only what the agent saw is acknowledged.
    /// Returns the notices acknowledged.
    #[tracing::instrument(name = "awareness.acknowledge", skip_all, fields(session = %watcher))]
    pub async fn acknowledge_notices(&self, watcher: &SessionKey, shown: &[Notice]) -> Vec<Notice> {
        let (taken, remain) = self.queue().take_shown(watcher, shown);
        self.acknowledge(watcher, &taken).await;
        if remain && self.is_main_session(watcher) && self.queue().mark_woken(watcher) {
            self.wake(vec![watcher.clone()]);
        }
        taken
    }

    /// The durable acks of notices taken from the queue.
    async fn acknowledge(&self, watcher: &SessionKey, taken: &[Notice]) {
        let now = self.now();
        for notice in taken {
            if notice.deleted_by.is_some() {
                // The target's last notice: consuming it removes the cursor.
                if let Err(error) = self
                    .store
                    .consume_deletion_notice(watcher, &notice.target)
                    .await
                {
                    warn!(target_session = %notice.target, %error, "could not acknowledge a deletion notice");
                    self.queue().insert(notice.clone());
                }
                self.queue().consumed(notice);
                continue;
            }
            match self
                .store
                .consume_notice(watcher, &notice.target, notice.changes_since, now)
                .await
            {
                Ok(consumed) => {
                    if consumed.reopened {
                        self.queue_cursors(consumed.cursor.as_slice());
                    }
                }
                Err(error) => {
                    // Still pending durably: keep it queued so the next turn sees it again.
                    warn!(target_session = %notice.target, %error, "could not acknowledge a notice");
                    self.queue().insert(notice.clone());
                }
            }
            // Any rebuild that read the cursors before this ack is now stale.
            self.queue().consumed(notice);
        }
    }

    /// Makes the queue match the durable cursors: after a restart, after another process's
    /// commit, after retention. Newly found notices wake main sessions. Returns how many
    /// notices are pending for served watchers.
    pub async fn rebuild_notices(&self) -> AwarenessResult<usize> {
        // A consume committing while the cursors are read makes the read stale: read again.
        for _ in 0..MAX_REBUILD_READS {
            let read_at = self.queue().generation();
            let durable: Vec<Notice> = self
                .store
                .cursors_with_pending_notice()
                .await?
                .iter()
                .filter(|c| (self.serves)(&c.watcher_key))
                .filter_map(Notice::from_cursor)
                .collect();
            let count = durable.len();
            let to_wake = {
                let mut queue = self.queue();
                let Some(fresh) = queue.rebuild(durable, read_at) else {
                    continue;
                };
                fresh
                    .into_iter()
                    .filter(|n| self.is_main_session(&n.watcher))
                    .filter(|n| queue.mark_woken(&n.watcher))
                    .map(|n| n.watcher)
                    .collect::<Vec<_>>()
            };
            self.wake(to_wake);
            return Ok(count);
        }
        // Consumes kept racing the read; the queue is left as it is and the next change (each
        // consume is one) triggers another rebuild.
        Ok(self.queue().all().len())
    }

    /// Follows other processes' commits (through the store's change feed) and rebuilds the
    /// notice queue after each, so a notice caused by another gateway process reaches the
    /// watchers this one serves. The task ends when the engine is dropped or the feed ends.
    pub fn follow_external_changes(
        self: &Arc<Self>,
    ) -> AwarenessResult<tokio::task::JoinHandle<()>> {
        let mut changes = self
            .store
            .external_changes(self.config.external_poll_interval)?;
        let engine: Weak<Self> = Arc::downgrade(self);
        Ok(tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(engine) = engine.upgrade() else {
                    return;
                };
                if let Err(error) = engine.rebuild_notices().await {
                    warn!(%error, "could not rebuild notices after an external change");
                }
            }
        }))
    }

    /// Applies retention: events older than `max_age` and beyond `max_rows` go (heads stay),
    /// idle cursors expire, and notices of expired cursors leave the queue.
    pub async fn apply_retention(&self) -> AwarenessResult<PruneReport> {
        let max_age = i64::try_from(self.config.retention.max_age.as_millis()).unwrap_or(i64::MAX);
        let older_than = self.now().saturating_sub(max_age);
        let report = self
            .store
            .prune_signal_log(older_than, self.config.retention.max_rows)
            .await?;
        if report.cursors_deleted > 0 {
            self.rebuild_notices().await?;
        }
        Ok(report)
    }

    pub(crate) fn forget_session(&self, session: &SessionKey, as_target: bool) {
        self.queue().forget_session(session, as_target);
    }
}

/// An append in flight: the queue remembers the notices taken meanwhile until it ends (also
/// when the append's future is dropped).
struct AppendInFlight<'a> {
    queue: &'a Mutex<NoticeQueue>,
    read_at: u64,
}

impl<'a> AppendInFlight<'a> {
    fn begin(queue: &'a Mutex<NoticeQueue>) -> Self {
        let read_at = lock(queue).begin_append();
        AppendInFlight { queue, read_at }
    }
}

impl Drop for AppendInFlight<'_> {
    fn drop(&mut self) {
        lock(self.queue).end_append(self.read_at);
    }
}

fn lock(queue: &Mutex<NoticeQueue>) -> MutexGuard<'_, NoticeQueue> {
    // A panic while holding the lock leaves a consistent map (every mutation is one call);
    // keep serving rather than poisoning every later turn.
    queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests;
