//! Where a channel's inbound events come from, and how each is acknowledged to the platform.
//!
//! Platforms deliver in two shapes, and a channel declares one [`InboundSource`]:
//!
//! * **Polling** ([`PollingFeed`]): the engine asks. Telegram `getUpdates` with an `offset`, Matrix
//!   `/sync` with a `since` token, the QA update feed. Every event has a [`PolledEvent::position`]
//!   that increases; the engine keeps the durable *safe-completed* watermark (every event at or
//!   below it is finished) and polls from it, so an event accepted and not finished before a crash
//!   is fetched again after the restart. A feed whose platform resumes from an opaque token (Matrix
//!   `next_batch`) returns it as [`PolledEvent::checkpoint`]; the engine stores it with the
//!   watermark and hands it back to [`PollingFeed::poll`].
//! * **Pushed** ([`PushedFeed`]): the platform sends. Webhooks (Slack's Events API, Telegram's
//!   `setWebhook`) and persistent sockets (Discord's gateway, Slack Socket Mode). The feed verifies
//!   what arrives (signatures), hands each event to the engine's [`EventSink`] with its
//!   [`TransportAck`], and answers the platform when the ack comes (a webhook's 200 within the
//!   platform's deadline, a socket's envelope ack). Redeliveries are deduplicated durably by the
//!   engine (by [`NormalizedInbound::event_id`](crate::NormalizedInbound)); a socket feed resumes
//!   its session itself after a disconnect.
//!
//! The transport ack, the polling watermark, the durable inbound record and read receipts are
//! four different things; only the first two are the source's business.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_types::DeliveryFailureKind;

/// The platform side of one event's acknowledgement: the HTTP answer of a webhook delivery, a
/// socket envelope ack. The engine calls at most one of the two, once, when the event's
/// [`ReceiveAckPolicy`](clawgate_types::ReceiveAckPolicy) allows (by default: after the event is
/// recorded durably). A polling feed's events need none: the watermark is their ack.
pub trait TransportAck: Send + Sync {
    /// The event is safe with the gateway: the platform may forget it.
    fn ack(&self);
    /// The gateway could not take the event: the platform should deliver it again.
    fn nack(&self, reason: &str);
}

/// A transport ack that does nothing (events whose ack is a watermark or that need none).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoTransportAck;

impl TransportAck for NoTransportAck {
    fn ack(&self) {}
    fn nack(&self, _reason: &str) {}
}

/// How the engine's first decision about a pushed event reached the feed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AckAnswer {
    /// Acked: answer the platform with success.
    Acked,
    /// Nacked with this reason: answer with a retryable failure.
    Nacked(String),
    /// No decision within the deadline (or the engine dropped the event): answer with a
    /// retryable failure; the platform redelivers and the engine dedupes.
    TimedOut,
}

/// A [`TransportAck`] a webhook or socket handler awaits: [`AckSignal::new`] gives the ack to
/// hand the [`EventSink`] with the event, then [`AckSignal::answer`] waits for the engine's
/// decision within the platform's deadline.
#[derive(Debug)]
pub struct AckSignal {
    receiver: tokio::sync::oneshot::Receiver<AckAnswer>,
}

struct SignalAck(Mutex<Option<tokio::sync::oneshot::Sender<AckAnswer>>>);

impl TransportAck for SignalAck {
    fn ack(&self) {
        self.send(AckAnswer::Acked);
    }
    fn nack(&self, reason: &str) {
        self.send(AckAnswer::Nacked(reason.to_owned()));
    }
}

impl SignalAck {
    fn send(&self, answer: AckAnswer) {
        let sender = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(answer);
        }
    }
}

impl AckSignal {
    /// A transport ack for one event, and the signal its handler waits on.
    pub fn new() -> (Arc<dyn TransportAck>, AckSignal) {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        (
            Arc::new(SignalAck(Mutex::new(Some(sender)))),
            AckSignal { receiver },
        )
    }

    /// The engine's decision, or [`AckAnswer::TimedOut`] after `deadline` (set it below the
    /// platform's own: Slack waits 3 s for a webhook answer).
    pub async fn answer(self, deadline: Duration) -> AckAnswer {
        match tokio::time::timeout(deadline, self.receiver).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(_) => AckAnswer::TimedOut,
        }
    }
}

/// Why a source could not deliver events right now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?} source failure: {message}")]
#[non_exhaustive]
pub struct SourceError {
    /// `Auth`/`Permission`: the account's credentials are refused (retrying will not help until
    /// an operator fixes them); anything else is retried with backoff.
    pub kind: DeliveryFailureKind,
    /// What happened, for the log (never a secret).
    pub message: String,
    /// The platform asked to wait this long.
    pub retry_after_ms: Option<u64>,
}

impl SourceError {
    /// A failure of `kind` described by `message`.
    pub fn new(kind: DeliveryFailureKind, message: impl Into<String>) -> SourceError {
        SourceError {
            kind,
            message: message.into(),
            retry_after_ms: None,
        }
    }

    /// The platform's requested wait before the next attempt.
    pub fn with_retry_after_ms(mut self, ms: Option<u64>) -> SourceError {
        self.retry_after_ms = ms;
        self
    }
}

/// How long one poll may wait for events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PollWait {
    /// Return at once with what is there (the engine is waiting for unfinished events and
    /// looks for new ones meanwhile).
    Immediate,
    /// Long-poll: wait up to the feed's own configured timeout for something new.
    Long,
}

/// One event a polling feed returned.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PolledEvent {
    /// Increases with every event of the feed (Telegram's `update_id`). Stable: the same event
    /// polled again has the same position.
    pub position: i64,
    /// The platform payload, as [`MessageReceiveAdapter::normalize`](crate::MessageReceiveAdapter)
    /// takes it.
    pub raw: serde_json::Value,
    /// Where to resume once this event and every earlier one is finished, for a platform that
    /// resumes from an opaque token (Matrix `next_batch`). `None`: the position says it.
    pub checkpoint: Option<String>,
}

impl PolledEvent {
    /// An event at `position`.
    pub fn new(position: i64, raw: serde_json::Value) -> PolledEvent {
        PolledEvent {
            position,
            raw,
            checkpoint: None,
        }
    }

    /// The resume token valid once this event is finished.
    pub fn with_checkpoint(mut self, checkpoint: impl Into<String>) -> PolledEvent {
        self.checkpoint = Some(checkpoint.into());
        self
    }
}

/// Where polling resumes: the durable watermark and, when the feed gave one, its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PollFrom {
    /// Every event at or below this position is finished.
    pub after: i64,
    /// The checkpoint of the event at `after`, if it carried one.
    pub checkpoint: Option<String>,
}

impl PollFrom {
    /// Resume after `after`, with `checkpoint`.
    pub fn new(after: i64, checkpoint: Option<String>) -> PollFrom {
        PollFrom { after, checkpoint }
    }
}

/// A feed the engine polls.
#[async_trait]
pub trait PollingFeed: Send + Sync {
    /// The events after `from.after`, in position order (an empty list when nothing is new
    /// after the wait). The engine polls again from the same place while earlier events are
    /// unfinished, so the platform must hand them out again until the watermark passes them
    /// (Telegram confirms updates only below the `offset` asked for).
    async fn poll(&self, from: &PollFrom, wait: PollWait) -> Result<Vec<PolledEvent>, SourceError>;
}

/// One event a pushed feed received.
#[non_exhaustive]
pub struct PushedEvent {
    /// The platform payload, verified (signature checked) by the feed.
    pub raw: serde_json::Value,
    /// Told when the engine has the event (or cannot take it).
    pub ack: Arc<dyn TransportAck>,
}

impl PushedEvent {
    /// An event with the ack its transport answers through.
    pub fn new(raw: serde_json::Value, ack: Arc<dyn TransportAck>) -> PushedEvent {
        PushedEvent { raw, ack }
    }
}

impl std::fmt::Debug for PushedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushedEvent")
            .field("raw", &self.raw)
            .finish_non_exhaustive()
    }
}

/// The engine's side of a pushed feed.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Takes one event in. Returns once the engine has queued it; its ack comes later, through
    /// [`PushedEvent::ack`]. An event delivered while the gateway stops is nacked.
    async fn deliver(&self, event: PushedEvent);

    /// Resolves when the gateway stops: the feed closes its listener or socket and returns.
    async fn stopped(&self);
}

/// A feed that receives what the platform pushes.
#[async_trait]
pub trait PushedFeed: Send + Sync {
    /// Listens (binds its webhook listener, connects and resumes its socket) and hands every
    /// verified event to `sink`, until [`EventSink::stopped`]. An error ends the feed for now;
    /// the engine logs it and runs the feed again after a backoff.
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError>;
}

/// Where a channel's inbound events come from.
#[derive(Clone)]
#[non_exhaustive]
pub enum InboundSource {
    /// The engine polls the feed from its durable watermark.
    Polling(Arc<dyn PollingFeed>),
    /// The feed pushes events to the engine with their transport acks.
    Pushed(Arc<dyn PushedFeed>),
    /// The channel only sends.
    None,
}

impl std::fmt::Debug for InboundSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InboundSource::Polling(_) => "InboundSource::Polling",
            InboundSource::Pushed(_) => "InboundSource::Pushed",
            InboundSource::None => "InboundSource::None",
        })
    }
}
