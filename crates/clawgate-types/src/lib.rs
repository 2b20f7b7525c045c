//! The clawgate vocabulary (layer 0).
//!
//! Every type that crosses a process boundary — stored payloads, the control API, CLI `--json` —
//! is defined here and serializes to the camelCase JSON shapes of the design pages, so peers in
//! other languages can read it. Invariants of this crate:
//!
//! * no I/O and no async runtime: only data, parsing and pure decisions;
//! * decoding never panics: malformed JSON and unknown enum values become [`WireError`];
//! * the legal [`IntentStatus`] transitions live in one table ([`IntentStatus::can_transition_to`]).

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod acp;
mod batch;
mod capabilities;
mod delivery;
mod failure;
mod ids;
mod intent;
mod live;
mod message;
mod origin;
mod receipt;
mod session;
mod visibility;
mod wire;

pub use acp::{AcpBackend, AcpSessionOwner, AcpxProcessLease, LeaseState};
pub use batch::{BatchAtomicity, MessagePartKind, RenderedMessageBatch, RenderedMessageUnit};
pub use capabilities::{
    AttachmentCapabilities, DeliveryCapabilities, LiveCapabilities, MessageCapabilities,
    TextCapabilities, ThreadCapabilities,
};
pub use delivery::{DeliveryStatus, ImmediateAckReason, MessageDurabilityPolicy, ReceiveAckPolicy};
pub use failure::{DeliveryFailure, DeliveryFailureKind, FailureReason};
pub use ids::{GatewayInstanceId, IntentId, LeaseId, ParseIdError};
pub use intent::{ALL_INTENT_STATUSES, DurableSendIntent, IllegalTransition, IntentStatus};
pub use live::{LiveCancelReason, LiveMessageState, LiveMessageUpdate, LiveMode};
pub use message::{
    ChannelMessage, MessageActor, MessageAttachment, MessageBody, MessageDirection, MessageQuote,
    MessageRelation, MessageTarget, SystemReason, TargetKind,
};
pub use origin::{
    EchoFacts, EchoPolicy, GATEWAY_ORIGIN_SCHEMA_VERSION, GatewayFailureCode, GatewayOrigin,
    GatewayOriginKind, MessageOrigin, should_drop_gateway_echo,
};
pub use receipt::{MessageReceipt, MessageReceiptPart};
pub use session::{
    ActorType, GLOBAL_SESSION_KEY, RunOutcome, SessionKey, SessionKeyError, SessionStateEvent,
    SessionStateEventKind, StateVersion,
};
pub use visibility::{
    AgentToAgentPolicy, SessionVisibility, SessionVisibilityInput, VisibilityRow,
};
pub use wire::{WireError, from_json, from_json_value, to_json};

/// Milliseconds since the Unix epoch, the unit of every timestamp on the wire.
pub type UnixMillis = i64;
