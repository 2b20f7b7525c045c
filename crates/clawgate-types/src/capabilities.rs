//! What a channel adapter declares it can do. The engine trusts these declarations, and the
//! conformance suite checks that they are true.
//!
//! Every struct starts from `Default` (nothing supported) and is built with `with_*` setters, so
//! a new capability field is not a breaking change for adapters.

use serde::{Deserialize, Serialize};

/// How the platform takes text.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct TextCapabilities {
    /// Longest text one platform message accepts, in characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u32>,
    /// Whether long text may be split into several messages.
    #[serde(default)]
    pub chunking: bool,
}

impl TextCapabilities {
    setters! {
        /// Sets whether long text may be split into several messages.
        with_chunking => chunking: bool;
    }

    setters! { opt
        /// Sets the longest text one platform message accepts, in characters.
        with_max_length => max_length: u32;
    }
}

/// How the platform takes files and media.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct AttachmentCapabilities {
    /// Files can be uploaded.
    pub upload: bool,
    /// Media can be sent by URL for the platform to fetch.
    pub remote_url: bool,
    /// Voice notes can be sent.
    #[serde(default)]
    pub voice: bool,
}

impl AttachmentCapabilities {
    setters! {
        /// Sets whether files can be uploaded.
        with_upload => upload: bool;
        /// Sets whether media can be sent by URL.
        with_remote_url => remote_url: bool;
        /// Sets whether voice notes can be sent.
        with_voice => voice: bool;
    }
}

/// How the platform relates messages to each other.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ThreadCapabilities {
    /// A message can answer another (reply-to).
    pub reply: bool,
    /// Conversations have topics that messages are posted into.
    #[serde(default)]
    pub topic: bool,
    /// The platform has threads of its own.
    #[serde(default)]
    pub native_thread: bool,
}

impl ThreadCapabilities {
    setters! {
        /// Sets whether a message can answer another.
        with_reply => reply: bool;
        /// Sets whether conversations have topics.
        with_topic => topic: bool;
        /// Sets whether the platform has threads of its own.
        with_native_thread => native_thread: bool;
    }
}

/// What the platform allows on a message after it is sent (live previews need it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct LiveCapabilities {
    /// A sent message can be edited.
    pub edit: bool,
    /// A sent message can be deleted.
    pub delete: bool,
    /// The platform has a streaming primitive of its own.
    #[serde(default)]
    pub native_stream: bool,
    /// The platform can show a progress indicator.
    #[serde(default)]
    pub progress: bool,
    /// Most edits per second the platform tolerates on one message (for edit coalescing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_edits_per_second: Option<u32>,
}

impl LiveCapabilities {
    setters! {
        /// Sets whether a sent message can be edited.
        with_edit => edit: bool;
        /// Sets whether a sent message can be deleted.
        with_delete => delete: bool;
        /// Sets whether the platform streams natively.
        with_native_stream => native_stream: bool;
        /// Sets whether the platform can show progress.
        with_progress => progress: bool;
    }

    setters! { opt
        /// Sets the most edits per second one message tolerates.
        with_max_edits_per_second => max_edits_per_second: u32;
    }
}

/// What the platform guarantees about a send.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DeliveryCapabilities {
    /// The platform deduplicates sends by a caller-chosen key.
    #[serde(default)]
    pub idempotency_key: bool,
    /// Rate-limit errors carry a retry-after the engine can honour.
    #[serde(default)]
    pub retry_after: bool,
    /// Every successful send returns a receipt with platform ids.
    #[serde(default)]
    pub receipt_required: bool,
    /// The adapter can answer "did this send land?" for an unknown outcome.
    #[serde(default)]
    pub reconcile_unknown_send: bool,
    /// Duplicate visible messages are an accepted trade-off (at-least-once replay of unknowns).
    #[serde(default)]
    pub duplicates_acceptable: bool,
}

impl DeliveryCapabilities {
    setters! {
        /// Sets whether the platform deduplicates sends by a caller-chosen key.
        with_idempotency_key => idempotency_key: bool;
        /// Sets whether rate-limit errors carry a retry-after.
        with_retry_after => retry_after: bool;
        /// Sets whether every successful send returns a receipt.
        with_receipt_required => receipt_required: bool;
        /// Sets whether the adapter can reconcile an unknown send.
        with_reconcile_unknown_send => reconcile_unknown_send: bool;
        /// Sets whether duplicate visible messages are accepted.
        with_duplicates_acceptable => duplicates_acceptable: bool;
    }
}

/// Everything a channel declares about itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageCapabilities {
    /// How it takes text.
    pub text: TextCapabilities,
    /// How it takes files and media; `None` when it takes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<AttachmentCapabilities>,
    /// How it relates messages; `None` when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<ThreadCapabilities>,
    /// What it allows after a send; `None` when nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveCapabilities>,
    /// What it guarantees about a send; `None` when nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliveryCapabilities>,
}

impl MessageCapabilities {
    /// A sent message can be edited (`live.edit`).
    pub fn can_edit(&self) -> bool {
        self.live.as_ref().is_some_and(|l| l.edit)
    }

    /// A sent message can be deleted (`live.delete`).
    pub fn can_delete(&self) -> bool {
        self.live.as_ref().is_some_and(|l| l.delete)
    }

    /// The platform deduplicates sends by idempotency key (`delivery.idempotencyKey`).
    pub fn dedupes_by_key(&self) -> bool {
        self.delivery.as_ref().is_some_and(|d| d.idempotency_key)
    }

    /// Rate-limit errors carry a retry-after (`delivery.retryAfter`).
    pub fn reports_retry_after(&self) -> bool {
        self.delivery.as_ref().is_some_and(|d| d.retry_after)
    }

    /// The adapter can reconcile an unknown send (`delivery.reconcileUnknownSend`).
    pub fn reconciles_unknown_sends(&self) -> bool {
        self.delivery
            .as_ref()
            .is_some_and(|d| d.reconcile_unknown_send)
    }

    setters! {
        /// Sets how it takes text.
        with_text => text: TextCapabilities;
    }

    setters! { opt
        /// Sets how it takes files and media.
        with_attachments => attachments: AttachmentCapabilities;
        /// Sets how it relates messages.
        with_threads => threads: ThreadCapabilities;
        /// Sets what it allows after a send.
        with_live => live: LiveCapabilities;
        /// Sets what it guarantees about a send.
        with_delivery => delivery: DeliveryCapabilities;
    }
}
