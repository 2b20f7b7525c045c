//! Sending: `im/v1/messages` create and reply under a `uuid` derived from the unit's key;
//! updates, recalls; previews as CardKit streaming cards; settling a send whose answer was lost.
//!
//! Which sends can be settled after a lost answer:
//! - within the `uuid` window (Feishu: one hour; `uuid_window_ms`, 55 minutes by default): yes,
//!   by sending the same request again under the same `uuid`. Feishu acts on a `uuid` at most
//!   once, so either the first one landed and no second copy is made, or it is sent now.
//! - after it: by reading the chat's history from the unit's render time on, for a message of
//!   this app with exactly the unit's `msg_type` and content. One match is the receipt; none,
//!   with the history read to its end, proves absence; two identical ones prove nothing.
//! - a streaming card preview: the same, and a preview settled that way is never finalized in
//!   place (which card entity it shows is not certain): it is recalled and the final is sent on
//!   its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageRenderAdapter, Reconciliation, SendContext,
    SendError,
};
use clawgate_types::clock::Clock;
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, LiveCancelReason, LiveCapabilities,
    MessageCapabilities, MessagePartKind, MessageReceiptPart, MessageRelation, RenderedMessageUnit,
    TextCapabilities, ThreadCapabilities,
};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::client::{CODE_MESSAGE_GONE, CODE_STREAMING_CLOSED, CallError, OpenApi};
use crate::render::{CARD_ELEMENT_ID, FeishuRenderer, MAX_TEXT_CHARS, card_json, now_ms};

/// The card id a preview probe names: no card entity has it, so a probe never creates.
const PROBE_CARD_ID: &str = "clawgate-probe-no-such-card";
/// History pages a reconciliation reads at most (50 messages each).
const HISTORY_PAGES: u32 = 20;
const HISTORY_PAGE_SIZE: u32 = 50;
/// How far before a unit's render time its history search starts (clock skew).
const HISTORY_SKEW_MS: u64 = 60_000;

/// The Feishu sender: one app.
pub struct FeishuAdapter {
    name: String,
    api: OpenApi,
    app_id: String,
    capabilities: MessageCapabilities,
    renderer: FeishuRenderer,
    streaming_cards: bool,
    uuid_window_ms: u64,
    /// The gateway's clock: render times, uuid windows and CardKit sequences are read on it.
    clock: Arc<dyn Clock>,
    /// The last CardKit `sequence` used per card in this process.
    sequences: Mutex<HashMap<String, i64>>,
    /// When this process last sent each unit key (a history absence proves nothing while a send
    /// may still be in flight).
    attempts: Mutex<HashMap<String, Instant>>,
    /// When this process first sent each unit key (ms since the epoch).
    first_sent: Mutex<HashMap<String, u64>>,
    started: Instant,
    settle: Duration,
}

impl std::fmt::Debug for FeishuAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeishuAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("streaming_cards", &self.streaming_cards)
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
                // CardKit takes about ten operations per second per card; half of it leaves
                // room for the final's two.
                .with_max_edits_per_second(5),
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

/// The `uuid` of a unit: a UUID (version 8, RFC 9562) from SHA-256 of its key, the same on
/// every attempt and after a restart (Feishu takes at most 50 characters).
pub fn uuid_of(unit_key: &str) -> String {
    let digest = Sha256::digest(unit_key.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The creation time of a UUID v7 (the intent ids the engine writes), in ms since the epoch.
fn uuid_v7_ms(id: &str) -> Option<u64> {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || hex.as_bytes().get(12) != Some(&b'7') {
        return None;
    }
    u64::from_str_radix(&hex[..12], 16).ok()
}

/// `(msg_type, content)` of a unit: the renderer's, or a plain `text` unit's.
fn body_of(unit: &RenderedMessageUnit) -> Result<(String, String), SendError> {
    if let (Some(msg_type), Some(content)) = (
        unit.payload.get("msg_type").and_then(Value::as_str),
        unit.payload.get("content").and_then(Value::as_str),
    ) {
        return Ok((msg_type.to_owned(), content.to_owned()));
    }
    let text = text_of(unit)?;
    Ok(("text".into(), json!({ "text": text }).to_string()))
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    unit.payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a Feishu unit needs `msg_type` + `content` or a `text` string"))
}

/// The message a reply answers, and whether it goes into the answered message's thread.
fn reply_of(message: &ChannelMessage) -> Option<(String, bool)> {
    let Some(MessageRelation::Reply {
        reply_to_id: Some(id),
        thread_id,
        ..
    }) = &message.relation
    else {
        return None;
    };
    let in_thread = thread_id.is_some() || message.target.thread_id.is_some();
    Some((id.clone(), in_thread))
}

/// `receive_id_type` of a target id: an `ou_` open id for a person, else a chat id.
fn receive_id_type(id: &str) -> &'static str {
    if id.starts_with("ou_") {
        "open_id"
    } else {
        "chat_id"
    }
}

/// The card entity a part shows, when it is a streaming card.
fn card_of(part: &MessageReceiptPart) -> Option<(String, u64, bool)> {
    let raw = part.raw.as_ref()?;
    Some((
        raw.get("cardId")?.as_str()?.to_owned(),
        raw.get("cardCreatedAtMs")?.as_u64()?,
        raw.get("reconciled").and_then(Value::as_bool) == Some(true),
    ))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Content compared as JSON (key order and spacing are not the message).
fn same_content(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

impl FeishuAdapter {
    pub(crate) fn new(
        name: &str,
        api: OpenApi,
        app_id: &str,
        streaming_cards: bool,
        uuid_window_ms: u64,
        settle: Duration,
        clock: Arc<dyn Clock>,
    ) -> FeishuAdapter {
        FeishuAdapter {
            name: name.to_owned(),
            api,
            app_id: app_id.to_owned(),
            capabilities: capabilities(),
            renderer: FeishuRenderer::new(clock.clone()),
            streaming_cards,
            uuid_window_ms,
            clock,
            sequences: Mutex::new(HashMap::new()),
            attempts: Mutex::new(HashMap::new()),
            first_sent: Mutex::new(HashMap::new()),
            started: Instant::now(),
            settle,
        }
    }

    /// The gateway clock's now, in ms since the epoch.
    fn now_ms(&self) -> u64 {
        now_ms(self.clock.as_ref())
    }

    /// The receipt part of a message Feishu answered with.
    fn part(
        unit: &RenderedMessageUnit,
        data: &Value,
        uuid: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        let id = data["message_id"].as_str().ok_or_else(|| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                "Feishu answered code 0 without a message_id",
            )
        })?;
        let mut part = MessageReceiptPart::new(id, unit.kind, unit.index);
        part.thread_id = data["thread_id"].as_str().map(str::to_owned);
        part.raw = Some(json!({
            "chatId": data["chat_id"],
            "msgType": data["msg_type"],
            "uuid": uuid,
            "createTime": data["create_time"],
        }));
        Ok(part)
    }

    /// Create or reply with `(msg_type, content)` under the unit's `uuid`.
    async fn post(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        msg_type: &str,
        content: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        let key = ctx.unit_key(unit);
        let uuid = uuid_of(&key);
        lock(&self.first_sent)
            .entry(key.clone())
            .or_insert_with(|| self.now_ms());
        lock(&self.attempts).insert(key, Instant::now());
        if let Some((reply_to, in_thread)) = reply_of(&ctx.message) {
            let body = json!({ "msg_type": msg_type, "content": content,
                "reply_in_thread": in_thread, "uuid": uuid });
            let path = format!("/open-apis/im/v1/messages/{reply_to}/reply");
            match self.api.call(Method::POST, &path, &[], Some(&body)).await {
                Ok(data) => return Self::part(unit, &data, &uuid),
                // The answered message was recalled: the answer goes to the chat instead.
                Err(error) if error.code() == Some(CODE_MESSAGE_GONE) => {
                    warn!(channel = %self.name, "the answered Feishu message is gone; sending to the chat");
                }
                Err(error) => return Err(error.into_send_error("reply")),
            }
        }
        let target = &ctx.message.target.id;
        let body = json!({ "receive_id": target, "msg_type": msg_type, "content": content,
            "uuid": uuid });
        let query = [("receive_id_type", receive_id_type(target).to_owned())];
        let data = self
            .api
            .call(
                Method::POST,
                "/open-apis/im/v1/messages",
                &query,
                Some(&body),
            )
            .await
            .map_err(|e| e.into_send_error("create message"))?;
        Self::part(unit, &data, &uuid)
    }

    /// The next CardKit `sequence` of a card: strictly increasing, also across restarts (the
    /// milliseconds since the card was created, never below the last one used here + 1).
    fn next_sequence(&self, card_id: &str, created_at_ms: u64) -> i64 {
        let by_time =
            i64::try_from(self.now_ms().saturating_sub(created_at_ms)).unwrap_or(i64::MAX);
        let mut sequences = lock(&self.sequences);
        let next = sequences
            .get(card_id)
            .map_or(by_time.max(1), |last| by_time.max(last + 1));
        sequences.insert(card_id.to_owned(), next);
        next
    }

    /// Creates a streaming card entity showing `text`.
    async fn create_card(&self, text: &str) -> Result<(String, u64), SendError> {
        let body = json!({ "type": "card_json", "data": card_json(text, true).to_string() });
        let created_at = self.now_ms();
        let data = self
            .api
            .call(
                Method::POST,
                "/open-apis/cardkit/v1/cards",
                &[],
                Some(&body),
            )
            .await
            .map_err(|e| e.into_send_error("create card"))?;
        let card_id = data["card_id"]
            .as_str()
            .ok_or_else(|| invalid("CardKit answered without a card_id"))?;
        Ok((card_id.to_owned(), created_at))
    }

    /// A streaming card sent as the preview message.
    async fn show_card(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        let (card_id, created_at) = self.create_card(text).await?;
        let content = json!({ "type": "card", "data": { "card_id": card_id } }).to_string();
        let mut part = self.post(ctx, unit, "interactive", &content).await?;
        if let Some(raw) = part.raw.as_mut() {
            raw["cardId"] = json!(card_id);
            raw["cardCreatedAtMs"] = json!(created_at);
        }
        part.edit_token = Some(card_id);
        Ok(part)
    }

    /// Replaces the whole card (the fallback once streaming mode is closed).
    async fn replace_card(
        &self,
        card_id: &str,
        created_at: u64,
        text: &str,
        streaming: bool,
    ) -> Result<(), CallError> {
        let body = json!({
            "card": { "type": "card_json", "data": card_json(text, streaming).to_string() },
            "sequence": self.next_sequence(card_id, created_at),
        });
        self.api
            .call(
                Method::PUT,
                &format!("/open-apis/cardkit/v1/cards/{card_id}"),
                &[],
                Some(&body),
            )
            .await
            .map(|_| ())
    }

    /// Streams `text` into the card's element; a card whose streaming was closed is replaced
    /// whole (300309, platform-apis-wave2 §13.2).
    async fn stream_text(
        &self,
        card_id: &str,
        created_at: u64,
        text: &str,
    ) -> Result<bool, CallError> {
        let body = json!({ "content": text, "sequence": self.next_sequence(card_id, created_at) });
        let path =
            format!("/open-apis/cardkit/v1/cards/{card_id}/elements/{CARD_ELEMENT_ID}/content");
        match self.api.call(Method::PUT, &path, &[], Some(&body)).await {
            Ok(_) => Ok(true),
            Err(error) if error.code() == Some(CODE_STREAMING_CLOSED) => {
                info!(channel = %self.name, card = %card_id, "the card's streaming mode was closed; replacing the whole card");
                self.replace_card(card_id, created_at, text, false).await?;
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Closes the card's streaming mode.
    async fn close_streaming(&self, card_id: &str, created_at: u64) -> Result<(), CallError> {
        let body = json!({
            "settings": json!({ "config": { "streaming_mode": false } }).to_string(),
            "sequence": self.next_sequence(card_id, created_at),
        });
        let path = format!("/open-apis/cardkit/v1/cards/{card_id}/settings");
        match self.api.call(Method::PATCH, &path, &[], Some(&body)).await {
            Ok(_) => Ok(()),
            // Closed already (by the platform, or by an earlier attempt): the outcome wanted.
            Err(error) if error.code() == Some(CODE_STREAMING_CLOSED) => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Looks for the unit in its chat's history, after its `uuid` window.
    async fn find_in_history(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        rendered_at: u64,
    ) -> Result<Reconciliation, SendError> {
        let (msg_type, content) = body_of(unit)?;
        let key = ctx.unit_key(unit);
        let start = rendered_at.saturating_sub(HISTORY_SKEW_MS) / 1_000;
        // A reply inside a topic thread is in the thread's history, not the chat's.
        let in_thread = reply_of(&ctx.message).is_some_and(|(_, in_thread)| in_thread);
        let container = match (in_thread, &ctx.message.target.thread_id) {
            (false, _) => ("chat", ctx.message.target.id.clone()),
            (true, Some(thread)) => ("thread", thread.clone()),
            // Which thread it went to is not known: its absence could not be proven.
            (true, None) => return Ok(Reconciliation::Unresolved),
        };
        let mut query = vec![
            ("container_id_type", container.0.to_owned()),
            ("container_id", container.1),
            ("start_time", start.to_string()),
            ("sort_type", "ByCreateTimeAsc".to_owned()),
            ("page_size", HISTORY_PAGE_SIZE.to_string()),
        ];
        let mut found = Vec::new();
        for _ in 0..HISTORY_PAGES {
            let data = self
                .api
                .call(Method::GET, "/open-apis/im/v1/messages", &query, None)
                .await
                .map_err(|e| e.into_send_error("list messages"))?;
            for item in data["items"].as_array().into_iter().flatten() {
                let ours = item["sender"]["sender_type"] == "app"
                    && item["sender"]["id"].as_str() == Some(self.app_id.as_str());
                if ours
                    && item["deleted"] != Value::Bool(true)
                    && item["msg_type"].as_str() == Some(msg_type.as_str())
                    && item["body"]["content"]
                        .as_str()
                        .is_some_and(|c| same_content(c, &content))
                {
                    found.push(item.clone());
                }
            }
            match data["page_token"]
                .as_str()
                .filter(|_| data["has_more"] == Value::Bool(true))
            {
                Some(token) => {
                    query.retain(|(k, _)| *k != "page_token");
                    query.push(("page_token", token.to_owned()));
                }
                None => {
                    return Ok(match found.as_slice() {
                        [one] => {
                            let uuid = uuid_of(&key);
                            Reconciliation::Sent(Box::new(Self::part(unit, one, &uuid)?))
                        }
                        [] if self.settled(ctx, &key) => Reconciliation::NotSent,
                        _ => Reconciliation::Unresolved,
                    });
                }
            }
        }
        // A history too long to read: nothing is proven.
        Ok(Reconciliation::Unresolved)
    }

    /// Whether a card preview under this unit's uuid exists, without making one: the probe is
    /// a create under the same uuid whose content names no card entity. Feishu answers a uuid it
    /// has seen with the message it made (→ landed) before it looks at the content; an unseen
    /// one is refused for the content (→ absent), so the probe itself never shows anything.
    async fn probe_card_preview(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let content = json!({ "type": "card", "data": { "card_id": PROBE_CARD_ID } }).to_string();
        match self.post(ctx, unit, "interactive", &content).await {
            Ok(mut part) => {
                if let Some(raw) = part.raw.as_mut() {
                    raw["reconciled"] = json!(true);
                    raw["cardId"] = json!(PROBE_CARD_ID);
                    raw["cardCreatedAtMs"] = json!(self.now_ms());
                }
                Ok(Reconciliation::Sent(Box::new(part)))
            }
            Err(error) if error.kind == DeliveryFailureKind::InvalidPayload => {
                Ok(Reconciliation::NotSent)
            }
            Err(error) => Err(error),
        }
    }

    /// Whether a history absence proves the unit never landed: no send of it may still be in
    /// flight, from this process or one stopped mid-request shortly before it started.
    fn settled(&self, ctx: &SendContext, key: &str) -> bool {
        let recent = |at: Instant| at.elapsed() < self.settle;
        if lock(&self.attempts).get(key).copied().is_some_and(recent) {
            return false;
        }
        !(ctx.intent_id.is_some() && recent(self.started))
    }
}

#[async_trait]
impl ChannelMessageAdapter for FeishuAdapter {
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
        let (msg_type, content) = body_of(unit)?;
        self.post(ctx, unit, &msg_type, &content).await
    }

    async fn edit(
        &self,
        _ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        if let Some((card_id, created_at, _)) = card_of(part) {
            self.replace_card(&card_id, created_at, text_of(unit)?, false)
                .await
                .map_err(|e| e.into_send_error("update card"))?;
            return Ok(part.clone());
        }
        let (msg_type, content) = body_of(unit)?;
        let path = format!("/open-apis/im/v1/messages/{}", part.platform_message_id);
        // Text and post are replaced with PUT; a card message is patched.
        let (method, body) = if msg_type == "interactive" {
            (Method::PATCH, json!({ "content": content }))
        } else {
            (
                Method::PUT,
                json!({ "msg_type": msg_type, "content": content }),
            )
        };
        self.api
            .call(method, &path, &[], Some(&body))
            .await
            .map_err(|e| e.into_send_error("update message"))?;
        let mut edited = part.clone();
        edited.kind = unit.kind;
        Ok(edited)
    }

    async fn delete(&self, _ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let path = format!("/open-apis/im/v1/messages/{}", part.platform_message_id);
        match self.api.call(Method::DELETE, &path, &[], None).await {
            Ok(_) => Ok(()),
            // Recalled before (a retry whose first answer was lost): the outcome wanted.
            Err(error) if error.code() == Some(CODE_MESSAGE_GONE) => Ok(()),
            Err(error) => Err(error.into_send_error("recall message")),
        }
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        let sent_here = lock(&self.attempts).contains_key(&key);
        // Outside a durable intent no process before this one could have sent it.
        if !sent_here && ctx.intent_id.is_none() {
            return Ok(Reconciliation::NotSent);
        }
        // The earliest moment the uuid can have been first used: nothing earlier than the unit's
        // render, its intent's creation, or this process's first attempt.
        let rendered_at = [
            unit.payload.get("renderedAtMs").and_then(Value::as_u64),
            ctx.intent_id
                .as_ref()
                .and_then(|id| uuid_v7_ms(id.as_str())),
            lock(&self.first_sent).get(&key).copied(),
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(0);
        let within_window = self.now_ms().saturating_sub(rendered_at) < self.uuid_window_ms;
        let preview = unit.kind == MessagePartKind::Preview;
        if within_window && preview && self.streaming_cards {
            return self.probe_card_preview(ctx, unit).await;
        }
        if within_window {
            // The same request under the same uuid: Feishu sends it now or not again.
            let mut part = self.send_unit(ctx, unit).await?;
            if preview && let Some(raw) = part.raw.as_mut() {
                raw["reconciled"] = json!(true);
            }
            info!(channel = %self.name, unit = %key, message = %part.platform_message_id, "an unknown Feishu send was settled under its uuid");
            return Ok(Reconciliation::Sent(Box::new(part)));
        }
        if preview && self.streaming_cards {
            // A card message's content names a card entity this process cannot know: its
            // history entry cannot be matched. The preview may show; an operator decides.
            warn!(channel = %self.name, unit = %key, "a Feishu card preview's outcome is unknown past its uuid window");
            return Ok(Reconciliation::Undecidable);
        }
        self.find_in_history(ctx, unit, rendered_at).await
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(&self.renderer)
    }
}

#[async_trait]
impl MessageLiveAdapter for FeishuAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        if self.streaming_cards {
            return self.show_card(ctx, unit, text_of(unit)?).await;
        }
        self.send_unit(ctx, unit).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        match card_of(preview) {
            // Which card a settled preview shows is not certain: it waits for the final.
            Some((_, _, true)) => Ok(preview.clone()),
            Some((card_id, created_at, false)) => {
                self.stream_text(&card_id, created_at, text_of(unit)?)
                    .await
                    .map_err(|e| e.into_send_error("stream card"))?;
                Ok(preview.clone())
            }
            None => self.edit(ctx, preview, unit).await,
        }
    }

    fn can_finalize_in_place(&self, preview: &MessageReceiptPart) -> bool {
        !matches!(card_of(preview), Some((_, _, true)))
    }

    /// The final is the card itself (the seed's duplicate-final suppression): its text is
    /// streamed in and streaming is closed; no second message carries it.
    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let Some((card_id, created_at, false)) = card_of(preview) else {
            return self.edit(ctx, preview, final_unit).await;
        };
        if final_unit.payload["msg_type"] != "text"
            && final_unit.payload["msg_type"] != "post"
            && final_unit.payload.get("msg_type").is_some()
        {
            // A card or raw final of its own is not the streamed text: sent on its own.
            return Err(invalid(
                "a card or raw final is not streamed into the preview card",
            ));
        }
        let text = text_of(final_unit)?;
        let streamed = self
            .stream_text(&card_id, created_at, text)
            .await
            .map_err(|e| e.into_send_error("stream card"))?;
        if streamed {
            self.close_streaming(&card_id, created_at)
                .await
                .map_err(|e| e.into_send_error("close card streaming"))?;
        }
        let mut part = preview.clone();
        part.kind = final_unit.kind;
        part.index = final_unit.index;
        Ok(part)
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
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn uuids_are_stable_per_unit_and_fit_feishu() {
        let a = uuid_of("feishu:reply:om_1:0#0");
        assert_eq!(a, uuid_of("feishu:reply:om_1:0#0"));
        assert_ne!(a, uuid_of("feishu:reply:om_1:0#1"));
        assert!(a.len() <= 50);
        assert_eq!(&a[14..15], "8", "version 8");
    }

    #[test]
    fn targets_and_replies_pick_their_endpoint() {
        assert_eq!(receive_id_type("ou_123"), "open_id");
        assert_eq!(receive_id_type("oc_123"), "chat_id");
        let mut m = ChannelMessage::outbound(
            "m",
            "feishu",
            clawgate_types::MessageTarget::group("oc_1"),
            "x",
        );
        assert_eq!(reply_of(&m), None);
        m.relation = Some(MessageRelation::reply_to_inbound("om_9"));
        assert_eq!(reply_of(&m), Some(("om_9".into(), false)));
        m.target.thread_id = Some("omt_1".into());
        assert_eq!(reply_of(&m), Some(("om_9".into(), true)));
    }

    #[test]
    fn an_intent_ids_time_is_read_from_its_uuid_v7() {
        assert_eq!(
            uuid_v7_ms("0192f0c1-2a3b-7c4d-8e5f-001122334455"),
            Some(0x0192_f0c1_2a3b)
        );
        assert_eq!(uuid_v7_ms("0192f0c1-2a3b-4c4d-8e5f-001122334455"), None);
        assert_eq!(uuid_v7_ms("intent-1"), None);
    }

    #[test]
    fn content_is_compared_as_json() {
        assert!(same_content(r#"{"text":"a"}"#, r#"{ "text" : "a" }"#));
        assert!(!same_content(r#"{"text":"a"}"#, r#"{"text":"b"}"#));
    }

    /// The uuid window is read on the gateway's clock: a lost send is settled by its uuid
    /// while the clock is inside the window, and from the chat's history once the clock has
    /// moved past it (no wall-clock hour passes here).
    #[cfg(feature = "simulator")]
    #[tokio::test]
    async fn the_uuid_window_runs_on_the_gateways_clock() {
        use clawgate_channel_sdk::Secret;
        use clawgate_types::clock::{ManualClock, SystemClock};

        use crate::simulator::{Fault, FaultKind, FeishuSimulator, SimulatorConfig};

        let sim = FeishuSimulator::start(SimulatorConfig::default())
            .await
            .unwrap();
        let config = sim.config().clone();
        let api = OpenApi::new(
            &sim.api_url(),
            &config.app_id,
            Secret::new(&config.app_secret),
            Duration::from_secs(3),
        );
        // The simulator stamps messages with the host's time and history is searched from the
        // render time: the driven clock starts at the host's now.
        let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
        let window_ms = 55 * 60 * 1_000;
        let adapter = FeishuAdapter::new(
            "feishu",
            api,
            &config.app_id,
            false,
            window_ms,
            Duration::ZERO,
            clock.clone(),
        );
        let chat = sim.group("g", &["ada"]);
        let lost_send = |text: &str, key: &str| {
            let m = ChannelMessage::outbound(
                "m1",
                "feishu",
                clawgate_types::MessageTarget::group(&chat),
                text,
            );
            let unit = adapter
                .render()
                .unwrap()
                .render(&m, adapter.capabilities(), key)
                .unwrap()
                .units
                .remove(0);
            (SendContext::new(m, key), unit)
        };
        let history_reads = || {
            sim.calls()
                .iter()
                .filter(|c| c.method == "GET" && c.path == "/open-apis/im/v1/messages")
                .count()
        };

        // Both sends are made (and their answers lost) at the simulator's now.
        let (inside_ctx, inside) = lost_send("inside the window", "k1");
        let (past_ctx, past) = lost_send("past the window", "k2");
        for (ctx, unit) in [(&inside_ctx, &inside), (&past_ctx, &past)] {
            sim.inject(Fault::once(FaultKind::LoseAnswer));
            adapter.send_unit(ctx, unit).await.unwrap_err();
        }
        let creates = || sim.calls().iter().filter(|c| c.method == "POST").count();

        clock.advance(window_ms as i64 - 1_000);
        let settled = adapter
            .reconcile_unknown_send(&inside_ctx, &inside)
            .await
            .unwrap();
        assert!(matches!(settled, Reconciliation::Sent(_)), "{settled:?}");
        assert_eq!(history_reads(), 0, "inside the window the uuid settles it");

        clock.advance(2_000);
        let creates_before = creates();
        let settled = adapter
            .reconcile_unknown_send(&past_ctx, &past)
            .await
            .unwrap();
        assert!(matches!(settled, Reconciliation::Sent(_)), "{settled:?}");
        assert_eq!(history_reads(), 1, "past the window history settles it");
        assert_eq!(
            creates(),
            creates_before,
            "past the window nothing is sent again"
        );
        assert_eq!(sim.bot_messages(&chat).len(), 2);
        sim.stop().await;
    }
}
