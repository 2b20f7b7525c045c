//! The channel-turn bridge: compatibility wrappers for channels written against "a turn" rather
//! than receive and send contexts.
//!
//! [`run`] is the simple path: receive the event, run the agent, deliver its replies. It is
//! non-durable by default — replies go through the caller's own deliver callback, never a generic
//! send first — and durable only when the channel opts in with an explicit policy.
//! [`run_prepared`] is for channel-owned dispatchers: the bridge records and finalizes the inbound
//! event; delivery stays the dispatcher's (it may call send contexts itself).

use std::future::Future;

use clawgate_channel_sdk::NormalizedInbound;
use clawgate_types::{ChannelMessage, DeliveryStatus, MessageDurabilityPolicy};

use crate::{
    AckController, MessagesError, Messenger, ReceiveOutcome, Receiver, SendOptions, SendOutcome,
};

/// How a simple turn delivers its replies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TurnDelivery {
    /// The channel's own deliver callback (the legacy behaviour and the default).
    #[default]
    ChannelCallback,
    /// Send contexts with this durability: an explicit, audited opt-in.
    Durable(MessageDurabilityPolicy),
}

/// One reply's delivery result, with the platform ids (returned on both paths).
#[derive(Debug, Clone, PartialEq)]
pub struct TurnDeliveryResult {
    pub status: DeliveryStatus,
    pub platform_message_ids: Vec<String>,
}

/// What a turn did.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    pub receive: ReceiveOutcome,
    pub deliveries: Vec<TurnDeliveryResult>,
}

/// The simple channel turn: receive → agent → deliver each reply.
///
/// `agent` turns the inbound message into replies; `deliver` is the channel's own delivery
/// (it returns the platform ids it created). With [`TurnDelivery::Durable`] the replies go
/// through `messenger` instead and `deliver` is not called.
pub async fn run<A, AFut, D, DFut>(
    receiver: &Receiver,
    messenger: &Messenger,
    raw: &serde_json::Value,
    ack: &AckController,
    delivery: TurnDelivery,
    agent: A,
    deliver: D,
) -> Result<TurnReport, MessagesError>
where
    A: FnOnce(NormalizedInbound) -> AFut,
    AFut: Future<Output = Result<Vec<ChannelMessage>, String>>,
    D: Fn(ChannelMessage) -> DFut,
    DFut: Future<Output = Result<Vec<String>, String>>,
{
    let deliveries = std::sync::Mutex::new(Vec::new());
    let receive = receiver
        .receive(raw, ack, |inbound| async {
            let replies = agent(inbound).await?;
            for reply in replies {
                let result = match delivery {
                    TurnDelivery::ChannelCallback => match deliver(reply).await {
                        Ok(ids) => TurnDeliveryResult {
                            status: DeliveryStatus::HandledVisible,
                            platform_message_ids: ids,
                        },
                        Err(error) => return Err(error),
                    },
                    TurnDelivery::Durable(durability) => {
                        let options = SendOptions {
                            durability,
                            ..SendOptions::default()
                        };
                        let report = messenger
                            .send(reply, options)
                            .await
                            .map_err(|e| e.to_string())?;
                        match &report.outcome {
                            SendOutcome::Sent { receipt }
                            | SendOutcome::AlreadySent { receipt } => TurnDeliveryResult {
                                status: DeliveryStatus::HandledVisible,
                                platform_message_ids: receipt.platform_message_ids.clone(),
                            },
                            // Durable and pending: recovery finishes it; the turn is done.
                            SendOutcome::RetryScheduled { .. }
                            | SendOutcome::Unknown { .. }
                            | SendOutcome::InProgress { .. } => TurnDeliveryResult {
                                status: DeliveryStatus::HandledNoSend,
                                platform_message_ids: vec![],
                            },
                            SendOutcome::Partial { delivered, .. } => TurnDeliveryResult {
                                status: DeliveryStatus::Failed,
                                platform_message_ids: delivered.platform_message_ids.clone(),
                            },
                            SendOutcome::Failed { failure, .. } => {
                                return Err(failure.message.clone());
                            }
                        }
                    }
                };
                deliveries
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(result);
            }
            Ok(())
        })
        .await?;
    let deliveries = deliveries
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(TurnReport {
        receive,
        deliveries,
    })
}

/// The prepared turn: the channel's own dispatcher delivers (previews, finals); the bridge
/// records the inbound event before and finalizes it after.
pub async fn run_prepared<P, PFut>(
    receiver: &Receiver,
    raw: &serde_json::Value,
    ack: &AckController,
    dispatcher: P,
) -> Result<ReceiveOutcome, MessagesError>
where
    P: FnOnce(NormalizedInbound) -> PFut,
    PFut: Future<Output = Result<(), String>>,
{
    receiver.receive(raw, ack, dispatcher).await
}
