//! The surface a clawgate channel author implements (layer 1; depends on `clawgate-types` only).
//!
//! A channel plugs into the gateway with one [`ChannelMessageAdapter`]: it sends rendered units,
//! optionally edits and deletes them, classifies its failures into [`SendError`]s, and — when the
//! platform allows — answers "did this send land?" for an unknown outcome
//! ([`ChannelMessageAdapter::reconcile_unknown_send`]). Optional adapters render messages
//! ([`MessageRenderAdapter`]), run live previews ([`MessageLiveAdapter`]), map origin markers to
//! platform metadata ([`MessageOriginAdapter`]) and normalize inbound events
//! ([`MessageReceiveAdapter`]). The adapter declares what it can do in
//! [`MessageCapabilities`]; the engine trusts the declaration and the conformance suite checks it.
//!
//! The engine (`clawgate-messages`) owns durability: it records the intent before calling the
//! adapter, records each unit's receipt part, and commits. An adapter never persists anything.
//!
//! # Example
//!
//! ```
//! use std::sync::Mutex;
//! use async_trait::async_trait;
//! use clawgate_channel_sdk::{ChannelMessageAdapter, SendContext, SendError};
//! use clawgate_types::{
//!     DeliveryFailureKind, MessageCapabilities, MessagePartKind, MessageReceiptPart,
//!     RenderedMessageUnit,
//! };
//!
//! /// A "platform" that keeps messages in memory.
//! struct Notebook {
//!     capabilities: MessageCapabilities,
//!     pages: Mutex<Vec<String>>,
//! }
//!
//! #[async_trait]
//! impl ChannelMessageAdapter for Notebook {
//!     fn channel(&self) -> &str {
//!         "notebook"
//!     }
//!
//!     fn capabilities(&self) -> &MessageCapabilities {
//!         &self.capabilities
//!     }
//!
//!     async fn send_unit(
//!         &self,
//!         _ctx: &SendContext,
//!         unit: &RenderedMessageUnit,
//!     ) -> Result<MessageReceiptPart, SendError> {
//!         let text = unit.payload["text"].as_str().ok_or_else(|| {
//!             SendError::before_io(DeliveryFailureKind::InvalidPayload, "unit has no text")
//!         })?;
//!         let mut pages = self.pages.lock().map_err(|_| {
//!             SendError::before_io(DeliveryFailureKind::Transient, "notebook lock poisoned")
//!         })?;
//!         pages.push(text.to_owned());
//!         Ok(MessageReceiptPart {
//!             platform_message_id: format!("page-{}", pages.len()),
//!             kind: MessagePartKind::Text,
//!             index: unit.index,
//!             thread_id: None,
//!             reply_to_id: None,
//!             edit_token: None,
//!             delete_token: None,
//!             url: None,
//!             raw: None,
//!         })
//!     }
//! }
//!
//! let adapter: Box<dyn ChannelMessageAdapter> = Box::new(Notebook {
//!     capabilities: MessageCapabilities::default(),
//!     pages: Mutex::new(Vec::new()),
//! });
//! assert_eq!(adapter.channel(), "notebook");
//! ```

mod error;
mod render;

use async_trait::async_trait;
use clawgate_types::{
    ChannelMessage, IntentId, LiveCancelReason, LiveMessageState, LiveMessageUpdate,
    MessageCapabilities, MessageOrigin, MessageReceipt, MessageReceiptPart, ReceiveAckPolicy,
    RenderedMessageBatch, RenderedMessageUnit,
};

pub use error::{ReceiveError, RenderError, SendError, SideEffect, classify_http_status};
pub use render::{DefaultRenderer, chunk_text};

/// What an adapter knows about the send it is performing. Rebuilt from the stored intent alone
/// after a restart, so it carries everything the platform call needs.
#[derive(Debug, Clone)]
pub struct SendContext {
    /// The durable intent (absent on the non-durable direct path).
    pub intent_id: Option<IntentId>,
    pub channel: String,
    pub account_id: Option<String>,
    /// Target, thread, relation, origin and formatting of the message.
    pub message: ChannelMessage,
    /// Stable across retries and restarts; the per-unit key is
    /// [`RenderedMessageBatch::unit_idempotency_key`].
    pub idempotency_key: String,
    /// 1 on the first attempt.
    pub attempt: u32,
    /// Parts already delivered by earlier attempts (never sent again).
    pub previous_receipt: Option<MessageReceipt>,
}

impl SendContext {
    /// The idempotency key of one unit of the batch.
    pub fn unit_key(&self, unit: &RenderedMessageUnit) -> String {
        format!("{}#{}", self.idempotency_key, unit.index)
    }
}

/// The adapter's answer about a send whose outcome is unknown.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciliation {
    /// The platform has it: here is its receipt part. Commit, never resend.
    Sent(Box<MessageReceiptPart>),
    /// The platform proves it does not have it: resending is safe.
    NotSent,
    /// The platform cannot tell right now: ask again later, do not resend.
    Unresolved,
}

/// The send side of a channel: the one adapter every channel implements.
///
/// Object safe; the engine holds it as `Arc<dyn ChannelMessageAdapter>`.
#[async_trait]
pub trait ChannelMessageAdapter: Send + Sync {
    /// The channel name messages address (`ChannelMessage::channel`).
    fn channel(&self) -> &str;

    /// What this adapter can do. Declare only what works: the conformance suite checks it.
    fn capabilities(&self) -> &MessageCapabilities;

    /// Delivers one rendered unit and returns its receipt part (with the unit's index).
    ///
    /// On failure, return a [`SendError`] whose [`SideEffect`] says whether the platform may
    /// have acted: [`SendError::before_io`] only when nothing can have reached the platform.
    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError>;

    /// Replaces the content of a delivered part (live finalization, corrections).
    async fn edit(
        &self,
        _ctx: &SendContext,
        _part: &MessageReceiptPart,
        _unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        Err(SendError::unsupported(self.channel(), "edit"))
    }

    /// Removes a delivered part (preview clean-up, redaction).
    async fn delete(
        &self,
        _ctx: &SendContext,
        _part: &MessageReceiptPart,
    ) -> Result<(), SendError> {
        Err(SendError::unsupported(self.channel(), "delete"))
    }

    /// Finds out whether a unit whose send outcome is unknown landed, using the platform's own
    /// state (idempotency key lookup, history search…). Called only when the capabilities
    /// declare `delivery.reconcileUnknownSend`.
    async fn reconcile_unknown_send(
        &self,
        _ctx: &SendContext,
        _unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        Ok(Reconciliation::Unresolved)
    }

    /// Channel-local effects of a successful send (echo caches, thread participation…).
    /// Runs once per committed send, after the commit, on the recovery path too.
    async fn after_send_success(&self, _ctx: &SendContext, _receipt: &MessageReceipt) {}

    /// Runs once per committed send, after [`Self::after_send_success`].
    async fn after_commit(&self, _ctx: &SendContext, _receipt: &MessageReceipt) {}

    /// A custom renderer; the engine uses [`DefaultRenderer`] when `None`.
    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        None
    }

    /// Live previews / edits / streams, when the channel supports them.
    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        None
    }

    /// Mapping of [`MessageOrigin`] to platform metadata, when the platform carries metadata.
    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        None
    }
}

/// Turns a message into the batch of units the platform receives.
pub trait MessageRenderAdapter: Send + Sync {
    /// The whole projected output: every chunk, media item and card, in one batch.
    fn render(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError>;

    /// A simpler rendering to try once when the platform rejected the payload
    /// (`invalid_payload`). `None`: no fallback exists, the send fails.
    fn render_fallback(
        &self,
        _message: &ChannelMessage,
        _capabilities: &MessageCapabilities,
        _idempotency_key: &str,
    ) -> Option<RenderedMessageBatch> {
        None
    }
}

/// Maps the core's origin marker to the platform's metadata and back.
pub trait MessageOriginAdapter: Send + Sync {
    /// Metadata to attach to an outbound unit.
    fn encode(&self, origin: &MessageOrigin) -> Option<serde_json::Value>;
    /// The marker carried by an inbound platform event, if any.
    fn decode(&self, raw: &serde_json::Value) -> Option<MessageOrigin>;
}

/// Live previews: begin → update… → finalize in place, or cancel and deliver normally.
#[async_trait]
pub trait MessageLiveAdapter: Send + Sync {
    /// Shows the first preview and returns its state (with its receipt).
    async fn begin(
        &self,
        ctx: &SendContext,
        update: &LiveMessageUpdate,
    ) -> Result<LiveMessageState, SendError>;

    /// Pushes an update into the preview.
    async fn update(
        &self,
        ctx: &SendContext,
        state: &LiveMessageState,
        update: &LiveMessageUpdate,
    ) -> Result<LiveMessageState, SendError>;

    /// Turns the preview into the final message in place.
    async fn finalize(
        &self,
        ctx: &SendContext,
        state: &LiveMessageState,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError>;

    /// Removes (or redacts) the preview because the final is delivered normally.
    async fn cancel(
        &self,
        ctx: &SendContext,
        state: &LiveMessageState,
        reason: LiveCancelReason,
    ) -> Result<(), SendError>;
}

/// Platform facts about an inbound event the core needs beyond the normalized message.
#[derive(Debug, Clone, PartialEq)]
pub struct NormalizedInbound {
    /// The platform's id of the event (dedupe key across redeliveries).
    pub event_id: String,
    pub message: ChannelMessage,
    /// The platform says a bot account wrote it.
    pub is_bot_author: bool,
}

/// The receive side: platform payload → normalized message + ack policy.
pub trait MessageReceiveAdapter: Send + Sync {
    /// Normalizes one platform event; malformed payloads are a typed error, never a panic.
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError>;

    /// When this event's transport (or polling) ack may be given.
    fn ack_policy(&self, _inbound: &NormalizedInbound) -> ReceiveAckPolicy {
        ReceiveAckPolicy::AfterRecord
    }
}
