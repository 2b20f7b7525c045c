//! Sending: `chat.postMessage`, `chat.update`, `chat.delete`; reconciling an unknown send from
//! the conversation's history by the unit's key in `metadata`; previews as a native stream
//! (`chat.startStream` / `appendStream` / `stopStream`) where the thread shape allows, else a
//! draft message edited in place.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageOriginAdapter, Reconciliation, SendContext,
    SendError,
};
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, LiveCancelReason, LiveCapabilities,
    MessageCapabilities, MessageOrigin, MessagePartKind, MessageReceiptPart, MessageRelation,
    RenderedMessageUnit, TargetKind, TextCapabilities, ThreadCapabilities,
};
use serde_json::{Value, json};
use tracing::warn;

use crate::client::{CallError, WebApi, refused_as};

/// Longest text of one message: `chat.update` refuses more (`msg_too_long`), and a final must
/// be able to replace its preview.
pub const MAX_TEXT_CHARS: u32 = 4_000;
/// The `event_type` of the metadata every sent message carries.
pub const METADATA_EVENT_TYPE: &str = "clawgate_message";
/// Messages per history page a reconciliation reads, and at most how many pages.
const HISTORY_LIMIT: u32 = 200;
const HISTORY_PAGES: u32 = 5;
/// How often an edit whose answer was lost is sent again (the same edit twice leaves one
/// message).
const EDIT_ATTEMPTS: u32 = 3;
/// The suffix the engine gives a preview's key (`clawgate_messages::PREVIEW_KEY_SUFFIX`).
const PREVIEW_KEY_SUFFIX: &str = "~preview";
/// The `edit_token` prefix of a native stream's part (the rest is the channel).
const STREAM_PREFIX: &str = "stream:";

/// Who asked in a thread: `chat.startStream` in a channel names its recipient. Filled by the
/// receiver, read by the sender; a thread without an entry (after a restart) previews as a draft.
pub(crate) type Recipients = Arc<Mutex<HashMap<(String, String), String>>>;

/// The Slack sender: one bot token.
pub struct SlackAdapter {
    name: String,
    api: WebApi,
    capabilities: MessageCapabilities,
    /// Previews in threads as native streams.
    native_streams: bool,
    team_id: Option<String>,
    /// The app's bot id (`B…`, from `auth.test`): its open streams are found by it.
    bot_id: Option<String>,
    recipients: Recipients,
    /// What each open stream shows (appends add only the rest).
    streamed: Mutex<HashMap<String, String>>,
    /// When each unit key was last sent by this process (a send still in flight may land).
    attempts: Mutex<HashMap<String, Instant>>,
    started: Instant,
    /// How long after a send its absence from history proves it did not land.
    settle: Duration,
}

impl std::fmt::Debug for SlackAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("native_streams", &self.native_streams)
            .finish_non_exhaustive()
    }
}

/// What the channel can do, as the engine and the conformance suite read it.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
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
                .with_native_stream(true)
                // chat.postMessage: about one per second per channel.
                .with_max_edits_per_second(1),
        )
        // No idempotency key; an unknown send is settled from history by its metadata key.
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
        .ok_or_else(|| invalid("a Slack text unit needs a `text` string"))
}

/// The thread a message goes to: its reply's thread (or the answered message, which becomes
/// the thread's parent), else its target's.
fn thread_of(message: &ChannelMessage) -> Option<String> {
    let from_relation = match &message.relation {
        Some(MessageRelation::Reply {
            thread_id,
            reply_to_id,
            ..
        }) => thread_id.clone().or_else(|| reply_to_id.clone()),
        _ => None,
    };
    from_relation.or_else(|| message.target.thread_id.clone())
}

/// The metadata of a sent unit: its key (for reconciliation) and the origin marker, if any.
fn metadata(key: &str, origin: Option<&Value>) -> Value {
    let mut payload = json!({ "key": key });
    if let Some(origin) = origin.and_then(|o| o.get("origin")) {
        payload["origin"] = origin.clone();
    }
    json!({ "event_type": METADATA_EVENT_TYPE, "event_payload": payload })
}

/// The conversation a part lives in.
fn channel_of(ctx: &SendContext, part: &MessageReceiptPart) -> String {
    part.edit_token
        .as_deref()
        .map(|t| t.strip_prefix(STREAM_PREFIX).unwrap_or(t).to_owned())
        .unwrap_or_else(|| ctx.message.target.id.clone())
}

fn is_stream(part: &MessageReceiptPart) -> bool {
    part.edit_token
        .as_deref()
        .is_some_and(|t| t.starts_with(STREAM_PREFIX))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl SlackAdapter {
    pub(crate) fn new(
        name: &str,
        api: WebApi,
        native_streams: bool,
        team_id: Option<String>,
        bot_id: Option<String>,
        recipients: Recipients,
    ) -> SlackAdapter {
        // A request outlives its timeout on the client only by Slack's own processing time.
        let settle = api.timeout() + Duration::from_secs(2);
        SlackAdapter {
            name: name.to_owned(),
            api,
            capabilities: capabilities(),
            native_streams,
            team_id,
            bot_id,
            recipients,
            streamed: Mutex::new(HashMap::new()),
            attempts: Mutex::new(HashMap::new()),
            started: Instant::now(),
            settle,
        }
    }

    fn part(
        channel: &str,
        ts: &str,
        thread: Option<&str>,
        unit: &RenderedMessageUnit,
        stream: bool,
    ) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(ts, unit.kind, unit.index);
        // Receipts keep the thread: edits and later replies stay in it.
        part.thread_id = thread.map(str::to_owned);
        part.edit_token = Some(if stream {
            format!("{STREAM_PREFIX}{channel}")
        } else {
            channel.to_owned()
        });
        part
    }

    /// `chat.postMessage` of one text unit into its conversation and thread.
    async fn post(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        if text.trim().is_empty() {
            return Err(invalid("Slack refuses an empty message (no_text)"));
        }
        let channel = ctx.message.target.id.clone();
        let thread = thread_of(&ctx.message);
        let key = ctx.unit_key(unit);
        let mut args = json!({
            "channel": channel,
            "text": text,
            "metadata": metadata(&key, ctx.origin_metadata.as_ref()),
            "unfurl_links": false,
            "unfurl_media": false,
        });
        if let Some(thread) = &thread {
            args["thread_ts"] = json!(thread);
        }
        lock(&self.attempts).insert(key, Instant::now());
        let answer = self
            .api
            .call("chat.postMessage", &args)
            .await
            .map_err(|e| e.into_send_error("chat.postMessage"))?;
        let ts = answer.get("ts").and_then(Value::as_str).ok_or_else(|| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                "Slack chat.postMessage answered ok without a ts",
            )
        })?;
        let channel = answer
            .get("channel")
            .and_then(Value::as_str)
            .unwrap_or(&channel);
        Ok(Self::part(channel, ts, thread.as_deref(), unit, false))
    }

    /// `chat.update`, sent again when its answer was lost (an edit cannot duplicate anything).
    async fn update(
        &self,
        channel: &str,
        part: &MessageReceiptPart,
        text: &str,
        metadata: Option<Value>,
    ) -> Result<MessageReceiptPart, SendError> {
        let mut args = json!({ "channel": channel, "ts": part.platform_message_id, "text": text });
        if let Some(metadata) = metadata {
            args["metadata"] = metadata;
        }
        let mut lost = None;
        for _ in 0..EDIT_ATTEMPTS {
            match self.api.call("chat.update", &args).await {
                Ok(_) => return Ok(part.clone()),
                Err(error @ CallError::Lost(_)) => lost = Some(error),
                Err(error) => return Err(error.into_send_error("chat.update")),
            }
        }
        Err(lost
            .unwrap_or_else(|| CallError::Lost("no answer".into()))
            .into_send_error("chat.update"))
    }

    /// The recipient of a native stream in `channel`'s `thread`: nobody needed in a DM, the
    /// person who asked in a channel.
    fn stream_recipient(&self, ctx: &SendContext, thread: &str) -> Option<Option<String>> {
        if ctx.message.target.kind == TargetKind::Direct {
            return Some(None);
        }
        let key = (ctx.message.target.id.clone(), thread.to_owned());
        lock(&self.recipients).get(&key).cloned().map(Some)
    }

    /// Whether a preview of this message is a native stream: a thread to stream into (a
    /// top-level DM has none, so it previews as a draft message), and in a channel a known
    /// recipient and workspace.
    fn stream_shape(&self, ctx: &SendContext) -> Option<(String, Option<String>)> {
        if !self.native_streams {
            return None;
        }
        let thread = thread_of(&ctx.message)?;
        let recipient = self.stream_recipient(ctx, &thread)?;
        if recipient.is_some() && self.team_id.is_none() {
            return None;
        }
        Some((thread, recipient))
    }

    async fn start_stream(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
        thread: &str,
        recipient: Option<String>,
    ) -> Result<MessageReceiptPart, CallError> {
        let channel = ctx.message.target.id.clone();
        let mut args = json!({ "channel": channel, "thread_ts": thread, "markdown_text": text });
        if let Some(user) = recipient {
            args["recipient_user_id"] = json!(user);
            args["recipient_team_id"] = json!(self.team_id);
        }
        let answer = self.api.call("chat.startStream", &args).await?;
        let ts = answer
            .get("ts")
            .and_then(Value::as_str)
            .ok_or_else(|| CallError::Lost("chat.startStream answered ok without a ts".into()))?;
        lock(&self.streamed).insert(ts.to_owned(), text.to_owned());
        Ok(Self::part(&channel, ts, Some(thread), unit, true))
    }

    /// What a stream shows: remembered, else read back from its thread (after a restart).
    async fn streamed_text(&self, channel: &str, part: &MessageReceiptPart) -> Option<String> {
        if let Some(text) = lock(&self.streamed).get(&part.platform_message_id) {
            return Some(text.clone());
        }
        let thread = part.thread_id.as_deref()?;
        let answer = self
            .api
            .call(
                "conversations.replies",
                &json!({ "channel": channel, "ts": thread, "limit": HISTORY_LIMIT }),
            )
            .await
            .ok()?;
        answer["messages"]
            .as_array()?
            .iter()
            .find(|m| m["ts"].as_str() == Some(part.platform_message_id.as_str()))
            .and_then(|m| m["text"].as_str())
            .map(str::to_owned)
    }

    /// Ends a stream, with `rest` appended and `metadata` set; `Ok(false)`: it was no longer
    /// streaming (stopped before, or by the person).
    async fn stop_stream(
        &self,
        channel: &str,
        part: &MessageReceiptPart,
        rest: Option<&str>,
        metadata: Option<Value>,
    ) -> Result<bool, SendError> {
        let mut args = json!({ "channel": channel, "ts": part.platform_message_id });
        if let Some(rest) = rest.filter(|r| !r.is_empty()) {
            args["markdown_text"] = json!(rest);
        }
        if let Some(metadata) = metadata {
            args["metadata"] = metadata;
        }
        let outcome = self.api.call("chat.stopStream", &args).await;
        lock(&self.streamed).remove(&part.platform_message_id);
        match outcome {
            Ok(_) => Ok(true),
            Err(error)
                if matches!(
                    error.code(),
                    Some("message_not_in_streaming_state" | "stopped_by_user")
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(error.into_send_error("chat.stopStream")),
        }
    }

    /// The final sent as a message of its own, the preview removed.
    async fn finalize_fresh(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let part = self.post(ctx, final_unit, text_of(final_unit)?).await?;
        if let Err(error) = self.remove_part(ctx, preview).await {
            warn!(channel = %self.name, error = %error.message, "the preview was not removed; the final was sent");
        }
        Ok(part)
    }

    async fn remove_part(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
    ) -> Result<(), SendError> {
        if is_stream(part) {
            self.stop_stream(&channel_of(ctx, part), part, None, None)
                .await?;
        }
        self.delete(ctx, part).await
    }

    /// Whether an absence from history proves the unit never landed: no send of it from this
    /// process may still be in flight, and none from a process before (one that may have been
    /// stopped mid-request less than the settle time ago).
    fn settled(&self, ctx: &SendContext, key: &str) -> bool {
        let recent = |at: Instant| at.elapsed() < self.settle;
        if lock(&self.attempts).get(key).copied().is_some_and(recent) {
            return false;
        }
        !(ctx.intent_id.is_some() && recent(self.started))
    }
}

/// The metadata key a platform message carries.
fn key_of(message: &Value) -> Option<&str> {
    message
        .get("metadata")?
        .get("event_payload")?
        .get("key")?
        .as_str()
}

#[async_trait]
impl ChannelMessageAdapter for SlackAdapter {
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
            MessagePartKind::Text | MessagePartKind::Preview => {
                self.post(ctx, unit, text_of(unit)?).await
            }
            other => Err(invalid(format!(
                "this Slack channel sends text only, not a {other:?} unit"
            ))),
        }
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let channel = channel_of(ctx, part);
        if is_stream(part) {
            // A streaming message refuses edits (streaming_state_conflict): end it first.
            self.stop_stream(&channel, part, None, None).await?;
        }
        self.update(&channel, part, text_of(unit)?, None).await
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let args = json!({ "channel": channel_of(ctx, part), "ts": part.platform_message_id });
        match self.api.call("chat.delete", &args).await {
            // Deleted before (a retry whose first answer was lost): the outcome wanted.
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some("message_not_found") => Ok(()),
            Err(error) => Err(error.into_send_error("chat.delete")),
        }
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        let channel = ctx.message.target.id.clone();
        let thread = thread_of(&ctx.message);
        let (method, mut args) = match &thread {
            Some(thread) => (
                "conversations.replies",
                json!({ "channel": channel, "ts": thread }),
            ),
            None => ("conversations.history", json!({ "channel": channel })),
        };
        // Metadata comes back only when asked for.
        args["include_all_metadata"] = json!(true);
        args["limit"] = json!(HISTORY_LIMIT);
        // A native stream preview carries no metadata (`chat.startStream` takes none; every other
        // message of ours has some): in its thread, the one message of this app without
        // metadata is it. Two such (two replies streaming in one thread) prove nothing.
        let stream_preview = key.ends_with(&format!("{PREVIEW_KEY_SUFFIX}#0"))
            && self.bot_id.is_some()
            && thread.is_some()
            && self.stream_shape(ctx).is_some();
        let mut open_streams = Vec::new();
        let mut exhausted = true;
        for _ in 0..HISTORY_PAGES {
            let answer = match self.api.call(method, &args).await {
                Ok(answer) => answer,
                // A thread whose parent is gone holds nothing of ours.
                Err(error) if error.code() == Some("thread_not_found") => break,
                Err(error) => return Err(error.into_send_error(method)),
            };
            let found = answer["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|m| key_of(m) == Some(key.as_str()));
            if stream_preview {
                open_streams.extend(
                    answer["messages"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|m| {
                            m["bot_id"].as_str() == self.bot_id.as_deref()
                                && m.get("metadata").is_none()
                                && m["ts"].as_str() != thread.as_deref()
                        })
                        .filter_map(|m| m["ts"].as_str().map(str::to_owned)),
                );
            }
            if let Some(message) = found {
                let ts = message["ts"].as_str().unwrap_or_default();
                return Ok(Reconciliation::Sent(Box::new(Self::part(
                    &channel,
                    ts,
                    thread.as_deref(),
                    unit,
                    false,
                ))));
            }
            let next = answer["response_metadata"]["next_cursor"]
                .as_str()
                .filter(|c| !c.is_empty() && answer["has_more"] == Value::Bool(true));
            match next {
                Some(cursor) => {
                    args["cursor"] = json!(cursor);
                    exhausted = false;
                }
                None => {
                    exhausted = true;
                    break;
                }
            }
        }
        // Not found in a history read to its end: absent. Read only in part (a very busy
        // conversation): nothing is proven, and nothing is sent again blindly.
        if !exhausted {
            return Ok(Reconciliation::Unresolved);
        }
        if let [ts] = open_streams.as_slice() {
            return Ok(Reconciliation::Sent(Box::new(Self::part(
                &channel,
                ts,
                thread.as_deref(),
                unit,
                true,
            ))));
        }
        if open_streams.len() > 1 {
            return Ok(Reconciliation::Unresolved);
        }
        Ok(if self.settled(ctx, &key) {
            Reconciliation::NotSent
        } else {
            Reconciliation::Unresolved
        })
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        Some(&SlackOrigin)
    }
}

#[async_trait]
impl MessageLiveAdapter for SlackAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        if let Some((thread, recipient)) = self.stream_shape(ctx) {
            match self.start_stream(ctx, unit, text, &thread, recipient).await {
                Ok(part) => return Ok(part),
                // A definite refusal of the stream (its arguments, this workspace): the
                // preview is a draft message instead.
                Err(error @ CallError::Refused { .. })
                    if matches!(
                        error.kind(),
                        DeliveryFailureKind::InvalidPayload | DeliveryFailureKind::Permission
                    ) =>
                {
                    warn!(channel = %self.name, error = ?error.code(), "Slack refused a native stream; previewing as a draft message");
                }
                Err(error) => return Err(error.into_send_error("chat.startStream")),
            }
        }
        self.post(ctx, unit, text).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        let channel = channel_of(ctx, preview);
        if !is_stream(preview) {
            return self.update(&channel, preview, text, None).await;
        }
        // A stream only grows: the new text's rest is appended; a text that rewrote what was
        // streamed waits for the final.
        let Some(shown) = self.streamed_text(&channel, preview).await else {
            return Ok(preview.clone());
        };
        let Some(rest) = text.strip_prefix(shown.as_str()).filter(|r| !r.is_empty()) else {
            return Ok(preview.clone());
        };
        let args =
            json!({ "channel": channel, "ts": preview.platform_message_id, "markdown_text": rest });
        match self.api.call("chat.appendStream", &args).await {
            Ok(_) => {
                lock(&self.streamed).insert(preview.platform_message_id.clone(), text.to_owned());
                Ok(preview.clone())
            }
            // Stopped (by the person, or before a restart): the final replaces it.
            Err(error) if error.kind() == DeliveryFailureKind::Conflict => Ok(preview.clone()),
            Err(error) => Err(error.into_send_error("chat.appendStream")),
        }
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        // An edit cannot move a message to another thread.
        if thread_of(&ctx.message) != preview.thread_id {
            return self.finalize_fresh(ctx, preview, final_unit).await;
        }
        let text = text_of(final_unit)?;
        let channel = channel_of(ctx, preview);
        let meta = metadata(&ctx.unit_key(final_unit), ctx.origin_metadata.as_ref());
        let mut part = preview.clone();
        part.kind = final_unit.kind;
        part.index = final_unit.index;
        if is_stream(preview) {
            let shown = self.streamed_text(&channel, preview).await;
            let rest = shown.as_deref().and_then(|s| text.strip_prefix(s));
            let stopped = self
                .stop_stream(&channel, preview, rest, Some(meta.clone()))
                .await?;
            part.edit_token = Some(channel.clone());
            if stopped && rest.is_some() {
                return Ok(part);
            }
            // The stream showed something else (or was stopped before): edited into the final.
        }
        match self.update(&channel, &part, text, Some(meta)).await {
            Ok(part) => Ok(part),
            // A definite refusal of the edit (too long, the edit window, the message gone):
            // the final goes out on its own.
            Err(error)
                if refused_as(
                    &error,
                    &[
                        DeliveryFailureKind::InvalidPayload,
                        DeliveryFailureKind::Permission,
                        DeliveryFailureKind::NotFound,
                        DeliveryFailureKind::Conflict,
                    ],
                ) =>
            {
                warn!(channel = %self.name, error = %error.message, "the preview cannot become the final; sending the final fresh");
                self.finalize_fresh(ctx, preview, final_unit).await
            }
            Err(error) => Err(error),
        }
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        _reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        self.remove_part(ctx, preview).await
    }
}

/// The origin marker in the message `metadata`'s `event_payload.origin`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlackOrigin;

impl MessageOriginAdapter for SlackOrigin {
    fn encode(&self, origin: &MessageOrigin) -> Option<Value> {
        Some(json!({ "origin": serde_json::to_value(origin).ok()? }))
    }

    /// From an Events API envelope (`event.metadata`, or `event.message.metadata` of an edit)
    /// or a bare message (history, replies).
    fn decode(&self, raw: &Value) -> Option<MessageOrigin> {
        let message = raw.get("event").unwrap_or(raw);
        let message = message.get("message").unwrap_or(message);
        let metadata = message.get("metadata")?;
        if metadata.get("event_type")?.as_str()? != METADATA_EVENT_TYPE {
            return None;
        }
        serde_json::from_value(metadata.get("event_payload")?.get("origin")?.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_markers_round_trip_through_metadata() {
        let origin = MessageOrigin::gateway_failure(
            clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
        );
        let encoded = SlackOrigin.encode(&origin);
        let meta = metadata("k#0", encoded.as_ref());
        let event =
            json!({ "type": "event_callback", "event": { "type": "message", "metadata": meta } });
        assert_eq!(SlackOrigin.decode(&event), Some(origin.clone()));
        assert_eq!(
            SlackOrigin.decode(&json!({ "metadata": meta })),
            Some(origin)
        );
        let unmarked = json!({ "event": { "type": "message", "metadata": metadata("k#0", None) } });
        assert_eq!(SlackOrigin.decode(&unmarked), None);
        let foreign =
            json!({ "metadata": { "event_type": "other_app", "event_payload": { "origin": {} } } });
        assert_eq!(SlackOrigin.decode(&foreign), None);
    }

    #[test]
    fn a_reply_threads_under_its_thread_or_the_answered_message() {
        let target = clawgate_types::MessageTarget::group("C1");
        let mut message = ChannelMessage::outbound("k", "slack", target.clone(), "x");
        assert_eq!(thread_of(&message), None);
        message.target = target.with_thread_id(Some("1.000001"));
        assert_eq!(thread_of(&message).as_deref(), Some("1.000001"));
        message.relation = Some(MessageRelation::reply_to("2.000002"));
        assert_eq!(thread_of(&message).as_deref(), Some("2.000002"));
    }
}
