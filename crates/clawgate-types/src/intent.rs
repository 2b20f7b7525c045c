//! Durable send intents and the one table of legal status transitions.

use serde::{Deserialize, Serialize};

use crate::{
    ChannelMessage, DeliveryFailure, IntentId, LiveMessageState, MessageReceipt,
    RenderedMessageBatch, RenderedMessageUnit, UnixMillis,
};

/// Where a durable send intent is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum IntentStatus {
    /// Recorded, not yet attempted (or scheduled for a retry at `nextAttemptAt`).
    Pending,
    /// Platform I/O may be in flight. A crash here leaves an unknown outcome.
    Sending,
    /// The platform returned a receipt that is recorded but not yet committed; committing it is
    /// all that is left (no platform I/O). The send path records the raw receipt and commits it in
    /// one transaction, so this status is stored only when a commit is split from its receipt
    /// (databases written by earlier builds, or an operator walking an intent by hand).
    Committing,
    /// Platform I/O may have happened but no receipt was committed: reconcile before any replay.
    UnknownAfterSend,
    /// Terminal: the receipt is committed.
    Sent,
    /// Parked or terminal failure, with its reason on the intent; an operator may retry it.
    Failed,
    /// Terminal: cancelled before it could be sent.
    Cancelled,
}

/// Every status, in lifecycle order (for exhaustive tests and listings).
pub const ALL_INTENT_STATUSES: [IntentStatus; 7] = [
    IntentStatus::Pending,
    IntentStatus::Sending,
    IntentStatus::Committing,
    IntentStatus::UnknownAfterSend,
    IntentStatus::Sent,
    IntentStatus::Failed,
    IntentStatus::Cancelled,
];

/// A status change the lifecycle does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal intent transition {from:?} -> {to:?}")]
pub struct IllegalTransition {
    /// The status the intent had.
    pub from: IntentStatus,
    /// The status that was asked for.
    pub to: IntentStatus,
}

impl IntentStatus {
    /// The single source of truth for the intent state machine.
    ///
    /// Same-status "transitions" are legal only where they mean bookkeeping: a pending intent
    /// rescheduled, an unknown outcome whose reconciliation stayed unresolved.
    pub fn can_transition_to(self, to: IntentStatus) -> bool {
        use IntentStatus::*;
        matches!(
            (self, to),
            (Pending, Pending | Sending | Failed | Cancelled)
                // A failure proven to have had no platform side effect reschedules;
                // anything after possible I/O without a receipt is an unknown outcome.
                | (Sending, Pending | Committing | UnknownAfterSend | Failed)
                // The raw receipt recorded and committed in one write.
                | (Sending, Sent)
                | (Committing, Sent)
                // Reconciliation: sent → commit, not_sent → resend, unresolved → stay.
                | (UnknownAfterSend, UnknownAfterSend | Sent | Pending | Failed | Cancelled)
                // Operator retry of a parked or failed intent.
                | (Failed, Pending | Cancelled)
        )
    }

    /// Checks a transition against the table.
    pub fn transition_to(self, to: IntentStatus) -> Result<IntentStatus, IllegalTransition> {
        if self.can_transition_to(to) {
            Ok(to)
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }

    /// Statuses that recovery must look at after a restart.
    pub fn is_recoverable(self) -> bool {
        matches!(
            self,
            IntentStatus::Pending
                | IntentStatus::Sending
                | IntentStatus::Committing
                | IntentStatus::UnknownAfterSend
        )
    }

    /// Statuses nothing ever leaves.
    pub fn is_terminal(self) -> bool {
        matches!(self, IntentStatus::Sent | IntentStatus::Cancelled)
    }

    /// The wire spelling (`unknown_after_send`…), also used as the stored column value.
    pub fn as_str(self) -> &'static str {
        match self {
            IntentStatus::Pending => "pending",
            IntentStatus::Sending => "sending",
            IntentStatus::Committing => "committing",
            IntentStatus::UnknownAfterSend => "unknown_after_send",
            IntentStatus::Sent => "sent",
            IntentStatus::Failed => "failed",
            IntentStatus::Cancelled => "cancelled",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(text: &str) -> Option<IntentStatus> {
        ALL_INTENT_STATUSES.into_iter().find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for IntentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Serde: a zero count is left out of the wire format (older records have none).
fn is_zero(count: &u32) -> bool {
    *count == 0
}

/// A visible outbound message the core decided must exist, recorded before any platform I/O.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DurableSendIntent {
    /// The intent's id.
    pub id: IntentId,
    /// Stable across retries and restarts; a second intent with the same key is a duplicate.
    pub idempotency_key: String,
    /// The channel that delivers it.
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The platform account it is sent from.
    pub account_id: Option<String>,
    /// Everything needed to rebuild the send context after a restart (target, thread, origin…).
    pub message: ChannelMessage,
    /// The whole projected batch, once rendered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<RenderedMessageBatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The live preview's state, for a streamed reply.
    pub live_state: Option<LiveMessageState>,
    /// Where it is in its lifecycle.
    pub status: IntentStatus,
    /// How many send attempts were made.
    pub attempt: u32,
    /// How many times the platform was asked about the current unknown outcome (reset when an
    /// outcome becomes unknown afresh); the retry policy's `max_reconciliations` bounds it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reconciliations: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// When the next attempt is due, for a pending intent.
    pub next_attempt_at: Option<UnixMillis>,
    /// After this instant the intent is failed with reason `expired` instead of delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The committed receipt, once sent.
    pub receipt: Option<MessageReceipt>,
    /// Receipts of the units that landed so far; those units are never sent again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_receipt: Option<MessageReceipt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The last attempt's classified failure.
    pub failure: Option<DeliveryFailure>,
    /// When it was recorded.
    pub created_at: UnixMillis,
    /// When it last changed.
    pub updated_at: UnixMillis,
}

impl DurableSendIntent {
    /// A fresh pending intent for a message.
    pub fn new(
        id: IntentId,
        idempotency_key: String,
        message: ChannelMessage,
        now: UnixMillis,
    ) -> Self {
        DurableSendIntent {
            id,
            idempotency_key,
            channel: message.channel.clone(),
            account_id: message.account_id.clone(),
            message,
            batch: None,
            live_state: None,
            status: IntentStatus::Pending,
            attempt: 0,
            reconciliations: 0,
            next_attempt_at: None,
            expires_at: None,
            receipt: None,
            partial_receipt: None,
            failure: None,
            created_at: now,
            updated_at: now,
        }
    }

    /// The units of its batch that its partial receipt does not cover yet, in order: what a
    /// retry or a recovery still has to send (none before the batch is rendered).
    pub fn missing_units(&self) -> impl Iterator<Item = &RenderedMessageUnit> + '_ {
        let delivered = |index: u32| {
            self.partial_receipt
                .as_ref()
                .is_some_and(|r| r.delivered_indices().any(|i| i == index))
        };
        self.batch
            .iter()
            .flat_map(|b| &b.units)
            .filter(move |u| !delivered(u.index))
    }

    /// Whether this intent has no final to send: a live reply whose stream never produced its
    /// final (no batch recorded), still open. Such an intent is never delivered — not by
    /// recovery, not by an operator's retry: its preview (if any) is removed, it is cancelled,
    /// and the unfinished inbound event runs its turn again.
    pub fn awaits_final(&self) -> bool {
        self.batch.is_none() && !self.status.is_terminal() && self.status != IntentStatus::Failed
    }
}
