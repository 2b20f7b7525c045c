//! The retry schedule and the failure policy of the design page, in one place.

use clawgate_types::{DeliveryFailureKind, FailureReason, UnixMillis};

/// How often and how long a send is retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts (sends, not reconciliations) before the intent fails with `max_attempts_exceeded`.
    pub max_attempts: u32,
    /// Delay before the second attempt; doubled for each later one.
    pub base_delay_ms: i64,
    /// Ceiling of the exponential backoff.
    pub max_delay_ms: i64,
    /// An intent older than this is failed with reason `expired` instead of delivered: a reply
    /// is not worth sending a week late.
    pub time_to_live_ms: i64,
    /// Delay before the second reconciliation of an unresolved unknown outcome; doubled for
    /// each later one (up to `max_delay_ms`).
    pub reconcile_delay_ms: i64,
    /// Reconciliations of one unknown outcome whose answers leave it unresolved (the platform
    /// unreachable, or "cannot tell" inside the window) before the intent is failed with
    /// `max_attempts_exceeded` — never resent. The last one is asked like any other.
    pub max_reconciliations: u32,
    /// How long the platform may keep answering "cannot tell" about an unknown outcome before
    /// the intent is parked for an operator (`clawgate outbox`). Until then the conversation's
    /// later replies wait behind it; a platform that cannot be reached does not count towards
    /// it (nothing could be sent then anyway).
    pub reconcile_window_ms: i64,
    /// How long a worker's claim on an intent holds if the worker dies.
    pub claim_ttl_ms: i64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            base_delay_ms: 1_000,
            max_delay_ms: 5 * 60_000,
            time_to_live_ms: 24 * 60 * 60_000,
            reconcile_delay_ms: 5_000,
            max_reconciliations: 20,
            reconcile_window_ms: 10 * 60_000,
            claim_ttl_ms: 2 * 60_000,
        }
    }
}

impl RetryPolicy {
    /// When an unknown outcome asked about `asked` times already is asked again: the
    /// reconciliation delay, doubled for each earlier reconciliation, at most `max_delay_ms`.
    pub fn next_reconciliation_at(&self, now: UnixMillis, asked: u32) -> UnixMillis {
        let exponent = asked.saturating_sub(1).min(30);
        let delay = self
            .reconcile_delay_ms
            .saturating_mul(1_i64 << exponent)
            .min(self.max_delay_ms.max(self.reconcile_delay_ms));
        now.saturating_add(delay)
    }

    /// When attempt number `attempt` (1-based) failing transiently may be tried again, honouring
    /// the platform's retry-after when it asks for longer.
    pub fn next_attempt_at(
        &self,
        now: UnixMillis,
        attempt: u32,
        retry_after_ms: Option<u64>,
    ) -> UnixMillis {
        let exponent = attempt.saturating_sub(1).min(30);
        let backoff = self
            .base_delay_ms
            .saturating_mul(1_i64 << exponent)
            .min(self.max_delay_ms);
        let asked = retry_after_ms.map_or(0, |ms| i64::try_from(ms).unwrap_or(i64::MAX));
        now.saturating_add(backoff.max(asked))
    }
}

/// What to do after a failed unit, decided from its class alone (the engine adds the
/// side-effect rule on top: anything after possible platform I/O is an unknown outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Try the same payload again later (transient, rate_limit, unclassified without I/O).
    Retry,
    /// Try once more with the renderer's fallback payload, else fail.
    RenderFallback,
    /// Park until an operator changes configuration (auth, permission).
    AwaitConfiguration,
    /// Ask the platform whether it already has the message (conflict).
    Reconcile,
    /// Give up (not_found for a fresh send, cancelled).
    Fail(FailureReason),
}

/// The failure policy of the design page.
pub fn disposition(kind: DeliveryFailureKind) -> Disposition {
    match kind {
        DeliveryFailureKind::Transient
        | DeliveryFailureKind::RateLimit
        | DeliveryFailureKind::Unknown => Disposition::Retry,
        DeliveryFailureKind::InvalidPayload => Disposition::RenderFallback,
        DeliveryFailureKind::Auth | DeliveryFailureKind::Permission => {
            Disposition::AwaitConfiguration
        }
        DeliveryFailureKind::Conflict => Disposition::Reconcile,
        DeliveryFailureKind::NotFound => Disposition::Fail(FailureReason::Permanent),
        DeliveryFailureKind::Cancelled => Disposition::Fail(FailureReason::OperatorCancelled),
        // A class newer than this build: unclassifiable to it, so handled as `Unknown` (retried
        // within the attempt budget), never as delivered.
        _ => Disposition::Retry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_ceiling_and_honours_retry_after() {
        let p = RetryPolicy {
            base_delay_ms: 100,
            max_delay_ms: 1_000,
            ..RetryPolicy::default()
        };
        let delays: Vec<i64> = (1..=6).map(|a| p.next_attempt_at(0, a, None)).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(
            p.next_attempt_at(0, 1, Some(5_000)),
            5_000,
            "the platform asked for longer"
        );
        assert_eq!(
            p.next_attempt_at(0, 3, Some(10)),
            400,
            "never sooner than the backoff"
        );
        assert_eq!(p.next_attempt_at(0, u32::MAX, None), 1_000, "no overflow");
    }

    #[test]
    fn every_failure_class_has_its_policy() {
        use DeliveryFailureKind::*;
        let table = [
            (Transient, Disposition::Retry),
            (RateLimit, Disposition::Retry),
            (Unknown, Disposition::Retry),
            (InvalidPayload, Disposition::RenderFallback),
            (Auth, Disposition::AwaitConfiguration),
            (Permission, Disposition::AwaitConfiguration),
            (Conflict, Disposition::Reconcile),
            (NotFound, Disposition::Fail(FailureReason::Permanent)),
            (
                Cancelled,
                Disposition::Fail(FailureReason::OperatorCancelled),
            ),
        ];
        for (kind, expected) in table {
            assert_eq!(disposition(kind), expected, "{kind:?}");
        }
    }
}
