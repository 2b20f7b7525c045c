//! What a send or a recovery pass reports back: never `()`.

use clawgate_types::{DeliveryFailure, IntentId, IntentStatus, MessageReceipt, UnixMillis};

/// The discriminated result of one send.
#[derive(Debug, Clone, PartialEq)]
pub enum SendOutcome {
    /// Every unit landed and the receipt is committed.
    Sent { receipt: MessageReceipt },
    /// The idempotency key belongs to a send committed earlier: nothing was sent again.
    AlreadySent { receipt: MessageReceipt },
    /// The idempotency key belongs to a send still in progress elsewhere (or awaiting
    /// recovery): nothing was sent now.
    InProgress { status: IntentStatus },
    /// `best_effort_parts`: the delivered prefix is committed; the rest failed.
    Partial {
        delivered: MessageReceipt,
        failure: DeliveryFailure,
    },
    /// A transient failure: the intent is pending and will be retried at `next_attempt_at`.
    RetryScheduled {
        next_attempt_at: UnixMillis,
        failure: DeliveryFailure,
        delivered: Option<MessageReceipt>,
    },
    /// The platform may have acted but no receipt came back: recovery reconciles before any
    /// replay.
    Unknown {
        failure: DeliveryFailure,
        delivered: Option<MessageReceipt>,
    },
    /// The send failed for good (or waits for configuration); see `failure.reason`.
    Failed {
        failure: DeliveryFailure,
        delivered: Option<MessageReceipt>,
    },
}

impl SendOutcome {
    /// The receipt of a committed send.
    pub fn receipt(&self) -> Option<&MessageReceipt> {
        match self {
            SendOutcome::Sent { receipt } | SendOutcome::AlreadySent { receipt } => Some(receipt),
            SendOutcome::Partial { delivered, .. } => Some(delivered),
            _ => None,
        }
    }
}

/// A send's outcome with the durable intent behind it.
#[derive(Debug, Clone, PartialEq)]
pub struct SendReport {
    /// `None` on the direct (non-durable) path.
    pub intent_id: Option<IntentId>,
    /// Whether the send was recorded durably (`false` for `disabled`, and for `best_effort` when
    /// the store was unavailable).
    pub durable: bool,
    pub outcome: SendOutcome,
}

/// What one recovery pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Intents taken (claimed) and looked at.
    pub examined: u64,
    /// Intents found due that another worker or pass took first (left to it).
    pub contended: u64,
    /// Committed (sent now, or found sent by reconciliation).
    pub committed: u64,
    /// Units found already delivered by reconciliation (not resent).
    pub reconciled_sent: u64,
    /// Units the platform proved missing, resent.
    pub reconciled_not_sent: u64,
    /// Left pending with a retry scheduled.
    pub rescheduled: u64,
    /// Unknown outcomes still unresolved (reconciliation scheduled, or parked for an operator
    /// when the adapter cannot reconcile).
    pub unknown: u64,
    /// Failed now (including `expired`).
    pub failed: u64,
    /// Of `failed`: past their time-to-live.
    pub expired: u64,
    /// Replies whose stream never produced a final: preview removed, intent cancelled (their
    /// inbound events run their turns again).
    pub abandoned: u64,
    /// Of `rescheduled`: the platform asked to slow down (rate limited). The channel's other
    /// due intents wait for the next pass instead of meeting the same answer.
    pub rate_limited: u64,
    /// Due intents this pass left for the next one (its time budget ran out, or their
    /// channel was rate limited): still due, not forgotten.
    pub deferred: u64,
}

impl RecoveryReport {
    /// Adds another report's counts to this one.
    pub fn add(&mut self, other: &RecoveryReport) {
        self.examined += other.examined;
        self.abandoned += other.abandoned;
        self.contended += other.contended;
        self.committed += other.committed;
        self.reconciled_sent += other.reconciled_sent;
        self.reconciled_not_sent += other.reconciled_not_sent;
        self.rescheduled += other.rescheduled;
        self.unknown += other.unknown;
        self.failed += other.failed;
        self.expired += other.expired;
        self.rate_limited += other.rate_limited;
        self.deferred += other.deferred;
    }
}
