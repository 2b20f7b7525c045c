//! Sending: `POST /channels/{id}/messages` with a nonce from the unit's key, edits (`PATCH`),
//! deletes, previews by edit, the settlement of lost answers, and the echo registry's entries.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    Book, ChannelMessageAdapter, ChannelState, MessageLiveAdapter, MessageOriginAdapter,
    Reconciliation, SendContext, SendError, StateError,
};
use clawgate_types::{
    AttachmentCapabilities, ChannelMessage, DeliveryCapabilities, DeliveryFailureKind,
    LiveCancelReason, LiveCapabilities, MessageCapabilities, MessageOrigin, MessagePartKind,
    MessageReceipt, MessageReceiptPart, MessageRelation, RenderedMessageUnit, TextCapabilities,
    ThreadCapabilities,
};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::client::{CallError, Rest};
use crate::echo::EchoRegistry;
use crate::wire::{Message, snowflake_ms};

/// Longest `content` of one message.
pub const MAX_TEXT_CHARS: u32 = 2000;
/// How many recent messages a reconciliation reads (Discord's page limit).
const RECONCILE_PAGE: usize = 100;
/// How often an edit whose answer was lost is sent again (the same content twice is one edit).
const EDIT_ATTEMPTS: u32 = 3;
/// The book of first send attempts: keyed by the nonce, the record is the channel id and its
/// time the first attempt's (a repeated append keeps the first). Written before each create,
/// read when a lost answer is settled, on whichever gateway settles it.
const ATTEMPTS: &str = "send-attempts";
/// The most attempts kept: past the nonce window a record no longer settles anything (an
/// attempt not found answers as one outside the window would), so records older than twice the
/// window are pruned, at most once per window, and never more than this many are kept.
const ATTEMPTS_KEPT: u64 = 10_000;

const CREATE: &str = "POST /channels/{id}/messages";
const EDIT: &str = "PATCH /channels/{id}/messages/{id}";
const DELETE: &str = "DELETE /channels/{id}/messages/{id}";
const LIST: &str = "GET /channels/{id}/messages";

/// The nonce of a unit: 25 hex characters of SHA-256 of its idempotency key (Discord takes at
/// most 25), the same across retries and restarts.
pub fn nonce_of(unit_key: &str) -> String {
    let digest = Sha256::digest(unit_key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..25].to_owned()
}

/// The bot account behind the channel (learned at start or from READY).
#[derive(Debug, Default)]
pub struct BotCell(RwLock<Option<String>>);

impl BotCell {
    /// The bot's user id, once known.
    pub fn get(&self) -> Option<String> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the bot's user id.
    pub fn set(&self, id: &str) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(id.to_owned());
    }
}

/// The Discord sender: one bot account.
pub struct DiscordAdapter {
    name: String,
    rest: Rest,
    capabilities: MessageCapabilities,
    echo: Arc<EchoRegistry>,
    bot: Arc<BotCell>,
    /// How long Discord dedupes a nonce (taken conservatively: shorter than Discord's).
    nonce_window: Duration,
    /// The first attempt of each nonce (for the window), in the account's state.
    attempts: Book,
    /// The gateway's clock (the attempts' times are stamped by it).
    state: ChannelState,
    /// When the attempts were last pruned, by the gateway's clock.
    pruned_at: AtomicI64,
}

impl std::fmt::Debug for DiscordAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscordAdapter")
            .field("name", &self.name)
            .field("rest", &self.rest)
            .finish_non_exhaustive()
    }
}

fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        // Media by URL, sent as its link (Discord unfurls it); uploads are not implemented.
        .with_attachments(
            AttachmentCapabilities::default()
                .with_upload(false)
                .with_remote_url(true),
        )
        .with_threads(
            ThreadCapabilities::default()
                .with_reply(true)
                .with_native_thread(true),
        )
        .with_live(
            LiveCapabilities::default()
                .with_edit(true)
                .with_delete(true)
                // Five edits per five seconds per channel.
                .with_max_edits_per_second(1),
        )
        // The nonce is Discord's idempotency key; a lost answer is settled from the channel's
        // recent messages (or resent inside the dedupe window, which returns the first message).
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(true)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

fn text_of(unit: &RenderedMessageUnit) -> Result<String, SendError> {
    if let Some(text) = unit.payload.get("text").and_then(Value::as_str) {
        return Ok(text.to_owned());
    }
    // Media goes out as its link (Discord unfurls it); uploads are not implemented.
    let url = unit.payload.get("url").and_then(Value::as_str);
    let caption = unit.payload.get("caption").and_then(Value::as_str);
    match (caption, url) {
        (Some(c), Some(u)) if !c.is_empty() => Ok(format!("{c}\n{u}")),
        (_, Some(u)) => Ok(u.to_owned()),
        _ => Err(invalid("a Discord unit needs a `text` (or a media `url`)")),
    }
}

/// Nothing may ping: no `@everyone`, roles or users unless the text names them explicitly as
/// `<@id>` of the user answered (`replied_user` stays off as well).
fn allowed_mentions() -> Value {
    json!({ "parse": [], "replied_user": false })
}

impl DiscordAdapter {
    pub(crate) fn new(
        name: &str,
        rest: Rest,
        echo: Arc<EchoRegistry>,
        bot: Arc<BotCell>,
        nonce_window: Duration,
        state: ChannelState,
    ) -> DiscordAdapter {
        DiscordAdapter {
            name: name.to_owned(),
            rest,
            capabilities: capabilities(),
            echo,
            bot,
            nonce_window,
            attempts: state.book(ATTEMPTS),
            state,
            pruned_at: AtomicI64::new(0),
        }
    }

    fn window_ms(&self) -> i64 {
        i64::try_from(self.nonce_window.as_millis()).unwrap_or(i64::MAX)
    }

    /// The channel a message goes to: its thread (threads are channels), else the target.
    fn channel_of(message: &ChannelMessage) -> String {
        let relation_thread = match &message.relation {
            Some(MessageRelation::Reply { thread_id, .. }) => thread_id.clone(),
            _ => None,
        };
        relation_thread
            .or_else(|| message.target.thread_id.clone())
            .unwrap_or_else(|| message.target.id.clone())
    }

    /// The channel a delivered part lives in.
    fn channel_of_part(ctx: &SendContext, part: &MessageReceiptPart) -> String {
        part.edit_token
            .clone()
            .unwrap_or_else(|| Self::channel_of(&ctx.message))
    }

    fn part(message: &Message, unit: &RenderedMessageUnit) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(message.id.clone(), unit.kind, unit.index);
        part.reply_to_id = message
            .message_reference
            .as_ref()
            .and_then(|r| r.message_id.clone());
        // Where it lives, for edits and deletes.
        part.edit_token = Some(message.channel_id.clone());
        part
    }

    /// Records the first attempt of `nonce` in `channel`, durably, before the request goes out.
    async fn note_attempt(&self, channel: &str, nonce: &str) -> Result<(), SendError> {
        let unrecorded = |e: StateError| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!(
                    "the send attempt could not be recorded before sending (nothing was sent): {e}"
                ),
            )
        };
        self.attempts
            .append(nonce, &channel)
            .await
            .map_err(unrecorded)?;
        let now = self.state.now_ms();
        let last = self.pruned_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) > self.window_ms()
            && self
                .pruned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            && let Err(error) = self
                .attempts
                .prune(self.nonce_window * 2, ATTEMPTS_KEPT)
                .await
        {
            warn!(%error, "old send attempts could not be pruned; trying again later");
        }
        Ok(())
    }

    /// The create body of `unit`.
    fn create_body(
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        nonce: &str,
    ) -> Result<Value, SendError> {
        let text = text_of(unit)?;
        if text.is_empty() {
            return Err(invalid("Discord refuses an empty message (50006)"));
        }
        if text.chars().count() > MAX_TEXT_CHARS as usize {
            return Err(invalid(format!(
                "a Discord message holds at most {MAX_TEXT_CHARS} characters; the renderer chunks longer text"
            )));
        }
        let mut body = json!({
            "content": text,
            "nonce": nonce,
            "enforce_nonce": true,
            "allowed_mentions": allowed_mentions(),
        });
        // Only the first unit answers: a chunked reply reads as one answer.
        if unit.index == 0
            && let Some(MessageRelation::Reply {
                reply_to_id: Some(reply_to),
                ..
            }) = &ctx.message.relation
        {
            // A reply whose question was deleted still lands, as a plain message.
            body["message_reference"] =
                json!({ "message_id": reply_to, "fail_if_not_exists": false });
        }
        Ok(body)
    }

    async fn create(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let channel = Self::channel_of(&ctx.message);
        let nonce = nonce_of(&ctx.unit_key(unit));
        let body = Self::create_body(ctx, unit, &nonce)?;
        let bot = self.bot.get();
        if let (Some(origin), Some(bot)) = (&ctx.message.origin, &bot) {
            self.echo.expect(&channel, &nonce, bot, origin);
        }
        self.note_attempt(&channel, &nonce).await?;
        let answer = self
            .rest
            .call(
                Method::POST,
                CREATE,
                &channel,
                &format!("/channels/{channel}/messages"),
                Some(&body),
            )
            .await
            .map_err(|e| e.into_send_error("create message"))?
            .unwrap_or_default();
        let message: Message = serde_json::from_value(answer).map_err(|e| {
            CallError::Lost(format!("not a Message: {e}")).into_send_error("create message")
        })?;
        if let Some(origin) = &ctx.message.origin {
            self.echo
                .sent(&channel, &message.id, &message.author.id, origin);
        }
        Ok(Self::part(&message, unit))
    }

    async fn edit_text(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        text: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        if text.is_empty() || text.chars().count() > MAX_TEXT_CHARS as usize {
            return Err(invalid(format!(
                "an edit needs 1-{MAX_TEXT_CHARS} characters"
            )));
        }
        let channel = Self::channel_of_part(ctx, part);
        let path = format!("/channels/{channel}/messages/{}", part.platform_message_id);
        let body = json!({ "content": text, "allowed_mentions": allowed_mentions() });
        let mut lost = None;
        for _ in 0..EDIT_ATTEMPTS {
            match self
                .rest
                .call(Method::PATCH, EDIT, &channel, &path, Some(&body))
                .await
            {
                Ok(_) => {
                    let mut edited = part.clone();
                    edited.edit_token = Some(channel);
                    return Ok(edited);
                }
                Err(CallError::Lost(reason)) => lost = Some(CallError::Lost(reason)),
                Err(error) => return Err(error.into_send_error("edit message")),
            }
        }
        Err(lost
            .unwrap_or_else(|| CallError::Lost("no answer".into()))
            .into_send_error("edit message"))
    }

    /// Whether `nonce`'s first send is certainly younger than the dedupe window, from its
    /// recorded first attempt (whichever gateway made it) or the answered message's time (the
    /// send came after it).
    async fn inside_window(&self, ctx: &SendContext, nonce: &str) -> Result<bool, SendError> {
        let now = self.state.now_ms();
        let recorded = self.attempts.find::<String>(nonce).await.map_err(|e| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("the send attempts cannot be read to settle a lost answer: {e}"),
            )
        })?;
        if let Some(first) = recorded {
            return Ok(now.saturating_sub(first.recorded_at) < self.window_ms());
        }
        let answered = match &ctx.message.relation {
            Some(MessageRelation::Reply {
                reply_to_id,
                inbound_message_id,
                ..
            }) => reply_to_id.as_deref().or(inbound_message_id.as_deref()),
            _ => None,
        };
        Ok(answered
            .and_then(snowflake_ms)
            .and_then(|at| i64::try_from(at).ok())
            .is_some_and(|at| now.saturating_sub(at) < self.window_ms()))
    }
}

#[async_trait]
impl ChannelMessageAdapter for DiscordAdapter {
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
        match unit.kind {
            MessagePartKind::Text | MessagePartKind::Preview | MessagePartKind::Media => {
                self.create(ctx, unit).await
            }
            other => Err(invalid(format!(
                "Discord cannot carry a {other:?} unit here"
            ))),
        }
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.edit_text(ctx, part, &text_of(unit)?).await
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let channel = Self::channel_of_part(ctx, part);
        let path = format!("/channels/{channel}/messages/{}", part.platform_message_id);
        match self
            .rest
            .call(Method::DELETE, DELETE, &channel, &path, None)
            .await
        {
            // Already gone: deleting twice leaves one deletion.
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some(10008) => Ok(()),
            Err(CallError::Lost(_)) => {
                // A delete is idempotent: once more settles it.
                match self
                    .rest
                    .call(Method::DELETE, DELETE, &channel, &path, None)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(error) if error.code() == Some(10008) => Ok(()),
                    Err(error) => Err(error.into_send_error("delete message")),
                }
            }
            Err(error) => Err(error.into_send_error("delete message")),
        }
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let channel = Self::channel_of(&ctx.message);
        let nonce = nonce_of(&ctx.unit_key(unit));
        let path = format!("/channels/{channel}/messages?limit={RECONCILE_PAGE}");
        let page = self
            .rest
            .call(Method::GET, LIST, &channel, &path, None)
            .await
            .map_err(|e| e.into_send_error("read recent messages"))?
            .unwrap_or_default();
        let messages: Vec<Message> = serde_json::from_value(page).unwrap_or_default();
        let bot = self.bot.get();
        let ours = |m: &&Message| bot.as_deref().is_none_or(|b| m.author.id == b);
        if let Some(found) = messages
            .iter()
            .filter(ours)
            .find(|m| m.nonce_text().as_deref() == Some(nonce.as_str()))
        {
            info!(message = %found.id, "a lost send was found in the channel by its nonce");
            return Ok(Reconciliation::Sent(Box::new(Self::part(found, unit))));
        }
        if self.inside_window(ctx, &nonce).await? {
            // The resend carries the same nonce: Discord answers it with the first message if
            // there is one.
            return Ok(Reconciliation::NotSent);
        }
        let nonces_shown = messages.iter().filter(ours).all(|m| m.nonce.is_some());
        let whole_history = messages.len() < RECONCILE_PAGE;
        if nonces_shown && whole_history {
            return Ok(Reconciliation::NotSent);
        }
        warn!(channel = %channel, "a lost send is older than Discord's nonce window and not among the recent messages: parked");
        Ok(Reconciliation::Unresolved)
    }

    async fn after_commit(&self, ctx: &SendContext, receipt: &MessageReceipt) {
        // The recovery path too: a reconciled send is registered like a live one.
        let (Some(origin), Some(bot)) = (&ctx.message.origin, self.bot.get()) else {
            return;
        };
        let channel = Self::channel_of(&ctx.message);
        for part in &receipt.parts {
            let channel = part.edit_token.as_deref().unwrap_or(&channel);
            self.echo
                .sent(channel, &part.platform_message_id, &bot, origin);
        }
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        Some(self)
    }
}

#[async_trait]
impl MessageLiveAdapter for DiscordAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.create(ctx, unit).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.edit(ctx, preview, unit).await
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let mut part = self.edit(ctx, preview, final_unit).await?;
        part.kind = final_unit.kind;
        part.index = final_unit.index;
        Ok(part)
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        info!(?reason, preview = %preview.platform_message_id, "removing a Discord preview");
        self.delete(ctx, preview).await
    }
}

/// Discord messages carry no metadata: the origin travels through the echo registry. `encode`
/// only tells the engine a marker is honoured; `decode` reads the registry.
impl MessageOriginAdapter for DiscordAdapter {
    fn encode(&self, origin: &MessageOrigin) -> Option<Value> {
        serde_json::to_value(origin).ok()
    }

    fn decode(&self, raw: &Value) -> Option<MessageOrigin> {
        let message: Message = serde_json::from_value(raw.clone()).ok()?;
        self.echo.origin_of(&message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_25_stable_characters_per_unit() {
        let a = nonce_of("discord:reply:1#0");
        assert_eq!(a.len(), 25);
        assert_eq!(a, nonce_of("discord:reply:1#0"));
        assert_ne!(a, nonce_of("discord:reply:1#1"));
    }

    #[test]
    fn mentions_are_locked_down() {
        assert_eq!(allowed_mentions()["parse"], json!([]));
        assert_eq!(allowed_mentions()["replied_user"], json!(false));
    }
}
