//! Sending: one consultation message (`POST /v3.0/oa/message/cs`, the `access_token` header)
//! per text unit, to the person's OA-scoped user id. Zalo has no idempotency key, no edit and
//! no message lookup: finals are plain durable sends, and a send whose answer was lost is
//! settled only by the OA's `oa_send_text` echo of it ([`EchoBook`]).
//!
//! An access token Zalo refuses (`-216`) is refreshed once and the send tried again: the
//! refusal had no effect, and the attempt record already covers both requests.

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation, SendContext, SendError};
use clawgate_types::clock::Clock;
use clawgate_types::{
    DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities, MessagePartKind,
    MessageReceiptPart, RenderedMessageUnit, TextCapabilities,
};
use serde_json::Value;
use tracing::warn;

use crate::client::{CallError, OaApi};
use crate::echoes::EchoBook;
use crate::tokens::TokenStore;

/// Longest text of one consultation message (2000 characters).
pub const MAX_TEXT_CHARS: u32 = 2_000;

/// The Zalo OA sender.
pub struct ZaloAdapter {
    name: String,
    api: OaApi,
    tokens: TokenStore,
    book: EchoBook,
    clock: Arc<dyn Clock>,
    capabilities: MessageCapabilities,
}

impl std::fmt::Debug for ZaloAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZaloAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

/// What the channel can do: text chunked at 2000, nothing else; no live previews (no edits),
/// no replies or threads, unknown sends reconciled from the OA's echo webhooks.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(false)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

impl ZaloAdapter {
    pub(crate) fn new(
        name: &str,
        api: OaApi,
        tokens: TokenStore,
        book: EchoBook,
        clock: Arc<dyn Clock>,
    ) -> ZaloAdapter {
        ZaloAdapter {
            name: name.to_owned(),
            api,
            tokens,
            book,
            clock,
            capabilities: capabilities(),
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for ZaloAdapter {
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
        if unit.kind != MessagePartKind::Text {
            return Err(invalid("this Zalo OA channel sends text only"));
        }
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a Zalo text unit needs a `text` string"))?;
        if text.trim().is_empty() {
            return Err(invalid("Zalo refuses an empty text"));
        }
        if text.chars().count() > MAX_TEXT_CHARS as usize {
            return Err(invalid(format!(
                "a Zalo consultation message holds at most {MAX_TEXT_CHARS} characters"
            )));
        }
        let user_id = ctx.message.target.id.as_str();
        let key = ctx.unit_key(unit);
        let token = self
            .tokens
            .access_token()
            .await
            .map_err(|e| e.into_send_error())?;
        // Before any I/O: a key without this record provably never went out.
        self.book
            .attempted(
                &key,
                user_id,
                text,
                u64::try_from(self.clock.now_ms()).unwrap_or(0),
            )
            .await
            .map_err(|e| SendError::before_io(DeliveryFailureKind::Transient, e.to_string()))?;
        let sent = match self.api.send_text(&token, user_id, text).await {
            Err(CallError::Refused(error)) if error.is_token_refusal() => {
                let fresh = self
                    .tokens
                    .after_refusal(&token)
                    .await
                    .map_err(|e| e.into_send_error())?;
                self.api.send_text(&fresh, user_id, text).await
            }
            other => other,
        };
        let msg_id = sent.map_err(|e| e.into_send_error("send"))?;
        if let Err(error) = self.book.answered(&key, &msg_id).await {
            // The engine records the receipt itself; the book only backs reconciliation.
            warn!(channel = %self.name, %error, "the answer was not written to the send book");
        }
        Ok(MessageReceiptPart::new(msg_id, unit.kind, unit.index))
    }

    /// Settled from the [`EchoBook`], read from the store (the attempt, the answer and the echo
    /// may have been written by another gateway sharing it): an answer, or an `oa_send_text`
    /// echo to the same person with the same text since the attempt, proves Zalo has it (its
    /// `msg_id`); no attempt record proves it never went out. An attempt without either stays
    /// unknown: Zalo posts echoes late when our listener was down (retrying for about an hour)
    /// and has no message lookup, so no wait proves it absent. The engine asks again within its
    /// reconciliation window, then parks it for an operator; it is never sent twice.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        let evidence = self
            .book
            .settle(&key)
            .await
            .map_err(|e| SendError::before_io(DeliveryFailureKind::Transient, e.to_string()))?;
        Ok(match evidence {
            None => Reconciliation::NotSent,
            Some(evidence) => match evidence.msg_id {
                Some(msg_id) => Reconciliation::Sent(Box::new(MessageReceiptPart::new(
                    msg_id, unit.kind, unit.index,
                ))),
                None => Reconciliation::Unresolved,
            },
        })
    }
}
