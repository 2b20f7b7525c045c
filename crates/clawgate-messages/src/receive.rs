//! Receive contexts: one platform event through normalize → echo gate → bot authorization →
//! durable record and dedupe → dispatch → finish, with the transport ack given exactly when the
//! ack policy allows.
//!
//! Four signals stay apart: the transport ack ([`TransportAck`], governed by
//! [`ReceiveAckPolicy`]), the polling-offset ack (the source's durable watermark), the
//! inbound-record ack (the record in the store) and user-visible read/typing receipts (never a
//! durability boundary; not handled here).

use std::future::Future;
use std::sync::{Arc, Mutex};

use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageReceiveAdapter, NormalizedInbound, ReceiveError, TransportAck,
};
use clawgate_store::{
    InboundKey, InboundRecord, InboundStatus, InboundStore, RecordInboundOutcome,
};
use clawgate_types::{EchoFacts, ReceiveAckPolicy, should_drop_gateway_echo};
use tracing::{info, warn};

use crate::{BotLoopGuard, BotLoopLimits, Clock, MessagesError};

/// What the first acknowledgement decision was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckState {
    Pending,
    Acked,
    Nacked(String),
}

/// Makes acks idempotent: the first of ack/nack wins, repeats do nothing, a nack after an ack
/// does nothing, and the first error is the one kept.
pub struct AckController {
    transport: Arc<dyn TransportAck>,
    state: Mutex<AckState>,
}

impl std::fmt::Debug for AckController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckController")
            .field("state", &self.state())
            .finish()
    }
}

impl AckController {
    pub fn new(transport: Arc<dyn TransportAck>) -> AckController {
        AckController {
            transport,
            state: Mutex::new(AckState::Pending),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, AckState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn ack(&self) {
        let mut state = self.lock();
        if *state == AckState::Pending {
            *state = AckState::Acked;
            self.transport.ack();
        }
    }

    pub fn nack(&self, reason: &str) {
        let mut state = self.lock();
        if *state == AckState::Pending {
            *state = AckState::Nacked(reason.to_owned());
            self.transport.nack(reason);
        }
    }

    pub fn state(&self) -> AckState {
        self.lock().clone()
    }
}

/// Receive-side choices.
#[derive(Debug, Clone)]
pub struct ReceiveOptions {
    /// Whether messages written by other bots are accepted (after the echo gate).
    pub allow_bots: bool,
    /// Attempts after which an event whose processing keeps failing is dead-lettered.
    pub max_attempts: u32,
    /// Bot-to-bot traffic limits per room (applies when bots are allowed).
    pub bot_loop: BotLoopLimits,
    /// The account events are recorded under when the platform payload names none: the
    /// channel account's id, so its unfinished events are found again after a restart.
    pub account_id: Option<String>,
}

impl Default for ReceiveOptions {
    fn default() -> Self {
        ReceiveOptions {
            allow_bots: false,
            max_attempts: 5,
            bot_loop: BotLoopLimits::default(),
            account_id: None,
        }
    }
}

/// Why a dispatch did not finish its event. A plain `String` is a retryable failure (it counts
/// toward dead-lettering); [`DispatchError::interrupted`] is a stop under it (a clean
/// shutdown), whose attempt is given back; [`DispatchError::permanent`] is a failure no retry
/// can fix, dead-lettered at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchError {
    pub message: String,
    pub interrupted: bool,
    /// Trying again cannot help (the event is dead-lettered at once).
    pub permanent: bool,
}

impl DispatchError {
    /// The process is stopping under the turn: not the event's failure.
    pub fn interrupted(message: impl Into<String>) -> DispatchError {
        DispatchError {
            message: message.into(),
            interrupted: true,
            permanent: false,
        }
    }

    /// A failure that another attempt would only repeat (the reply was refused for good, the
    /// event is unanswerable): dead-lettered at once, and a redelivery of it is not taken up
    /// again.
    pub fn permanent(message: impl Into<String>) -> DispatchError {
        DispatchError {
            message: message.into(),
            interrupted: false,
            permanent: true,
        }
    }
}

impl From<String> for DispatchError {
    fn from(message: String) -> DispatchError {
        DispatchError {
            message,
            interrupted: false,
            permanent: false,
        }
    }
}

/// What happened to one platform event.
#[derive(Debug, Clone, PartialEq)]
pub enum ReceiveOutcome {
    /// The payload could not be normalized, or the channel ignores it
    /// ([`ReceiveError::Ignored`]); acked: redelivering it would not help.
    Invalid(ReceiveError),
    /// A marked gateway-failure echo from a bot in a shared room: dropped before authorization.
    DroppedEcho,
    /// A bot-authored message while bots are not allowed.
    Unauthorized,
    /// A bot-authored message from a pair over its bot-loop limit (cooling down).
    LoopGuarded,
    /// Seen and finished before (a webhook redelivery, a replayed poll).
    Duplicate { status: InboundStatus },
    /// Delivered again while an attempt at it runs in this process: not dispatched a second
    /// time (that attempt finishes the event).
    InFlight,
    /// Recorded, dispatched and finished.
    Handled { record: InboundRecord },
    /// Dispatch failed; the event stays recorded for another attempt, or is dead-lettered.
    Failed {
        error: String,
        attempts: u32,
        dead_lettered: bool,
    },
}

/// An event that passed the stateless part of a receive.
struct Screened {
    inbound: NormalizedInbound,
    policy: ReceiveAckPolicy,
    key: InboundKey,
    payload: serde_json::Value,
}

/// Why [`Receiver::screen`] let an event go without a record (it acked it).
enum Dropped {
    Invalid(ReceiveError),
    Echo,
    Unauthorized,
}

impl From<Dropped> for ReceiveOutcome {
    fn from(dropped: Dropped) -> ReceiveOutcome {
        match dropped {
            Dropped::Invalid(error) => ReceiveOutcome::Invalid(error),
            Dropped::Echo => ReceiveOutcome::DroppedEcho,
            Dropped::Unauthorized => ReceiveOutcome::Unauthorized,
        }
    }
}

/// Runs receive contexts for one channel.
pub struct Receiver {
    store: Arc<dyn InboundStore>,
    channel: Arc<dyn ChannelMessageAdapter>,
    normalizer: Arc<dyn MessageReceiveAdapter>,
    clock: Arc<dyn Clock>,
    options: ReceiveOptions,
    loop_guard: BotLoopGuard,
    /// Events an attempt of this receiver is working on. A second delivery of one of them is
    /// not dispatched, whatever the caller's ordering (lanes, webhook handlers, replays). Other
    /// processes never work on this account's events: the account's ownership lease keeps it
    /// to one gateway.
    in_flight: Arc<Mutex<std::collections::HashSet<InboundKey>>>,
}

/// An attempt's hold on its event in [`Receiver::in_flight`]: released when the attempt ends
/// (after its finishing write, so a redelivery then finds the finished record), or when it is
/// dropped mid-way.
struct Attempt {
    in_flight: Arc<Mutex<std::collections::HashSet<InboundKey>>>,
    key: InboundKey,
}

impl Attempt {
    /// `None` when an attempt at `key` runs already.
    fn start(
        in_flight: &Arc<Mutex<std::collections::HashSet<InboundKey>>>,
        key: &InboundKey,
    ) -> Option<Attempt> {
        let fresh = in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.clone());
        fresh.then(|| Attempt {
            in_flight: in_flight.clone(),
            key: key.clone(),
        })
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        in_flight.remove(&self.key);
        crate::sparse::shrink_set(&mut in_flight);
    }
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("channel", &self.channel.channel())
            .field("options", &self.options)
            .finish()
    }
}

impl Receiver {
    pub fn new(
        store: Arc<dyn InboundStore>,
        channel: Arc<dyn ChannelMessageAdapter>,
        normalizer: Arc<dyn MessageReceiveAdapter>,
        clock: Arc<dyn Clock>,
        options: ReceiveOptions,
    ) -> Receiver {
        let loop_guard = BotLoopGuard::new(options.bot_loop);
        Receiver {
            store,
            channel,
            normalizer,
            clock,
            options,
            loop_guard,
            in_flight: Arc::default(),
        }
    }

    /// Marks the event completed, durably, and `record` with it.
    async fn complete(
        &self,
        key: &InboundKey,
        record: &mut InboundRecord,
    ) -> Result<(), MessagesError> {
        let finished_at = self.clock.now_ms();
        record.attempts = self
            .store
            .finish_inbound(key, InboundStatus::Completed, None, finished_at)
            .await?;
        record.status = InboundStatus::Completed;
        record.updated_at = finished_at;
        Ok(())
    }

    /// What every receive does first, without writing anything: normalize, stamp the account,
    /// ack an `Immediate` event, and drop gateway echoes and unauthorized bots (acked).
    fn screen(&self, raw: &serde_json::Value, ack: &AckController) -> Result<Screened, Dropped> {
        let mut inbound = match self.normalizer.normalize(raw) {
            Ok(inbound) => inbound,
            Err(error @ ReceiveError::Ignored { .. }) => {
                info!(%error, "platform event finished without a turn");
                ack.ack();
                return Err(Dropped::Invalid(error));
            }
            Err(error) => {
                warn!(%error, "malformed platform event dropped");
                ack.ack();
                return Err(Dropped::Invalid(error));
            }
        };
        if inbound.message.account_id.is_none() {
            inbound
                .message
                .account_id
                .clone_from(&self.options.account_id);
        }
        let policy = self.normalizer.ack_policy(&inbound);
        if matches!(policy, ReceiveAckPolicy::Immediate { .. }) {
            ack.ack();
        }
        // The core, not each channel, decides echoes — by marker, before bot authorization.
        let origin = self
            .channel
            .origin()
            .and_then(|o| o.decode(raw))
            .or_else(|| inbound.message.origin.clone());
        let facts = EchoFacts {
            is_bot_author: inbound.is_bot_author,
            is_roomish: inbound.message.target.kind.is_roomish(),
        };
        if should_drop_gateway_echo(origin.as_ref(), facts) {
            info!(event = %inbound.event_id, "gateway-failure echo dropped");
            ack.ack();
            return Err(Dropped::Echo);
        }
        if inbound.is_bot_author && !self.options.allow_bots {
            ack.ack();
            return Err(Dropped::Unauthorized);
        }
        let key = InboundKey {
            channel: inbound.message.channel.clone(),
            account_id: inbound.message.account_id.clone().unwrap_or_default(),
            event_id: inbound.event_id.clone(),
        };
        let payload = serde_json::to_value(&inbound.message).unwrap_or_default();
        Ok(Screened {
            inbound,
            policy,
            key,
            payload,
        })
    }

    /// Makes a pushed event durable the moment the platform hands it over, before it waits
    /// for its conversation's earlier turns (which may take minutes; a crash meanwhile must
    /// not lose it, and a webhook must be answered within seconds). Counts no attempt: the
    /// event's [`Self::receive`] does. An `AfterRecord` event is acked once written; what
    /// receive would drop without a record is not written (and acked, as receive would).
    pub async fn accept(
        &self,
        raw: &serde_json::Value,
        ack: &AckController,
    ) -> Result<(), MessagesError> {
        let Ok(Screened {
            policy,
            key,
            payload,
            ..
        }) = self.screen(raw, ack)
        else {
            return Ok(());
        };
        if let Err(error) = self
            .store
            .accept_inbound(&key, &payload, self.clock.now_ms())
            .await
        {
            ack.nack(&error.to_string());
            return Err(MessagesError::Store(error));
        }
        if policy == ReceiveAckPolicy::AfterRecord {
            ack.ack();
        }
        Ok(())
    }

    /// One receive context. `dispatch` runs the turn (visible output goes through send
    /// contexts); the transport ack is given through `ack` when the event's policy allows.
    /// An event whose `max_attempts` starts all died with the process is dead-lettered without
    /// another dispatch.
    pub async fn receive<F, Fut, E>(
        &self,
        raw: &serde_json::Value,
        ack: &AckController,
        dispatch: F,
    ) -> Result<ReceiveOutcome, MessagesError>
    where
        F: FnOnce(NormalizedInbound) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<DispatchError>,
    {
        self.receive_or_settle(raw, ack, dispatch, |_| async { Err(String::new()) })
            .await
    }

    /// [`Self::receive`], with `settle` asked instead of `dispatch` once the attempt budget is
    /// spent: an attempt that died after its work was done (a reply delivered, the process
    /// killed before the event was completed) must not end as a dead letter beside that work.
    /// `settle` finishes what exists without starting the work again: `Ok` completes the
    /// event, `Err` dead-letters it (its text joins the reason).
    pub async fn receive_or_settle<F, Fut, E, S, SFut>(
        &self,
        raw: &serde_json::Value,
        ack: &AckController,
        dispatch: F,
        settle: S,
    ) -> Result<ReceiveOutcome, MessagesError>
    where
        F: FnOnce(NormalizedInbound) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: Into<DispatchError>,
        S: FnOnce(NormalizedInbound) -> SFut,
        SFut: Future<Output = Result<(), String>>,
    {
        let Screened {
            inbound,
            policy,
            key,
            payload,
        } = match self.screen(raw, ack) {
            Ok(screened) => screened,
            Err(dropped) => return Ok(dropped.into()),
        };
        // Held until this receive returns, i.e. after the attempt's finishing write.
        let Some(_attempt) = Attempt::start(&self.in_flight, &key) else {
            info!(event = %key.event_id, "delivered again while an attempt at it runs; not dispatched twice");
            if policy == ReceiveAckPolicy::AfterDurableSend {
                // The running attempt acks its own delivery once the reply is durable; this
                // copy is refused so that the platform asks again if that attempt fails.
                ack.nack("this event is being processed; deliver it again later");
            } else {
                ack.ack();
            }
            return Ok(ReceiveOutcome::InFlight);
        };
        if inbound.is_bot_author {
            let author = inbound
                .message
                .sender
                .as_ref()
                .map_or("", |s| s.id.as_str());
            if !self
                .loop_guard
                .admit(&inbound.message.target.id, author, self.clock.now_ms())
            {
                warn!(room = %inbound.message.target.id, author, "bot loop suspected; message dropped");
                // Accepted when it was pushed (see `accept`): finished, or it would replay
                // at every start. A polled event has no record yet.
                if let Ok(Some(record)) = self.store.load_inbound(&key).await
                    && record.status == InboundStatus::Received
                {
                    self.store
                        .finish_inbound(
                            &key,
                            InboundStatus::Completed,
                            Some("bot loop suspected; dropped"),
                            self.clock.now_ms(),
                        )
                        .await?;
                }
                ack.ack();
                return Ok(ReceiveOutcome::LoopGuarded);
            }
        }
        let now = self.clock.now_ms();
        // The attempt that starts now is counted in the same write that records the event, so
        // a turn that kills the process (a poison message) is still counted.
        let recorded = self.store.record_inbound(&key, &payload, now).await;
        let mut record = match recorded {
            Ok(RecordInboundOutcome::New(record)) => record,
            Ok(RecordInboundOutcome::Duplicate(record))
                if record.status != InboundStatus::Received =>
            {
                ack.ack();
                return Ok(ReceiveOutcome::Duplicate {
                    status: record.status,
                });
            }
            // Recorded before but never finished (a crash or a failed attempt): process it now.
            Ok(RecordInboundOutcome::Duplicate(record)) => record,
            Err(error) => {
                ack.nack(&error.to_string());
                return Err(MessagesError::Store(error));
            }
        };
        let attempt = record.attempts;
        if policy == ReceiveAckPolicy::AfterRecord {
            ack.ack();
        }
        if attempt > self.options.max_attempts {
            // Every allowed attempt started and none finished: each ended with the process
            // (a crash, a kill). Dispatching again would only crash again; what an attempt
            // finished before dying is settled instead.
            let settled = settle(inbound).await;
            if settled.is_ok() {
                self.complete(&key, &mut record).await?;
                info!(event = %key.event_id, "an attempt that died had finished the work; completed");
                ack.ack();
                return Ok(ReceiveOutcome::Handled { record });
            }
            let mut error = format!(
                "processing started {} times and never finished (the process stopped during \
                 each attempt); not dispatched again",
                attempt - 1
            );
            if let Err(detail) = settled
                && !detail.is_empty()
            {
                error.push_str(": ");
                error.push_str(&detail);
            }
            self.store
                .finish_inbound(
                    &key,
                    InboundStatus::DeadLettered,
                    Some(&error),
                    self.clock.now_ms(),
                )
                .await?;
            warn!(event = %key.event_id, attempts = attempt - 1, %error, "inbound event dead-lettered");
            ack.ack();
            return Ok(ReceiveOutcome::Failed {
                error,
                attempts: attempt - 1,
                dead_lettered: true,
            });
        }
        match dispatch(inbound).await {
            Ok(()) => {
                self.complete(&key, &mut record).await?;
                if policy == ReceiveAckPolicy::AfterDurableSend {
                    ack.ack();
                }
                Ok(ReceiveOutcome::Handled { record })
            }
            Err(error) => {
                let DispatchError {
                    message: error,
                    interrupted,
                    permanent,
                } = error.into();
                if interrupted {
                    // Not the event's failure: its attempt is given back and it stays
                    // unfinished for the next start.
                    let attempts = self
                        .store
                        .interrupt_inbound(&key, &error, self.clock.now_ms())
                        .await?;
                    ack.nack(&error);
                    return Ok(ReceiveOutcome::Failed {
                        error,
                        attempts,
                        dead_lettered: false,
                    });
                }
                let dead = permanent || attempt >= self.options.max_attempts;
                let status = if dead {
                    InboundStatus::DeadLettered
                } else {
                    InboundStatus::Received
                };
                let attempts = self
                    .store
                    .finish_inbound(&key, status, Some(&error), self.clock.now_ms())
                    .await?;
                if dead {
                    // Not retried forever and not blocking its lane: the platform may stop.
                    warn!(event = %key.event_id, attempts, %error, "inbound event dead-lettered");
                    ack.ack();
                } else {
                    ack.nack(&error);
                }
                Ok(ReceiveOutcome::Failed {
                    error,
                    attempts,
                    dead_lettered: dead,
                })
            }
        }
    }
}
