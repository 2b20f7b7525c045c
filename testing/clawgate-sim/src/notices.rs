//! The notice protocol under the same seeded crashes: the real awareness engine on the real
//! store, two watchers on one target, material and log-only events by either watcher or
//! someone else, watchers' turns consuming their notices, and the process dying at any commit
//! (its in-memory notice queue lost; the next process rebuilds it from the store).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clawgate_awareness::{Actor, Awareness, NewSession, SpawnChild, StateChange};
use clawgate_store::{SignalLogStore as _, WatchCursorStore as _};
use clawgate_store_sqlite::{SqliteOptions, SqliteStore};
use clawgate_types::clock::ManualClock;
use clawgate_types::{SessionKey, StateVersion};

use crate::crash::Crash;
use crate::rng::Rng;
use crate::world::Violation;

const START: i64 = 1_767_225_600_000;

fn key(text: &str) -> SessionKey {
    SessionKey::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

struct NoticeWorld {
    store: Arc<SqliteStore>,
    clock: Arc<ManualClock>,
    crash: Arc<Crash>,
    awareness: Arc<Awareness>,
    target: SessionKey,
    watchers: [SessionKey; 2],
    /// `(watcher, changes_since)` shown in this process's life.
    shown: HashSet<(usize, StateVersion)>,
    trace: Vec<String>,
    lives: u32,
}

impl NoticeWorld {
    async fn new() -> NoticeWorld {
        let crash = Arc::new(Crash::default());
        let store = Arc::new(
            SqliteStore::open_in_memory(SqliteOptions {
                commit_hook: Some(crash.hook()),
                // One write per commit: how many writes the writer finds queued together
                // depends on thread timing, and the crash counts commits.
                max_batch: 1,
                ..SqliteOptions::default()
            })
            .unwrap_or_else(|e| panic!("in-memory store: {e}")),
        );
        let clock = Arc::new(ManualClock::new(START));
        let awareness = Self::awareness(&store, &clock);
        let main = key("agent:main:main");
        let peer = key("agent:main:subagent:peer");
        let target = key("agent:main:subagent:child");
        for session in [&main, &peer] {
            awareness
                .create_session(NewSession::new(session.clone()), Actor::system("sim"))
                .await
                .unwrap_or_else(|e| panic!("session: {e}"));
        }
        awareness
            .spawn_child(SpawnChild {
                parent: main.clone(),
                child: NewSession::new(target.clone()),
            })
            .await
            .unwrap_or_else(|e| panic!("child: {e}"));
        assert!(awareness.watch(&peer, &target).await, "the peer watches");
        NoticeWorld {
            store,
            clock,
            crash,
            awareness,
            target,
            watchers: [main, peer],
            shown: HashSet::new(),
            trace: Vec::new(),
            lives: 0,
        }
    }

    fn awareness(store: &Arc<SqliteStore>, clock: &Arc<ManualClock>) -> Arc<Awareness> {
        Arc::new(
            Awareness::builder(store.clone())
                .clock(clock.clone())
                .build(),
        )
    }

    async fn restart_if_dead(&mut self) {
        if !self.crash.dead.load(Ordering::SeqCst) {
            return;
        }
        self.lives += 1;
        self.trace
            .push(format!("CRASHED; restart (life {})", self.lives));
        self.crash.dead.store(false, Ordering::SeqCst);
        self.awareness = Self::awareness(&self.store, &self.clock);
        self.shown.clear();
        let rebuilt = self.awareness.rebuild_notices().await;
        self.trace
            .push(format!("restart sweep: {rebuilt:?} pending"));
    }

    /// A watcher's turn: what its queue holds must be its durable pending notice; then it is
    /// shown and consumed.
    async fn turn(&mut self, w: usize) -> Result<(), String> {
        let watcher = self.watchers[w].clone();
        let queued = self.awareness.pending_notices(&watcher);
        self.crash.checking.store(true, Ordering::SeqCst);
        let cursor = self.store.load_cursor(&watcher, &self.target).await;
        self.crash.checking.store(false, Ordering::SeqCst);
        let cursor = cursor.map_err(|e| e.to_string())?;
        for notice in &queued {
            let pending = cursor.as_ref().is_some_and(|c| {
                c.notified_version.is_some() && c.acked_version == notice.changes_since
            });
            if !pending {
                return Err(format!(
                    "one notice per pair: watcher {w}'s queue holds a notice since {:?} that is \
                     not its pending durable one ({cursor:?})",
                    notice.changes_since
                ));
            }
        }
        let consumed = self.awareness.consume_notices(&watcher).await;
        for notice in &consumed {
            if !self.shown.insert((w, notice.changes_since)) {
                return Err(format!(
                    "watcher {w} was shown the notice since {:?} twice",
                    notice.changes_since
                ));
            }
            self.justified(w, notice.changes_since).await?;
        }
        self.trace.push(format!(
            "watcher {w}'s turn: shown {:?}",
            consumed
                .iter()
                .map(|n| n.changes_since.0)
                .collect::<Vec<_>>()
        ));
        Ok(())
    }

    /// A notice since `since` for watcher `w` stands for a material event of someone else after
    /// `since`.
    async fn justified(&self, w: usize, since: StateVersion) -> Result<(), String> {
        let watcher = self.watchers[w].as_str().to_owned();
        self.crash.checking.store(true, Ordering::SeqCst);
        let log = self.store.events_since(&self.target, since, 10_000).await;
        self.crash.checking.store(false, Ordering::SeqCst);
        let log = log.map_err(|e| e.to_string())?;
        if log
            .events
            .iter()
            .any(|e| e.kind.notifies() && e.actor_id.as_deref() != Some(watcher.as_str()))
        {
            Ok(())
        } else {
            Err(format!(
                "watcher {w} was shown a notice since {since:?} with no material event of \
                 someone else after it (its own, or log-only)"
            ))
        }
    }

    async fn step(&mut self, rng: &mut Rng) -> Result<(), String> {
        match rng.below(100) {
            0..=44 => {
                let (change, who) = match rng.below(5) {
                    0 => (
                        StateChange::compacted(Actor::system("runtime"), "compacted"),
                        "a log-only event",
                    ),
                    1 => (
                        StateChange::goal_changed(Actor::agent(&self.watchers[0]), "goal"),
                        "watcher 0's own event",
                    ),
                    2 => (
                        StateChange::goal_changed(Actor::agent(&self.watchers[1]), "goal"),
                        "watcher 1's own event",
                    ),
                    _ => (
                        StateChange::human_direct_message(Actor::human("person"), "sim"),
                        "a person's message",
                    ),
                };
                let appended = self.awareness.record(&self.target, change).await;
                self.trace.push(format!(
                    "{who} on the target: {:?}",
                    appended.map(|a| a.event.sequence)
                ));
            }
            45..=79 => self.turn(rng.below(2) as usize).await?,
            80..=84 => {
                let rebuilt = self.awareness.rebuild_notices().await;
                self.trace
                    .push(format!("rebuild (a change feed's wake-up): {rebuilt:?}"));
            }
            _ => {
                let armed = self.crash.arm_at_random(rng, 4);
                self.trace.push(armed);
            }
        }
        self.restart_if_dead().await;
        Ok(())
    }

    /// No more crashes: each watcher consumes until nothing is pending; then no material
    /// event of someone else lies after what it acknowledged.
    async fn settle(&mut self) -> Result<(), String> {
        self.crash.disarm();
        self.restart_if_dead().await;
        self.awareness
            .rebuild_notices()
            .await
            .map_err(|e| e.to_string())?;
        for w in 0..2 {
            for _ in 0..4 {
                self.turn(w).await?;
            }
            let watcher = self.watchers[w].as_str().to_owned();
            let cursor = self
                .store
                .load_cursor(&self.watchers[w], &self.target)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the watch cursor is gone")?;
            let log = self
                .store
                .events_since(&self.target, cursor.acked_version, 10_000)
                .await
                .map_err(|e| e.to_string())?;
            let lost = log
                .events
                .iter()
                .find(|e| e.kind.notifies() && e.actor_id.as_deref() != Some(watcher.as_str()));
            if let Some(event) = lost {
                return Err(format!(
                    "watcher {w} acknowledged up to {:?} and was never told of the material \
                     event {} after it",
                    cursor.acked_version, event.sequence
                ));
            }
        }
        Ok(())
    }
}

/// One seed of the notice protocol: its trace (every step and what came of it).
pub fn run_notice_seed(seed: u64, steps: u32) -> Result<Vec<String>, Violation> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("a current-thread runtime: {e}"));
    runtime.block_on(async {
        let mut world = NoticeWorld::new().await;
        let mut rng = Rng::new(seed);
        for _ in 0..steps {
            if let Err(property) = world.step(&mut rng).await {
                return Err(Violation {
                    seed,
                    property,
                    trace: world.trace,
                });
            }
        }
        match world.settle().await {
            Ok(()) => Ok(world.trace),
            Err(property) => Err(Violation {
                seed,
                property,
                trace: world.trace,
            }),
        }
    })
}
