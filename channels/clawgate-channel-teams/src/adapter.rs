//! Sending: activities to a conversation (`POST …/activities`), replies in a channel thread
//! (`POST {channel};messageid={root}/activities/{root}` with `replyToId`), updates (`PUT`, the
//! whole activity) and deletes. Previews in one-on-one chats are a Teams stream (a `typing`
//! activity with `streaminfo`, more of them with the text so far, then the final `message` on
//! the stream: the progress becomes the answer in place); elsewhere a message updated in place.
//! A preview unit's progress labels (`payload.progress`, the newest last) become the stream's
//! informative updates ("Searching…"): sent first when there is no text yet, interleaved when a
//! new label comes, one request a second either way.
//!
//! A send whose answer was lost cannot be settled: the connector has no idempotency key and a
//! bot cannot read an activity back, so it is left to an operator (never sent again blindly).
//! Everything after a preview exists is settled by repeating: an update of the same content is
//! the same message, and a stream's final repeated answers "already completed" once it landed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, MessageLiveAdapter, SendContext, SendError};
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, LiveCancelReason, LiveCapabilities,
    MessageCapabilities, MessagePartKind, MessageReceiptPart, MessageRelation, MessageTarget,
    RenderedMessageUnit, TargetKind, TextCapabilities, ThreadCapabilities,
};
use reqwest::Method;
use serde_json::{Value, json};
use tracing::warn;

use crate::client::{CallError, ConnectorApi, encode_segment};
use crate::receive::split_thread;
use crate::references::References;

/// Longest text of one message this channel sends (chunks beyond it): Teams takes about 28 KB
/// per message, which 7,000 characters stay under in any script.
pub const MAX_TEXT_CHARS: u32 = 7_000;
/// How often an update, a delete or a stream's final whose answer was lost is sent again.
const REPEATS: u32 = 3;
/// Teams takes one streaming request a second per stream.
const STREAM_INTERVAL: Duration = Duration::from_secs(1);
/// How long a conversation is held after a 429 without `Retry-After` (the rate-limit page's
/// sample backs off from 2 s).
const RATE_LIMIT_HOLD_MS: u64 = 2_000;
/// The `edit_token` prefix of a stream's part (the rest is the conversation).
const STREAM_PREFIX: &str = "stream:";

/// The Teams sender: one bot's app credentials.
pub struct TeamsAdapter {
    name: String,
    api: ConnectorApi,
    references: References,
    default_service_url: Option<String>,
    streaming: bool,
    capabilities: MessageCapabilities,
    /// Each open stream's last sequence number and request time (lost on a restart: a stream
    /// then takes only its final).
    streams: Mutex<HashMap<String, (u64, Instant)>>,
    /// Each open stream's last informative text, so a label is shown once.
    informed: Mutex<HashMap<String, String>>,
    /// Conversations Teams answered a send 429 for, and until when: sends there wait it out
    /// here rather than spend the bot's quota on refusals.
    throttled: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for TeamsAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TeamsAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("streaming", &self.streaming)
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
                .with_progress(true)
                // A stream takes one request a second.
                .with_max_edits_per_second(1),
        )
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(false)
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
        .ok_or_else(|| invalid("a Teams text unit needs a `text` string"))
}

/// The newest progress label of a preview unit (`payload.progress`: labels, or objects with a
/// `label`, oldest first).
fn latest_progress(unit: &RenderedMessageUnit) -> Option<&str> {
    unit.payload
        .get("progress")?
        .as_array()?
        .iter()
        .filter_map(|v| v.as_str().or_else(|| v.get("label")?.as_str()))
        .map(str::trim)
        .rfind(|label| !label.is_empty())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The thread a message goes to (a channel post's id): its reply's thread, else its target's.
fn thread_of(message: &ChannelMessage) -> Option<String> {
    let from_relation = match &message.relation {
        Some(MessageRelation::Reply { thread_id, .. }) => thread_id.clone(),
        _ => None,
    };
    from_relation.or_else(|| message.target.thread_id.clone())
}

/// The activity a message answers (`replyToId`): its relation's, else its thread's root.
fn reply_to_of(message: &ChannelMessage) -> Option<String> {
    match &message.relation {
        Some(MessageRelation::Reply {
            reply_to_id: Some(id),
            ..
        }) => Some(id.clone()),
        _ => thread_of(message),
    }
}

/// The conversation id a call addresses: a channel thread is `{channel};messageid={root}`.
fn addressed(target: &MessageTarget, thread: Option<&str>) -> String {
    let (base, _) = split_thread(&target.id);
    match thread {
        Some(root) => format!("{base};messageid={root}"),
        None => base.to_owned(),
    }
}

fn is_stream(part: &MessageReceiptPart) -> bool {
    part.edit_token
        .as_deref()
        .is_some_and(|t| t.starts_with(STREAM_PREFIX))
}

/// The conversation (as addressed) a part lives in.
fn conversation_of(ctx: &SendContext, part: &MessageReceiptPart) -> String {
    part.edit_token
        .as_deref()
        .map(|t| t.strip_prefix(STREAM_PREFIX).unwrap_or(t).to_owned())
        .unwrap_or_else(|| addressed(&ctx.message.target, part.thread_id.as_deref()))
}

/// A streaming activity: `kind` with `text` and the stream's fields, both as the `streaminfo`
/// entity streaming-ux.md describes and in `channelData` (as Teams' own libraries send them).
fn stream_activity(
    kind: &str,
    text: &str,
    stream_id: Option<&str>,
    stream_type: &str,
    sequence: Option<u64>,
) -> Value {
    let mut info = json!({ "streamType": stream_type });
    if let Some(id) = stream_id {
        info["streamId"] = json!(id);
    }
    if let Some(sequence) = sequence {
        info["streamSequence"] = json!(sequence);
    }
    let mut entity = info.clone();
    entity["type"] = json!("streaminfo");
    json!({ "type": kind, "text": text, "entities": [entity], "channelData": info })
}

impl TeamsAdapter {
    pub(crate) fn new(
        name: &str,
        api: ConnectorApi,
        references: References,
        default_service_url: Option<String>,
        streaming: bool,
    ) -> TeamsAdapter {
        TeamsAdapter {
            name: name.to_owned(),
            api,
            references,
            default_service_url,
            streaming,
            capabilities: capabilities(),
            streams: Mutex::new(HashMap::new()),
            informed: Mutex::new(HashMap::new()),
            throttled: Mutex::new(HashMap::new()),
        }
    }

    /// Where the connector of `conversation` is: the service URL Teams gave with its
    /// activities (read from the store: another gateway may have learned it), else the
    /// configured one.
    async fn service_url(&self, conversation: &str) -> Result<String, CallError> {
        let (base, _) = split_thread(conversation);
        match self.references.get(base).await {
            Ok(Some(reference)) => return Ok(reference.service_url),
            Ok(None) => {}
            Err(error) => return Err(CallError::State(error.to_string())),
        }
        self.default_service_url
            .clone()
            .ok_or_else(|| CallError::Refused {
                status: 404,
                code: "NoConversationReference".into(),
                message: format!(
                    "Teams: no conversation reference for {base}: the bot learns where to send \
                     from the activities Teams sends it (install the bot there, or have someone \
                     write to it first), or set service_url"
                ),
                retry_after_ms: None,
            })
    }

    async fn call(
        &self,
        method: Method,
        conversation: &str,
        activity: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Value), CallError> {
        let service_url = self.service_url(conversation).await?;
        let (base, _) = split_thread(conversation);
        // The limits that answered 429 count sends; updates and deletes go on.
        let send = method == Method::POST;
        let held = lock(&self.throttled)
            .get(base)
            .filter(|_| send)
            .map(|until| until.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero());
        if let Some(left) = held {
            return Err(CallError::Refused {
                status: 429,
                code: "Throttled".into(),
                message: "held back: Teams asked this bot to wait in this conversation".into(),
                retry_after_ms: Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1)),
            });
        }
        let mut path = format!("conversations/{}/activities", encode_segment(conversation));
        if let Some(id) = activity {
            path.push('/');
            path.push_str(&encode_segment(id));
        }
        let outcome = self.api.call(method, &service_url, &path, body).await;
        if let Err(CallError::Refused {
            status: 429,
            retry_after_ms,
            ..
        }) = &outcome
            && send
        {
            let wait = Duration::from_millis(retry_after_ms.unwrap_or(RATE_LIMIT_HOLD_MS));
            lock(&self.throttled).insert(base.to_owned(), Instant::now() + wait);
        }
        outcome
    }

    /// Repeats an idempotent call while its answer is lost.
    async fn repeated(
        &self,
        method: Method,
        conversation: &str,
        activity: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Value), CallError> {
        let mut lost = CallError::Lost("no answer".into());
        for _ in 0..REPEATS {
            match self
                .call(method.clone(), conversation, activity, body)
                .await
            {
                Err(error @ CallError::Lost(_)) => lost = error,
                other => return other,
            }
        }
        Err(lost)
    }

    fn part(
        id: &str,
        conversation: &str,
        thread: Option<&str>,
        unit: &RenderedMessageUnit,
        stream: bool,
    ) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(id, unit.kind, unit.index);
        part.thread_id = thread.map(str::to_owned);
        part.edit_token = Some(if stream {
            format!("{STREAM_PREFIX}{conversation}")
        } else {
            conversation.to_owned()
        });
        part
    }

    fn id_of(answer: &Value, operation: &str) -> Result<String, SendError> {
        answer["id"].as_str().map(str::to_owned).ok_or_else(|| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!("Teams {operation} answered without the activity's id"),
            )
        })
    }

    /// One message activity into the message's conversation (a reply in its thread).
    async fn post(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        if text.trim().is_empty() {
            return Err(invalid("Teams refuses an empty message"));
        }
        let thread = thread_of(&ctx.message);
        let conversation = addressed(&ctx.message.target, thread.as_deref());
        let reply_to = reply_to_of(&ctx.message);
        let mut body = json!({ "type": "message", "text": text });
        if let Some(reply_to) = &reply_to {
            body["replyToId"] = json!(reply_to);
        }
        let (_, answer) = self
            .call(
                Method::POST,
                &conversation,
                reply_to.as_deref(),
                Some(&body),
            )
            .await
            .map_err(|e| e.into_send_error("send activity"))?;
        let id = Self::id_of(&answer, "send activity")?;
        Ok(Self::part(
            &id,
            &conversation,
            thread.as_deref(),
            unit,
            false,
        ))
    }

    /// `PUT` of the whole activity, repeated while its answer is lost.
    async fn update(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        text: &str,
    ) -> Result<(), CallError> {
        let conversation = conversation_of(ctx, part);
        let body = json!({ "type": "message", "id": part.platform_message_id, "text": text });
        self.repeated(
            Method::PUT,
            &conversation,
            Some(&part.platform_message_id),
            Some(&body),
        )
        .await
        .map(|_| ())
    }

    /// Whether a preview of this message is a Teams stream: streaming on, a one-on-one chat.
    fn streams_here(&self, ctx: &SendContext) -> bool {
        self.streaming && ctx.message.target.kind == TargetKind::Direct
    }

    async fn start_stream(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
    ) -> Result<MessageReceiptPart, CallError> {
        let conversation = addressed(&ctx.message.target, None);
        // No text yet: the stream opens with the progress (a start needs text).
        let informative = latest_progress(unit).filter(|_| text.trim().is_empty());
        let body = match informative {
            Some(label) => stream_activity("typing", label, None, "informative", Some(1)),
            None => stream_activity("typing", text, None, "streaming", Some(1)),
        };
        let (_, answer) = self
            .call(Method::POST, &conversation, None, Some(&body))
            .await?;
        let id = answer["id"]
            .as_str()
            .ok_or_else(|| CallError::Lost("a stream start answered without its id".into()))?;
        lock(&self.streams).insert(id.to_owned(), (1, Instant::now()));
        if let Some(label) = informative {
            lock(&self.informed).insert(id.to_owned(), label.to_owned());
        }
        Ok(Self::part(id, &conversation, None, unit, true))
    }

    /// The stream's final message. `Ok(false)`: the stream takes no more (the person stopped
    /// it, or its time ran out): the final must go on its own.
    async fn end_stream(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        text: &str,
    ) -> Result<bool, SendError> {
        let conversation = conversation_of(ctx, preview);
        let body = stream_activity(
            "message",
            text,
            Some(&preview.platform_message_id),
            "final",
            None,
        );
        let mut repeated = false;
        let mut lost = CallError::Lost("no answer".into());
        for _ in 0..REPEATS {
            match self
                .call(Method::POST, &conversation, None, Some(&body))
                .await
            {
                Ok(_) => {
                    lock(&self.streams).remove(&preview.platform_message_id);
                    lock(&self.informed).remove(&preview.platform_message_id);
                    return Ok(true);
                }
                Err(error @ CallError::Lost(_)) => {
                    lost = error;
                    repeated = true;
                }
                Err(error) if error.code() == Some("ContentStreamNotAllowed") => {
                    lock(&self.streams).remove(&preview.platform_message_id);
                    lock(&self.informed).remove(&preview.platform_message_id);
                    // Only a final completes a stream: after a lost answer (or a restart that
                    // finalizes again) "already completed" is this final having landed.
                    if error.message().contains("already completed") {
                        return Ok(true);
                    }
                    warn!(channel = %self.name, reason = %error.message(), repeated, "the stream takes no final; sending the final on its own");
                    return Ok(false);
                }
                Err(error) => return Err(error.into_send_error("stream final")),
            }
        }
        Err(lost.into_send_error("stream final"))
    }

    /// The final sent as a message of its own, the preview removed.
    async fn finalize_fresh(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let part = self.post(ctx, final_unit, text_of(final_unit)?).await?;
        if let Err(error) = self.delete(ctx, preview).await {
            warn!(channel = %self.name, error = %error.message, "the preview was not removed; the final was sent");
        }
        Ok(part)
    }
}

#[async_trait]
impl ChannelMessageAdapter for TeamsAdapter {
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
                "this Teams channel sends text only, not a {other:?} unit"
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
        let mut edited = part.clone();
        edited.kind = unit.kind;
        edited.index = unit.index;
        if is_stream(part) && self.end_stream(ctx, part, text).await? {
            edited.edit_token = Some(conversation_of(ctx, part));
            return Ok(edited);
        }
        self.update(ctx, part, text)
            .await
            .map_err(|e| e.into_send_error("update activity"))?;
        Ok(edited)
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let conversation = conversation_of(ctx, part);
        lock(&self.streams).remove(&part.platform_message_id);
        lock(&self.informed).remove(&part.platform_message_id);
        match self
            .repeated(
                Method::DELETE,
                &conversation,
                Some(&part.platform_message_id),
                None,
            )
            .await
        {
            Ok(_) => Ok(()),
            // Gone already (a repeat whose first answer was lost): the outcome wanted.
            Err(error) if error.kind() == DeliveryFailureKind::NotFound => Ok(()),
            Err(error) => Err(error.into_send_error("delete activity")),
        }
    }

    fn typing_interval(&self) -> Option<Duration> {
        // Teams shows a typing indicator for about three seconds.
        Some(Duration::from_secs(3))
    }

    /// A plain `typing` activity, in one-on-one chats (in a channel it would not show in the
    /// thread the answer goes to).
    async fn show_typing(&self, target: &MessageTarget) -> Result<(), SendError> {
        if target.kind != TargetKind::Direct {
            return Ok(());
        }
        let body = json!({ "type": "typing" });
        self.call(Method::POST, &addressed(target, None), None, Some(&body))
            .await
            .map(|_| ())
            .map_err(|e| e.into_send_error("typing"))
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }
}

#[async_trait]
impl MessageLiveAdapter for TeamsAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        if self.streams_here(ctx) {
            match self.start_stream(ctx, unit, text).await {
                Ok(part) => return Ok(part),
                // Streaming refused here (not allowed for this bot or tenant): the preview is
                // a message updated in place instead.
                Err(error) if error.code() == Some("ContentStreamNotAllowed") => {
                    warn!(channel = %self.name, reason = %error.message(), "Teams refused a stream; previewing as a message");
                }
                Err(error) => return Err(error.into_send_error("stream start")),
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
        if !is_stream(preview) {
            self.update(ctx, preview, text)
                .await
                .map_err(|e| e.into_send_error("update activity"))?;
            return Ok(preview.clone());
        }
        // A stream this process did not start (before a restart) has an unknown sequence: it
        // takes only its final.
        let Some((sequence, last)) = lock(&self.streams)
            .get(&preview.platform_message_id)
            .copied()
        else {
            return Ok(preview.clone());
        };
        let wait = STREAM_INTERVAL.saturating_sub(last.elapsed());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let stream_id = preview.platform_message_id.as_str();
        // A new progress label goes out as an informative update; the text follows with the
        // next update (one request a second), and the final carries all of it anyway.
        let label = latest_progress(unit).filter(|label| {
            lock(&self.informed).get(stream_id).map(String::as_str) != Some(*label)
        });
        if label.is_none() && text.trim().is_empty() {
            return Ok(preview.clone());
        }
        let next = sequence + 1;
        let body = match label {
            Some(label) => {
                lock(&self.informed).insert(stream_id.to_owned(), label.to_owned());
                stream_activity("typing", label, Some(stream_id), "informative", Some(next))
            }
            None => stream_activity("typing", text, Some(stream_id), "streaming", Some(next)),
        };
        let conversation = conversation_of(ctx, preview);
        let outcome = self
            .call(Method::POST, &conversation, None, Some(&body))
            .await;
        // Sent or not, this sequence number is spent: a lost request may still arrive.
        lock(&self.streams).insert(preview.platform_message_id.clone(), (next, Instant::now()));
        match outcome {
            Ok(_) => Ok(preview.clone()),
            // Out of order (dropped), stopped by the person, or out of time: the final replaces
            // whatever it shows.
            Err(error @ CallError::Dropped { .. }) => {
                warn!(channel = %self.name, code = ?error.code(), "Teams dropped a stream update");
                Ok(preview.clone())
            }
            Err(error) if error.code() == Some("ContentStreamNotAllowed") => Ok(preview.clone()),
            Err(error) => Err(error.into_send_error("stream update")),
        }
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        // An update cannot move a message to another thread.
        if thread_of(&ctx.message) != preview.thread_id {
            return self.finalize_fresh(ctx, preview, final_unit).await;
        }
        let text = text_of(final_unit)?;
        let mut part = preview.clone();
        part.kind = final_unit.kind;
        part.index = final_unit.index;
        if is_stream(preview) {
            if self.end_stream(ctx, preview, text).await? {
                part.edit_token = Some(conversation_of(ctx, preview));
                return Ok(part);
            }
            return self.finalize_fresh(ctx, preview, final_unit).await;
        }
        match self.update(ctx, preview, text).await {
            Ok(()) => Ok(part),
            // A definite refusal of the update (the message gone, too large): the final goes
            // out on its own.
            Err(error @ CallError::Refused { .. })
                if matches!(
                    error.kind(),
                    DeliveryFailureKind::NotFound
                        | DeliveryFailureKind::InvalidPayload
                        | DeliveryFailureKind::Conflict
                ) =>
            {
                warn!(channel = %self.name, code = ?error.code(), "the preview cannot become the final; sending the final on its own");
                self.finalize_fresh(ctx, preview, final_unit).await
            }
            Err(error) => Err(error.into_send_error("update activity")),
        }
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        _reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        self.delete(ctx, preview).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_reply_addresses_its_thread_and_answers_its_root() {
        let target = MessageTarget::group("19:c@thread.tacv2").with_thread_id(Some("1600"));
        let message = ChannelMessage::outbound("k", "teams", target.clone(), "x");
        assert_eq!(
            addressed(&target, thread_of(&message).as_deref()),
            "19:c@thread.tacv2;messageid=1600"
        );
        assert_eq!(reply_to_of(&message).as_deref(), Some("1600"));
        let dm = ChannelMessage::outbound("k", "teams", MessageTarget::direct("a:1"), "x");
        assert_eq!(reply_to_of(&dm), None);
        let mut answer = dm.clone();
        answer.relation = Some(MessageRelation::reply_to("1700"));
        assert_eq!(reply_to_of(&answer).as_deref(), Some("1700"));
    }
}
