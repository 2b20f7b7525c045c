//! Policies that decide how durable a send is and when a platform event is acknowledged,
//! and the discriminated status a durable final delivery reports.

use serde::{Deserialize, Serialize};

/// How much durability a send requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MessageDurabilityPolicy {
    /// Fail closed: nothing is sent when the intent cannot be written.
    Required,
    /// Proceed when persistence is unavailable, and say so.
    BestEffort,
    /// The direct (legacy) path: no intent at all. Legacy entry points default to this.
    #[default]
    Disabled,
}

/// Why an event is acknowledged before it is processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ImmediateAckReason {
    /// The platform's webhook times out before processing could finish.
    WebhookTimeout,
    /// The platform's API requires acknowledging on receipt.
    PlatformContract,
}

known_variants!(ImmediateAckReason {
    WebhookTimeout,
    PlatformContract
});

/// When the transport (or polling offset) acknowledgement may be given for an inbound event.
///
/// This governs transport/polling acks only — never read receipts or status reactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ReceiveAckPolicy {
    /// Acknowledge on receipt, before the event is recorded.
    Immediate {
        /// Why the ack cannot wait.
        reason: ImmediateAckReason,
    },
    /// Acknowledge once the event is durably recorded.
    AfterRecord,
    /// Acknowledge once the reply's durable send is recorded.
    AfterDurableSend,
    /// The adapter acknowledges on its own.
    Manual,
}

/// The result of a durable final delivery, discriminated so callers cannot ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Terminal: the message is visible on the platform.
    HandledVisible,
    /// Terminal: handled, and nothing needed sending.
    HandledNoSend,
    /// The durable path cannot serve this; the channel's own delivery may take over.
    Unsupported,
    /// The durable path does not apply here; the channel's own delivery may take over.
    NotApplicable,
    /// The send failed; the failure propagates.
    Failed,
}

impl DeliveryStatus {
    /// Terminal statuses end delivery; the others may fall back to channel-owned delivery.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            DeliveryStatus::HandledVisible | DeliveryStatus::HandledNoSend
        )
    }
}
