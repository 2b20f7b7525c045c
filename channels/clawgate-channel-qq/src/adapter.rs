//! Sending: passive replies keyed by `(msg_id, msg_seq)`, active messages within a quota, C2C
//! stream previews, recalls, and settling a send whose answer was lost.
//!
//! - **Passive reply** (`msg_id` of the answered inbound message): `msg_seq` is derived from the
//!   unit's durable key ([`msg_seq_of`]), so every attempt of a unit — after a lost answer, after
//!   a restart — repeats the same pair. QQ acts on a pair once; a repeat answers **40054005**
//!   (deduplicated), which means the earlier request landed. QQ returns no message id then: the
//!   receipt part's id is `<msg_id>:<msg_seq>` and its `raw` says `"deduplicated": true`.
//! - **Active message** (no `msg_id`): only when the passive window is closed (expired, or the
//!   message's replies are used up) and the account's `active_quota_per_month` for that user or
//!   group is not used up; else a typed `permission` refusal, never a silent drop. QQ does not
//!   deduplicate active messages, so each attempt is written to the [`ActiveJournal`] first and a
//!   lost answer is parked ([`Reconciliation::Undecidable`]): QQ has no message lookup to tell.
//! - **C2C stream previews** ([`MessageLiveAdapter`]): the first chunk is a passive stream message
//!   (`stream: {state: 1, index: 1}`) whose answer's id names the stream; later chunks append the
//!   new text (or `reset` it). A stream idle longer than `stream_idle_timeout_ms` (the
//!   accumulator timeout) is not continued: QQ closes idle streams. QQ messages cannot be edited,
//!   so the engine never finalizes a preview in place: it recalls the stream message and sends
//!   the final — the accumulated text — as a plain passive reply, which a lost answer cannot
//!   duplicate. Groups get no previews (QQ streams C2C only): one plain final.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageRenderAdapter, Reconciliation, SendContext,
    SendError,
};
use clawgate_types::clock::Clock;
use clawgate_types::{
    AttachmentCapabilities, ChannelMessage, DeliveryCapabilities, DeliveryFailureKind,
    LiveCancelReason, LiveCapabilities, MessageCapabilities, MessagePartKind, MessageReceiptPart,
    RenderedMessageUnit, TargetKind, TextCapabilities,
};
use reqwest::Method;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::client::{CODE_DEDUPLICATED, CODE_MESSAGE_GONE, CallError, OpenApi, send_error};
use crate::journal::{ActiveAttempt, ActiveJournal, JournalError};
use crate::passive::{answered_msg_id, msg_seq_of};
use crate::receive::RecentInbound;
use crate::render::{FILE_VOICE, MAX_TEXT_CHARS, QqRenderer};
use crate::tts::Tts;

/// What a preview probe shows when the preview it looks for never landed (the engine asks
/// about a preview without its text).
pub const PROBE_TEXT: &str = "…";

/// The conversation a message goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chat<'a> {
    /// A person (C2C), by their `user_openid`.
    User(&'a str),
    /// A group, by its `group_openid`.
    Group(&'a str),
}

impl Chat<'_> {
    fn base(&self) -> String {
        match self {
            Chat::User(openid) => format!("/v2/users/{openid}"),
            Chat::Group(openid) => format!("/v2/groups/{openid}"),
        }
    }

    fn id(&self) -> &str {
        match self {
            Chat::User(id) | Chat::Group(id) => id,
        }
    }
}

fn chat_of(message: &ChannelMessage) -> Result<Chat<'_>, SendError> {
    let id = message.target.id.as_str();
    match message.target.kind {
        TargetKind::Direct => Ok(Chat::User(id)),
        TargetKind::Group => Ok(Chat::Group(id)),
        other => Err(invalid(format!(
            "a QQ message goes to a person (direct, user_openid) or a group (group_openid), not \
             a {other:?} target"
        ))),
    }
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

/// A journal that cannot be read or written: nothing was sent; try again later.
fn journal_failed(error: JournalError) -> SendError {
    SendError::before_io(DeliveryFailureKind::Transient, error.to_string())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the channel can do.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_attachments(
            AttachmentCapabilities::default()
                .with_remote_url(true)
                .with_upload(false),
        )
        .with_live(
            LiveCapabilities::default()
                // QQ messages cannot be edited: a preview is recalled, never finalized in place.
                .with_edit(false)
                .with_delete(true)
                .with_native_stream(true)
                .with_max_edits_per_second(2),
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

/// A C2C stream this process is writing.
#[derive(Debug, Clone)]
struct Stream {
    index: u64,
    shown: String,
    last_chunk: Instant,
}

/// How a passive reply ended.
enum Passive {
    Sent(MessageReceiptPart),
    /// The window is closed (expired or out of replies): nothing was sent.
    Closed(SendError),
}

/// The QQ Bot sender: one bot.
pub struct QqAdapter {
    name: String,
    api: OpenApi,
    journal: ActiveJournal,
    /// The gateway's clock (the month an active message is counted in).
    clock: Arc<dyn Clock>,
    capabilities: MessageCapabilities,
    renderer: QqRenderer,
    tts: Option<Tts>,
    active_quota: u32,
    c2c_streaming: bool,
    stream_idle: Duration,
    streams: Mutex<HashMap<String, Stream>>,
    /// Unit keys this process sent (a direct send never sent here provably never went out).
    attempted: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for QqAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QqAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("active_quota", &self.active_quota)
            .field("c2c_streaming", &self.c2c_streaming)
            .finish_non_exhaustive()
    }
}

/// How an adapter is set up (from the account's settings).
#[derive(Debug, Clone)]
pub(crate) struct AdapterConfig {
    pub(crate) active_quota: u32,
    pub(crate) c2c_streaming: bool,
    pub(crate) stream_idle: Duration,
    pub(crate) text_as_voice: bool,
    pub(crate) tts: Option<Tts>,
    pub(crate) recent: Arc<RecentInbound>,
    pub(crate) clock: Arc<dyn Clock>,
}

impl QqAdapter {
    pub(crate) fn new(
        name: &str,
        api: OpenApi,
        journal: ActiveJournal,
        config: AdapterConfig,
    ) -> QqAdapter {
        QqAdapter {
            name: name.to_owned(),
            api,
            journal,
            clock: config.clock,
            capabilities: capabilities(),
            renderer: QqRenderer {
                text_as_voice: config.text_as_voice,
                tts: config.tts.is_some(),
                recent: config.recent,
            },
            tts: config.tts,
            active_quota: config.active_quota,
            c2c_streaming: config.c2c_streaming,
            stream_idle: config.stream_idle,
            streams: Mutex::new(HashMap::new()),
            attempted: Mutex::new(HashSet::new()),
        }
    }

    /// Journals the id of a passive reply QQ answered (not an id-less dedupe receipt).
    async fn remember(&self, key: &str, part: &MessageReceiptPart) {
        let deduplicated = part
            .raw
            .as_ref()
            .is_some_and(|r| r.get("deduplicated") == Some(&Value::Bool(true)));
        if deduplicated {
            return;
        }
        if let Err(error) = self
            .journal
            .answered_passive(key, &part.platform_message_id)
            .await
        {
            warn!(channel = %self.name, %error, "a passive reply's id was not journaled; a later check of it gets the id-less receipt");
        }
    }

    /// The inbound message a unit answers, from durable data: the one its render chose (in
    /// the stored batch), or the send's relation or key.
    fn durable_reply_to(ctx: &SendContext, unit: &RenderedMessageUnit) -> Option<String> {
        unit.payload
            .get("replyTo")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| answered_msg_id(ctx))
    }

    /// The inbound message a unit answers: from durable data, else the choice an earlier
    /// attempt journaled (on any gateway), else the chat's latest message — journaled, durably,
    /// before the send, so every attempt answers the same message under the same `msg_seq`.
    async fn choose_reply_to(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Option<String>, SendError> {
        if let Some(msg_id) = Self::durable_reply_to(ctx, unit) {
            return Ok(Some(msg_id));
        }
        let key = ctx.unit_key(unit);
        if let Some(msg_id) = self.journal.chosen(&key).await.map_err(journal_failed)? {
            return Ok(Some(msg_id));
        }
        let Some(msg_id) = self.renderer.recent.latest(&ctx.message.target) else {
            return Ok(None);
        };
        let chosen = self
            .journal
            .chose(&key, &msg_id)
            .await
            .map_err(journal_failed)?;
        Ok(Some(chosen))
    }

    /// The inbound message an earlier attempt of a unit answered, when it was a passive reply.
    async fn attempted_reply_to(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Option<String>, SendError> {
        match Self::durable_reply_to(ctx, unit) {
            Some(msg_id) => Ok(Some(msg_id)),
            None => self
                .journal
                .chosen(&ctx.unit_key(unit))
                .await
                .map_err(journal_failed),
        }
    }

    /// Uploads a file for `chat` (`srv_send_msg: false`: nothing is sent) and returns its
    /// `file_info`. A lost answer sent nothing either, so every failure here is before I/O.
    async fn upload(&self, chat: Chat<'_>, body: Value) -> Result<String, SendError> {
        let path = format!("{}/files", chat.base());
        let answer = self
            .api
            .call(Method::POST, &path, Some(&body))
            .await
            .map_err(|e| {
                let mut error = send_error(e, "media upload");
                // An upload with srv_send_msg false never shows anything: nothing was sent.
                error.side_effect = clawgate_channel_sdk::SideEffect::None;
                if error.kind == DeliveryFailureKind::Unknown {
                    error.kind = DeliveryFailureKind::Transient;
                }
                error
            })?;
        answer
            .get("file_info")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| {
                SendError::before_io(
                    DeliveryFailureKind::Transient,
                    "QQ media upload answered without file_info",
                )
            })
    }

    /// The message body of a unit (without `msg_id` / `msg_seq`): text, or media after its
    /// upload, or a TTS voice after its synthesis and upload.
    async fn body_of(
        &self,
        chat: Chat<'_>,
        unit: &RenderedMessageUnit,
    ) -> Result<Value, SendError> {
        let payload = &unit.payload;
        if let Some(media) = payload.get("media") {
            let file_type = media.get("file_type").and_then(Value::as_u64).unwrap_or(1);
            let url = media
                .get("url")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("a QQ media unit needs media.url"))?;
            let file_info = self
                .upload(
                    chat,
                    json!({ "file_type": file_type, "url": url, "srv_send_msg": false }),
                )
                .await?;
            return Ok(
                json!({ "msg_type": 7, "content": " ", "media": { "file_info": file_info } }),
            );
        }
        if let Some(tts) = payload.get("tts") {
            let text = tts
                .get("text")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("a QQ voice unit needs tts.text"))?;
            let engine = self.tts.as_ref().ok_or_else(|| {
                invalid("text as voice needs a tts_command in the channel's settings")
            })?;
            let audio = engine.speak(text).await?;
            let file_data = base64::engine::general_purpose::STANDARD.encode(audio);
            let file_info = self
                .upload(
                    chat,
                    json!({ "file_type": FILE_VOICE, "file_data": file_data, "srv_send_msg": false }),
                )
                .await?;
            return Ok(
                json!({ "msg_type": 7, "content": " ", "media": { "file_info": file_info } }),
            );
        }
        let text = payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a QQ unit needs `text`, `media` or `tts`"))?;
        if text.trim().is_empty() {
            return Err(invalid("QQ refuses an empty message"));
        }
        Ok(json!({ "msg_type": 0, "content": text }))
    }

    fn part(unit: &RenderedMessageUnit, id: &str, raw: Value) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(id, unit.kind, unit.index);
        part.raw = Some(raw);
        part
    }

    /// A passive reply to `msg_id` under `msg_seq`.
    async fn passive(
        &self,
        chat: Chat<'_>,
        unit: &RenderedMessageUnit,
        mut body: Value,
        msg_id: &str,
        msg_seq: u64,
    ) -> Result<Passive, SendError> {
        body["msg_id"] = json!(msg_id);
        body["msg_seq"] = json!(msg_seq);
        let path = format!("{}/messages", chat.base());
        match self.api.call(Method::POST, &path, Some(&body)).await {
            Ok(answer) => {
                let id = answer.get("id").and_then(Value::as_str).ok_or_else(|| {
                    SendError::after_io(
                        DeliveryFailureKind::Unknown,
                        "QQ answered a passive reply without an id",
                    )
                })?;
                Ok(Passive::Sent(Self::part(
                    unit,
                    id,
                    json!({ "msgId": msg_id, "msgSeq": msg_seq, "passive": true }),
                )))
            }
            Err(Ok(CallError::Refused(error))) if error.code == CODE_DEDUPLICATED => {
                // The pair was used: an earlier attempt of this very unit landed.
                info!(channel = %self.name, msg_id, msg_seq, "QQ deduplicated a passive reply: it had landed");
                Ok(Passive::Sent(Self::part(
                    unit,
                    &format!("{msg_id}:{msg_seq}"),
                    json!({ "msgId": msg_id, "msgSeq": msg_seq, "passive": true,
                        "deduplicated": true }),
                )))
            }
            Err(Ok(CallError::Refused(error))) if error.passive_closed() => Ok(Passive::Closed(
                CallError::Refused(error).into_send_error("passive reply"),
            )),
            Err(error) => Err(send_error(error, "passive reply")),
        }
    }

    /// An active message, journaled first and counted against the quota.
    async fn active(
        &self,
        ctx: &SendContext,
        chat: Chat<'_>,
        unit: &RenderedMessageUnit,
        body: Value,
        why: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        let key = ctx.unit_key(unit);
        if self.active_quota == 0 {
            return Err(SendError::before_io(
                DeliveryFailureKind::Permission,
                format!(
                    "QQ: not sent to {}: {why}, and active messages are off for this account \
                     (active_quota_per_month = 0)",
                    chat.id()
                ),
            ));
        }
        let reserved = self
            .journal
            .reserve(&key, chat.id(), self.clock.now_ms(), self.active_quota)
            .await
            .map_err(journal_failed)?;
        if !reserved {
            return Err(SendError::before_io(
                DeliveryFailureKind::Permission,
                format!(
                    "QQ: not sent to {}: {why}, and the {} active messages a month this account \
                     allows it are used up (active_quota_per_month)",
                    chat.id(),
                    self.active_quota
                ),
            ));
        }
        warn!(channel = %self.name, to = chat.id(), unit = %key, "{why}: sending an active message");
        let path = format!("{}/messages", chat.base());
        let answer = self
            .api
            .call(Method::POST, &path, Some(&body))
            .await
            .map_err(|e| send_error(e, "active message"))?;
        let id = answer.get("id").and_then(Value::as_str).ok_or_else(|| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                "QQ answered an active message without an id",
            )
        })?;
        if let Err(error) = self.journal.answered(&key, id).await {
            warn!(channel = %self.name, %error, "the active message's id was not journaled; a lost-answer check of it would park it");
        }
        Ok(Self::part(unit, id, json!({ "passive": false })))
    }

    /// One stream chunk; returns the answer's id.
    async fn chunk(
        &self,
        openid: &str,
        msg_id: &str,
        msg_seq: u64,
        content: &str,
        stream: Value,
    ) -> Result<Option<String>, Result<CallError, crate::client::TokenError>> {
        let body = json!({ "msg_type": 0, "content": content, "msg_id": msg_id,
            "msg_seq": msg_seq, "stream": stream });
        let path = format!("/v2/users/{openid}/messages");
        let answer = self.api.call(Method::POST, &path, Some(&body)).await?;
        Ok(answer.get("id").and_then(Value::as_str).map(str::to_owned))
    }

    /// Appends (or resets to) `text` on a stream this process writes; `state` 1 = more to come,
    /// 10 = done. Any failure ends the stream here: its index is no longer certain.
    async fn continue_stream(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        text: &str,
        state: u64,
    ) -> Result<(), SendError> {
        let id = preview.platform_message_id.clone();
        let Chat::User(openid) = chat_of(&ctx.message)? else {
            return Err(invalid("QQ streams C2C messages only"));
        };
        let raw = preview.raw.clone().unwrap_or(Value::Null);
        let (Some(msg_id), Some(msg_seq)) = (
            raw.get("msgId").and_then(Value::as_str),
            raw.get("msgSeq").and_then(Value::as_u64),
        ) else {
            return Err(invalid("this preview is not a QQ stream message"));
        };
        let Some(stream) = lock(&self.streams).get(&id).cloned() else {
            return Err(SendError::before_io(
                DeliveryFailureKind::Conflict,
                "the QQ stream was not started by this process (or ended): it is not continued",
            ));
        };
        if stream.last_chunk.elapsed() > self.stream_idle {
            lock(&self.streams).remove(&id);
            return Err(SendError::before_io(
                DeliveryFailureKind::Conflict,
                format!(
                    "the QQ stream was idle for more than {} ms (the accumulator timeout): the \
                     final is sent as a plain reply",
                    self.stream_idle.as_millis()
                ),
            ));
        }
        let (content, reset) = match text.strip_prefix(stream.shown.as_str()) {
            Some(delta) => (delta, false),
            None => (text, true),
        };
        if content.is_empty() && state == 1 {
            return Ok(());
        }
        let index = if reset { 1 } else { stream.index + 1 };
        let chunk = json!({ "state": state, "id": id, "index": index, "reset": reset });
        match self.chunk(openid, msg_id, msg_seq, content, chunk).await {
            Ok(_) if state == 1 => {
                lock(&self.streams).insert(
                    id,
                    Stream {
                        index,
                        shown: text.to_owned(),
                        last_chunk: Instant::now(),
                    },
                );
                Ok(())
            }
            Ok(_) => {
                lock(&self.streams).remove(&id);
                Ok(())
            }
            Err(error) => {
                lock(&self.streams).remove(&id);
                Err(send_error(error, "stream chunk"))
            }
        }
    }

    /// Recalls a message (a preview).
    async fn recall(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        lock(&self.streams).remove(&part.platform_message_id);
        if part
            .raw
            .as_ref()
            .is_some_and(|r| r.get("deduplicated") == Some(&Value::Bool(true)))
        {
            return Err(SendError::before_io(
                DeliveryFailureKind::NotFound,
                "QQ never named this message's id (settled by deduplication): it cannot be recalled",
            ));
        }
        let chat = chat_of(&ctx.message)?;
        let path = format!("{}/messages/{}", chat.base(), part.platform_message_id);
        match self.api.call(Method::DELETE, &path, None).await {
            Ok(_) => Ok(()),
            Err(Ok(error)) if error.code() == Some(CODE_MESSAGE_GONE) => Ok(()),
            Err(error) => Err(send_error(error, "recall")),
        }
    }

    /// Settles a preview whose first chunk's answer was lost: the first chunk again under the
    /// same pair. The engine asks without the text, so the probe shows [`PROBE_TEXT`] when the
    /// preview never landed; the engine then removes it or replaces its text.
    async fn reconcile_preview(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let mut probe = unit.clone();
        if probe
            .payload
            .get("text")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            probe.payload = json!({ "text": PROBE_TEXT });
        }
        match self.show(ctx, &probe).await {
            Ok(part) => Ok(Reconciliation::Sent(Box::new(part))),
            Err(error) if error.platform_code.as_deref() == Some("40054005") => {
                // It landed, and QQ will not say its id: nothing can continue or recall it.
                warn!(channel = %self.name, "a QQ stream preview landed but its id is unknown; it stays as it is");
                Ok(Reconciliation::Undecidable)
            }
            Err(error) if error.side_effect == clawgate_channel_sdk::SideEffect::None => {
                // Refused now (the window closed, say): whether it landed then is unknown.
                warn!(channel = %self.name, error = %error.message, "a QQ stream preview's outcome cannot be told");
                Ok(Reconciliation::Undecidable)
            }
            Err(error) => Err(error),
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for QqAdapter {
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
        let chat = chat_of(&ctx.message)?;
        let body = self.body_of(chat, unit).await?;
        lock(&self.attempted).insert(ctx.unit_key(unit));
        let why = match self.choose_reply_to(ctx, unit).await? {
            Some(msg_id) => {
                let msg_seq = msg_seq_of(&ctx.unit_key(unit));
                match self
                    .passive(chat, unit, body.clone(), &msg_id, msg_seq)
                    .await?
                {
                    Passive::Sent(part) => {
                        self.remember(&ctx.unit_key(unit), &part).await;
                        return Ok(part);
                    }
                    Passive::Closed(error) => {
                        format!(
                            "the passive reply to {msg_id} was refused ({})",
                            error.message
                        )
                    }
                }
            }
            None => "it answers no inbound message".to_owned(),
        };
        self.active(ctx, chat, unit, body, &why).await
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        self.recall(ctx, part).await
    }

    /// - An active attempt in the journal: its recorded id, else [`Reconciliation::Undecidable`]
    ///   (QQ does not deduplicate active messages and has no lookup).
    /// - A passive reply: the same `(msg_id, msg_seq)` again. An id or 40054005 settles it as
    ///   sent; a closed window leaves it undecidable (it may have landed before it closed).
    /// - Neither (no answered message, nothing journaled): it never went out.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        if unit.kind == MessagePartKind::Preview {
            return self.reconcile_preview(ctx, unit).await;
        }
        let key = ctx.unit_key(unit);
        // From the store, not from what this process saw: another gateway may have sent it.
        match self.journal.attempt(&key).await.map_err(journal_failed)? {
            Some(ActiveAttempt::Answered(id)) => {
                return Ok(Reconciliation::Sent(Box::new(Self::part(
                    unit,
                    &id,
                    json!({ "passive": false }),
                ))));
            }
            Some(ActiveAttempt::Unanswered) => {
                warn!(channel = %self.name, unit = %key, "an active QQ message's answer was lost: QQ cannot tell whether it landed; parked");
                return Ok(Reconciliation::Undecidable);
            }
            None => {}
        }
        if let Some(id) = self
            .journal
            .passive_id(&key)
            .await
            .map_err(journal_failed)?
        {
            return Ok(Reconciliation::Sent(Box::new(Self::part(
                unit,
                &id,
                json!({ "passive": true }),
            ))));
        }
        let sent_here = lock(&self.attempted).contains(&key);
        if !sent_here && ctx.intent_id.is_none() {
            // A direct send (no durable intent) this process never made.
            return Ok(Reconciliation::NotSent);
        }
        let Some(msg_id) = self.attempted_reply_to(ctx, unit).await? else {
            // Not a passive reply, and no active attempt in the journal: it never went out.
            return Ok(Reconciliation::NotSent);
        };
        let chat = chat_of(&ctx.message)?;
        let body = self.body_of(chat, unit).await?;
        let msg_seq = msg_seq_of(&key);
        match self.passive(chat, unit, body, &msg_id, msg_seq).await? {
            Passive::Sent(part) => Ok(Reconciliation::Sent(Box::new(part))),
            Passive::Closed(error) => {
                warn!(channel = %self.name, unit = %key, error = %error.message, "a passive QQ reply's outcome is unknown and its window closed; parked");
                Ok(Reconciliation::Undecidable)
            }
        }
    }

    fn previews(&self, message: &ChannelMessage) -> bool {
        self.c2c_streaming
            && message.target.kind == TargetKind::Direct
            && !self.renderer.speaks(message)
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(&self.renderer)
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }
}

#[async_trait]
impl MessageLiveAdapter for QqAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let Chat::User(openid) = chat_of(&ctx.message)? else {
            return Err(invalid("QQ streams C2C messages only"));
        };
        let msg_id = self.choose_reply_to(ctx, unit).await?.ok_or_else(|| {
            invalid("a QQ stream is a passive reply: it needs the answered msg_id")
        })?;
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| invalid("a QQ stream preview needs text"))?;
        let msg_seq = msg_seq_of(&ctx.unit_key(unit));
        lock(&self.attempted).insert(ctx.unit_key(unit));
        let id = self
            .chunk(
                openid,
                &msg_id,
                msg_seq,
                text,
                json!({ "state": 1, "index": 1 }),
            )
            .await
            .map_err(|e| send_error(e, "stream start"))?
            .ok_or_else(|| {
                SendError::after_io(
                    DeliveryFailureKind::Unknown,
                    "QQ answered a stream's first chunk without its id",
                )
            })?;
        lock(&self.streams).insert(
            id.clone(),
            Stream {
                index: 1,
                shown: text.to_owned(),
                last_chunk: Instant::now(),
            },
        );
        Ok(Self::part(
            unit,
            &id,
            json!({ "msgId": msg_id, "msgSeq": msg_seq, "stream": true }),
        ))
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a QQ stream preview needs text"))?;
        self.continue_stream(ctx, preview, text, 1).await?;
        Ok(preview.clone())
    }

    fn can_finalize_in_place(&self, preview: &MessageReceiptPart) -> bool {
        lock(&self.streams)
            .get(&preview.platform_message_id)
            .is_some_and(|s| s.last_chunk.elapsed() <= self.stream_idle)
    }

    /// Ends the stream with the final text (`state: 10`). The engine calls it only for a
    /// channel that edits; QQ does not, so finals arrive as plain replies instead.
    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = final_unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .filter(|_| final_unit.kind == MessagePartKind::Text)
            .ok_or_else(|| invalid("only a text final can end a QQ stream"))?;
        self.continue_stream(ctx, preview, text, 10).await?;
        let mut part = preview.clone();
        part.kind = final_unit.kind;
        Ok(part)
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        info!(channel = %self.name, ?reason, stream = %preview.platform_message_id, "recalling the QQ stream preview");
        self.recall(ctx, preview).await
    }
}
