//! The rendered form of one outbound message: a batch of units delivered under one intent.

use serde::{Deserialize, Serialize};

/// What a rendered unit or a receipt part is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MessagePartKind {
    /// Text.
    Text,
    /// An image, video or file.
    Media,
    /// A voice note.
    Voice,
    /// A structured card.
    Card,
    /// A live preview of a message still being produced.
    Preview,
    /// Something the adapter could not classify.
    Unknown,
}

known_variants!(MessagePartKind {
    Text,
    Media,
    Voice,
    Card,
    Preview,
    Unknown
});

/// What happens when only some units of a batch land.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum BatchAtomicity {
    /// The batch is one logical message: retry the units without receipts until all land.
    AllOrRetryRemaining,
    /// Each unit stands alone: report the delivered prefix and stop at the first failure.
    BestEffortParts,
}

/// One deliverable unit of a batch (a chunk of text, a media item, a card…).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RenderedMessageUnit {
    /// Position in the batch; receipt parts refer to units by it.
    pub index: u32,
    /// What the unit is.
    pub kind: MessagePartKind,
    /// The adapter-specific rendered payload.
    pub payload: serde_json::Value,
    /// Whether the message is incomplete without this unit.
    pub required: bool,
}

impl RenderedMessageUnit {
    /// A required unit of this kind and payload.
    pub fn new(index: u32, kind: MessagePartKind, payload: serde_json::Value) -> Self {
        RenderedMessageUnit {
            index,
            kind,
            payload,
            required: true,
        }
    }

    /// A required text unit, payload `{"text": text}`.
    pub fn text(index: u32, text: impl Into<String>) -> Self {
        Self::new(
            index,
            MessagePartKind::Text,
            serde_json::json!({ "text": text.into() }),
        )
    }

    setters! {
        /// Sets whether the message is incomplete without this unit.
        with_required => required: bool;
    }
}

/// The whole projected output of one message, recorded in one durable intent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct RenderedMessageBatch {
    /// The units, in delivery order.
    pub units: Vec<RenderedMessageUnit>,
    /// What happens when only some units land.
    pub atomicity: BatchAtomicity,
    /// The intent's idempotency key; each unit's key derives from it.
    pub idempotency_key: String,
}

impl RenderedMessageBatch {
    /// A batch of these units under one idempotency key.
    pub fn new(
        units: Vec<RenderedMessageUnit>,
        atomicity: BatchAtomicity,
        idempotency_key: impl Into<String>,
    ) -> Self {
        RenderedMessageBatch {
            units,
            atomicity,
            idempotency_key: idempotency_key.into(),
        }
    }

    /// Units that a receipt with the given delivered indices does not cover yet, in order.
    pub fn missing_units<'a>(
        &'a self,
        delivered: &'a [u32],
    ) -> impl Iterator<Item = &'a RenderedMessageUnit> + 'a {
        self.units
            .iter()
            .filter(move |u| !delivered.contains(&u.index))
    }

    /// Per-unit idempotency key: stable across retries and restarts, distinct per unit.
    pub fn unit_idempotency_key(&self, index: u32) -> String {
        unit_idempotency_key(&self.idempotency_key, index)
    }
}

/// The idempotency key of unit `index` of the batch sent under `intent_key`: `<key>#<index>`.
/// The only place the shape is written (`clawgate_messages::intent_key_of_unit` reads it back).
pub fn unit_idempotency_key(intent_key: &str, index: u32) -> String {
    format!("{intent_key}#{index}")
}
