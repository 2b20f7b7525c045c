//! Our own flood control: a token bucket in bytes, so the server never has a reason to drop us
//! for excess flood. Servers count both commands and bytes (RFC 1459 §8.10 adds 2 s per
//! message; ngircd closes a client that sends more than about 1.5 KB a second), so every line
//! costs its length, and at least `min_cost` bytes however short it is.

use std::time::{Duration, Instant};

/// The bucket's shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FloodPolicy {
    /// Bytes that may go out at once after a quiet period.
    pub burst_bytes: u32,
    /// Bytes a second sustained.
    pub bytes_per_second: u32,
    /// What the shortest line costs (caps the number of lines a second).
    pub min_cost: u32,
}

impl Default for FloodPolicy {
    fn default() -> FloodPolicy {
        FloodPolicy {
            burst_bytes: 1024,
            bytes_per_second: 512,
            min_cost: 128,
        }
    }
}

/// A token bucket.
#[derive(Debug)]
pub struct TokenBucket {
    policy: FloodPolicy,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(policy: FloodPolicy, now: Instant) -> TokenBucket {
        TokenBucket {
            policy,
            tokens: f64::from(policy.burst_bytes),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(self.policy.bytes_per_second))
            .min(f64::from(self.policy.burst_bytes));
        self.at = now;
    }

    /// How long to wait before lines of these lengths may go out together (zero: now). More
    /// than the burst waits for a full bucket.
    pub fn wait_for(&mut self, lens: &[usize], now: Instant) -> Duration {
        self.refill(now);
        let cost = self.cost(lens);
        if self.tokens >= cost {
            return Duration::ZERO;
        }
        let rate = f64::from(self.policy.bytes_per_second.max(1));
        Duration::from_secs_f64((cost - self.tokens) / rate)
    }

    /// Takes the tokens of lines of these lengths that go out now.
    pub fn take(&mut self, lens: &[usize], now: Instant) {
        self.refill(now);
        self.tokens -= self.cost(lens);
    }

    fn cost(&self, lens: &[usize]) -> f64 {
        let total: f64 = lens
            .iter()
            .map(|len| {
                f64::from(
                    u32::try_from(*len)
                        .unwrap_or(u32::MAX)
                        .max(self.policy.min_cost),
                )
            })
            .sum();
        total.min(f64::from(self.policy.burst_bytes))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_goes_out_then_the_rate_holds() {
        let policy = FloodPolicy {
            burst_bytes: 1000,
            bytes_per_second: 500,
            min_cost: 100,
        };
        let start = Instant::now();
        let mut bucket = TokenBucket::new(policy, start);
        let mut now = start;
        let mut sent = 0usize;
        // Ten seconds of 250-byte lines as fast as the bucket allows.
        while now < start + Duration::from_secs(10) {
            let wait = bucket.wait_for(&[250], now);
            now += wait;
            bucket.take(&[250], now);
            sent += 250;
        }
        // The burst plus ten seconds at the rate, and not a line more.
        assert!(sent <= 1000 + 500 * 10 + 250, "{sent}");
        assert!(sent >= 500 * 10, "{sent}");
        // Short lines cost the minimum.
        let mut bucket = TokenBucket::new(policy, start);
        for _ in 0..10 {
            assert_eq!(bucket.wait_for(&[5], start), Duration::ZERO);
            bucket.take(&[5], start);
        }
        assert!(bucket.wait_for(&[5], start) > Duration::ZERO);
    }
}
