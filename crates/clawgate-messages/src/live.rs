//! Live previews: a draft shown while the final is produced, edited as text streams (coalesced
//! to the platform's edit rate), then finalized in place when allowed — or cancelled and the
//! final delivered normally (stale preview, media, an error, a different reply target).
//!
//! The preview's receipt is kept on the durable intent, so recovery after a crash never leaves it
//! dangling: a preview without a final is removed (the turn is replayed from the unfinished
//! inbound record), and one with a final is removed before the final is delivered normally.
//!
//! Media can stream too ([`LivePreview::deliver_media`]): each attachment goes out at once as a
//! message of its own and is recorded on the intent (its receipt part, by identity) before the
//! call returns. Streamed media is content, never a preview: nothing removes it, and the final —
//! in place, fresh, or recovered after a crash — drops every attachment already streamed, so
//! the user sees each one once. Its parts join the final's receipt after the final's own units.

use std::collections::BTreeMap;
use std::sync::Arc;

use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation, SendError, SideEffect};
use clawgate_types::{
    BatchAtomicity, ChannelMessage, DeliveryFailureKind, DurableSendIntent, IntentStatus,
    LiveCancelReason, LiveMessageState, LiveMode, MessageAttachment, MessagePartKind,
    MessageReceipt, MessageReceiptPart, RenderedMessageBatch, RenderedMessageUnit, UnixMillis,
};
use tracing::{info, warn};

use crate::engine::Inner;
use crate::{MessagesError, Messenger, SendOptions, SendOutcome, SendReport};

/// Suffix of the idempotency key a preview is sent under (never the final's key, so a
/// reconciliation of the final can never find the preview instead).
pub const PREVIEW_KEY_SUFFIX: &str = "~preview";
/// Suffix of the idempotency key media streamed during a reply is sent under.
pub const MEDIA_KEY_SUFFIX: &str = "~media";

/// The intent key behind a unit key a platform stored: `<key>#<unit>` (a final's unit),
/// `<key>~preview#0` (a live preview) or `<key>~media#<n>` (streamed media).
pub fn intent_key_of_unit(unit_key: &str) -> Option<&str> {
    let (key, _unit) = unit_key.rsplit_once('#')?;
    Some(
        key.strip_suffix(PREVIEW_KEY_SUFFIX)
            .or_else(|| key.strip_suffix(MEDIA_KEY_SUFFIX))
            .unwrap_or(key),
    )
}

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
    /// A preview was sent and its answer lost, and asking the platform did not settle whether
    /// it landed: no further preview is sent (it could duplicate), and the final asks again.
    preview_unknown: bool,
}

impl std::fmt::Debug for LivePreview {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LivePreview")
            .field("intent", &self.intent.id)
            .finish()
    }
}

fn text_unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::new(
        0,
        MessagePartKind::Preview,
        serde_json::json!({ "text": text }),
    )
}

fn invalid(message: String) -> MessagesError {
    MessagesError::Store(clawgate_store::StoreError::InvalidInput(message))
}

/// The parts of the media streamed so far, in the order they went out, renumbered from
/// `first_index` on: a final with `first_index` units of its own carries them after those, so
/// none stands for a unit of the final (a unit with a receipt part is never sent, and these
/// were never units of it).
fn streamed_parts(
    streamed: &BTreeMap<String, MessageReceiptPart>,
    first_index: usize,
) -> Vec<MessageReceiptPart> {
    let mut parts: Vec<MessageReceiptPart> = streamed.values().cloned().collect();
    parts.sort_by_key(|p| p.index);
    for (n, part) in parts.iter_mut().enumerate() {
        part.index = u32::try_from(first_index + n).unwrap_or(u32::MAX);
    }
    parts
}

/// Removes from the final every attachment already streamed (the final never repeats them).
fn drop_streamed(message: &mut ChannelMessage, state: Option<&LiveMessageState>) {
    if let Some(state) = state {
        message.attachments.retain(|a| !state.has_streamed(a));
    }
}

/// Whether a final has nothing of its own to send (no text, no attachment).
fn nothing_to_send(message: &ChannelMessage) -> bool {
    message.attachments.is_empty() && message.body.as_ref().is_none_or(|b| b.text.is_empty())
}

/// A receipt of `parts`, or none when there are none.
fn receipt_of(parts: Vec<MessageReceiptPart>, now: UnixMillis) -> Option<MessageReceipt> {
    (!parts.is_empty()).then(|| MessageReceipt::from_parts(parts, now))
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
    ///
    /// The intent is recorded in one write as `pending` with no batch and an empty live state:
    /// until [`LivePreview::finalize`] records the final, the data itself says there is nothing
    /// to send ([`DurableSendIntent::awaits_final`]), so a crash at any instant before that
    /// leaves an intent recovery cancels (removing any preview) instead of one it "delivers".
    pub async fn begin_live(
        &self,
        message: ChannelMessage,
        options: SendOptions,
        live: LiveOptions,
    ) -> Result<LivePreview, MessagesError> {
        let ctx = self.begin_stream(message, options).await?;
        let (adapter, intent, durable) = ctx.into_parts();
        if !durable {
            return Err(MessagesError::Store(
                clawgate_store::StoreError::InvalidInput(
                    "live previews need a durable intent of their own (the preview must never \
                     be orphaned); the key names an existing intent or durability is not \
                     available"
                        .into(),
                ),
            ));
        }
        Ok(LivePreview {
            messenger: self.clone(),
            adapter,
            intent,
            options: live,
            shown: None,
            last_edit_at: i64::MIN / 2,
            waiting: None,
            delivered_blocks: String::new(),
            preview_unknown: false,
        })
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
        if self.shown.as_deref() == Some(text)
            || !previews_possible(&self.adapter, &self.intent.message)
        {
            return Ok(false);
        }
        let now = self.inner().clock.now_ms();
        let ctx = self.inner().context(&self.intent);
        // No preview yet (nothing streamed, or only media): the first update shows it.
        let showing = self
            .intent
            .live_state
            .as_ref()
            .filter(|s| s.mode == LiveMode::Block || s.receipt.is_some());
        let Some(state) = showing.cloned() else {
            if self.preview_unknown {
                // Another preview could show the text twice: the final settles it.
                return Ok(false);
            }
            let preview_ctx = preview_context(&ctx);
            let part = match show(&self.adapter, &preview_ctx, &text_unit(text)).await {
                Ok(part) => part,
                Err(error) if error.side_effect == SideEffect::Possible => {
                    // The answer was lost, not the preview: ask the platform by the preview's
                    // own key before anything else is sent for this reply.
                    match find_preview(&self.adapter, &preview_ctx).await {
                        PreviewProbe::Landed(part) => *part,
                        PreviewProbe::Absent => {
                            warn!(error = %error.message, "preview not shown (the platform has none); the next update tries again");
                            return Ok(false);
                        }
                        PreviewProbe::Unknown => {
                            warn!(error = %error.message, "preview outcome unknown; no further preview, the final settles it");
                            self.preview_unknown = true;
                            return Ok(false);
                        }
                    }
                }
                Err(error) => {
                    warn!(error = %error.message, "preview not shown; the next update tries again");
                    return Ok(false);
                }
            };
            let can_edit = in_place_possible(&self.adapter, &part);
            let streamed_media = self
                .intent
                .live_state
                .take()
                .map(|s| s.streamed_media)
                .unwrap_or_default();
            self.intent.live_state = Some(
                LiveMessageState::empty(LiveMode::Partial)
                    .with_receipt(MessageReceipt::from_parts(vec![part], now))
                    .with_visible_since(now)
                    .with_can_finalize_in_place(can_edit)
                    .with_last_rendered_hash(hash(text))
                    .with_stale_after_ms(self.options.stale_after_ms)
                    .with_streamed_media(streamed_media),
            );
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
        match replace(&self.adapter, &ctx, &part, &text_unit(text)).await {
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
    /// blocks delivered. When the platform refuses to remove it, nothing is delivered
    /// ([`MessagesError::PreviewNotRemoved`]) and the preview stays recorded for the final,
    /// [`LivePreview::abandon`] or recovery to remove.
    pub async fn deliver_block(&mut self, text: &str) -> Result<(), MessagesError> {
        let inner = self.messenger.inner.clone();
        let ctx = inner.context(&self.intent);
        let mut state = self
            .intent
            .live_state
            .clone()
            .unwrap_or_else(|| LiveMessageState::empty(LiveMode::Block));
        if state.mode != LiveMode::Block {
            if let Some(part) = state.receipt.as_ref().and_then(|r| r.parts.first())
                && let Err(refused) =
                    remove_preview(&self.adapter, &ctx, part, LiveCancelReason::Aborted).await
            {
                // The preview stays recorded, so whoever ends the stream removes it: a block
                // beside it would show its text twice, and forgetting it would leave it for good.
                return Err(MessagesError::PreviewNotRemoved(refused.message));
            }
            state.mode = LiveMode::Block;
            state.receipt = None;
            state.can_finalize_in_place = false;
            self.shown = None;
            self.waiting = None;
        }
        let index = state.receipt.as_ref().map_or(0, |r| r.parts.len());
        let unit = RenderedMessageUnit::text(u32::try_from(index).unwrap_or(u32::MAX), text);
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

    /// Delivers an attachment now, as a message of its own, without touching the text preview.
    /// Its receipt part is recorded on the intent under the attachment's identity (its URL, else
    /// its file name) before this returns, so the final — even one recovered after a crash —
    /// never sends it again, and nothing ever removes it (it is content, not a preview).
    ///
    /// An attachment already streamed (same identity) is not sent again. One with neither a URL
    /// nor a file name is refused before any I/O: the final could not recognise it.
    pub async fn deliver_media(
        &mut self,
        attachment: MessageAttachment,
    ) -> Result<(), MessagesError> {
        let Some(identity) = LiveMessageState::media_identity(&attachment).map(str::to_owned)
        else {
            return Err(invalid(
                "streamed media needs a url or a file name, so the final can tell it was \
                 already delivered"
                    .into(),
            ));
        };
        let streamed = self
            .intent
            .live_state
            .as_ref()
            .map_or(0, |s| s.streamed_media.len());
        if self
            .intent
            .live_state
            .as_ref()
            .is_some_and(|s| s.streamed_media.contains_key(&identity))
        {
            return Ok(());
        }
        let inner = self.messenger.inner.clone();
        // Rendered like any attachment of this channel (capability checks, origin marker), as
        // a message with nothing else in it.
        let mut media = self.intent.message.clone();
        media.body = None;
        media.attachments = vec![attachment];
        // Media gets keys of its own, numbered in stream order: the final's units and the
        // blocks never collide with them, and a retry after a failure reuses the same key.
        let mut ctx = inner.context(&self.intent);
        ctx.idempotency_key = format!("{}{MEDIA_KEY_SUFFIX}", ctx.idempotency_key);
        let batch = inner.render(&self.adapter, &media, &ctx.idempotency_key)?;
        let [unit] = batch.units.as_slice() else {
            return Err(invalid(format!(
                "the {} renderer made {} units of one attachment; streamed media must be one \
                 message",
                self.intent.channel,
                batch.units.len()
            )));
        };
        let mut unit = unit.clone();
        unit.index = u32::try_from(streamed).unwrap_or(u32::MAX);
        let part = self
            .adapter
            .send_unit(&ctx, &unit)
            .await
            .map_err(|e| invalid(format!("media not delivered: {}", e.message)))?;
        let state = self
            .intent
            .live_state
            .get_or_insert_with(|| LiveMessageState::empty(LiveMode::Partial));
        state.streamed_media.insert(identity, part);
        // Recorded before anything else, so neither the final nor recovery repeats it.
        self.persist().await
    }

    /// Text held back by edit coalescing, if any (it is sent by the next update or the final).
    pub fn coalesced(&self) -> Option<&str> {
        self.waiting.as_deref()
    }

    /// Gives the stream up without a final (the turn failed, or will be replayed): the preview
    /// is removed and the intent cancelled, so a replayed turn starts a fresh one and nothing
    /// is left dangling. Delivered blocks and streamed media are content and stay. When the
    /// platform refuses to remove the preview, the intent is left open for recovery (its claim
    /// released), which removes the preview and cancels it once the platform allows.
    pub async fn abandon(mut self) -> Result<(), MessagesError> {
        let inner = self.messenger.inner.clone();
        if !inner
            .end_unfinished_stream(&self.adapter, &mut self.intent)
            .await?
        {
            // Recovery removes the preview and cancels the intent once the platform allows.
            inner
                .store
                .release_intent_claim(&self.intent.id, &inner.worker)
                .await?;
        }
        Ok(())
    }

    /// Ends the stream without a final after `error`, which is returned whatever happens here:
    /// the preview is removed and the intent cancelled — or, when the platform refuses, the
    /// intent stays recorded with its preview (claim released) and recovery removes it.
    async fn end_without_final(self, error: MessagesError) -> MessagesError {
        if let Err(cleanup) = self.abandon().await {
            warn!(%error, %cleanup, "the stream without a final could not be ended; recovery removes its preview");
        }
        error
    }

    /// Delivers the final message: in place when the preview can become it, otherwise the
    /// preview is removed (`reason`) and the final sent normally. Attachments already streamed
    /// ([`LivePreview::deliver_media`]) are dropped from the final; only the others can cancel
    /// the preview for carrying media.
    ///
    /// An edit into the preview whose answer was lost is an unknown outcome (`Unknown`), made
    /// again by recovery, never followed by a fresh final. A final that cannot be rendered ends
    /// the stream as [`LivePreview::abandon`] does and its render error is returned.
    pub async fn finalize(
        mut self,
        mut final_message: ChannelMessage,
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
        if self.preview_unknown {
            self.settle_unknown_preview(now).await;
        }
        let state = self.intent.live_state.clone();
        drop_streamed(&mut final_message, state.as_ref());
        let streamed = state
            .as_ref()
            .map(|s| s.streamed_media.clone())
            .unwrap_or_default();
        if nothing_to_send(&final_message) && !streamed.is_empty() {
            return self.finalize_streamed_only(final_message, &streamed).await;
        }
        let batch = match inner.render(&self.adapter, &final_message, &key) {
            Ok(batch) => batch,
            // No final can be recorded: the stream ends as a failed turn's does (its preview
            // removed, or left recorded for recovery to remove), and the caller gets this error.
            Err(error) => return Err(self.end_without_final(error).await),
        };
        let reply_changed = final_message.relation != self.intent.message.relation;
        self.intent.message = final_message;
        self.intent.batch = Some(batch.clone());
        // The streamed media is delivered already: the final's receipt names it, after the
        // final's own units, and nothing sends it again.
        self.intent.partial_receipt = receipt_of(streamed_parts(&streamed, batch.units.len()), now);
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
        // Why the preview could not become the final, when an edit was tried and refused.
        let mut edit_refused = None;
        if let (Some(part), None) = (&preview, cancel) {
            // In place: the preview becomes the final.
            self.intent.attempt += 1;
            inner
                .save(&mut self.intent, IntentStatus::Sending, true)
                .await?;
            let ctx = inner.context(&self.intent);
            match finalize_in_place(&self.adapter, &ctx, part, &batch.units[0]).await {
                Ok(mut edited) => {
                    edited.index = 0;
                    let edited = MessageReceipt::from_parts(vec![edited], now);
                    match &mut self.intent.partial_receipt {
                        Some(receipt) => receipt.merge(edited),
                        None => self.intent.partial_receipt = Some(edited),
                    }
                    let outcome = inner.commit(&self.adapter, &mut self.intent, true).await?;
                    info!("preview finalized in place");
                    return Ok(SendReport {
                        intent_id: Some(self.intent.id.clone()),
                        durable: true,
                        outcome,
                    });
                }
                Err(error) if error.side_effect == SideEffect::Possible => {
                    // The edit may have landed: the preview may show the final already, so it
                    // stays recorded as the final's carrier and recovery makes the edit again
                    // (an edit repeated cannot duplicate anything). A fresh final now could
                    // stand beside it, or replace a final the user has already read.
                    warn!(kind = ?error.kind, error = %error.message, "finalizing in place: outcome unknown; the edit is made again, never a second final");
                    let again = inner
                        .clock
                        .now_ms()
                        .saturating_add(inner.policy.reconcile_delay_ms);
                    let outcome = inner
                        .unknown_until(&mut self.intent, &error, Some(again), true)
                        .await?;
                    return Ok(SendReport {
                        intent_id: Some(self.intent.id.clone()),
                        durable: true,
                        outcome,
                    });
                }
                Err(error) => {
                    // Refused: the preview still shows its draft, so it goes and the final is
                    // sent normally.
                    warn!(kind = ?error.kind, error = %error.message, "finalizing in place failed; sending a fresh final");
                    inner
                        .save(&mut self.intent, IntentStatus::Pending, true)
                        .await?;
                    edit_refused = Some(error);
                }
            }
        }
        if let Some(part) = &preview {
            let reason = cancel.unwrap_or(LiveCancelReason::Error);
            let ctx = inner.context(&self.intent);
            if let Err(refused) = remove_preview(&self.adapter, &ctx, part, reason).await {
                let why = match &edit_refused {
                    Some(error) => format!("finalizing in place failed ({})", error.message),
                    None => format!("the preview cannot become the final ({reason:?})"),
                };
                return self.final_waits_for_preview_removal(&why, &refused).await;
            }
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

impl Inner {
    /// Ends a stream that has no final (`intent.awaits_final()`), under this worker's claim:
    /// its preview is removed — the recorded one, or the one the platform holds under the
    /// preview's key — and the intent is cancelled, so the unfinished inbound event's replay
    /// starts a fresh reply. Returns `false`, leaving the intent as it is for a later pass,
    /// when the platform refused to remove the preview: a cancelled intent would forget it.
    pub(crate) async fn end_unfinished_stream(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
    ) -> Result<bool, MessagesError> {
        let ctx = self.context(intent);
        if !remove_stream_preview(adapter, &ctx, intent.live_state.as_ref()).await {
            return Ok(false);
        }
        if intent.status == IntentStatus::Sending {
            // Not written by this build (a stream is `pending` until its final is recorded).
            self.save(intent, IntentStatus::UnknownAfterSend, true)
                .await?;
        }
        intent.live_state = None;
        intent.next_attempt_at = None;
        self.save(intent, IntentStatus::Cancelled, true).await?;
        info!(intent = %intent.id, "a reply without a final was cancelled; its turn runs again");
        Ok(true)
    }
}

impl LivePreview {
    /// The platform refused to remove the preview a fresh final would replace: the final is
    /// recorded (it is the intent's batch) and waits, `pending` with a retry scheduled and the
    /// preview still recorded, so recovery removes the preview first and then delivers the
    /// final — never a fresh final beside a preview that may still show. The recorded and
    /// returned failure names both why the preview had to go (`why`) and the refusal.
    async fn final_waits_for_preview_removal(
        mut self,
        why: &str,
        refused: &SendError,
    ) -> Result<SendReport, MessagesError> {
        let inner = self.messenger.inner.clone();
        let now = inner.clock.now_ms();
        let next =
            inner
                .policy
                .next_attempt_at(now, self.intent.attempt.max(1), refused.retry_after_ms);
        let failure = clawgate_types::DeliveryFailure {
            kind: clawgate_types::DeliveryFailureKind::Transient,
            message: format!(
                "{why}; the preview could not be removed ({}); the final waits until it is",
                refused.message
            ),
            reason: None,
            retry_after_ms: refused.retry_after_ms,
            platform_code: refused.platform_code.clone(),
            at: now,
        };
        self.intent.next_attempt_at = Some(next);
        self.intent.failure = Some(failure.clone());
        inner
            .save(&mut self.intent, IntentStatus::Pending, true)
            .await?;
        warn!("preview not removed; the final is delivered once it is");
        Ok(SendReport {
            intent_id: Some(self.intent.id.clone()),
            durable: true,
            outcome: SendOutcome::RetryScheduled {
                next_attempt_at: next,
                failure,
                delivered: self.intent.partial_receipt.clone(),
            },
        })
    }

    /// A preview whose answer was lost is looked for once more before the final goes out: if
    /// it landed it is recorded (and then finalized in place or removed, never left beside a
    /// fresh final). If the platform still cannot tell, the final is sent fresh — the reply
    /// must land — and that preview, if it exists, is beyond reach.
    async fn settle_unknown_preview(&mut self, now: UnixMillis) {
        let ctx = preview_context(&self.inner().context(&self.intent));
        match find_preview(&self.adapter, &ctx).await {
            PreviewProbe::Landed(part) => {
                let can_edit = in_place_possible(&self.adapter, &part);
                let state = self
                    .intent
                    .live_state
                    .get_or_insert_with(|| LiveMessageState::empty(LiveMode::Partial));
                state.receipt = Some(MessageReceipt::from_parts(vec![*part], now));
                state.visible_since = Some(now);
                state.can_finalize_in_place = can_edit;
                state.stale_after_ms = Some(self.options.stale_after_ms);
                info!("the preview whose answer was lost did land; the final takes its place");
            }
            PreviewProbe::Absent => {}
            PreviewProbe::Unknown => {
                warn!("whether the preview landed is still unknown; sending the final fresh");
            }
        }
        self.preview_unknown = false;
    }

    /// The final is only media that already streamed: a preview still showing goes (it shows
    /// text the final does not have) and the streamed media is committed as the final.
    async fn finalize_streamed_only(
        mut self,
        final_message: ChannelMessage,
        streamed: &BTreeMap<String, MessageReceiptPart>,
    ) -> Result<SendReport, MessagesError> {
        let inner = self.messenger.inner.clone();
        let now = inner.clock.now_ms();
        // Recorded first, with an empty batch: recovery then commits the streamed media
        // instead of treating the intent as an unfinished stream.
        self.intent.batch = Some(RenderedMessageBatch::new(
            Vec::new(),
            BatchAtomicity::AllOrRetryRemaining,
            self.intent.idempotency_key.clone(),
        ));
        self.intent.message = final_message;
        self.intent.partial_receipt = receipt_of(streamed_parts(streamed, 0), now);
        self.persist().await?;
        let preview = self
            .intent
            .live_state
            .as_ref()
            .filter(|s| s.mode != LiveMode::Block)
            .and_then(|s| s.receipt.as_ref())
            .and_then(|r| r.parts.first())
            .cloned();
        if let Some(part) = &preview {
            let ctx = inner.context(&self.intent);
            if let Err(refused) =
                remove_preview(&self.adapter, &ctx, part, LiveCancelReason::Media).await
            {
                return self
                    .final_waits_for_preview_removal(
                        "the final is only media already streamed",
                        &refused,
                    )
                    .await;
            }
        }
        self.intent.live_state = None;
        self.intent.attempt += 1;
        inner
            .save(&mut self.intent, IntentStatus::Sending, true)
            .await?;
        let outcome = inner.commit(&self.adapter, &mut self.intent, true).await?;
        Ok(SendReport {
            intent_id: Some(self.intent.id.clone()),
            durable: true,
            outcome,
        })
    }

    /// The final of a block stream: only what the blocks (and the streamed media) did not
    /// deliver goes out.
    async fn finalize_blocks(
        mut self,
        mut final_message: ChannelMessage,
    ) -> Result<SendReport, MessagesError> {
        let inner = self.messenger.inner.clone();
        let now = inner.clock.now_ms();
        let state = self.intent.live_state.take();
        drop_streamed(&mut final_message, state.as_ref());
        let streamed = state
            .as_ref()
            .map(|s| s.streamed_media.clone())
            .unwrap_or_default();
        let blocks = state.and_then(|s| s.receipt);
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
        if rest.is_empty() && final_message.attachments.is_empty() {
            // Everything was delivered as blocks (and streamed media): commit their receipt,
            // send nothing more.
            let after_blocks = blocks
                .as_ref()
                .and_then(|r| r.parts.iter().map(|p| p.index).max())
                .map_or(0, |last| last as usize + 1);
            let mut receipt = blocks.unwrap_or_else(|| MessageReceipt::from_parts(Vec::new(), now));
            if let Some(media) = receipt_of(streamed_parts(&streamed, after_blocks), now) {
                receipt.merge(media);
            }
            // An empty batch: the final is recorded (nothing of its own to send), so a crash
            // before the commit is committed by recovery, not cancelled as a stream without one.
            self.intent.batch = Some(RenderedMessageBatch::new(
                Vec::new(),
                BatchAtomicity::AllOrRetryRemaining,
                self.intent.idempotency_key.clone(),
            ));
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
        let batch = inner.render(&self.adapter, &final_message, &key)?;
        self.intent.partial_receipt = receipt_of(streamed_parts(&streamed, batch.units.len()), now);
        self.intent.batch = Some(batch);
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

/// The context a preview is sent under: a key of its own, `<key>~preview`. Under the intent's
/// key it would pass for the final's first unit, and a final recovered after a crash
/// mid-finalize would be "reconciled" as the (removed) preview instead of being sent.
pub(crate) fn preview_context(
    ctx: &clawgate_channel_sdk::SendContext,
) -> clawgate_channel_sdk::SendContext {
    let mut preview = ctx.clone();
    preview.idempotency_key = format!("{}{PREVIEW_KEY_SUFFIX}", ctx.idempotency_key);
    preview
}

/// What the platform says about a preview whose send answer never arrived.
pub(crate) enum PreviewProbe {
    Landed(Box<MessageReceiptPart>),
    Absent,
    /// The platform cannot tell (or the adapter cannot ask).
    Unknown,
}

/// How often a preview probe the platform turned away without acting on it is asked again.
const PROBE_RETRIES: u32 = 3;
/// The wait before asking again when the platform named none (doubled each time).
const PROBE_BACKOFF_MS: u64 = 250;
/// The longest wait between probes: the turn waits on them.
const PROBE_WAIT_CAP_MS: u64 = 2_000;

/// Asks the platform whether the preview (sent under `preview_ctx`'s key) landed. A probe
/// turned away before the platform acted (rate limited, or a transient failure before any
/// I/O) is asked again after the platform's `retry_after` or a short backoff: giving up at
/// once would leave a preview that did land beyond reach, beside the final for good.
pub(crate) async fn find_preview(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    preview_ctx: &clawgate_channel_sdk::SendContext,
) -> PreviewProbe {
    let reconciles = adapter.capabilities().reconciles_unknown_sends();
    if !reconciles {
        return PreviewProbe::Unknown;
    }
    let mut retries = 0;
    loop {
        match adapter
            .reconcile_unknown_send(preview_ctx, &text_unit(""))
            .await
        {
            Ok(Reconciliation::Sent(part)) => return PreviewProbe::Landed(part),
            Ok(Reconciliation::NotSent) => return PreviewProbe::Absent,
            Ok(_) => return PreviewProbe::Unknown,
            Err(error) if retries < PROBE_RETRIES && turned_away(&error) => {
                let wait = error
                    .retry_after_ms
                    .unwrap_or(PROBE_BACKOFF_MS << retries)
                    .min(PROBE_WAIT_CAP_MS);
                info!(error = %error.message, wait_ms = wait, "the platform turned the preview probe away; asking again");
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                retries += 1;
            }
            Err(error) => {
                warn!(error = %error.message, "asking the platform about the preview failed");
                return PreviewProbe::Unknown;
            }
        }
    }
}

/// Whether the platform refused a call without acting on it, so asking again is an answer
/// deferred, not a second act.
fn turned_away(error: &SendError) -> bool {
    error.kind == DeliveryFailureKind::RateLimit
        || (error.kind == DeliveryFailureKind::Transient && error.side_effect == SideEffect::None)
}

/// Removes the preview of a stream that ends without a final: the recorded one, or — when none
/// is recorded (a crash or a store failure between the platform's answer and the record, or an
/// answer lost) — the one the platform holds under the preview's key. Delivered blocks and
/// streamed media are content, never removed.
pub(crate) async fn remove_stream_preview(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    ctx: &clawgate_channel_sdk::SendContext,
    state: Option<&LiveMessageState>,
) -> bool {
    if state.is_some_and(|s| s.mode == LiveMode::Block) {
        return true;
    }
    let recorded = state
        .and_then(|s| s.receipt.as_ref())
        .and_then(|r| r.parts.first())
        .cloned();
    let part = match recorded {
        Some(part) => part,
        None => match find_preview(adapter, &preview_context(ctx)).await {
            PreviewProbe::Landed(part) => *part,
            // Unknown: nothing more can be done about a preview no one can find.
            PreviewProbe::Absent | PreviewProbe::Unknown => return true,
        },
    };
    remove_preview(adapter, ctx, &part, LiveCancelReason::Aborted)
        .await
        .is_ok()
}

/// Whether a preview may be shown for `message`: the channel wants one, and it could always
/// take it down again — the platform deletes (`live.delete`), and the preview can follow the
/// text (`live.edit`, or a live adapter of the channel's own). Otherwise a preview the final
/// cannot replace would stay beside it for good, so the reply is sent once, plainly, at the end.
pub fn previews_possible(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    message: &ChannelMessage,
) -> bool {
    let capabilities = adapter.capabilities();
    capabilities.can_delete()
        && (capabilities.can_edit() || adapter.live().is_some())
        && adapter.previews(message)
}

/// Whether `preview` can become the final by an edit: the channel edits, and its live adapter
/// (when it has one) says this preview is a message that can (a native draft is not).
pub(crate) fn in_place_possible(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    preview: &MessageReceiptPart,
) -> bool {
    adapter.capabilities().can_edit()
        && adapter
            .live()
            .is_none_or(|live| live.can_finalize_in_place(preview))
}

// A preview's platform operations go through the channel's live adapter when it declares one
// (a native stream), else through its plain send / edit / delete.

async fn show(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    ctx: &clawgate_channel_sdk::SendContext,
    unit: &RenderedMessageUnit,
) -> Result<MessageReceiptPart, SendError> {
    match adapter.live() {
        Some(live) => live.show(ctx, unit).await,
        None => adapter.send_unit(ctx, unit).await,
    }
}

async fn replace(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    ctx: &clawgate_channel_sdk::SendContext,
    preview: &MessageReceiptPart,
    unit: &RenderedMessageUnit,
) -> Result<MessageReceiptPart, SendError> {
    match adapter.live() {
        Some(live) => live.replace(ctx, preview, unit).await,
        None => adapter.edit(ctx, preview, unit).await,
    }
}

pub(crate) async fn finalize_in_place(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    ctx: &clawgate_channel_sdk::SendContext,
    preview: &MessageReceiptPart,
    unit: &RenderedMessageUnit,
) -> Result<MessageReceiptPart, SendError> {
    match adapter.live() {
        Some(live) => live.finalize(ctx, preview, unit).await,
        None => adapter.edit(ctx, preview, unit).await,
    }
}

/// Removes a preview; the platform's refusal when it would not (the preview may still show).
/// A preview already gone is fine.
pub(crate) async fn remove_preview(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    ctx: &clawgate_channel_sdk::SendContext,
    part: &clawgate_types::MessageReceiptPart,
    reason: LiveCancelReason,
) -> Result<(), SendError> {
    let removed = match adapter.live() {
        Some(live) => live.remove(ctx, part, reason).await,
        None => adapter.delete(ctx, part).await,
    };
    match removed {
        Ok(()) => {
            info!(?reason, "preview removed");
            Ok(())
        }
        Err(error) if error.kind == clawgate_types::DeliveryFailureKind::NotFound => Ok(()),
        Err(error) => {
            warn!(?reason, error = %error.message, "preview could not be removed");
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::intent_key_of_unit;

    #[test]
    fn unit_keys_name_their_intent() {
        assert_eq!(
            intent_key_of_unit("qa:reply:m-1:0#0"),
            Some("qa:reply:m-1:0")
        );
        assert_eq!(
            intent_key_of_unit("qa:reply:m-1:0~preview#0"),
            Some("qa:reply:m-1:0")
        );
        assert_eq!(
            intent_key_of_unit("qa:reply:m-1:0~media#2"),
            Some("qa:reply:m-1:0")
        );
        assert_eq!(intent_key_of_unit("no-unit"), None);
    }

    use super::*;
    use clawgate_types::MessageBody;

    fn attachment(url: Option<&str>, file_name: Option<&str>) -> MessageAttachment {
        let mut attachment = MessageAttachment::new(MessagePartKind::Media);
        attachment.url = url.map(str::to_owned);
        attachment.file_name = file_name.map(str::to_owned);
        attachment
    }

    fn part(index: u32, id: &str) -> MessageReceiptPart {
        MessageReceiptPart::new(id, MessagePartKind::Media, index)
    }

    fn state(streamed: &[(&str, u32, &str)]) -> LiveMessageState {
        LiveMessageState::empty(LiveMode::Partial)
            .with_can_finalize_in_place(true)
            .with_streamed_media(
                streamed
                    .iter()
                    .map(|(identity, index, id)| ((*identity).to_owned(), part(*index, id)))
                    .collect(),
            )
    }

    fn message(text: Option<&str>, attachments: Vec<MessageAttachment>) -> ChannelMessage {
        let mut message = ChannelMessage::outbound(
            "out-1",
            "qa",
            clawgate_types::MessageTarget::group("room-1"),
            "",
        )
        .with_attachments(attachments);
        message.body = text.map(MessageBody::new);
        message
    }

    #[test]
    fn the_final_keeps_only_attachments_not_streamed() {
        let streamed = state(&[("https://x/a.png", 0, "m-2"), ("b.pdf", 1, "m-4")]);
        let a = attachment(Some("https://x/a.png"), Some("a.png"));
        let b = attachment(None, Some("b.pdf"));
        let c = attachment(Some("https://x/c.png"), Some("b.pdf"));
        // (case, state, final attachments, kept)
        #[rustfmt::skip]
        let cases = [
            ("all streamed",      Some(&streamed), vec![a.clone(), b.clone()], vec![]),
            ("one new",           Some(&streamed), vec![a.clone(), c.clone()], vec![c.clone()]),
            ("a URL is the identity, not the file name",
                                  Some(&streamed), vec![c.clone()],            vec![c.clone()]),
            ("nothing streamed",  None,            vec![a.clone(), b.clone()], vec![a, b]),
            ("no attachments",    Some(&streamed), vec![],                     vec![]),
        ];
        for (case, state, attachments, kept) in cases {
            let mut final_message = message(Some("text"), attachments);
            drop_streamed(&mut final_message, state);
            assert_eq!(final_message.attachments, kept, "{case}");
        }
    }

    #[test]
    fn streamed_parts_follow_the_final_units_in_stream_order() {
        // Keys sort by identity; the parts keep the order they were streamed in.
        let streamed = state(&[("z.png", 0, "m-2"), ("a.png", 1, "m-3")]).streamed_media;
        let numbered = |first| {
            streamed_parts(&streamed, first)
                .into_iter()
                .map(|p| (p.index, p.platform_message_id))
                .collect::<Vec<_>>()
        };
        assert_eq!(numbered(0), vec![(0, "m-2".into()), (1, "m-3".into())]);
        assert_eq!(
            numbered(3),
            vec![(3, "m-2".into()), (4, "m-3".into())],
            "after a final of three units"
        );
        assert!(streamed_parts(&BTreeMap::new(), 2).is_empty());
        assert_eq!(receipt_of(Vec::new(), 0), None, "no parts, no receipt");
    }

    #[test]
    fn a_final_without_text_or_attachments_has_nothing_to_send() {
        let image = attachment(Some("https://x/a.png"), None);
        // (case, text, attachments, nothing to send)
        let cases: [(&str, Option<&str>, Vec<MessageAttachment>, bool); 5] = [
            ("no body", None, vec![], true),
            ("empty text", Some(""), vec![], true),
            ("text", Some("hi"), vec![], false),
            ("an attachment", None, vec![image.clone()], false),
            ("both", Some("hi"), vec![image], false),
        ];
        for (case, text, attachments, nothing) in cases {
            assert_eq!(
                nothing_to_send(&message(text, attachments)),
                nothing,
                "{case}"
            );
        }
    }
}
