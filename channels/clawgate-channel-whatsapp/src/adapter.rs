//! Sending: one `POST /<phone-number-id>/messages` of `type: text` per unit, replies quoted
//! with `context.message_id`, and the unit's key in `biz_opaque_callback_data`, which Meta
//! echoes in every status webhook of that message. WhatsApp has no idempotency key, no edit and
//! no delete for business messages: finals are plain durable sends, and a send whose answer
//! was lost is settled only by a status webhook carrying its key ([`StatusBook`]).

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation, SendContext, SendError};
use clawgate_types::{
    DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities, MessageReceiptPart,
    RenderedMessageUnit, TextCapabilities, ThreadCapabilities,
};
use serde_json::{Value, json};
use tracing::warn;

use crate::client::GraphApi;
use crate::status::StatusBook;

/// Longest text body of one message (platform-apis §6: 4096 characters).
pub const MAX_TEXT_CHARS: u32 = 4_096;
/// Longest `biz_opaque_callback_data` Meta accepts.
pub const MAX_CALLBACK_DATA: usize = 512;

/// The WhatsApp sender: one business phone number.
pub struct WhatsAppAdapter {
    name: String,
    api: GraphApi,
    book: StatusBook,
    capabilities: MessageCapabilities,
    preview_url: bool,
}

impl std::fmt::Debug for WhatsAppAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhatsAppAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

/// What the channel can do, as the engine and the conformance suite read it: text chunked at
/// 4096, quoted replies, no live previews (no edits), unknown sends reconciled from status
/// webhooks.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_threads(ThreadCapabilities::default().with_reply(true))
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    unit.payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a WhatsApp text unit needs a `text` string"))
}

impl WhatsAppAdapter {
    pub(crate) fn new(
        name: &str,
        api: GraphApi,
        book: StatusBook,
        preview_url: bool,
    ) -> WhatsAppAdapter {
        WhatsAppAdapter {
            name: name.to_owned(),
            api,
            book,
            capabilities: capabilities(),
            preview_url,
        }
    }

    /// The body of one text unit to `to`.
    fn body(&self, ctx: &SendContext, key: &str, text: &str) -> Value {
        let mut body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": ctx.message.target.id,
            "type": "text",
            "text": { "body": text, "preview_url": self.preview_url },
            "biz_opaque_callback_data": key,
        });
        // Only a WhatsApp message can be quoted.
        if let Some(quoted) = ctx
            .message
            .relation
            .as_ref()
            .and_then(|r| r.reply_to_id())
            .filter(|id| id.starts_with("wamid."))
        {
            body["context"] = json!({ "message_id": quoted });
        }
        body
    }
}

#[async_trait]
impl ChannelMessageAdapter for WhatsAppAdapter {
    fn channel(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        if text.trim().is_empty() {
            return Err(invalid("WhatsApp refuses an empty text body"));
        }
        if text.chars().count() > MAX_TEXT_CHARS as usize {
            return Err(invalid(format!(
                "a WhatsApp text body holds at most {MAX_TEXT_CHARS} characters"
            )));
        }
        let key = ctx.unit_key(unit);
        if key.len() > MAX_CALLBACK_DATA {
            return Err(invalid(format!(
                "the unit key is {} bytes, over biz_opaque_callback_data's {MAX_CALLBACK_DATA}",
                key.len()
            )));
        }
        let answer = self
            .api
            .messages(&self.body(ctx, &key, text))
            .await
            .map_err(|e| e.into_send_error("send"))?;
        let wamid = answer
            .pointer("/messages/0/id")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                SendError::after_io(
                    DeliveryFailureKind::Unknown,
                    "WhatsApp answered the send without messages[0].id",
                )
            })?;
        Ok(MessageReceiptPart::new(wamid, unit.kind, unit.index))
    }

    /// Settled only by a status webhook carrying the unit's key: `sent`, `delivered` or `read`
    /// prove the message is WhatsApp's. Nothing proves it absent (there is no "get sent
    /// message" API, Meta retries a status delivery for days, and a `failed` status can come
    /// beside a `delivered` one), so without that evidence the unit stays unknown: the engine
    /// asks again later and an operator sees it, it is never sent a second time.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        match self.book.get(&key) {
            Some(evidence) if evidence.accepted => Ok(Reconciliation::Sent(Box::new(
                MessageReceiptPart::new(evidence.wamid, unit.kind, unit.index),
            ))),
            Some(evidence) => {
                warn!(
                    channel = %self.name,
                    key,
                    wamid = %evidence.wamid,
                    codes = ?evidence.failed_codes,
                    "WhatsApp reported this message failed and never sent: left for an operator"
                );
                Ok(Reconciliation::Unresolved)
            }
            None => Ok(Reconciliation::Unresolved),
        }
    }
}
