//! A Telegram-shaped channel: `sendMessage` / `editMessageText` / `deleteMessage`, updates
//! polled with `getUpdates(offset)`, errors as `{error_code, description, retry_after}`. The
//! platform is [`BotApi`], an in-process stand-in with Telegram's rules, so the whole crate
//! runs without a network; a real channel crate puts an HTTP client where [`BotApi`] is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use serde::{Deserialize, Serialize};

/// A Bot API error answer (`ok: false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub error_code: u16,
    pub description: String,
    pub retry_after: Option<u64>,
}

/// One chat message, as `getUpdates` and `sendMessage` return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub message_id: i64,
    pub chat_id: String,
    pub from: Option<String>,
    pub from_bot: bool,
    pub text: String,
}

/// What the next call meets.
#[derive(Debug, Clone)]
pub enum Fault {
    Refuse(ApiError),
    LoseAnswer,
}

#[derive(Debug, Default)]
struct Chats {
    next_id: i64,
    chats: BTreeMap<String, Vec<Message>>,
    /// Update id → message; kept until a `getUpdates` offset passes it.
    updates: BTreeMap<i64, Message>,
    next_update: i64,
    /// Faults to come, each after letting this many calls through.
    faults: Vec<(u32, Fault)>,
}

/// The in-process Bot API.
#[derive(Debug, Default)]
pub struct BotApi {
    chats: Mutex<Chats>,
}

impl BotApi {
    fn chats(&self) -> std::sync::MutexGuard<'_, Chats> {
        self.chats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Someone writes into a chat: the message and its update appear.
    pub fn user_writes(&self, chat_id: &str, from: &str, text: &str, bot: bool) -> Message {
        let mut chats = self.chats();
        let message = chats.post(chat_id, Some(from.to_owned()), bot, text);
        chats.next_update += 1;
        let update_id = chats.next_update;
        chats.updates.insert(update_id, message.clone());
        message
    }

    /// The chat's messages, oldest first.
    pub fn messages(&self, chat_id: &str) -> Vec<Message> {
        self.chats().chats.get(chat_id).cloned().unwrap_or_default()
    }

    /// After `after` more calls go through, one call meets `fault`.
    pub fn inject(&self, after: u32, fault: Fault) {
        self.chats().faults.push((after, fault));
    }

    fn fault(&self) -> Option<Fault> {
        let mut chats = self.chats();
        let (after, _) = chats.faults.first_mut()?;
        if *after > 0 {
            *after -= 1;
            return None;
        }
        Some(chats.faults.remove(0).1)
    }

    fn call<T>(
        &self,
        act: impl FnOnce(&mut Chats) -> Result<T, ApiError>,
    ) -> Result<Option<T>, ApiError> {
        match self.fault() {
            Some(Fault::Refuse(error)) => Err(error),
            Some(Fault::LoseAnswer) => act(&mut self.chats()).map(|_| None),
            None => act(&mut self.chats()).map(Some),
        }
    }
}

impl Chats {
    fn post(&mut self, chat_id: &str, from: Option<String>, bot: bool, text: &str) -> Message {
        self.next_id += 1;
        let message = Message {
            message_id: self.next_id,
            chat_id: chat_id.to_owned(),
            from,
            from_bot: bot,
            text: text.to_owned(),
        };
        self.chats
            .entry(chat_id.to_owned())
            .or_default()
            .push(message.clone());
        message
    }

    fn find(&mut self, chat_id: &str, message_id: i64) -> Result<&mut Message, ApiError> {
        self.chats
            .get_mut(chat_id)
            .and_then(|m| m.iter_mut().find(|m| m.message_id == message_id))
            .ok_or_else(|| ApiError {
                error_code: 400,
                description: "Bad Request: message to edit not found".into(),
                retry_after: None,
            })
    }
}

/// The channel: adapter, normalizer and polling feed in one value.
#[derive(Debug, Clone)]
pub struct TemplateChannel {
    name: String,
    api: Arc<BotApi>,
    capabilities: MessageCapabilities,
}

impl TemplateChannel {
    /// A channel named `name` speaking to `api`.
    pub fn new(name: &str, api: Arc<BotApi>) -> TemplateChannel {
        let capabilities = MessageCapabilities::default()
            .with_text(
                clawgate_channel_sdk::types::TextCapabilities::default()
                    .with_max_length(4096)
                    .with_chunking(true),
            )
            .with_live(
                clawgate_channel_sdk::types::LiveCapabilities::default()
                    .with_edit(true)
                    .with_delete(true)
                    .with_max_edits_per_second(1),
            )
            // No idempotency keys on this platform: an unknown outcome stays unknown.
            .with_delivery(
                clawgate_channel_sdk::types::DeliveryCapabilities::default()
                    .with_retry_after(true)
                    .with_receipt_required(true),
            );
        TemplateChannel {
            name: name.to_owned(),
            api,
            capabilities,
        }
    }

    /// The whole channel as the gateway takes it.
    pub fn plugin(&self) -> ChannelPlugin {
        let this = Arc::new(self.clone());
        ChannelPlugin::new(this.clone())
            .with_inbound(this.clone(), InboundSource::Polling(this))
            .with_description("Telegram-shaped bot (in-process Bot API)")
    }
}

/// A Bot API error as a classified send failure: a definite answer means nothing happened.
fn send_error(error: ApiError) -> SendError {
    SendError::before_io(classify_http_status(error.error_code), error.description)
        .with_retry_after_ms(error.retry_after.map(|s| s * 1_000))
        .with_platform_code(error.error_code.to_string())
}

/// The answer was lost after the platform acted: the outcome is unknown.
fn lost_answer() -> SendError {
    SendError::after_io(
        DeliveryFailureKind::Unknown,
        "the Bot API's answer was lost",
    )
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    unit.payload["text"].as_str().ok_or_else(|| {
        SendError::before_io(DeliveryFailureKind::InvalidPayload, "a unit needs a text")
    })
}

fn message_id(part: &MessageReceiptPart) -> Result<i64, SendError> {
    part.platform_message_id.parse().map_err(|_| {
        SendError::before_io(
            DeliveryFailureKind::InvalidPayload,
            "not a Bot API message id",
        )
    })
}

#[async_trait]
impl ChannelMessageAdapter for TemplateChannel {
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
        let text = text_of(unit)?;
        let chat = &ctx.message.target.id;
        let sent = self
            .api
            .call(|chats| Ok(chats.post(chat, None, true, text)))
            .map_err(send_error)?
            .ok_or_else(lost_answer)?;
        Ok(MessageReceiptPart::new(
            sent.message_id.to_string(),
            unit.kind,
            unit.index,
        ))
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let (text, id) = (text_of(unit)?, message_id(part)?);
        let chat = &ctx.message.target.id;
        self.api
            .call(|chats| {
                chats.find(chat, id)?.text = text.to_owned();
                Ok(())
            })
            .map_err(send_error)?
            .ok_or_else(lost_answer)?;
        Ok(part.clone())
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let id = message_id(part)?;
        let chat = &ctx.message.target.id;
        self.api
            .call(|chats| {
                chats.find(chat, id)?;
                if let Some(messages) = chats.chats.get_mut(chat) {
                    messages.retain(|m| m.message_id != id);
                }
                Ok(())
            })
            .map_err(send_error)?
            .ok_or_else(lost_answer)
    }
}

impl MessageReceiveAdapter for TemplateChannel {
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError> {
        let message: Message =
            serde_json::from_value(raw.clone()).map_err(|e| ReceiveError::Malformed {
                channel: self.name.clone(),
                reason: e.to_string(),
            })?;
        let mut sender = MessageActor::new(message.from.clone().unwrap_or_default());
        sender.is_bot = message.from_bot;
        let inbound = ChannelMessage::inbound(
            message.message_id.to_string(),
            &self.name,
            MessageTarget::group(&message.chat_id),
        )
        .with_text(&message.text)
        .with_sender(sender)
        // Kept so an unfinished event can be worked on again from its durable record.
        .with_raw(raw.clone());
        Ok(NormalizedInbound::new(
            format!("{}:{}", message.chat_id, message.message_id),
            inbound,
        )
        .by_bot(message.from_bot))
    }
}

#[async_trait]
impl PollingFeed for TemplateChannel {
    async fn poll(&self, from: &PollFrom, wait: PollWait) -> Result<Vec<PolledEvent>, SourceError> {
        // getUpdates(offset): every update below the offset is confirmed and forgotten.
        let offset = from.after + 1;
        let events: Vec<PolledEvent> = {
            let mut chats = self.api.chats();
            chats.updates = chats.updates.split_off(&offset);
            chats
                .updates
                .iter()
                .filter_map(|(id, m)| Some(PolledEvent::new(*id, serde_json::to_value(m).ok()?)))
                .collect()
        };
        if events.is_empty() && wait == PollWait::Long {
            // A real feed long-polls (`timeout` seconds); the stand-in just waits a little.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(events)
    }
}

/// `[channels.settings]` of a `template` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// The environment variable holding the bot token.
    token_env: String,
}

/// Builds `template` channels, all on one [`BotApi`].
#[derive(Debug, Default)]
pub struct TemplateFactory {
    api: Arc<BotApi>,
}

impl TemplateFactory {
    /// Channels of this factory speak to `api`.
    pub fn new(api: Arc<BotApi>) -> TemplateFactory {
        TemplateFactory { api }
    }
}

#[async_trait]
impl ChannelFactory for TemplateFactory {
    fn kind(&self) -> &str {
        "template"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: Settings = setup.settings()?;
        // A real crate hands the token to its HTTP client; it is never logged.
        let _token: Secret = setup.secret("token_env", &settings.token_env)?;
        Ok(TemplateChannel::new(&setup.name, self.api.clone()).plugin())
    }
}
