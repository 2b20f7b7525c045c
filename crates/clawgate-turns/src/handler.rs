//! The event handler a host gives each channel's `SourceRunner`: every inbound event through
//! the channel's receive context (dedupe, echo gate, durable inbound record) to a turn.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use clawgate_messages::{AckController, DispatchError, EventHandler, ReceiveOutcome, Receiver};
use tracing::{Instrument, warn};

use crate::{Channel, Turns};

/// A channel's inbound events, through its receive context, to turns.
pub struct TurnHandler {
    turns: Arc<Turns>,
    channel: Arc<Channel>,
    receiver: Receiver,
}

impl TurnHandler {
    /// Hands `channel`'s events, received through `receiver` (the channel's receive context),
    /// to `turns`.
    pub fn new(turns: Arc<Turns>, channel: Arc<Channel>, receiver: Receiver) -> TurnHandler {
        TurnHandler {
            turns,
            channel,
            receiver,
        }
    }
}

impl std::fmt::Debug for TurnHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnHandler")
            .field("channel", &self.channel.name)
            .field("receiver", &self.receiver)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl EventHandler for TurnHandler {
    async fn accept(&self, raw: &serde_json::Value, ack: &AckController) {
        if let Err(error) = self.receiver.accept(raw, ack).await {
            // Still queued: its receive records it when its turn comes.
            warn!(channel = %self.channel.name, %error, "pushed event not recorded on arrival");
        }
    }

    fn is_control(&self, inbound: &clawgate_channel_sdk::NormalizedInbound) -> bool {
        self.channel.commands
            && inbound
                .message
                .body
                .as_ref()
                .is_some_and(|body| crate::Command::parse(&body.text).is_some())
    }

    async fn handle(&self, raw: &serde_json::Value, ack: &AckController, attempt: u32) -> bool {
        let gateway = &*self.turns;
        let channel = &self.channel;
        let span = tracing::info_span!("turn", channel = %channel.name, attempt);
        gateway
            .counters
            .receives_in_flight
            .fetch_add(1, Ordering::SeqCst);
        let outcome = self
            .receiver
            .receive_or_settle(
                raw,
                ack,
                |inbound| async move {
                    // A turn cut short by a stop is not the message's failure: its attempt is
                    // given back.
                    gateway.turn(channel, inbound).await.map_err(|e| {
                        if gateway.stopping() {
                            DispatchError::interrupted(e.to_string())
                        } else if e.is_permanent() {
                            DispatchError::permanent(e.to_string())
                        } else {
                            DispatchError::from(e.to_string())
                        }
                    })
                },
                |inbound| async move { gateway.settle(channel, inbound).await },
            )
            .instrument(span)
            .await;
        gateway
            .counters
            .receives_in_flight
            .fetch_sub(1, Ordering::SeqCst);
        match &outcome {
            Ok(ReceiveOutcome::Failed {
                dead_lettered: false,
                error,
                ..
            }) => {
                warn!(%error, attempt, "turn failed; retrying");
                false
            }
            Ok(ReceiveOutcome::Failed {
                dead_lettered: true,
                error,
                ..
            }) => gateway.tell_of_failure(channel, raw, error).await,
            // Dead-lettered by an earlier run that may have died before its notice was
            // recorded: the notice is keyed by the event, so this sends it at most once.
            Ok(ReceiveOutcome::Duplicate {
                status: clawgate_store::InboundStatus::DeadLettered,
            }) => {
                gateway
                    .tell_of_failure(channel, raw, "dead-lettered by an earlier run")
                    .await
            }
            Ok(_) => true,
            Err(e) => {
                warn!(error = %e, attempt, "receive failed; retrying");
                false
            }
        }
    }
}
