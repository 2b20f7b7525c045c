//! The simulated process's death at a chosen commit of the store.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use clawgate_store_sqlite::{CommitHook, CommitStage, CommitVerdict};

/// Where the simulated process dies: at a commit of the store's writer (every transaction,
/// reads of the in-memory database included), counted here — but not the checker's own reads.
#[derive(Debug, Default)]
pub(crate) struct Crash {
    /// `(commit, before)`: abort right before that commit (nothing of it stored) or right
    /// after it (stored, nobody told).
    at: Mutex<Option<(u64, bool)>>,
    /// Commits of the engines so far (the one in progress included).
    counted: AtomicU64,
    /// The invariant checks are reading: not the process's work, not counted.
    pub(crate) checking: AtomicBool,
    pub(crate) dead: Arc<AtomicBool>,
}

impl Crash {
    pub(crate) fn hook(self: &Arc<Self>) -> CommitHook {
        let crash = self.clone();
        CommitHook(Arc::new(move |stage, _| {
            if crash.checking.load(Ordering::SeqCst) {
                return CommitVerdict::Proceed;
            }
            if crash.dead.load(Ordering::SeqCst) {
                // A dead process writes nothing more.
                return CommitVerdict::RefuseAsDiskFull;
            }
            let n = match stage {
                CommitStage::Before => crash.counted.fetch_add(1, Ordering::SeqCst) + 1,
                CommitStage::Committed => crash.counted.load(Ordering::SeqCst),
            };
            let mut at = crash
                .at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match *at {
                Some((target, true)) if target == n && stage == CommitStage::Before => {
                    *at = None;
                    crash.dead.store(true, Ordering::SeqCst);
                    CommitVerdict::RefuseAsDiskFull
                }
                Some((target, false)) if target == n && stage == CommitStage::Committed => {
                    *at = None;
                    crash.dead.store(true, Ordering::SeqCst);
                    CommitVerdict::Proceed
                }
                _ => CommitVerdict::Proceed,
            }
        }))
    }

    fn arm(&self, after: u64, before: bool) {
        let target = self.counted.load(Ordering::SeqCst) + after;
        *self
            .at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((target, before));
    }

    /// Arms a crash at one of the next `upto` commits, before or after it (from `rng`), and
    /// says so for the trace.
    pub(crate) fn arm_at_random(&self, rng: &mut crate::rng::Rng, upto: u64) -> String {
        let after = 1 + rng.below(upto);
        let before = rng.chance(50);
        self.arm(after, before);
        format!(
            "crash armed: {} the {after}th commit from now",
            if before { "before" } else { "after" }
        )
    }

    pub(crate) fn disarm(&self) {
        *self
            .at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }
}
