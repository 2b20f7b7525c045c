//! Sending: `sendMessage` and the media methods, `editMessageText`, `deleteMessage`,
//! `sendChatAction`, and previews (`sendMessage` + edits, or `sendMessageDraft` in private
//! chats).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageRenderAdapter, SendContext, SendError,
};
use clawgate_types::{
    AttachmentCapabilities, ChannelMessage, DeliveryCapabilities, DeliveryFailureKind,
    LiveCancelReason, LiveCapabilities, MessageAttachment, MessageCapabilities, MessagePartKind,
    MessageReceiptPart, MessageRelation, MessageTarget, RenderedMessageUnit, TargetKind,
    TextCapabilities, ThreadCapabilities,
};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::client::{BotApi, CallError};
use crate::migrations::Migrations;
use crate::render::{MAX_CAPTION_CHARS, TelegramRenderer};
use crate::wire::Message;

/// Longest text of one message, after entity parsing.
pub const MAX_TEXT_CHARS: u32 = 4096;
/// How often an edit whose answer was lost is sent again (an edit is idempotent: the same text
/// twice leaves one message, and Telegram answers the repeat with "message is not modified").
const EDIT_ATTEMPTS: u32 = 3;
/// The receipt id prefix of a native draft (`sendMessageDraft` creates no message).
const DRAFT_PREFIX: &str = "draft:";
/// The suffix the engine gives a preview's key (`clawgate_messages::PREVIEW_KEY_SUFFIX`).
const PREVIEW_KEY_SUFFIX: &str = "~preview";

/// The Telegram sender: one bot account.
pub struct TelegramAdapter {
    name: String,
    api: BotApi,
    capabilities: MessageCapabilities,
    renderer: TelegramRenderer,
    migrations: Arc<Migrations>,
    /// Previews in private chats are native drafts while Telegram allows this bot them.
    drafts: AtomicBool,
    /// Show "typing…" while the agent works.
    typing: bool,
}

impl std::fmt::Debug for TelegramAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelegramAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("drafts", &self.drafts.load(Ordering::Relaxed))
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
        // Media by URL: Telegram fetches it. Uploads are not implemented.
        .with_attachments(
            AttachmentCapabilities::default()
                .with_upload(false)
                .with_remote_url(true)
                .with_voice(true),
        )
        .with_threads(
            ThreadCapabilities::default()
                .with_reply(true)
                .with_topic(true)
                .with_native_thread(false),
        )
        .with_live(
            LiveCapabilities::default()
                .with_edit(true)
                .with_delete(true)
                .with_native_stream(true)
                // About one message or edit per second per chat before 429s.
                .with_max_edits_per_second(1),
        )
        // No idempotency key exists and bots cannot read chat history: an unknown outcome
        // stays unknown and is never sent again blindly.
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(false)
                .with_duplicates_acceptable(false),
        )
}

/// `chat_id` as the Bot API takes it: a number, or `@channelusername`.
fn chat_value(chat: &str) -> Value {
    chat.parse::<i64>()
        .map_or_else(|_| json!(chat), |id| json!(id))
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

/// A numeric id the Bot API needs (`message_id`, `message_thread_id`).
fn number(value: &str, what: &str) -> Result<i64, SendError> {
    value
        .parse()
        .map_err(|_| invalid(format!("{what} {value:?} is not a Telegram id")))
}

/// The Bot API `parse_mode` of a body format; `None`: plain text.
fn parse_mode(format: Option<&str>) -> Option<&'static str> {
    match format?.to_ascii_lowercase().as_str() {
        "html" => Some("HTML"),
        "markdown" | "markdownv2" => Some("MarkdownV2"),
        _ => None,
    }
}

/// The media method and its file parameter for an attachment.
fn media_method(attachment: &MessageAttachment) -> (&'static str, &'static str) {
    let mime = attachment.mime_type.as_deref().unwrap_or_default();
    if attachment.kind == MessagePartKind::Voice {
        ("sendVoice", "voice")
    } else if mime.starts_with("image/") && mime != "image/gif" {
        ("sendPhoto", "photo")
    } else if mime == "image/gif" {
        ("sendAnimation", "animation")
    } else if mime.starts_with("video/") {
        ("sendVideo", "video")
    } else if mime.starts_with("audio/") {
        ("sendAudio", "audio")
    } else {
        ("sendDocument", "document")
    }
}

/// A stable non-zero `draft_id` for one reply (the same reply animates the same draft).
fn draft_id(key: &str) -> i64 {
    // FNV-1a: stable across processes and builds (a restart continues the same draft).
    let mut hash: u32 = 0x811c_9dc5;
    for byte in key.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    i64::from(hash % 2_000_000_000) + 1
}

fn is_draft(part: &MessageReceiptPart) -> bool {
    part.platform_message_id.starts_with(DRAFT_PREFIX)
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    unit.payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a Telegram text unit needs a `text` string"))
}

impl TelegramAdapter {
    pub(crate) fn new(
        name: &str,
        api: BotApi,
        migrations: Arc<Migrations>,
        drafts: bool,
    ) -> TelegramAdapter {
        TelegramAdapter {
            name: name.to_owned(),
            api,
            capabilities: capabilities(),
            renderer: TelegramRenderer,
            migrations,
            drafts: AtomicBool::new(drafts),
            typing: true,
        }
    }

    /// Whether "typing…" is shown while the agent works.
    pub(crate) fn with_typing(mut self, typing: bool) -> TelegramAdapter {
        self.typing = typing;
        self
    }

    /// The chat a message goes to now: a group upgraded to a supergroup lives at its new id.
    fn chat(&self, target: &MessageTarget) -> String {
        self.migrations.current(&target.id)
    }

    /// The chat a delivered part lives in (recorded when it was sent, as the chat may have
    /// moved since).
    fn chat_of(&self, ctx: &SendContext, part: &MessageReceiptPart) -> String {
        part.edit_token
            .clone()
            .unwrap_or_else(|| self.chat(&ctx.message.target))
    }

    /// The topic a message goes to: its reply's thread, else its target's.
    fn thread(message: &ChannelMessage) -> Result<Option<i64>, SendError> {
        let relation_thread = match &message.relation {
            Some(MessageRelation::Reply { thread_id, .. }) => thread_id.clone(),
            _ => None,
        };
        relation_thread
            .or_else(|| message.target.thread_id.clone())
            .map(|t| number(&t, "thread"))
            .transpose()
    }

    /// `reply_parameters` of a reply: the answered message, and the quote when there is one.
    /// `allow_sending_without_reply`: a final still lands when the question was deleted.
    fn reply_parameters(message: &ChannelMessage) -> Result<Option<Value>, SendError> {
        let Some(MessageRelation::Reply {
            reply_to_id: Some(reply_to),
            quote,
            ..
        }) = &message.relation
        else {
            return Ok(None);
        };
        let mut parameters = json!({
            "message_id": number(reply_to, "reply target")?,
            "allow_sending_without_reply": true,
        });
        if let Some(quote) = quote.as_ref().filter(|q| !q.text.is_empty()) {
            parameters["quote"] = json!(quote.text.chars().take(1024).collect::<String>());
        }
        Ok(Some(parameters))
    }

    /// Calls `method` on `chat`; when Telegram answers that the group became a supergroup, the
    /// move is remembered (durably) and the call made once more at the new id. Returns the chat
    /// the call went to.
    async fn call_in_chat<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        chat: &str,
        mut params: Value,
    ) -> Result<(T, String), CallError> {
        params["chat_id"] = chat_value(chat);
        match self.api.call::<T>(method, &params, Duration::ZERO).await {
            Ok(result) => Ok((result, chat.to_owned())),
            Err(CallError::Refused {
                migrate_to_chat_id: Some(moved),
                ..
            }) => {
                let moved = moved.to_string();
                info!(from = chat, to = %moved, "the group was upgraded to a supergroup; following it");
                self.migrations.remember(chat, &moved).await;
                params["chat_id"] = chat_value(&moved);
                let result = self.api.call::<T>(method, &params, Duration::ZERO).await?;
                Ok((result, moved))
            }
            Err(error) => Err(error),
        }
    }

    /// Sends, and once more without `parse_mode` when Telegram cannot parse the markup (the
    /// refusal was definite: nothing was sent).
    async fn send_formatted(
        &self,
        method: &str,
        chat: &str,
        params: Value,
    ) -> Result<(Message, String), SendError> {
        let formatted = params.get("parse_mode").is_some();
        match self
            .call_in_chat::<Message>(method, chat, params.clone())
            .await
        {
            Err(error) if formatted && error.refused_with("can't parse entities") => {
                warn!(
                    method,
                    "Telegram could not parse the markup; sending as plain text"
                );
                let mut plain = params;
                if let Some(map) = plain.as_object_mut() {
                    map.remove("parse_mode");
                }
                self.call_in_chat(method, chat, plain)
                    .await
                    .map_err(|e| e.into_send_error(method))
            }
            other => other.map_err(|e| e.into_send_error(method)),
        }
    }

    fn part(message: &Message, chat: String, unit: &RenderedMessageUnit) -> MessageReceiptPart {
        let mut part =
            MessageReceiptPart::new(message.message_id.to_string(), unit.kind, unit.index);
        part.thread_id = message.message_thread_id.map(|t| t.to_string());
        part.reply_to_id = message
            .reply_to_message
            .as_ref()
            .map(|r| r.message_id.to_string());
        // Where the message lives, for later edits and deletes.
        part.edit_token = Some(chat);
        part
    }

    /// The parameters every send to `message`'s conversation shares.
    fn base_params(message: &ChannelMessage) -> Result<Value, SendError> {
        let mut params = json!({});
        if let Some(thread) = Self::thread(message)? {
            params["message_thread_id"] = json!(thread);
        }
        if let Some(reply) = Self::reply_parameters(message)? {
            params["reply_parameters"] = reply;
        }
        Ok(params)
    }

    async fn send_text(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
        format: Option<&str>,
    ) -> Result<MessageReceiptPart, SendError> {
        if text.is_empty() {
            return Err(invalid("Telegram refuses an empty message text"));
        }
        let mut params = Self::base_params(&ctx.message)?;
        params["text"] = json!(text);
        if let Some(mode) = parse_mode(format) {
            params["parse_mode"] = json!(mode);
        }
        let chat = self.chat(&ctx.message.target);
        let (message, chat) = self.send_formatted("sendMessage", &chat, params).await?;
        Ok(Self::part(&message, chat, unit))
    }

    /// A media unit: the file by URL with its caption. When Telegram cannot take the file (it
    /// cannot fetch the URL, the type is wrong) the unit goes out as a text with a link.
    async fn send_media(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let attachment: MessageAttachment =
            serde_json::from_value(unit.payload.clone()).map_err(|e| {
                invalid(format!(
                    "a Telegram {:?} unit needs an attachment: {e}",
                    unit.kind
                ))
            })?;
        let url = attachment
            .url
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                invalid("Telegram media goes by URL here (uploads are not supported)")
            })?;
        let caption = unit
            .payload
            .get("caption")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let format = unit.payload.get("format").and_then(Value::as_str);
        let (method, field) = media_method(&attachment);
        let mut params = Self::base_params(&ctx.message)?;
        params[field] = json!(url);
        if !caption.is_empty() {
            params["caption"] = json!(caption.chars().take(MAX_CAPTION_CHARS).collect::<String>());
            if let Some(mode) = parse_mode(format) {
                params["parse_mode"] = json!(mode);
            }
        }
        let chat = self.chat(&ctx.message.target);
        match self.send_formatted(method, &chat, params).await {
            Ok((message, chat)) => Ok(Self::part(&message, chat, unit)),
            // Only a definite refusal of the file itself falls back (nothing was sent); a
            // missing chat or a lost answer is the send's own outcome.
            Err(error)
                if error.kind == DeliveryFailureKind::InvalidPayload
                    && error.side_effect == clawgate_channel_sdk::SideEffect::None =>
            {
                warn!(method, error = %error.message, "Telegram refused the file; sending a link instead");
                let link = if caption.is_empty() {
                    url
                } else {
                    format!("{caption}\n{url}")
                };
                self.send_text(ctx, unit, &link, None).await
            }
            Err(error) => Err(error),
        }
    }

    /// `editMessageText`; "message is not modified" means the message already shows the text.
    /// An edit whose answer was lost is sent again: repeating an edit cannot duplicate anything.
    async fn edit_text(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        text: &str,
        format: Option<&str>,
    ) -> Result<MessageReceiptPart, SendError> {
        let message_id = number(&part.platform_message_id, "message")?;
        let mut params = json!({ "message_id": message_id, "text": text });
        if let Some(mode) = parse_mode(format) {
            params["parse_mode"] = json!(mode);
        }
        let chat = self.chat_of(ctx, part);
        let mut lost = None;
        for _ in 0..EDIT_ATTEMPTS {
            let outcome = match self
                .call_in_chat::<Value>("editMessageText", &chat, params.clone())
                .await
            {
                Err(error)
                    if params.get("parse_mode").is_some()
                        && error.refused_with("can't parse entities") =>
                {
                    if let Some(map) = params.as_object_mut() {
                        map.remove("parse_mode");
                    }
                    self.call_in_chat::<Value>("editMessageText", &chat, params.clone())
                        .await
                }
                other => other,
            };
            match outcome {
                Ok((_, chat)) => {
                    let mut edited = part.clone();
                    edited.edit_token = Some(chat);
                    return Ok(edited);
                }
                Err(error) if error.refused_with("message is not modified") => {
                    return Ok(part.clone());
                }
                Err(CallError::Lost(reason)) => lost = Some(CallError::Lost(reason)),
                Err(error) => return Err(error.into_send_error("editMessageText")),
            }
        }
        Err(lost
            .unwrap_or_else(|| CallError::Lost("no answer".into()))
            .into_send_error("editMessageText"))
    }

    /// Shows "typing…" in `target` (Telegram shows it for 5 s or until the bot's next message).
    pub(crate) async fn typing(&self, target: &MessageTarget) -> Result<(), SendError> {
        let mut params = json!({ "action": "typing" });
        if let Some(thread) = target.thread_id.as_deref() {
            params["message_thread_id"] = json!(number(thread, "thread")?);
        }
        let chat = self.chat(target);
        self.call_in_chat::<Value>("sendChatAction", &chat, params)
            .await
            .map(|_| ())
            .map_err(|e| e.into_send_error("sendChatAction"))
    }

    /// Whether this preview goes out as a native draft: a private chat, while Telegram lets
    /// this bot use drafts.
    fn uses_draft(&self, target: &MessageTarget) -> bool {
        self.drafts.load(Ordering::Relaxed)
            && (target.kind == TargetKind::Direct
                || self.chat(target).parse::<i64>().is_ok_and(|id| id > 0))
    }

    /// `sendMessageDraft`. A draft is ephemeral and repeating it with the same id only animates
    /// it, so a lost answer is as good as a delivered one.
    async fn draft(&self, ctx: &SendContext, text: &str) -> Result<MessageReceiptPart, CallError> {
        // The reply's own key: the first preview is shown under `<key>~preview`, later ones
        // under the reply's key, and all of them are one draft.
        let key = &ctx.idempotency_key;
        let id = draft_id(key.strip_suffix(PREVIEW_KEY_SUFFIX).unwrap_or(key));
        let mut params = json!({ "draft_id": id, "text": text });
        if let Some(thread) = ctx
            .message
            .target
            .thread_id
            .as_deref()
            .and_then(|t| t.parse::<i64>().ok())
        {
            params["message_thread_id"] = json!(thread);
        }
        let chat = self.chat(&ctx.message.target);
        match self
            .call_in_chat::<Value>("sendMessageDraft", &chat, params)
            .await
        {
            Ok(_) | Err(CallError::Lost(_)) => Ok(MessageReceiptPart::new(
                format!("{DRAFT_PREFIX}{id}"),
                MessagePartKind::Preview,
                0,
            )),
            Err(error) => Err(error),
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for TelegramAdapter {
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
                let format = unit.payload.get("format").and_then(Value::as_str);
                self.send_text(ctx, unit, text_of(unit)?, format).await
            }
            MessagePartKind::Media | MessagePartKind::Voice => self.send_media(ctx, unit).await,
            other => Err(invalid(format!("Telegram cannot carry a {other:?} unit"))),
        }
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let format = unit.payload.get("format").and_then(Value::as_str);
        self.edit_text(ctx, part, text_of(unit)?, format).await
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let message_id = number(&part.platform_message_id, "message")?;
        let chat = self.chat_of(ctx, part);
        match self
            .call_in_chat::<Value>("deleteMessage", &chat, json!({ "message_id": message_id }))
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(error.into_send_error("deleteMessage")),
        }
    }

    fn previews(&self, message: &ChannelMessage) -> bool {
        // A quoted reply is sent once, complete: a preview would show the quote twice.
        !matches!(
            &message.relation,
            Some(MessageRelation::Reply { quote: Some(_), .. })
        )
    }

    fn typing_interval(&self) -> Option<Duration> {
        // Telegram shows the action for 5 s.
        self.typing.then_some(Duration::from_secs(4))
    }

    async fn show_typing(&self, target: &MessageTarget) -> Result<(), SendError> {
        self.typing(target).await
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(&self.renderer)
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        Some(self)
    }
}

#[async_trait]
impl MessageLiveAdapter for TelegramAdapter {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        if self.uses_draft(&ctx.message.target) {
            match self.draft(ctx, text).await {
                Ok(part) => return Ok(part),
                Err(CallError::Refused {
                    status: 400 | 403, ..
                }) => {
                    // This bot may not use drafts (or not here): previews are messages from now on.
                    warn!("Telegram refused a native draft; previews are sent as messages");
                    self.drafts.store(false, Ordering::Relaxed);
                }
                Err(error) => return Err(error.into_send_error("sendMessageDraft")),
            }
        }
        // Previews are plain text: a half-streamed markup would not parse.
        self.send_text(ctx, unit, text, None).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = text_of(unit)?;
        if is_draft(preview) {
            return self
                .draft(ctx, text)
                .await
                .map_err(|e| e.into_send_error("sendMessageDraft"));
        }
        self.edit_text(ctx, preview, text, None).await
    }

    fn can_finalize_in_place(&self, preview: &MessageReceiptPart) -> bool {
        // A draft is not a message: the final is sent as one (a `sendMessage`, whose lost answer
        // cannot be settled); a message preview becomes the final by an edit (which can).
        !is_draft(preview)
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        if is_draft(preview) {
            return Err(invalid("a native draft cannot become the final message"));
        }
        self.edit(ctx, preview, final_unit).await
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        _reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        if is_draft(preview) {
            // Nothing to delete: a draft ends with the bot's next message or after ~30 s.
            return Ok(());
        }
        self.delete(ctx, preview).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_ids_are_stable_non_zero_and_differ_per_reply() {
        let a = draft_id("telegram:reply:1:5:0");
        assert_eq!(a, draft_id("telegram:reply:1:5:0"));
        assert_ne!(a, draft_id("telegram:reply:1:6:0"));
        assert!(a > 0 && a <= 2_000_000_000);
    }

    #[test]
    fn chat_ids_are_numbers_and_usernames_strings() {
        assert_eq!(chat_value("-1001234"), json!(-1_001_234_i64));
        assert_eq!(chat_value("@news"), json!("@news"));
    }

    #[test]
    fn media_methods_follow_the_file_type() {
        let with = |kind, mime: &str| {
            let mut a = MessageAttachment::new(kind);
            a.mime_type = Some(mime.into());
            media_method(&a).0
        };
        assert_eq!(with(MessagePartKind::Media, "image/png"), "sendPhoto");
        assert_eq!(with(MessagePartKind::Media, "video/mp4"), "sendVideo");
        assert_eq!(
            with(MessagePartKind::Media, "application/pdf"),
            "sendDocument"
        );
        assert_eq!(with(MessagePartKind::Voice, "audio/ogg"), "sendVoice");
    }

    #[test]
    fn formats_map_to_parse_modes() {
        assert_eq!(parse_mode(Some("html")), Some("HTML"));
        assert_eq!(parse_mode(Some("markdown")), Some("MarkdownV2"));
        assert_eq!(parse_mode(Some("plain")), None);
        assert_eq!(parse_mode(None), None);
    }
}
