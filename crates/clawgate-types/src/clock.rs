//! Time as a dependency: every layer reads "now" through a [`Clock`], so tests drive retention,
//! retries and ordering without sleeping. The one definition, here in layer 0, so the engines,
//! the store and the gateway share it.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::UnixMillis;

/// Where "now" comes from.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> UnixMillis;
}

/// The system's wall clock.
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
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: UnixMillis) -> ManualClock {
        ManualClock {
            now: AtomicI64::new(start),
        }
    }

    /// Moves the clock forward by `ms` milliseconds.
    pub fn advance(&self, ms: i64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }

    /// Moves the clock to `now` (backwards too).
    pub fn set(&self, now: UnixMillis) {
        self.now.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> UnixMillis {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance(250);
        assert_eq!(clock.now_ms(), 1_250);
        clock.set(7);
        assert_eq!(clock.now_ms(), 7);
    }

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("host clock after 1970")
            .as_millis();
        let now = u128::try_from(SystemClock.now_ms()).expect("positive");
        assert!(now >= before, "{now} < {before}");
    }
}
