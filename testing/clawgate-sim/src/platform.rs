//! The simulated platform: a chat platform with no idempotency of its own (a unit sent twice
//! shows twice, so a protocol bug is visible), scripted faults, an answer to "did this unit
//! land?" looked up by the unit's key, and a switch that stands for the gateway process being
//! dead: then nothing reaches the platform.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageReceiveAdapter, NormalizedInbound, ReceiveError, Reconciliation,
    SendContext, SendError,
};
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities,
    MessageReceiptPart, MessageTarget, RenderedMessageUnit, TextCapabilities,
};

pub const CHANNEL: &str = "sim";
/// Units are cut at this many characters, so a long reply has several.
pub const MAX_TEXT: usize = 40;

/// What the platform does with an upcoming call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Refused before anything happened (a 503).
    Refuse,
    /// Done, and the answer lost.
    LoseAnswer,
    /// Not done, and no answer either (the caller cannot tell it from `LoseAnswer`).
    LostBeforeLanding,
    /// A reconciliation: the platform cannot tell right now.
    CannotTell,
}

/// How the adapter declares itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterKind {
    /// Answers "did it land?" truthfully.
    Reconciles,
    /// Neither reconciles nor accepts duplicates: unknown outcomes are parked.
    Neither,
    /// Declares duplicates acceptable while the platform does not deduplicate (the broken
    /// variant: replaying an unknown outcome without asking shows a unit twice).
    ClaimsDuplicatesAcceptable,
}

/// One unit the platform holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    pub id: String,
    /// `<idempotency key>#<unit index>`.
    pub unit_key: String,
    pub conversation: String,
    pub text: String,
}

#[derive(Debug, Default)]
struct State {
    landed: Vec<Landed>,
    faults: VecDeque<Fault>,
    calls: u64,
}

/// The platform and the adapter in front of it. Clones share the platform.
#[derive(Debug, Clone)]
pub struct SimPlatform {
    state: Arc<Mutex<State>>,
    /// The gateway process is dead: nothing reaches the platform.
    dead: Arc<AtomicBool>,
    capabilities: Arc<MessageCapabilities>,
}

impl SimPlatform {
    pub fn new(kind: AdapterKind, dead: Arc<AtomicBool>) -> SimPlatform {
        let delivery = DeliveryCapabilities::default()
            .with_receipt_required(true)
            .with_reconcile_unknown_send(kind == AdapterKind::Reconciles)
            .with_duplicates_acceptable(kind == AdapterKind::ClaimsDuplicatesAcceptable);
        let capabilities = MessageCapabilities::default()
            .with_text(
                TextCapabilities::default()
                    .with_max_length(MAX_TEXT as u32)
                    .with_chunking(true),
            )
            .with_delivery(delivery);
        SimPlatform {
            state: Arc::default(),
            dead,
            capabilities: Arc::new(capabilities),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    pub fn landed(&self) -> Vec<Landed> {
        self.lock().landed.clone()
    }

    /// The raw event a person's message is on this platform.
    pub fn event(id: &str, conversation: &str, text: &str) -> serde_json::Value {
        serde_json::json!({ "id": id, "conversation": conversation, "text": text })
    }

    fn gone() -> SendError {
        SendError::before_io(
            DeliveryFailureKind::Transient,
            "the simulated gateway process is dead",
        )
    }
}

#[async_trait]
impl ChannelMessageAdapter for SimPlatform {
    fn channel(&self) -> &str {
        CHANNEL
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Self::gone());
        }
        let text = unit
            .payload
            .get("text")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut state = self.lock();
        state.calls += 1;
        let fault = state.faults.pop_front();
        if fault == Some(Fault::Refuse) {
            return Err(SendError::before_io(
                DeliveryFailureKind::Transient,
                "503 service unavailable",
            ));
        }
        if fault == Some(Fault::LostBeforeLanding) {
            return Err(SendError::after_io(
                DeliveryFailureKind::Unknown,
                "the connection broke before an answer",
            ));
        }
        let id = format!("p{}", state.landed.len() + 1);
        state.landed.push(Landed {
            id: id.clone(),
            unit_key: ctx.unit_key(unit),
            conversation: ctx.message.target.id.clone(),
            text,
        });
        if fault == Some(Fault::LoseAnswer) {
            return Err(SendError::after_io(
                DeliveryFailureKind::Unknown,
                "the connection broke before an answer",
            ));
        }
        Ok(MessageReceiptPart::new(id, unit.kind, unit.index))
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(Self::gone());
        }
        let mut state = self.lock();
        if state.faults.front() == Some(&Fault::CannotTell) {
            state.faults.pop_front();
            return Ok(Reconciliation::Unresolved);
        }
        let key = ctx.unit_key(unit);
        Ok(match state.landed.iter().find(|l| l.unit_key == key) {
            Some(landed) => Reconciliation::Sent(Box::new(MessageReceiptPart::new(
                landed.id.clone(),
                unit.kind,
                unit.index,
            ))),
            None => Reconciliation::NotSent,
        })
    }
}

impl MessageReceiveAdapter for SimPlatform {
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError> {
        let field = |name: &str| {
            raw.get(name)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| ReceiveError::Malformed {
                    channel: CHANNEL.into(),
                    reason: format!("no {name}"),
                })
        };
        let id = field("id")?;
        let message = ChannelMessage::inbound(
            id.clone(),
            CHANNEL,
            MessageTarget::direct(field("conversation")?),
        )
        .with_text(field("text")?)
        .with_raw(raw.clone());
        Ok(NormalizedInbound::new(id, message))
    }
}
