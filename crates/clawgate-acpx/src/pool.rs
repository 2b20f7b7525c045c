//! Bounds on live agent sessions, per agent: a cap on live processes (`max_live`), closing
//! sessions left idle (`idle_close`), and the queue of turns waiting for a slot.
//!
//! A live session is *in use* while a `SessionUse` of it is held (a turn's prompt) and idle
//! otherwise. At the cap, a turn that needs a new process takes the slot of the least recently
//! used idle session: that session is closed, and its process either ends (a new one starts)
//! or, with `reuse_processes`, is handed to the waiting conversation (one ACP connection, one
//! session on it at a time). When every session is in use the turn waits, first come first
//! served. While turns wait, a session that falls idle is given up to them rather than kept by
//! its own conversation's next turn (which queues behind them): a few busy conversations cannot
//! starve the others.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use clawgate_types::SessionKey;
use tokio::sync::Notify;

/// The limits of one agent's sessions (see `agents[]` in the gateway's configuration).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AgentLimits {
    /// Live agent processes at most; `None` is unbounded.
    pub max_live: Option<usize>,
    /// A session idle this long is closed (its next turn starts a process again and resumes
    /// the ACP session when the agent can); `None` keeps idle sessions open.
    pub idle_close: Option<Duration>,
    /// At the cap, the least recently used idle session's process serves the waiting turn's
    /// session (the old ACP session closed, the new one loaded or begun on the same
    /// connection) instead of ending and another starting. Only an agent that advertises
    /// `session/close` is reused, so it never holds more than one session.
    pub reuse_processes: bool,
}

/// What the pools show (`status`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolFigures {
    /// Live agent sessions (one process tree each), those being started or closed included.
    pub live: usize,
    /// Of those, serving a turn right now.
    pub in_use: usize,
    /// Turns waiting for a slot under an agent's `max_live`.
    pub queued: usize,
    /// Sessions closed for idleness since the start.
    pub idle_closes: u64,
    /// Idle sessions closed to give their slot to a waiting turn since the start.
    pub evictions: u64,
    /// Of those, the ones whose process went on to serve the waiting turn's session.
    pub handovers: u64,
}

/// How much a live session is used: turns in it now, and since when it is idle.
#[derive(Debug)]
pub(crate) struct Usage {
    in_use: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Usage {
    pub(crate) fn new() -> Arc<Usage> {
        Arc::new(Usage {
            in_use: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        })
    }

    pub(crate) fn in_use(&self) -> bool {
        self.in_use.load(Ordering::SeqCst) > 0
    }

    pub(crate) fn idle_since(&self) -> Instant {
        *self
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Holds a live session in use (a turn's prompt): idle again, since now, when dropped.
#[derive(Debug)]
pub(crate) struct InUse {
    usage: Arc<Usage>,
    pools: Arc<Pools>,
}

impl InUse {
    pub(crate) fn new(usage: Arc<Usage>, pools: Arc<Pools>) -> Self {
        usage.in_use.fetch_add(1, Ordering::SeqCst);
        InUse { usage, pools }
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        *self
            .usage
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        self.usage.in_use.fetch_sub(1, Ordering::SeqCst);
        self.pools.changed.notify_waiters();
    }
}

/// The limits, the waiting turns and the counters of every agent.
#[derive(Debug, Default)]
pub(crate) struct Pools {
    limits: Mutex<HashMap<String, AgentLimits>>,
    /// Per agent, the tickets of turns waiting for a slot, first come first.
    waiting: Mutex<HashMap<String, VecDeque<u64>>>,
    next_ticket: AtomicU64,
    /// Woken whenever a slot may have come free: a session fell idle or closed, a waiting
    /// turn left the queue.
    pub(crate) changed: Notify,
    pub(crate) idle_closes: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) handovers: AtomicU64,
    /// Per agent, sessions taken out of the live set whose processes are being ended: they
    /// still count against `max_live` until they are gone.
    closing: Mutex<HashMap<String, usize>>,
    /// The sessions whose processes are being started (outside the live set's lock, so starts
    /// run side by side), with their agents: they count against `max_live`, and a second turn
    /// of the same session waits for the first start instead of starting another process.
    starting: Mutex<HashMap<SessionKey, String>>,
}

impl Pools {
    pub(crate) fn set_limits(&self, agent: &str, limits: AgentLimits) {
        self.limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent.to_owned(), limits);
    }

    pub(crate) fn limits(&self, agent: &str) -> AgentLimits {
        self.limits
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
            .copied()
            .unwrap_or_default()
    }

    /// Whether `ticket` (or a turn without one) may take a slot now: nobody waits before it.
    pub(crate) fn is_first(&self, agent: &str, ticket: Option<u64>) -> bool {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        match waiting.get(agent).and_then(VecDeque::front) {
            None => true,
            Some(first) => Some(*first) == ticket,
        }
    }

    /// Queues a turn of `agent`; returns its ticket.
    pub(crate) fn enqueue(&self, agent: &str) -> u64 {
        self.queue(agent, VecDeque::push_back)
    }

    /// Queues a turn of `agent` before every other: it already had its turn at a slot and lost
    /// it through no doing of its own (its hand-over failed); returns its ticket.
    pub(crate) fn enqueue_first(&self, agent: &str) -> u64 {
        self.queue(agent, VecDeque::push_front)
    }

    fn queue(&self, agent: &str, put: fn(&mut VecDeque<u64>, u64)) -> u64 {
        let ticket = self.next_ticket.fetch_add(1, Ordering::SeqCst);
        put(
            self.waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(agent.to_owned())
                .or_default(),
            ticket,
        );
        ticket
    }

    /// Takes `ticket` out of the queue (it got its slot, or gave up), and wakes the others: the
    /// next one may be first now.
    pub(crate) fn leave(&self, agent: &str, ticket: Option<u64>) {
        let Some(ticket) = ticket else {
            return;
        };
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(queue) = waiting.get_mut(agent) {
                queue.retain(|t| *t != ticket);
                if queue.is_empty() {
                    waiting.remove(agent);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// A session of `agent` is being closed: its process counts until [`Pools::closed`].
    pub(crate) fn closing(&self, agent: &str) {
        *self
            .closing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(agent.to_owned())
            .or_default() += 1;
    }

    /// A session of `agent` that was closing is gone; waiting turns are woken.
    pub(crate) fn closed(&self, agent: &str) {
        {
            let mut closing = self.closing.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = closing.get_mut(agent) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    closing.remove(agent);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Sessions of `agent` being closed now.
    pub(crate) fn closing_count(&self, agent: &str) -> usize {
        self.closing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(agent)
            .copied()
            .unwrap_or(0)
    }

    /// Sessions of every agent being closed now.
    pub(crate) fn closing_total(&self) -> usize {
        self.closing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .sum()
    }

    /// Marks `key`'s process as being started for `agent` until the returned guard is dropped.
    pub(crate) fn begin_start(self: &Arc<Self>, key: &SessionKey, agent: &str) -> Starting {
        self.starting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), agent.to_owned());
        Starting {
            pools: self.clone(),
            key: key.clone(),
        }
    }

    /// Whether a process of `key` is being started now.
    pub(crate) fn is_starting(&self, key: &SessionKey) -> bool {
        self.starting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(key)
    }

    /// Processes of `agent` being started now.
    pub(crate) fn starting_count(&self, agent: &str) -> usize {
        self.starting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|a| *a == agent)
            .count()
    }

    /// Processes of every agent being started now.
    pub(crate) fn starting_total(&self) -> usize {
        self.starting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub(crate) fn queued(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(VecDeque::len)
            .sum()
    }
}

/// Takes a waiting turn's ticket out of the queue however its wait ends (a turn cancelled
/// while it waits must not block the queue).
pub(crate) struct Ticket<'a> {
    pub(crate) pools: &'a Pools,
    pub(crate) agent: &'a str,
    pub(crate) ticket: Option<u64>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.pools.leave(self.agent, self.ticket.take());
    }
}

/// A session's process being started: counted against its agent's `max_live` until dropped
/// (started and in the live set, or failed), then the waiting turns are woken.
#[derive(Debug)]
pub(crate) struct Starting {
    pools: Arc<Pools>,
    key: SessionKey,
}

impl Drop for Starting {
    fn drop(&mut self) {
        self.pools
            .starting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
        self.pools.changed.notify_waiters();
    }
}
