//! Closed classes of delivery failure, as adapters classify transport errors.

use serde::{Deserialize, Serialize};

use crate::UnixMillis;

/// The class of a delivery failure; the engine's retry policy is keyed on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeliveryFailureKind {
    /// Network blip, 5xx: try again with backoff.
    Transient,
    /// The platform asked us to slow down (honour `retryAfterMs`).
    RateLimit,
    /// Credentials missing or rejected: waits for a configuration change.
    Auth,
    /// The account may not post there: waits for a configuration change.
    Permission,
    /// The target or the message to edit no longer exists.
    NotFound,
    /// The platform rejected the payload itself (too long, bad markup…).
    InvalidPayload,
    /// The platform already has a conflicting message (duplicate idempotency key…).
    Conflict,
    /// The send was cancelled on purpose.
    Cancelled,
    /// Not classifiable: treated as a possible platform side effect.
    Unknown,
}

known_variants!(DeliveryFailureKind {
    Transient,
    RateLimit,
    Auth,
    Permission,
    NotFound,
    InvalidPayload,
    Conflict,
    Cancelled,
    Unknown,
});

impl DeliveryFailureKind {
    /// Whether the same payload may simply be tried again later.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            DeliveryFailureKind::Transient | DeliveryFailureKind::RateLimit
        )
    }

    /// Whether only an operator's configuration change can make a retry succeed.
    pub fn needs_configuration_change(self) -> bool {
        matches!(
            self,
            DeliveryFailureKind::Auth | DeliveryFailureKind::Permission
        )
    }
}

/// Why an intent ended up failed, beyond the failure class of its last attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The intent outlived its time-to-live; a stale reply is not delivered after an outage.
    Expired,
    /// The retry schedule's attempt budget is spent.
    MaxAttemptsExceeded,
    /// The failure class is not retryable and no fallback applies.
    Permanent,
    /// Waiting for credentials or permissions to change; an operator retry resumes it.
    AwaitingConfiguration,
    /// An operator cancelled it.
    OperatorCancelled,
}

/// A classified failure, kept on the intent so operators can see why.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct DeliveryFailure {
    /// The failure class.
    pub kind: DeliveryFailureKind,
    /// Human-readable description from the adapter (never message content).
    pub message: String,
    /// Why the intent ended up failed, once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailureReason>,
    /// How long the platform asked to wait before a retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Platform status or error code, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_code: Option<String>,
    /// When the attempt failed.
    pub at: UnixMillis,
}
