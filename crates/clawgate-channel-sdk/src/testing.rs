//! An in-memory platform and the channel that speaks to it (feature `testing`).
//!
//! [`MemoryPlatform`] behaves like a small chat service: conversations of messages with ids,
//! edits and deletes, an idempotency-key index (so an unknown outcome is reconcilable), an
//! update feed with increasing positions that keeps every update until a poll's position passes
//! it (Telegram's `getUpdates` rule), and a push mode that delivers each update with an ack,
//! redelivers what was not acked and resumes a dropped connection from the last acked update.
//! Failures are injected per call. [`MemoryChannel`] is the channel: adapter, normalizer and
//! source (polling or pushed), and [`MemoryFactory`] registers it as kind `memory`.
//!
//! It exists so the gateway, the conformance suite and channel authors can run a whole channel
//! without a network: the conformance suite passes against it.

pub mod ports;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, LiveCancelReason, LiveCapabilities,
    MessageActor, MessageCapabilities, MessageOrigin, MessagePartKind, MessageReceiptPart,
    MessageTarget, RenderedMessageUnit, TargetKind, TextCapabilities,
};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use crate::{
    AckAnswer, AckSignal, ChannelFactory, ChannelMessageAdapter, ChannelPlugin, ChannelSetup,
    EventSink, InboundSource, MessageLiveAdapter, MessageOriginAdapter, MessageReceiveAdapter,
    NormalizedInbound, PollFrom, PollWait, PolledEvent, PollingFeed, PushedEvent, PushedFeed,
    ReceiveError, Reconciliation, SendContext, SendError, SetupError, SourceError,
};

/// One message on the memory platform.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MemoryMessage {
    /// The platform's message id (`m1`, `m2`, …).
    pub id: String,
    /// The conversation it is in (`dm-…` conversations are direct chats).
    pub conversation: String,
    /// Who wrote it; `None` for the bot account.
    pub author: Option<String>,
    /// The author is a bot account.
    pub author_is_bot: bool,
    /// The current text.
    pub text: String,
    /// How many times it was edited.
    pub edits: u32,
    /// Metadata attached by the sender (origin markers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// A failure the platform produces for upcoming calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryFault {
    /// Refuse the call with a definite error of this kind (nothing happens on the platform).
    Refuse(DeliveryFailureKind),
    /// Do what was asked, then lose the answer (the caller cannot know it happened).
    LoseAnswer,
}

#[derive(Debug, Default)]
struct State {
    next_id: u64,
    messages: BTreeMap<String, Vec<MemoryMessage>>,
    by_key: HashMap<String, (String, String)>,
    /// The update feed: position → message, kept until a poll passes the position.
    updates: BTreeMap<i64, MemoryMessage>,
    next_position: i64,
    /// Calls to let through before the next fault, and the faults to produce.
    faults: VecDeque<(u32, MemoryFault, u32)>,
    /// Push mode: updates the gateway acked (a platform may still deliver them again).
    acked: BTreeMap<i64, MemoryMessage>,
    sends: u64,
    /// Calls that came through the channel's live adapter (`show`, `replace`, `finalize`,
    /// `remove`).
    live_calls: u64,
    connection: u64,
}

/// The in-memory platform. Cheap to clone; clones share the platform.
#[derive(Debug, Clone, Default)]
pub struct MemoryPlatform {
    state: Arc<Mutex<State>>,
    changed: Arc<Notify>,
}

impl MemoryPlatform {
    /// An empty platform.
    pub fn new() -> MemoryPlatform {
        MemoryPlatform::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Someone writes `text` into `conversation`: the message appears and an update is queued.
    /// Returns the message.
    pub fn write(&self, conversation: &str, author: &str, text: &str, bot: bool) -> MemoryMessage {
        let message = {
            let mut state = self.lock();
            let message = state.post(conversation, Some(author.to_owned()), bot, text, None);
            state.next_position += 1;
            let position = state.next_position;
            state.updates.insert(position, message.clone());
            message
        };
        self.changed.notify_waiters();
        message
    }

    /// The messages of a conversation, oldest first.
    pub fn messages(&self, conversation: &str) -> Vec<MemoryMessage> {
        self.lock()
            .messages
            .get(conversation)
            .cloned()
            .unwrap_or_default()
    }

    /// The texts of a conversation, oldest first.
    pub fn texts(&self, conversation: &str) -> Vec<String> {
        self.messages(conversation)
            .into_iter()
            .map(|m| m.text)
            .collect()
    }

    /// How many preview operations came through the live adapter (a channel built
    /// [`MemoryChannel::with_live_stream`]).
    pub fn live_calls(&self) -> u64 {
        self.lock().live_calls
    }

    /// How many messages the bot account created (sends that landed, lost answers included).
    pub fn sends(&self) -> u64 {
        self.lock().sends
    }

    /// After `after` more calls go through, the next `count` calls meet `fault`.
    pub fn inject(&self, fault: MemoryFault, count: u32, after: u32) {
        self.lock().faults.push_back((after, fault, count));
    }

    /// Push mode: drops the connection; the feed reconnects and delivers every update not
    /// acked yet again.
    pub fn drop_connection(&self) {
        self.lock().connection += 1;
        self.changed.notify_waiters();
    }

    /// Push mode: delivers every update not acked yet again, as a platform does when its
    /// webhook delivery was not acknowledged in time.
    pub fn redeliver_unacked(&self) {
        self.drop_connection();
    }

    /// Push mode: delivers every update again, acked ones included, as a platform whose
    /// retry raced the ack does (Slack retries a delivery it did not see answered in 3 s).
    pub fn redeliver_all(&self) {
        {
            let mut state = self.lock();
            let acked = std::mem::take(&mut state.acked);
            state.updates.extend(acked);
        }
        self.drop_connection();
    }

    /// The updates still queued (not yet passed by a poll, or not yet acked).
    pub fn queued_updates(&self) -> usize {
        self.lock().updates.len()
    }

    /// The fault the next call meets, if any (counts the call).
    fn next_fault(&self) -> Option<MemoryFault> {
        let mut state = self.lock();
        let (after, fault, count) = state.faults.front_mut()?;
        if *after > 0 {
            *after -= 1;
            return None;
        }
        let fault = *fault;
        *count -= 1;
        if *count == 0 {
            state.faults.pop_front();
        }
        Some(fault)
    }
}

impl State {
    fn post(
        &mut self,
        conversation: &str,
        author: Option<String>,
        bot: bool,
        text: &str,
        metadata: Option<serde_json::Value>,
    ) -> MemoryMessage {
        self.next_id += 1;
        let message = MemoryMessage {
            id: format!("m{}", self.next_id),
            conversation: conversation.to_owned(),
            author,
            author_is_bot: bot,
            text: text.to_owned(),
            edits: 0,
            metadata,
        };
        self.messages
            .entry(conversation.to_owned())
            .or_default()
            .push(message.clone());
        message
    }

    fn find_mut(&mut self, conversation: &str, id: &str) -> Option<&mut MemoryMessage> {
        self.messages
            .get_mut(conversation)?
            .iter_mut()
            .find(|m| m.id == id)
    }
}

/// How the channel receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MemoryMode {
    /// The engine polls the update feed.
    #[default]
    Polling,
    /// The platform pushes updates with acks (a webhook or socket).
    Pushed,
}

/// The channel of a [`MemoryPlatform`]: adapter, normalizer and source.
#[derive(Debug, Clone)]
pub struct MemoryChannel {
    name: String,
    platform: MemoryPlatform,
    capabilities: MessageCapabilities,
    mode: MemoryMode,
    long_poll: Duration,
    live_stream: bool,
}

fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(2_000)
                .with_chunking(true),
        )
        .with_live(
            LiveCapabilities::default()
                .with_edit(true)
                .with_delete(true)
                .with_native_stream(false)
                .with_progress(false)
                .with_max_edits_per_second(20),
        )
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(true)
                .with_retry_after(false)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        )
}

fn failure(kind: DeliveryFailureKind) -> SendError {
    let error = SendError::before_io(
        kind,
        format!("the memory platform refused the call ({kind:?})"),
    );
    if kind == DeliveryFailureKind::RateLimit {
        error.with_retry_after_ms(Some(1_000))
    } else {
        error
    }
}

fn lost() -> SendError {
    SendError::after_io(
        DeliveryFailureKind::Unknown,
        "the memory platform's answer was lost",
    )
}

fn part(message: &MemoryMessage, unit: u32, kind: MessagePartKind) -> MessageReceiptPart {
    MessageReceiptPart::new(message.id.clone(), kind, unit)
}

impl MemoryChannel {
    /// A polling channel named `name` on `platform`.
    pub fn new(name: impl Into<String>, platform: MemoryPlatform) -> MemoryChannel {
        MemoryChannel {
            name: name.into(),
            platform,
            capabilities: capabilities(),
            mode: MemoryMode::Polling,
            long_poll: Duration::from_secs(5),
            live_stream: false,
        }
    }

    /// Previews go through this channel's own [`MessageLiveAdapter`] (counted in
    /// [`MemoryPlatform::live_calls`]), as a platform with a native stream would.
    pub fn with_live_stream(mut self) -> MemoryChannel {
        self.live_stream = true;
        self
    }

    fn count_live_call(&self) {
        self.platform.lock().live_calls += 1;
    }

    /// Receives by push instead of polling.
    pub fn pushed(mut self) -> MemoryChannel {
        self.mode = MemoryMode::Pushed;
        self
    }

    /// The platform this channel speaks to.
    pub fn platform(&self) -> &MemoryPlatform {
        &self.platform
    }

    /// The whole channel as the gateway takes it.
    pub fn plugin(&self) -> ChannelPlugin {
        let this = Arc::new(self.clone());
        let source = match self.mode {
            MemoryMode::Polling => InboundSource::Polling(this.clone()),
            MemoryMode::Pushed => InboundSource::Pushed(this.clone()),
        };
        ChannelPlugin::new(this.clone())
            .with_inbound(this, source)
            .with_description(format!("in-memory platform ({:?})", self.mode))
            .with_extension(Arc::new(self.platform.clone()))
    }

    fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
        unit.payload
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| {
                SendError::before_io(
                    DeliveryFailureKind::InvalidPayload,
                    "a memory unit needs a `text` string",
                )
            })
    }

    fn check(&self) -> Result<bool, SendError> {
        match self.platform.next_fault() {
            Some(MemoryFault::Refuse(kind)) => Err(failure(kind)),
            Some(MemoryFault::LoseAnswer) => Ok(true),
            None => Ok(false),
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for MemoryChannel {
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
        let text = Self::text_of(unit)?;
        if text.chars().count() > 2_000 {
            return Err(SendError::before_io(
                DeliveryFailureKind::InvalidPayload,
                "message too long (2000 characters at most)",
            ));
        }
        let lose = self.check()?;
        let key = ctx.unit_key(unit);
        let conversation = &ctx.message.target.id;
        let message = {
            let mut state = self.platform.lock();
            let existing = state
                .by_key
                .get(&key)
                .and_then(|(c, id)| state.messages.get(c)?.iter().find(|m| &m.id == id))
                .cloned();
            match existing {
                Some(message) => message,
                None => {
                    let message =
                        state.post(conversation, None, true, text, ctx.origin_metadata.clone());
                    state.sends += 1;
                    state
                        .by_key
                        .insert(key, (conversation.clone(), message.id.clone()));
                    message
                }
            }
        };
        if lose {
            return Err(lost());
        }
        Ok(part(&message, unit.index, unit.kind))
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part_sent: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = Self::text_of(unit)?;
        let lose = self.check()?;
        let message = {
            let mut state = self.platform.lock();
            let message = state
                .find_mut(&ctx.message.target.id, &part_sent.platform_message_id)
                .ok_or_else(|| {
                    SendError::before_io(DeliveryFailureKind::NotFound, "no such message")
                })?;
            text.clone_into(&mut message.text);
            message.edits += 1;
            message.clone()
        };
        if lose {
            return Err(lost());
        }
        Ok(part(&message, part_sent.index, part_sent.kind))
    }

    async fn delete(&self, ctx: &SendContext, sent: &MessageReceiptPart) -> Result<(), SendError> {
        let lose = self.check()?;
        {
            let mut state = self.platform.lock();
            let messages = state
                .messages
                .get_mut(&ctx.message.target.id)
                .ok_or_else(|| {
                    SendError::before_io(DeliveryFailureKind::NotFound, "no such conversation")
                })?;
            let before = messages.len();
            messages.retain(|m| m.id != sent.platform_message_id);
            if messages.len() == before {
                return Err(SendError::before_io(
                    DeliveryFailureKind::NotFound,
                    "no such message",
                ));
            }
        }
        if lose { Err(lost()) } else { Ok(()) }
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let state = self.platform.lock();
        let found = state
            .by_key
            .get(&ctx.unit_key(unit))
            .and_then(|(c, id)| state.messages.get(c)?.iter().find(|m| &m.id == id));
        // The key index is written with the message: absent means never sent.
        Ok(match found {
            Some(message) => Reconciliation::Sent(Box::new(part(message, unit.index, unit.kind))),
            None => Reconciliation::NotSent,
        })
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        Some(self)
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        self.live_stream.then_some(self as &dyn MessageLiveAdapter)
    }
}

/// A "native stream": the same platform operations, counted, so a test can tell the engine
/// went through the live adapter.
#[async_trait]
impl MessageLiveAdapter for MemoryChannel {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.count_live_call();
        self.send_unit(ctx, unit).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.count_live_call();
        self.edit(ctx, preview, unit).await
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.count_live_call();
        self.edit(ctx, preview, final_unit).await
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        _reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        self.count_live_call();
        self.delete(ctx, preview).await
    }
}

/// Origin markers travel as message metadata, verbatim.
impl MessageOriginAdapter for MemoryChannel {
    fn encode(&self, origin: &MessageOrigin) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "clawgateOrigin": origin }))
    }

    fn decode(&self, raw: &serde_json::Value) -> Option<MessageOrigin> {
        serde_json::from_value(raw.get("metadata")?.get("clawgateOrigin")?.clone()).ok()
    }
}

impl MessageReceiveAdapter for MemoryChannel {
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError> {
        let message: MemoryMessage =
            serde_json::from_value(raw.clone()).map_err(|e| ReceiveError::Malformed {
                channel: self.name.clone(),
                reason: e.to_string(),
            })?;
        let kind = if message.conversation.starts_with("dm-") {
            TargetKind::Direct
        } else {
            TargetKind::Group
        };
        let mut inbound = ChannelMessage::inbound(
            message.id.clone(),
            &self.name,
            MessageTarget::new(kind, message.conversation.clone()),
        )
        .with_text(message.text.clone())
        .with_raw(raw.clone());
        inbound.sender = message
            .author
            .clone()
            .map(|id| MessageActor::new(id).with_is_bot(message.author_is_bot));
        inbound.origin = self.decode(raw);
        Ok(NormalizedInbound::new(message.id, inbound).by_bot(message.author_is_bot))
    }
}

fn raw_of(message: &MemoryMessage) -> serde_json::Value {
    serde_json::to_value(message).unwrap_or_default()
}

#[async_trait]
impl PollingFeed for MemoryChannel {
    async fn poll(&self, from: &PollFrom, wait: PollWait) -> Result<Vec<PolledEvent>, SourceError> {
        if let Some(fault) = self.platform.next_fault() {
            return Err(match fault {
                MemoryFault::Refuse(kind) => {
                    SourceError::new(kind, "the memory platform refused the poll")
                }
                MemoryFault::LoseAnswer => SourceError::new(
                    DeliveryFailureKind::Unknown,
                    "the memory platform's poll answer was lost",
                ),
            });
        }
        let deadline = tokio::time::Instant::now() + self.long_poll;
        loop {
            let changed = self.platform.changed.notified();
            let events: Vec<PolledEvent> = {
                let mut state = self.platform.lock();
                // Like getUpdates: asking from a position confirms every update at or below it.
                state.updates = state.updates.split_off(&(from.after + 1));
                state
                    .updates
                    .iter()
                    .map(|(position, message)| PolledEvent::new(*position, raw_of(message)))
                    .collect()
            };
            if !events.is_empty() || wait == PollWait::Immediate {
                return Ok(events);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Ok(Vec::new());
            }
        }
    }
}

/// How long the pushed feed waits for the engine's ack before the delivery counts as failed.
const ACK_DEADLINE: Duration = Duration::from_secs(3);

#[async_trait]
impl PushedFeed for MemoryChannel {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        // The connection this feed is on, and the last update it delivered on it. A new
        // connection delivers every update not acked yet again (the engine dedupes them).
        let mut connection = None;
        let mut sent = 0;
        loop {
            let changed = self.platform.changed.notified();
            let pending: Vec<(i64, MemoryMessage)> = {
                let state = self.platform.lock();
                if connection != Some(state.connection) {
                    connection = Some(state.connection);
                    sent = 0;
                }
                state
                    .updates
                    .range(sent + 1..)
                    .map(|(p, m)| (*p, m.clone()))
                    .collect()
            };
            for (position, message) in pending {
                if connection != Some(self.platform.lock().connection) {
                    break;
                }
                sent = position;
                let (ack, signal) = AckSignal::new();
                sink.deliver(PushedEvent::new(raw_of(&message), ack)).await;
                let platform = self.platform.clone();
                // Each delivery is answered on its own, as webhook requests are.
                tokio::spawn(async move {
                    if signal.answer(ACK_DEADLINE).await == AckAnswer::Acked {
                        let mut state = platform.lock();
                        if let Some(message) = state.updates.remove(&position) {
                            state.acked.insert(position, message);
                        }
                    }
                });
            }
            tokio::select! {
                () = sink.stopped() => return Ok(()),
                () = changed => {}
            }
        }
    }
}

/// Settings of a `memory` channel entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MemorySettings {
    #[serde(default)]
    mode: MemoryMode,
}

/// Registers `memory` channels on one shared [`MemoryPlatform`].
#[derive(Debug, Clone, Default)]
pub struct MemoryFactory {
    platform: MemoryPlatform,
}

impl MemoryFactory {
    /// Every channel this factory builds speaks to `platform`.
    pub fn new(platform: MemoryPlatform) -> MemoryFactory {
        MemoryFactory { platform }
    }
}

#[async_trait]
impl ChannelFactory for MemoryFactory {
    fn kind(&self) -> &str {
        "memory"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: MemorySettings = setup.settings()?;
        let channel = MemoryChannel::new(setup.name.clone(), self.platform.clone());
        let channel = match settings.mode {
            MemoryMode::Polling => channel,
            MemoryMode::Pushed => channel.pushed(),
        };
        Ok(channel.plugin())
    }
}
