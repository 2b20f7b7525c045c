//! Sending: one `POST /<phone-number-id>/messages` of `type: text` per unit, replies quoted
//! with `context.message_id`, and the unit's key in `biz_opaque_callback_data`, which Meta
//! echoes in every status webhook of that message. WhatsApp has no idempotency key, no edit and
//! no delete for business messages: finals are plain durable sends, and a send whose answer
//! was lost is settled only by a status webhook carrying its key ([`StatusBook`]).

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation, SendContext, SendError};
use clawgate_types::{
    AttachmentCapabilities, DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities,
    MessagePartKind, MessageReceiptPart, RenderedMessageUnit, TextCapabilities, ThreadCapabilities,
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
        // Media by `link` (Meta fetches it); uploads (`POST /media`) are not used.
        .with_attachments(AttachmentCapabilities::default().with_remote_url(true))
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

/// A media unit (a serialized attachment with a `url`) as the message type its MIME type
/// asks for: jpeg/png images, video, audio, anything else a document (with its file name).
fn media_of(unit: &RenderedMessageUnit) -> Result<(&'static str, Value), SendError> {
    let field = |key: &str| unit.payload.get(key).and_then(Value::as_str);
    let link = field("url")
        .filter(|u| u.starts_with("https://") || u.starts_with("http://"))
        .ok_or_else(|| {
            invalid("WhatsApp sends media by an http(s) link; uploads are not supported")
        })?;
    let mime = field("mimeType").unwrap_or_default();
    let kind = match mime {
        "image/jpeg" | "image/png" => "image",
        m if m.starts_with("video/") => "video",
        m if m.starts_with("audio/") => "audio",
        _ => "document",
    };
    let mut media = json!({ "link": link });
    if kind == "document"
        && let Some(name) = field("fileName")
    {
        media["filename"] = json!(name);
    }
    Ok((kind, media))
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

    /// The body of one unit to the target: `content` is its `text` or media object.
    fn body(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        key: &str,
        kind: &str,
        content: Value,
    ) -> Value {
        let mut body = json!({
            "messaging_product": "whatsapp",
            "recipient_type": "individual",
            "to": ctx.message.target.id,
            "type": kind,
            "biz_opaque_callback_data": key,
        });
        body[kind] = content;
        // Only a WhatsApp message can be quoted, and only the first chunk quotes it.
        if let Some(quoted) = ctx
            .message
            .relation
            .as_ref()
            .and_then(|r| r.reply_to_id())
            .filter(|id| unit.index == 0 && id.starts_with("wamid."))
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
        let (kind, content) = if unit.kind == MessagePartKind::Text {
            let text = text_of(unit)?;
            if text.trim().is_empty() {
                return Err(invalid("WhatsApp refuses an empty text body"));
            }
            if text.chars().count() > MAX_TEXT_CHARS as usize {
                return Err(invalid(format!(
                    "a WhatsApp text body holds at most {MAX_TEXT_CHARS} characters"
                )));
            }
            (
                "text",
                json!({ "body": text, "preview_url": self.preview_url }),
            )
        } else {
            media_of(unit)?
        };
        let key = ctx.unit_key(unit);
        if key.len() > MAX_CALLBACK_DATA {
            return Err(invalid(format!(
                "the unit key is {} bytes, over biz_opaque_callback_data's {MAX_CALLBACK_DATA}",
                key.len()
            )));
        }
        // Before any I/O: a key without this record provably never went out.
        self.book
            .attempted(&key)
            .await
            .map_err(|e| SendError::before_io(DeliveryFailureKind::Transient, e.to_string()))?;
        let answer = self
            .api
            .messages(&self.body(ctx, unit, &key, kind, content))
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
        if let Err(error) = self.book.answered(&key, wamid).await {
            // The engine records the receipt itself; the book only backs reconciliation.
            warn!(channel = %self.name, %error, "the answer was not written to the status book");
        }
        Ok(MessageReceiptPart::new(wamid, unit.kind, unit.index))
    }

    /// Settled from the [`StatusBook`] (read from the store at this moment: the evidence may
    /// have been written by another gateway): an answer or a `sent`/`delivered`/`read` status with
    /// the unit's key proves the message is WhatsApp's (its `wamid`); no attempt record proves
    /// it never went out. An attempt without either stays unknown: there is no "get sent
    /// message" API, Meta delivers a status late when our listener was down (retrying for
    /// 7 days), and a `failed` status can come beside a `delivered` one, so no wait proves it
    /// absent. The engine asks again later and an operator sees it; it is never sent twice.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        let evidence = self.book.get(&key).await.map_err(|e| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("{e}; the send is settled once the store answers"),
            )
        })?;
        let Some(evidence) = evidence else {
            return Ok(Reconciliation::NotSent);
        };
        match evidence.wamid {
            Some(wamid) if evidence.accepted => Ok(Reconciliation::Sent(Box::new(
                MessageReceiptPart::new(wamid, unit.kind, unit.index),
            ))),
            wamid => {
                if !evidence.failed_codes.is_empty() {
                    warn!(
                        channel = %self.name,
                        key,
                        wamid = ?wamid,
                        codes = ?evidence.failed_codes,
                        "WhatsApp reported this message failed and never sent: left for an operator"
                    );
                }
                Ok(Reconciliation::Unresolved)
            }
        }
    }
}
