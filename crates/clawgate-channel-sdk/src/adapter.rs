//! The send side: the adapter every channel implements, and its optional render, live and
//! origin adapters.

use std::time::Duration;

use async_trait::async_trait;
use clawgate_types::{
    ChannelMessage, IntentId, LiveCancelReason, MessageCapabilities, MessageOrigin, MessageReceipt,
    MessageReceiptPart, MessageTarget, RenderedMessageBatch, RenderedMessageUnit,
};

use crate::{RenderError, SendError};

/// What an adapter knows about the send it is performing. Rebuilt from the stored intent alone
/// after a restart, so it carries everything the platform call needs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SendContext {
    /// The durable intent (absent on the non-durable direct path).
    pub intent_id: Option<IntentId>,
    /// The channel name.
    pub channel: String,
    /// The account the message goes out on.
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
    /// The message's origin marker as platform metadata, from the adapter's
    /// [`MessageOriginAdapter::encode`] (the engine calls it): attach it to every unit sent.
    pub origin_metadata: Option<serde_json::Value>,
}

impl SendContext {
    /// The context of attempt 1 of `message` under `idempotency_key`, outside any durable
    /// intent (the engine fills the rest from the stored intent).
    pub fn new(message: ChannelMessage, idempotency_key: impl Into<String>) -> SendContext {
        SendContext {
            intent_id: None,
            channel: message.channel.clone(),
            account_id: message.account_id.clone(),
            message,
            idempotency_key: idempotency_key.into(),
            attempt: 1,
            previous_receipt: None,
            origin_metadata: None,
        }
    }

    /// The idempotency key of one unit of the batch (the same key
    /// [`RenderedMessageBatch::unit_idempotency_key`] gives).
    pub fn unit_key(&self, unit: &RenderedMessageUnit) -> String {
        clawgate_types::unit_idempotency_key(&self.idempotency_key, unit.index)
    }
}

/// The adapter's answer about a send whose outcome is unknown.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Reconciliation {
    /// The platform has it: here is its receipt part. Commit, never resend.
    Sent(Box<MessageReceiptPart>),
    /// The platform proves it does not have it: resending is safe.
    NotSent,
    /// The platform cannot tell right now: ask again later, do not resend (after the
    /// engine's reconciliation window the send is parked for an operator).
    Unresolved,
    /// The platform can never tell (a single-use reply token whose answer was lost, a
    /// platform without ids or history): park the send for an operator now, do not resend.
    Undecidable,
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
    /// On failure, return a [`SendError`] whose [`SideEffect`](crate::SideEffect) says whether the platform may
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

    /// Whether a live preview may be shown while `message` is produced (when the channel can
    /// preview at all). `false`: the message is sent once, when it is complete (Telegram: a
    /// quoted reply, whose quote a preview would show twice).
    fn previews(&self, _message: &ChannelMessage) -> bool {
        true
    }

    /// How often the engine calls [`Self::show_typing`] while an agent works on a reply;
    /// `None` (the default): the channel shows no typing indicator.
    fn typing_interval(&self) -> Option<Duration> {
        None
    }

    /// Shows once that a reply is being worked on in `target` (the indicator fades on its own).
    /// Best effort: a failure is logged, never retried.
    async fn show_typing(&self, _target: &MessageTarget) -> Result<(), SendError> {
        Ok(())
    }

    /// Channel-local effects of a delivered send (echo caches, thread participation…). Runs
    /// once per committed send, after its receipt is durable, on the recovery path too.
    async fn after_commit(&self, _ctx: &SendContext, _receipt: &MessageReceipt) {}

    /// A custom renderer; the engine uses [`DefaultRenderer`](crate::DefaultRenderer) when `None`.
    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        None
    }

    /// How previews reach the platform, when the channel has its own way (a native stream);
    /// `None`: previews are [`Self::send_unit`], [`Self::edit`] and [`Self::delete`] of this
    /// adapter.
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

/// How a live preview reaches the platform, for a channel with its own way (Slack's
/// `chat.startStream`, Telegram's `sendMessageDraft`). The engine keeps the preview's durable
/// state and calls these at the same points it would otherwise call `send_unit`, `edit` and
/// `delete`: `show` once, `replace` for each coalesced update, `finalize` to turn the preview into
/// the final in place, `remove` when the final is delivered on its own (or the reply ends
/// without one). A preview's unit key is `<reply key>~preview#0`, so a lost `show` answer is
/// reconciled by [`ChannelMessageAdapter::reconcile_unknown_send`] like any unit.
#[async_trait]
pub trait MessageLiveAdapter: Send + Sync {
    /// Shows the first preview text; returns its receipt part.
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError>;

    /// Replaces the preview's text.
    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError>;

    /// Whether `preview` can become the final in place ([`Self::finalize`]); `false` (a
    /// native draft that is not a message) makes the engine remove it and send the final
    /// through the durable send path.
    fn can_finalize_in_place(&self, _preview: &MessageReceiptPart) -> bool {
        true
    }

    /// Turns the preview into the final message in place; returns the final's part.
    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError>;

    /// Removes the preview (`reason` says why).
    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        reason: LiveCancelReason,
    ) -> Result<(), SendError>;
}
