//! Sending: `m.room.message` events with a transaction id derived from the unit's idempotency
//! key, `m.replace` edits, redactions, and previews that become the final by an edit (or are
//! redacted and the final sent fresh when an edit cannot carry it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageOriginAdapter, Reconciliation, SendContext,
    SendError, SideEffect,
};
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, LiveCancelReason, LiveCapabilities,
    MessageCapabilities, MessageOrigin, MessageReceiptPart, MessageRelation, RenderedMessageUnit,
    TextCapabilities, ThreadCapabilities,
};
use reqwest::Method;
use ruma::events::relation::{InReplyTo, Reply, Thread};
use ruma::events::room::message::{
    Relation, ReplacementMetadata, RoomMessageEventContent, RoomMessageEventContentWithoutRelation,
};
use ruma::{EventId, OwnedEventId, OwnedUserId};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::client::{CallError, MatrixApi, segment};

/// Longest text of one event, in characters. An event is at most 65 536 bytes with its
/// signatures; a formatted message carries the text twice (`body` and `formatted_body`) and a
/// character is up to 4 bytes, so 4000 characters always fit.
pub const MAX_TEXT_CHARS: u32 = 4000;
/// The content key carrying the gateway's origin marker.
pub const ORIGIN_KEY: &str = "org.clawgate.origin";
/// How many events back reconciliation looks for a transaction id in the room's history.
const RECONCILE_HISTORY: usize = 500;

/// The transaction id of a unit key: stable across retries and restarts, URL-safe, and the
/// same for a resend, so the homeserver answers it with the event it already has.
pub(crate) fn txn_id(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("cg{hex}")
}

/// The Matrix sender: one account on one homeserver.
pub struct MatrixAdapter {
    name: String,
    api: MatrixApi,
    user_id: OwnedUserId,
    capabilities: MessageCapabilities,
    encrypted: EncryptedRooms,
}

/// What the channel knows of its rooms' encryption: found encrypted (true) or not (false) by a
/// state lookup, or seen turning encrypted by `/sync` (shared by the sender and the source, so a
/// room that turns encrypted gets nothing in the clear from then on).
#[derive(Debug, Clone, Default)]
pub(crate) struct EncryptedRooms(Arc<Mutex<HashMap<String, bool>>>);

impl EncryptedRooms {
    fn get(&self, room: &str) -> Option<bool> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(room)
            .copied()
    }

    pub(crate) fn set(&self, room: &str, encrypted: bool) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(room.to_owned(), encrypted);
    }
}

impl std::fmt::Debug for MatrixAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatrixAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("user_id", &self.user_id)
            .finish_non_exhaustive()
    }
}

/// What the channel can do, as the engine and the conformance suite read it.
pub(crate) fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_threads(
            ThreadCapabilities::default()
                .with_reply(true)
                .with_topic(false)
                .with_native_thread(true),
        )
        .with_live(
            LiveCapabilities::default()
                .with_edit(true)
                .with_delete(true)
                .with_native_stream(false)
                .with_max_edits_per_second(2),
        )
        // The transaction id is the idempotency key: a resend with the same id returns the
        // event already sent, and the room history names the transaction id of our own events.
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

fn event_id(value: &str, what: &str) -> Result<OwnedEventId, SendError> {
    EventId::parse(value)
        .map_err(|e| invalid(format!("{what} {value:?} is not a Matrix event id: {e}")))
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    unit.payload
        .get("text")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| invalid("a Matrix text unit needs a non-empty text"))
}

/// The plain `body` of an HTML text: tags dropped, the common entities decoded.
pub(crate) fn plain_of_html(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => in_tag = false,
            _ if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The message content of a text in `format` (`html`: `org.matrix.custom.html` with a plain
/// `body`; anything else: plain text).
fn text_content(text: &str, format: Option<&str>) -> RoomMessageEventContentWithoutRelation {
    if format.is_some_and(|f| f.eq_ignore_ascii_case("html")) {
        RoomMessageEventContentWithoutRelation::text_html(plain_of_html(text), text)
    } else {
        RoomMessageEventContentWithoutRelation::text_plain(text)
    }
}

/// Where a message goes in its room: the thread root and the event it answers.
fn placement(
    message: &ChannelMessage,
) -> Result<(Option<OwnedEventId>, Option<OwnedEventId>), SendError> {
    let (reply, relation_thread) = match &message.relation {
        Some(MessageRelation::Reply {
            reply_to_id,
            thread_id,
            ..
        }) => (reply_to_id.clone(), thread_id.clone()),
        _ => (None, None),
    };
    let thread = message.target.thread_id.clone().or(relation_thread);
    Ok((
        thread.map(|t| event_id(&t, "thread root")).transpose()?,
        reply.map(|r| event_id(&r, "reply target")).transpose()?,
    ))
}

#[derive(Deserialize)]
struct EventIdAnswer {
    event_id: OwnedEventId,
}

#[derive(Deserialize)]
struct MessagesPage {
    #[serde(default)]
    chunk: Vec<Value>,
    #[serde(default)]
    end: Option<String>,
}

impl MatrixAdapter {
    pub(crate) fn new(
        name: &str,
        api: MatrixApi,
        user_id: OwnedUserId,
        encrypted: EncryptedRooms,
    ) -> MatrixAdapter {
        MatrixAdapter {
            name: name.to_owned(),
            api,
            user_id,
            capabilities: capabilities(),
            encrypted,
        }
    }

    fn room_of<'a>(ctx: &'a SendContext, part: &'a MessageReceiptPart) -> &'a str {
        part.edit_token
            .as_deref()
            .unwrap_or(ctx.message.target.id.as_str())
    }

    /// The content of a new message: text, thread / reply relation, origin marker.
    fn content(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
        format: Option<&str>,
    ) -> Result<Value, SendError> {
        let (thread, reply) = placement(&ctx.message)?;
        let mut content: RoomMessageEventContent = text_content(text, format).into();
        content.relates_to = match (thread, reply) {
            (Some(root), Some(reply)) => Some(Relation::Thread(Thread::reply(root, reply))),
            // Outside a reply, a thread message falls back to a reply to the root for clients
            // without threads.
            (Some(root), None) => Some(Relation::Thread(Thread::plain(root.clone(), root))),
            (None, Some(reply)) => Some(Relation::Reply(Reply::new(InReplyTo::new(reply)))),
            (None, None) => None,
        };
        let mut value = serde_json::to_value(&content)
            .map_err(|e| invalid(format!("the message content does not serialize: {e}")))?;
        self.mark(ctx, unit, &mut value);
        Ok(value)
    }

    /// Adds the origin marker (from the engine's encoding, or the unit's own) to `content`.
    fn mark(&self, ctx: &SendContext, unit: &RenderedMessageUnit, content: &mut Value) {
        let metadata = ctx.origin_metadata.clone().or_else(|| {
            let origin: MessageOrigin =
                serde_json::from_value(unit.payload.get("origin")?.clone()).ok()?;
            MatrixOrigin.encode(&origin)
        });
        if let (Some(Value::Object(metadata)), Some(map)) = (metadata, content.as_object_mut()) {
            for (key, value) in metadata {
                map.insert(key, value);
            }
        }
    }

    /// Refuses rooms with end-to-end encryption: this channel does not encrypt, and a plain
    /// message there would bypass the room's promise to its members.
    async fn ensure_unencrypted(&self, room: &str) -> Result<(), SendError> {
        let encrypted = match self.encrypted.get(room) {
            Some(encrypted) => encrypted,
            None => {
                let path = format!("rooms/{}/state/m.room.encryption/", segment(room));
                let found = match self
                    .api
                    .call::<Value>(Method::GET, &path, None, Duration::ZERO)
                    .await
                {
                    Ok(_) => Some(true),
                    Err(error) if error.errcode() == Some("M_NOT_FOUND") => Some(false),
                    // Not in the room, or the homeserver is away: the send itself will say.
                    Err(_) => None,
                };
                let Some(encrypted) = found else {
                    return Ok(());
                };
                self.encrypted.set(room, encrypted);
                encrypted
            }
        };
        if encrypted {
            warn!(channel = %self.name, room, "refusing to send into an end-to-end encrypted room");
            return Err(SendError::before_io(
                DeliveryFailureKind::Permission,
                format!(
                    "Matrix room {room} is end-to-end encrypted and this channel does not encrypt: \
                     talk to the account in an unencrypted room"
                ),
            ));
        }
        Ok(())
    }

    /// `PUT /rooms/{room}/send/m.room.message/{txnId}`.
    async fn put_event(
        &self,
        room: &str,
        txn: &str,
        content: &Value,
    ) -> Result<OwnedEventId, CallError> {
        let path = format!(
            "rooms/{}/send/m.room.message/{}",
            segment(room),
            segment(txn)
        );
        self.api
            .call::<EventIdAnswer>(Method::PUT, &path, Some(content), Duration::ZERO)
            .await
            .map(|a| a.event_id)
    }

    fn part(
        event: &EventId,
        room: &str,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let (thread, reply) = placement(&ctx.message)?;
        let mut part = MessageReceiptPart::new(event.to_string(), unit.kind, unit.index);
        part.thread_id = thread.map(|t| t.to_string());
        part.reply_to_id = reply.map(|r| r.to_string());
        // The room the event lives in, for later edits and redactions.
        part.edit_token = Some(room.to_owned());
        Ok(part)
    }

    async fn send_text(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        format: Option<&str>,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        let room = ctx.message.target.id.as_str();
        self.ensure_unencrypted(room).await?;
        let content = self.content(ctx, unit, text, format)?;
        let event = self
            .put_event(room, &txn_id(&ctx.unit_key(unit)), &content)
            .await
            .map_err(|e| e.into_send_error("send"))?;
        Self::part(&event, room, ctx, unit)
    }

    /// An `m.replace` edit of `part`. Its transaction id follows the edit's content, so an edit
    /// whose answer was lost is sent again without leaving two edits.
    async fn replace_text(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
        format: Option<&str>,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        let original = event_id(&part.platform_message_id, "edited event")?;
        let room = Self::room_of(ctx, part).to_owned();
        let content =
            text_content(text, format).make_replacement(ReplacementMetadata::new(original, None));
        let mut value = serde_json::to_value(&content)
            .map_err(|e| invalid(format!("the edit does not serialize: {e}")))?;
        self.mark(ctx, unit, &mut value);
        let txn = txn_id(&format!(
            "edit\n{}\n{}\n{value}",
            ctx.unit_key(unit),
            part.platform_message_id
        ));
        let mut lost = None;
        for _ in 0..3 {
            match self.put_event(&room, &txn, &value).await {
                Ok(_) => return Ok(part.clone()),
                Err(error @ CallError::Lost(_)) => lost = Some(error),
                Err(error) => return Err(error.into_send_error("edit")),
            }
        }
        Err(lost
            .unwrap_or_else(|| CallError::Lost("no answer".into()))
            .into_send_error("edit"))
    }

    /// `PUT /rooms/{room}/redact/{eventId}/{txnId}`.
    async fn redact(&self, room: &str, event: &str, reason: &str) -> Result<(), SendError> {
        let path = format!(
            "rooms/{}/redact/{}/{}",
            segment(room),
            segment(event),
            segment(&txn_id(&format!("redact\n{event}")))
        );
        match self
            .api
            .call::<Value>(
                Method::PUT,
                &path,
                Some(&json!({ "reason": reason })),
                Duration::ZERO,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(error.into_send_error("redact")),
        }
    }

    /// Looks for the event our account sent with `txn` among the room's latest events.
    async fn find_transaction(
        &self,
        room: &str,
        txn: &str,
    ) -> Result<Option<OwnedEventId>, SendError> {
        let mut from: Option<String> = None;
        let mut seen = 0;
        while seen < RECONCILE_HISTORY {
            let mut path = format!("rooms/{}/messages?dir=b&limit=100", segment(room));
            if let Some(from) = &from {
                path.push_str(&format!("&from={}", segment(from)));
            }
            let page: MessagesPage = self
                .api
                .call(Method::GET, &path, None, Duration::ZERO)
                .await
                .map_err(|e| e.into_send_error("messages"))?;
            seen += page.chunk.len().max(1);
            for event in &page.chunk {
                let ours =
                    event.get("sender").and_then(Value::as_str) == Some(self.user_id.as_str());
                let same = event
                    .pointer("/unsigned/transaction_id")
                    .and_then(Value::as_str)
                    == Some(txn);
                if ours && same {
                    let id = event
                        .get("event_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    return Ok(Some(event_id(id, "history event")?));
                }
            }
            match page.end {
                Some(end) if !page.chunk.is_empty() => from = Some(end),
                _ => break,
            }
        }
        Ok(None)
    }

    /// The final sent as a new event, the preview redacted.
    async fn finalize_fresh(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let format = final_unit.payload.get("format").and_then(Value::as_str);
        let part = self.send_text(ctx, final_unit, format).await?;
        let room = Self::room_of(ctx, preview).to_owned();
        if let Err(error) = self
            .redact(
                &room,
                &preview.platform_message_id,
                "replaced by the final message",
            )
            .await
        {
            warn!(channel = %self.name, error = %error.message, "the preview was not redacted; the final was sent");
        }
        Ok(part)
    }
}

#[async_trait]
impl ChannelMessageAdapter for MatrixAdapter {
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
        use clawgate_types::MessagePartKind;
        match unit.kind {
            MessagePartKind::Text | MessagePartKind::Preview => {
                let format = unit.payload.get("format").and_then(Value::as_str);
                self.send_text(ctx, unit, format).await
            }
            other => Err(invalid(format!(
                "this Matrix channel sends no {other:?} units (text only)"
            ))),
        }
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let format = unit.payload.get("format").and_then(Value::as_str);
        self.replace_text(ctx, part, unit, format).await
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let room = Self::room_of(ctx, part).to_owned();
        self.redact(&room, &part.platform_message_id, "removed by the gateway")
            .await
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let room = ctx.message.target.id.as_str();
        let txn = txn_id(&ctx.unit_key(unit));
        // Not found is safe to resend: the resend carries the same transaction id, which the
        // homeserver answers with the event it has if the history search missed it.
        Ok(match self.find_transaction(room, &txn).await? {
            Some(event) => Reconciliation::Sent(Box::new(Self::part(&event, room, ctx, unit)?)),
            None => Reconciliation::NotSent,
        })
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        Some(&MatrixOrigin)
    }
}

#[async_trait]
impl MessageLiveAdapter for MatrixAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        // Previews are plain text: half-streamed markup would not be valid HTML.
        self.send_text(ctx, unit, None).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.replace_text(ctx, preview, unit, None).await
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        // An edit cannot move an event to another reply target or thread.
        let (thread, reply) = placement(&ctx.message)?;
        if reply.map(|r| r.to_string()) != preview.reply_to_id
            || thread.map(|t| t.to_string()) != preview.thread_id
        {
            return self.finalize_fresh(ctx, preview, final_unit).await;
        }
        match self.edit(ctx, preview, final_unit).await {
            Ok(part) => Ok(part),
            // A definite refusal of the edit (the content, the account's power to edit):
            // the final goes out on its own and the preview is redacted.
            Err(error)
                if error.side_effect == SideEffect::None
                    && matches!(
                        error.kind,
                        DeliveryFailureKind::InvalidPayload
                            | DeliveryFailureKind::Permission
                            | DeliveryFailureKind::NotFound
                    ) =>
            {
                warn!(channel = %self.name, error = %error.message, "the preview cannot become the final; redacting it and sending the final");
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
        self.delete(ctx, preview).await
    }
}

/// The origin marker as a namespaced content key (`org.clawgate.origin`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MatrixOrigin;

impl MessageOriginAdapter for MatrixOrigin {
    fn encode(&self, origin: &MessageOrigin) -> Option<Value> {
        let marker = serde_json::to_value(origin).ok()?;
        Some(json!({ ORIGIN_KEY: marker }))
    }

    fn decode(&self, raw: &Value) -> Option<MessageOrigin> {
        let marker = raw.get("content")?.get(ORIGIN_KEY)?;
        serde_json::from_value(marker.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transaction_ids_are_stable_url_safe_and_differ_per_key() {
        let a = txn_id("matrix:reply:1#0");
        assert_eq!(a, txn_id("matrix:reply:1#0"));
        assert_ne!(a, txn_id("matrix:reply:1#1"));
        assert_eq!(a.len(), 34);
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric()));
    }

    #[test]
    fn html_bodies_get_a_plain_fallback() {
        assert_eq!(
            plain_of_html("<b>bold</b> &amp; <i>x</i> &lt;3"),
            "bold & x <3"
        );
        let content =
            serde_json::to_value(text_content("<b>hi</b>", Some("html"))).unwrap_or_default();
        assert_eq!(content["format"], "org.matrix.custom.html");
        assert_eq!(content["formatted_body"], "<b>hi</b>");
        assert_eq!(content["body"], "hi");
        let plain =
            serde_json::to_value(text_content("<b>hi</b>", Some("plain"))).unwrap_or_default();
        assert_eq!(plain["body"], "<b>hi</b>");
        assert!(plain.get("formatted_body").is_none());
    }

    #[test]
    fn origin_markers_round_trip_through_content() {
        let origin = MessageOrigin::gateway_failure(
            clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
        );
        let encoded = MatrixOrigin.encode(&origin).unwrap_or_default();
        let raw = json!({ "type": "m.room.message", "content": { "body": "x", ORIGIN_KEY: encoded[ORIGIN_KEY] } });
        assert_eq!(MatrixOrigin.decode(&raw), Some(origin));
        assert_eq!(
            MatrixOrigin.decode(&json!({ "content": { "body": "x" } })),
            None
        );
    }
}
