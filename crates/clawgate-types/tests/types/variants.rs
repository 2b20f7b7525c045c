//! Every variant of every field-less wire enum, listed once.
//!
//! Each list is paired with an exhaustive `match`: adding a variant to the crate breaks the
//! build here until the list (and so every table and strategy built from it) is updated. The
//! `#[non_exhaustive]` enums cannot be matched exhaustively outside the crate: their lists are
//! the crate's `KNOWN` constants, which carry the same guard inside the crate.

use clawgate_types::{
    AcpBackend, ActorType, BatchAtomicity, DeliveryFailureKind, DeliveryStatus, EchoPolicy,
    FailureReason, GatewayFailureCode, GatewayOriginKind, ImmediateAckReason, LeaseState,
    LiveCancelReason, LiveMode, MessageDirection, MessageDurabilityPolicy, MessagePartKind,
    RunOutcome, SessionStateEventKind, SessionVisibility, SystemReason, TargetKind,
};

macro_rules! all_variants {
    ($($list:ident: $ty:ident { $($variant:ident),+ $(,)? })*) => {$(
        pub(crate) const $list: &[$ty] = &[$($ty::$variant),+];
        const _: fn($ty) = |value| match value {
            $($ty::$variant)|+ => (),
        };
    )*};
}

all_variants! {
    MESSAGE_DIRECTIONS: MessageDirection { Inbound, Outbound }
    BATCH_ATOMICITIES: BatchAtomicity { AllOrRetryRemaining, BestEffortParts }
    GATEWAY_FAILURE_CODES: GatewayFailureCode {
        AgentFailedBeforeReply, MissingApiKey, ModelLoginExpired, AgentsBusy, AgentStillWorking,
    }
    GATEWAY_ORIGIN_KINDS: GatewayOriginKind { GatewayFailure }
    ECHO_POLICIES: EchoPolicy { DropBotRoomEcho }
    FAILURE_REASONS: FailureReason {
        Expired, MaxAttemptsExceeded, Permanent, AwaitingConfiguration, OperatorCancelled,
    }
    DURABILITY_POLICIES: MessageDurabilityPolicy { Required, BestEffort, Disabled }
    DELIVERY_STATUSES: DeliveryStatus {
        HandledVisible, HandledNoSend, Unsupported, NotApplicable, Failed,
    }
    SESSION_EVENT_KINDS: SessionStateEventKind {
        Created, HumanDirectMessage, GoalChanged, ChildSpawned, RunCompleted, RunFailed,
        Compacted,
    }
    ACTOR_TYPES: ActorType { Human, Agent, System }
    RUN_OUTCOMES: RunOutcome { Cancelled, Timeout, Error }
    ACP_BACKENDS: AcpBackend { Acpx }
    LEASE_STATES: LeaseState { Open, Closing, Closed, Lost }
    SESSION_VISIBILITIES: SessionVisibility { OwnSession, Tree, Agent, All }
}

pub(crate) const TARGET_KINDS: &[TargetKind] = TargetKind::KNOWN;
pub(crate) const SYSTEM_REASONS: &[SystemReason] = SystemReason::KNOWN;
pub(crate) const PART_KINDS: &[MessagePartKind] = MessagePartKind::KNOWN;
pub(crate) const FAILURE_KINDS: &[DeliveryFailureKind] = DeliveryFailureKind::KNOWN;
pub(crate) const IMMEDIATE_ACK_REASONS: &[ImmediateAckReason] = ImmediateAckReason::KNOWN;
pub(crate) const LIVE_MODES: &[LiveMode] = LiveMode::KNOWN;
pub(crate) const LIVE_CANCEL_REASONS: &[LiveCancelReason] = LiveCancelReason::KNOWN;
