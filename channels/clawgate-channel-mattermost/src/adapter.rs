//! Sending: `POST /api/v4/posts` with a `pending_post_id` from the unit's key and the key in
//! `props`, patches, deletes, draft-post previews, and the settlement of lost answers.
//!
//! Which sends can be settled after a lost answer:
//! - inside the `pending_post_id` window (30 s on the server, `pending_window_s` here, kept
//!   below it) the same create is sent again: the server answers it with the post it already
//!   made, or 500 `…deduplicate_create_post.pending` while the first is still in flight;
//! - beyond it (or after a restart of either side, which forgets the window) the channel's posts
//!   since the send are listed and the bot's post carrying the unit's key in `props` is the
//!   answer; absent once no attempt can still be in flight, it was not sent.
//!
//! The first attempt of each unit is recorded in the account's state before its create goes
//! out, so whichever gateway settles a lost answer knows when the send began.

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
    MessageReceiptPart, MessageRelation, RenderedMessageUnit, TextCapabilities, ThreadCapabilities,
};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::client::{Api, CallError, PENDING_IN_FLIGHT};
use crate::draft::{progress_of, render_draft};
use crate::wire::{Post, PostList};

/// `PostMessageMaxRunesV2`: the longest message of one post.
pub const MAX_MESSAGE_RUNES: u32 = 16_383;
/// The prop every post sent carries: its unit's idempotency key.
pub const KEY_PROP: &str = "clawgate_key";
/// The prop carrying the origin marker.
pub const ORIGIN_PROP: &str = "clawgate_origin";
/// How often a call whose answer was lost (or met an in-flight twin) is sent again inside one
/// send; both are safe to repeat (the same patch, the same pending_post_id).
const ATTEMPTS: u32 = 3;

/// The book of first send attempts: keyed by the unit's idempotency key, the record is the
/// channel id and its time the first attempt's (a repeated append keeps the first).
const ATTEMPTS_BOOK: &str = "send-attempts";
/// How long an attempt is kept: a lost send is settled (or parked for an operator) long before;
/// one settled without its record lists from `reconcile_lookback_s` back, as before it was kept.
const ATTEMPTS_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most attempts kept (the oldest go first).
const ATTEMPTS_KEPT: u64 = 50_000;
/// How often old attempts are pruned, at most.
const PRUNE_EVERY_MS: i64 = 3_600_000;

/// The `pending_post_id` of a unit: 32 hex characters of SHA-256 of its idempotency key, the
/// same across retries and restarts.
pub fn pending_post_id_of(unit_key: &str) -> String {
    let digest = Sha256::digest(unit_key.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The bot account behind the channel (learned at start from `GET /users/me`).
#[derive(Debug, Default)]
pub struct BotCell(RwLock<Option<(String, String)>>);

impl BotCell {
    /// The bot's user id, once known.
    pub fn id(&self) -> Option<String> {
        self.read().map(|(id, _)| id)
    }

    /// The bot's username, once known.
    pub fn username(&self) -> Option<String> {
        self.read().map(|(_, name)| name)
    }

    fn read(&self) -> Option<(String, String)> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the bot's id and username.
    pub fn set(&self, id: &str, username: &str) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((id.to_owned(), username.to_owned()));
    }
}

/// The Mattermost sender: one bot account.
pub struct MattermostAdapter {
    name: String,
    api: Api,
    capabilities: MessageCapabilities,
    bot: Arc<BotCell>,
    /// How long a resend is trusted to be deduped by its pending_post_id (below the server's 30 s).
    pending_window: Duration,
    /// How far back a reconciliation lists when it knows nothing of the first attempt.
    lookback: Duration,
    /// The first attempt of each unit, in the account's state (whichever gateway made it).
    attempts: Book,
    /// The gateway's clock (the attempts' times are stamped by it).
    state: ChannelState,
    /// When this adapter was built, by the gateway's clock.
    started_ms: i64,
    /// When the attempts were last pruned, by the gateway's clock.
    pruned_at: AtomicI64,
    /// Longer than any request of a process before this one can have stayed in flight.
    settle: Duration,
}

impl std::fmt::Debug for MattermostAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MattermostAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .finish_non_exhaustive()
    }
}

fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_MESSAGE_RUNES)
                .with_chunking(true),
        )
        // Media by URL, posted as its link (the server previews it); uploads are not implemented.
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
                .with_max_edits_per_second(2),
        )
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
    let url = unit.payload.get("url").and_then(Value::as_str);
    let caption = unit.payload.get("caption").and_then(Value::as_str);
    match (caption, url) {
        (Some(c), Some(u)) if !c.is_empty() => Ok(format!("{c}\n{u}")),
        (_, Some(u)) => Ok(u.to_owned()),
        _ => Err(invalid(
            "a Mattermost unit needs a `text` (or a media `url`)",
        )),
    }
}

fn checked(text: &str) -> Result<(), SendError> {
    if text.trim().is_empty() {
        return Err(invalid(
            "Mattermost posts need a message; this one is empty",
        ));
    }
    if text.chars().count() > MAX_MESSAGE_RUNES as usize {
        return Err(invalid(format!(
            "a Mattermost post holds at most {MAX_MESSAGE_RUNES} characters; the renderer chunks longer text"
        )));
    }
    Ok(())
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The thread root of a message: its reply's thread, else its target's (the receiver puts the
/// root of the answered post there: never a reply's id, which the server refuses as root).
fn thread_of(message: &ChannelMessage) -> Option<String> {
    let from_relation = match &message.relation {
        Some(MessageRelation::Reply { thread_id, .. }) => thread_id.clone(),
        _ => None,
    };
    from_relation
        .or_else(|| message.target.thread_id.clone())
        .filter(|t| !t.is_empty())
}

/// The props of a sent unit: its key, and the origin marker if any.
fn props(key: &str, origin: Option<&Value>) -> Value {
    let mut props = json!({ KEY_PROP: key });
    if let Some(origin) = origin.and_then(|o| o.get("origin")) {
        props[ORIGIN_PROP] = origin.clone();
    }
    props
}

fn channel_of(ctx: &SendContext, part: &MessageReceiptPart) -> String {
    part.edit_token
        .clone()
        .unwrap_or_else(|| ctx.message.target.id.clone())
}

/// Whether a send failure is a definite refusal of one of `kinds`.
fn refused_as(error: &SendError, kinds: &[DeliveryFailureKind]) -> bool {
    error.side_effect == clawgate_channel_sdk::SideEffect::None && kinds.contains(&error.kind)
}

impl MattermostAdapter {
    pub(crate) fn new(
        name: &str,
        api: Api,
        bot: Arc<BotCell>,
        pending_window: Duration,
        lookback: Duration,
        state: ChannelState,
    ) -> MattermostAdapter {
        let settle = api.timeout() + Duration::from_secs(2);
        MattermostAdapter {
            name: name.to_owned(),
            api,
            capabilities: capabilities(),
            bot,
            pending_window,
            lookback,
            attempts: state.book(ATTEMPTS_BOOK),
            started_ms: state.now_ms(),
            state,
            pruned_at: AtomicI64::new(0),
            settle,
        }
    }

    /// Records the first attempt of unit `key` in `channel`, durably, before the create goes out.
    async fn note_attempt(&self, key: &str, channel: &str) -> Result<(), SendError> {
        self.attempts.append(key, &channel).await.map_err(|e| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!(
                    "the send attempt could not be recorded before sending (nothing was sent): {e}"
                ),
            )
        })?;
        let now = self.state.now_ms();
        let last = self.pruned_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) > PRUNE_EVERY_MS
            && self
                .pruned_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            && let Err(error) = self.attempts.prune(ATTEMPTS_MAX_AGE, ATTEMPTS_KEPT).await
        {
            warn!(%error, "old send attempts could not be pruned; trying again later");
        }
        Ok(())
    }

    /// When unit `key` was first attempted, by whichever gateway.
    async fn first_attempt(&self, key: &str) -> Result<Option<i64>, SendError> {
        let read = |e: StateError| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("the send attempts cannot be read to settle a lost answer: {e}"),
            )
        };
        Ok(self
            .attempts
            .find::<String>(key)
            .await
            .map_err(read)?
            .map(|r| r.recorded_at))
    }

    fn part(post: &Post, unit: &RenderedMessageUnit) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(post.id.clone(), unit.kind, unit.index);
        part.thread_id = (!post.root_id.is_empty()).then(|| post.root_id.clone());
        // Where it lives, for patches and deletes.
        part.edit_token = Some(post.channel_id.clone());
        part
    }

    /// `POST /api/v4/posts` of `message` for `unit`.
    async fn create(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        message: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        checked(message)?;
        let key = ctx.unit_key(unit);
        let mut body = json!({
            "channel_id": ctx.message.target.id,
            "message": message,
            "pending_post_id": pending_post_id_of(&key),
            "props": props(&key, ctx.origin_metadata.as_ref()),
        });
        if let Some(root) = thread_of(&ctx.message) {
            body["root_id"] = json!(root);
        }
        self.note_attempt(&key, &ctx.message.target.id).await?;
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            match self.api.call(Method::POST, "/posts", Some(&body)).await {
                Ok(answer) => {
                    let post: Post = serde_json::from_value(answer).map_err(|e| {
                        CallError::Lost(format!("not a Post: {e}")).into_send_error("create post")
                    })?;
                    return Ok(Self::part(&post, unit));
                }
                // Our own earlier attempt is still being created: ask again shortly.
                Err(error) if error.error_id() == Some(PENDING_IN_FLIGHT) => {
                    last = Some(error);
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt + 1))).await;
                }
                Err(error) => return Err(error.into_send_error("create post")),
            }
        }
        // Still in flight: its outcome is not known yet, and only a reconciliation may tell.
        let reason = last.map_or_else(String::new, |e| format!("{e:?}"));
        Err(SendError::after_io(
            DeliveryFailureKind::Unknown,
            format!(
                "Mattermost create post: an earlier attempt with the same pending_post_id is still in flight ({reason})"
            ),
        ))
    }

    /// `PUT /api/v4/posts/{id}/patch`, sent again when its answer was lost.
    async fn patch(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        patch: &Value,
    ) -> Result<MessageReceiptPart, SendError> {
        let path = format!("/posts/{}/patch", part.platform_message_id);
        let mut lost = None;
        for _ in 0..ATTEMPTS {
            match self.api.call(Method::PUT, &path, Some(patch)).await {
                Ok(_) => {
                    let mut edited = part.clone();
                    edited.edit_token = Some(channel_of(ctx, part));
                    return Ok(edited);
                }
                Err(CallError::Lost(reason)) => lost = Some(CallError::Lost(reason)),
                Err(error) => return Err(error.into_send_error("patch post")),
            }
        }
        Err(lost
            .unwrap_or_else(|| CallError::Lost("no answer".into()))
            .into_send_error("patch post"))
    }

    /// The final as a post of its own, the draft removed (best effort: the final counts).
    async fn finalize_fresh(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let part = self.create(ctx, final_unit, &text_of(final_unit)?).await?;
        if let Err(error) = self.delete(ctx, preview).await {
            warn!(channel = %self.name, error = %error.message, "the draft was not removed; the final was sent");
        }
        Ok(part)
    }

    /// Whether an absence from the channel proves the unit never landed, its first attempt
    /// made at `first` and now `now` (the gateway's clock).
    fn settled(&self, ctx: &SendContext, first: Option<i64>, now: i64) -> bool {
        let recent = |at: i64| now.saturating_sub(at) < millis(self.settle);
        if first.is_some_and(recent) {
            return false;
        }
        // A process before this one may have been stopped mid-request.
        !(ctx.intent_id.is_some() && recent(self.started_ms))
    }
}

#[async_trait]
impl ChannelMessageAdapter for MattermostAdapter {
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
                self.create(ctx, unit, &text_of(unit)?).await
            }
            other => Err(invalid(format!(
                "Mattermost cannot carry a {other:?} unit here"
            ))),
        }
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        checked(&text)?;
        self.patch(ctx, part, &json!({ "message": text })).await
    }

    async fn delete(&self, _ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let path = format!("/posts/{}", part.platform_message_id);
        for _ in 0..ATTEMPTS {
            match self.api.call(Method::DELETE, &path, None).await {
                Ok(_) => return Ok(()),
                // Already gone (deleted by someone, or a retry whose first answer was lost).
                Err(error) if error.status() == Some(404) => return Ok(()),
                // A delete is idempotent: once more settles it.
                Err(CallError::Lost(_)) => {}
                Err(error) => return Err(error.into_send_error("delete post")),
            }
        }
        Err(CallError::Lost("no answer".into()).into_send_error("delete post"))
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        let first = self.first_attempt(&key).await?;
        let now = self.state.now_ms();
        // From a minute before the first attempt (clocks differ); without one, the lookback.
        let since = first
            .or(ctx.message.timestamp)
            .map_or(now.saturating_sub(millis(self.lookback)), |at| {
                at.saturating_sub(60_000)
            });
        let path = format!("/channels/{}/posts?since={since}", ctx.message.target.id);
        let answer = self
            .api
            .call(Method::GET, &path, None)
            .await
            .map_err(|e| e.into_send_error("list channel posts"))?;
        let list: PostList = serde_json::from_value(answer).unwrap_or_default();
        let bot = self.bot.id();
        let found = list.posts.values().find(|p| {
            bot.as_deref().is_none_or(|b| p.user_id == b) && p.prop(KEY_PROP) == Some(key.as_str())
        });
        if let Some(post) = found {
            info!(post = %post.id, "a lost send was found in the channel by its props key");
            return Ok(Reconciliation::Sent(Box::new(Self::part(post, unit))));
        }
        if first.is_some_and(|at| now.saturating_sub(at) < millis(self.pending_window)) {
            // Not landed yet; a resend carries the same pending_post_id, which the server
            // answers with the first post if that one lands meanwhile (or 500 while in flight).
            return Ok(Reconciliation::NotSent);
        }
        Ok(if self.settled(ctx, first, now) {
            Reconciliation::NotSent
        } else {
            Reconciliation::Unresolved
        })
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        Some(&MattermostOrigin)
    }
}

#[async_trait]
impl MessageLiveAdapter for MattermostAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let body = render_draft(&text_of(unit)?, &progress_of(&unit.payload));
        self.create(ctx, unit, &body).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let body = render_draft(&text_of(unit)?, &progress_of(&unit.payload));
        checked(&body)?;
        self.patch(ctx, preview, &json!({ "message": body })).await
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        // A patch cannot move a post to another thread.
        if thread_of(&ctx.message) != preview.thread_id {
            return self.finalize_fresh(ctx, preview, final_unit).await;
        }
        let text = text_of(final_unit)?;
        checked(&text)?;
        // The draft takes the final's key: a lost answer is then settled like a fresh final's.
        let patch = json!({
            "message": text,
            "props": props(&ctx.unit_key(final_unit), ctx.origin_metadata.as_ref()),
        });
        match self.patch(ctx, preview, &patch).await {
            Ok(mut part) => {
                part.kind = final_unit.kind;
                part.index = final_unit.index;
                Ok(part)
            }
            // The draft was deleted, or the server refuses the edit (edit time limit,
            // permissions): the final goes out on its own.
            Err(error)
                if refused_as(
                    &error,
                    &[
                        DeliveryFailureKind::NotFound,
                        DeliveryFailureKind::Permission,
                        DeliveryFailureKind::InvalidPayload,
                        DeliveryFailureKind::Conflict,
                    ],
                ) =>
            {
                warn!(channel = %self.name, error = %error.message, "the draft cannot become the final; sending the final fresh");
                self.finalize_fresh(ctx, preview, final_unit).await
            }
            Err(error) => Err(error),
        }
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        info!(?reason, preview = %preview.platform_message_id, "removing a Mattermost draft");
        self.delete(ctx, preview).await
    }
}

/// The origin marker in the post's `props.clawgate_origin`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MattermostOrigin;

impl MessageOriginAdapter for MattermostOrigin {
    fn encode(&self, origin: &MessageOrigin) -> Option<Value> {
        Some(json!({ "origin": serde_json::to_value(origin).ok()? }))
    }

    /// From a WebSocket event (`data.post`, a JSON string) or a bare post.
    fn decode(&self, raw: &Value) -> Option<MessageOrigin> {
        let post: Post = match raw.get("data").and_then(|d| d.get("post")) {
            Some(Value::String(post)) => serde_json::from_str(post).ok()?,
            _ => serde_json::from_value(raw.clone()).ok()?,
        };
        serde_json::from_value(post.props.get(ORIGIN_PROP)?.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_post_ids_are_stable_per_unit() {
        let a = pending_post_id_of("mattermost:reply:1#0");
        assert_eq!(a.len(), 32);
        assert_eq!(a, pending_post_id_of("mattermost:reply:1#0"));
        assert_ne!(a, pending_post_id_of("mattermost:reply:1#1"));
    }

    #[test]
    fn origin_markers_round_trip_through_props() {
        let origin = MessageOrigin::gateway_failure(
            clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
        );
        let encoded = MattermostOrigin.encode(&origin);
        let post = json!({ "id": "p", "props": props("k#0", encoded.as_ref()) });
        assert_eq!(MattermostOrigin.decode(&post), Some(origin.clone()));
        let event = json!({ "event": "posted", "data": { "post": post.to_string() } });
        assert_eq!(MattermostOrigin.decode(&event), Some(origin));
        let unmarked = json!({ "id": "p", "props": props("k#0", None) });
        assert_eq!(MattermostOrigin.decode(&unmarked), None);
    }
}
