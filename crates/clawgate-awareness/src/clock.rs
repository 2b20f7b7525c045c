//! Time as a dependency: every timestamp the engine writes comes from a [`Clock`], so tests
//! drive retention and ordering without sleeping.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use clawgate_types::UnixMillis;

/// Where "now" comes from.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> UnixMillis;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> UnixMillis {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            // A clock before 1970 is a broken host; 0 keeps ordering sane rather than panicking.
            .unwrap_or(0)
    }
}

/// A clock that moves only when told to (tests, simulations).
#[derive(Debug)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    pub fn new(start: UnixMillis) -> ManualClock {
        ManualClock {
            now: AtomicI64::new(start),
        }
    }

    pub fn set(&self, now: UnixMillis) {
        self.now.store(now, Ordering::SeqCst);
    }

    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> UnixMillis {
        self.now.load(Ordering::SeqCst)
    }
}
