//! Live previews: a draft shown while the final is produced, edited as text streams (coalesced
//! to the platform's edit rate), then finalized in place when allowed — or cancelled and the
//! final delivered normally (stale preview, media, an error, a different reply target).
//!
//! The preview's receipt is kept on the durable intent, so recovery after a crash never leaves it
//! dangling: a preview without a final is removed (the turn is replayed from the unfinished
//! inbound record), and one with a final is removed before the final is delivered normally.

use std::sync::Arc;

use clawgate_channel_sdk::ChannelMessageAdapter;
use clawgate_types::{
    ChannelMessage, DurableSendIntent, IntentStatus, LiveCancelReason, LiveMessageState, LiveMode,
    MessageBody, MessagePartKind, MessageReceipt, RenderedMessageUnit, UnixMillis,
};
use tracing::{info, warn};

use crate::engine::Inner;
use crate::{MessagesError, Messenger, SendOptions, SendOutcome, SendReport};

/// How a live preview behaves.
#[derive(Debug, Clone, Copy)]
pub struct LiveOptions {
    /// After this age the preview is not finalized in place: a fresh final is sent.
    pub stale_after_ms: u64,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            stale_after_ms: 60_000,
        }
    }
}

/// One message streamed as a preview, then finalized.
pub struct LivePreview {
    messenger: Messenger,
    adapter: Arc<dyn ChannelMessageAdapter>,
    intent: DurableSendIntent,
    options: LiveOptions,
    /// Text shown last, and when the last edit went out (for coalescing).
    shown: Option<String>,
    last_edit_at: UnixMillis,
    /// Text waiting for the edit rate to allow it.
    waiting: Option<String>,
    /// Text already delivered as completed blocks (never delivered again by the final).
    delivered_blocks: String,
}

impl std::fmt::Debug for LivePreview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LivePreview")
            .field("intent", &self.intent.id)
            .finish()
    }
}

fn text_unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit {
        index: 0,
        kind: MessagePartKind::Preview,
        payload: serde_json::json!({ "text": text }),
        required: true,
    }
}

fn hash(text: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    format!("{:016x}", h.finish())
}

impl Messenger {
    /// Records the intent of a message whose text will stream in (durable before any preview
    /// is shown); nothing is visible until the first [`LivePreview::update`].
    pub async fn begin_live(
        &self,
        mut message: ChannelMessage,
        options: SendOptions,
        live: LiveOptions,
    ) -> Result<LivePreview, MessagesError> {
        // A placeholder body makes the intent renderable; the final replaces it.
        if message.body.as_ref().is_none_or(|b| b.text.is_empty()) {
            message.body = Some(MessageBody {
                text: "…".into(),
                format: None,
            });
        }
        let ctx = self.begin(message, options).await?;
        let (adapter, mut intent, durable) = ctx.into_parts();
        if !durable {
            return Err(MessagesError::Store(
                clawgate_store::StoreError::InvalidInput(
                    "live previews need a durable intent (the preview must never be orphaned)"
                        .into(),
                ),
            ));
        }
        // No final yet: recovery knows a preview without a batch is an unfinished stream.
        intent.batch = None;
        let mut live_preview = LivePreview {
            messenger: self.clone(),
            adapter,
            intent,
            options: live,
            shown: None,
            last_edit_at: i64::MIN / 2,
            waiting: None,
            delivered_blocks: String::new(),
        };
        live_preview.persist().await?;
        Ok(live_preview)
    }
}

impl LivePreview {
    fn inner(&self) -> &Inner {
        &self.messenger.inner
    }

    async fn persist(&mut self) -> Result<(), MessagesError> {
        let inner = self.messenger.inner.clone();
        inner
            .save(&mut self.intent, IntentStatus::Pending, true)
            .await
    }

    fn min_edit_interval_ms(&self) -> i64 {
        let per_second = self
            .adapter
            .capabilities()
            .live
            .as_ref()
            .and_then(|l| l.max_edits_per_second)
            .unwrap_or(1)
            .max(1);
        1_000 / i64::from(per_second)
    }

    /// Shows `text` (the whole text so far). The first call sends the preview; later calls edit
    /// it, coalesced so edits never exceed the platform's declared rate. Returns whether the
    /// platform was touched now.
    pub async fn update(&mut self, text: &str) -> Result<bool, MessagesError> {
        if self.shown.as_deref() == Some(text) {
            return Ok(false);
        }
        let now = self.inner().clock.now_ms();
        let ctx = self.inner().context(&self.intent);
        let Some(state) = self.intent.live_state.clone() else {
            let part = match self.adapter.send_unit(&ctx, &text_unit(text)).await {
                Ok(part) => part,
                Err(error) => {
                    warn!(error = %error.message, "preview not shown; the final will be sent normally");
                    return Ok(false);
                }
            };
            let can_edit = self
                .adapter
                .capabilities()
                .live
                .as_ref()
                .is_some_and(|l| l.edit);
            self.intent.live_state = Some(LiveMessageState {
                mode: LiveMode::Partial,
                receipt: Some(MessageReceipt::from_parts(vec![part], now)),
                visible_since: Some(now),
                can_finalize_in_place: can_edit,
                last_rendered_hash: Some(hash(text)),
                stale_after_ms: Some(self.options.stale_after_ms),
            });
            // The preview exists on the platform: record it before anything else can happen.
            self.persist().await?;
            self.shown = Some(text.to_owned());
            self.last_edit_at = now;
            return Ok(true);
        };
        if now - self.last_edit_at < self.min_edit_interval_ms() {
            self.waiting = Some(text.to_owned());
            return Ok(false);
        }
        self.waiting = None;
        let Some(part) = state
            .receipt
            .as_ref()
            .and_then(|r| r.parts.first())
            .cloned()
        else {
            return Ok(false);
        };
        match self.adapter.edit(&ctx, &part, &text_unit(text)).await {
            Ok(_) => {
                self.shown = Some(text.to_owned());
                self.last_edit_at = now;
                Ok(true)
            }
            Err(error) => {
                warn!(error = %error.message, "preview edit failed; the final will replace it");
                Ok(false)
            }
        }
    }

    /// Delivers a completed block as its own message (block streaming). A preview still showing
    /// is removed first, so the same text is never shown by both; the final later skips what the
    /// blocks delivered.
    pub async fn deliver_block(&mut self, text: &str) -> Result<(), MessagesError> {
        let inner = self.messenger.inner.clone();
        let ctx = inner.context(&self.intent);
        let mut state = self.intent.live_state.clone().unwrap_or(LiveMessageState {
            mode: LiveMode::Block,
            receipt: None,
            visible_since: None,
            can_finalize_in_place: false,
            last_rendered_hash: None,
            stale_after_ms: None,
        });
        if state.mode != LiveMode::Block {
            if let Some(part) = state.receipt.as_ref().and_then(|r| r.parts.first()) {
                remove_preview(&self.adapter, &ctx, part, LiveCancelReason::Aborted).await;
            }
            state = LiveMessageState {
                mode: LiveMode::Block,
                receipt: None,
                can_finalize_in_place: false,
                ..state
            };
            self.shown = None;
            self.waiting = None;
        }
        let index = state.receipt.as_ref().map_or(0, |r| r.parts.len());
        let unit = RenderedMessageUnit {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            kind: MessagePartKind::Text,
            payload: serde_json::json!({ "text": text }),
            required: true,
        };
        // Blocks get keys of their own: the final's units must not collide with them.
        let mut block_ctx = ctx.clone();
        block_ctx.idempotency_key = format!("{}~block", ctx.idempotency_key);
        let part = self
            .adapter
            .send_unit(&block_ctx, &unit)
            .await
            .map_err(|e| {
                MessagesError::Store(clawgate_store::StoreError::InvalidInput(format!(
                    "block not delivered: {}",
                    e.message
                )))
            })?;
        let now = inner.clock.now_ms();
        let single = MessageReceipt::from_parts(vec![part], now);
        match &mut state.receipt {
            Some(receipt) => receipt.merge(single),
            None => state.receipt = Some(single),
        }
        self.intent.live_state = Some(state);
        // Delivered blocks are recorded before anything else, so neither a retry nor the final
        // repeats them.
        self.persist().await?;
        self.delivered_blocks.push_str(text);
        Ok(())
    }

    /// Text held back by edit coalescing, if any (it is sent by the next update or the final).
    pub fn coalesced(&self) -> Option<&str> {
        self.waiting.as_deref()
    }

    /// Gives the stream up without a final (the turn failed, or will be replayed): the preview
    /// is removed and the intent cancelled, so a replayed turn starts a fresh one and nothing
    /// is left dangling. Delivered blocks are content and stay.
    pub async fn abandon(mut self) -> Result<(), MessagesError> {
        let inner = self.messenger.inner.clone();
        let state = self.intent.live_state.take();
        if let Some(state) = &state
            && state.mode != LiveMode::Block
            && let Some(part) = state.receipt.as_ref().and_then(|r| r.parts.first())
        {
            remove_preview(
                &self.adapter,
                &inner.context(&self.intent),
                part,
                LiveCancelReason::Aborted,
            )
            .await;
        }
        inner
            .save(&mut self.intent, IntentStatus::Cancelled, true)
            .await
    }

    /// Delivers the final message: in place when the preview can become it, otherwise the
    /// preview is removed (`reason`) and the final sent normally.
    pub async fn finalize(
        mut self,
        final_message: ChannelMessage,
    ) -> Result<SendReport, MessagesError> {
        if self
            .intent
            .live_state
            .as_ref()
            .is_some_and(|s| s.mode == LiveMode::Block)
        {
            return self.finalize_blocks(final_message).await;
        }
        let inner = self.messenger.inner.clone();
        let now = inner.clock.now_ms();
        let key = self.intent.idempotency_key.clone();
        let batch = inner.render(&self.adapter, &final_message, &key)?;
        let state = self.intent.live_state.clone();
        let reply_changed = final_message.relation != self.intent.message.relation;
        self.intent.message = final_message;
        self.intent.batch = Some(batch.clone());
        self.persist().await?;
        let cancel = match &state {
            None => None,
            Some(s) if s.is_stale(now) => Some(LiveCancelReason::Stale),
            Some(_) if !self.intent.message.attachments.is_empty() => Some(LiveCancelReason::Media),
            Some(_) if reply_changed => Some(LiveCancelReason::ReplyTargetMismatch),
            Some(s) if !s.can_finalize_in_place || batch.units.len() != 1 => {
                Some(LiveCancelReason::Media)
            }
            Some(_) => None,
        };
        let preview = state
            .as_ref()
            .and_then(|s| s.receipt.as_ref())
            .and_then(|r| r.parts.first())
            .cloned();
        if let (Some(part), None) = (&preview, cancel) {
            // In place: the preview becomes the final.
            self.intent.attempt += 1;
            inner
                .save(&mut self.intent, IntentStatus::Sending, true)
                .await?;
            let ctx = inner.context(&self.intent);
            match self.adapter.edit(&ctx, part, &batch.units[0]).await {
                Ok(mut edited) => {
                    edited.index = 0;
                    self.intent.partial_receipt =
                        Some(MessageReceipt::from_parts(vec![edited], now));
                    let outcome = inner.commit(&self.adapter, &mut self.intent, true).await?;
                    info!("preview finalized in place");
                    return Ok(SendReport {
                        intent_id: Some(self.intent.id.clone()),
                        durable: true,
                        outcome,
                    });
                }
                Err(error) => {
                    // Whatever the preview shows now, it goes and the final is sent normally:
                    // the user sees the final once either way.
                    warn!(kind = ?error.kind, error = %error.message, "finalizing in place failed; sending a fresh final");
                    inner
                        .save(&mut self.intent, IntentStatus::Pending, true)
                        .await?;
                }
            }
        }
        if let Some(part) = &preview {
            let reason = cancel.unwrap_or(LiveCancelReason::Error);
            remove_preview(&self.adapter, &inner.context(&self.intent), part, reason).await;
        }
        self.intent.live_state = None;
        let outcome: SendOutcome = inner.deliver(&self.adapter, &mut self.intent, true).await?;
        Ok(SendReport {
            intent_id: Some(self.intent.id.clone()),
            durable: true,
            outcome,
        })
    }
}

impl LivePreview {
    /// The final of a block stream: only what the blocks did not deliver goes out.
    async fn finalize_blocks(
        mut self,
        mut final_message: ChannelMessage,
    ) -> Result<SendReport, MessagesError> {
        let inner = self.messenger.inner.clone();
        let blocks = self.intent.live_state.take().and_then(|s| s.receipt);
        let text = final_message
            .body
            .as_ref()
            .map(|b| b.text.clone())
            .unwrap_or_default();
        let rest = text
            .strip_prefix(self.delivered_blocks.as_str())
            .unwrap_or(&text)
            .trim_start()
            .to_owned();
        if rest.is_empty() {
            // Everything was delivered as blocks: commit their receipt, send nothing more.
            let receipt = blocks
                .unwrap_or_else(|| MessageReceipt::from_parts(Vec::new(), inner.clock.now_ms()));
            self.intent.attempt += 1;
            inner
                .save(&mut self.intent, IntentStatus::Sending, true)
                .await?;
            self.intent.partial_receipt = Some(receipt);
            let outcome = inner.commit(&self.adapter, &mut self.intent, true).await?;
            return Ok(SendReport {
                intent_id: Some(self.intent.id.clone()),
                durable: true,
                outcome,
            });
        }
        if let Some(body) = final_message.body.as_mut() {
            body.text = rest;
        }
        let key = self.intent.idempotency_key.clone();
        self.intent.batch = Some(inner.render(&self.adapter, &final_message, &key)?);
        self.intent.message = final_message;
        self.persist().await?;
        let outcome = inner.deliver(&self.adapter, &mut self.intent, true).await?;
        Ok(SendReport {
            intent_id: Some(self.intent.id.clone()),
            durable: true,
            outcome,
        })
    }
}

/// Removes a preview (best effort: a preview already gone is fine).
pub(crate) async fn remove_preview(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    ctx: &clawgate_channel_sdk::SendContext,
    part: &clawgate_types::MessageReceiptPart,
    reason: LiveCancelReason,
) {
    match adapter.delete(ctx, part).await {
        Ok(()) => info!(?reason, "preview removed"),
        Err(error) if error.kind == clawgate_types::DeliveryFailureKind::NotFound => {}
        Err(error) => warn!(?reason, error = %error.message, "preview could not be removed"),
    }
}
