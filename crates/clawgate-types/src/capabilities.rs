//! What a channel adapter declares it can do. The engine trusts these declarations, and the
//! conformance suite checks that they are true.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TextCapabilities {
    /// Longest text one platform message accepts, in characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u32>,
    /// Whether long text may be split into several messages.
    #[serde(default)]
    pub chunking: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AttachmentCapabilities {
    pub upload: bool,
    pub remote_url: bool,
    #[serde(default)]
    pub voice: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ThreadCapabilities {
    pub reply: bool,
    #[serde(default)]
    pub topic: bool,
    #[serde(default)]
    pub native_thread: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LiveCapabilities {
    pub edit: bool,
    pub delete: bool,
    #[serde(default)]
    pub native_stream: bool,
    #[serde(default)]
    pub progress: bool,
    /// Most edits per second the platform tolerates on one message (for edit coalescing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_edits_per_second: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
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

/// Everything a channel declares about itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct MessageCapabilities {
    pub text: TextCapabilities,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attachments: Option<AttachmentCapabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<ThreadCapabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<LiveCapabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliveryCapabilities>,
}
