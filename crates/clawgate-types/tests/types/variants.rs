//! Every variant of every field-less wire enum, listed once.
//!
//! Each list is paired with an exhaustive `match`: adding a variant to the crate breaks the
//! build here until the list (and so every table and strategy built from it) is updated.

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
    TARGET_KINDS: TargetKind { Direct, Group, Channel, Thread }
    SYSTEM_REASONS: SystemReason {
        Approval, Task, Hook, Cron, Subagent, MessageTool, Cli, ControlUi, Automation, Error,
    }
    PART_KINDS: MessagePartKind { Text, Media, Voice, Card, Preview, Unknown }
    BATCH_ATOMICITIES: BatchAtomicity { AllOrRetryRemaining, BestEffortParts }
    GATEWAY_FAILURE_CODES: GatewayFailureCode {
        AgentFailedBeforeReply, MissingApiKey, ModelLoginExpired,
    }
    GATEWAY_ORIGIN_KINDS: GatewayOriginKind { GatewayFailure }
    ECHO_POLICIES: EchoPolicy { DropBotRoomEcho }
    FAILURE_KINDS: DeliveryFailureKind {
        Transient, RateLimit, Auth, Permission, NotFound, InvalidPayload, Conflict, Cancelled,
        Unknown,
    }
    FAILURE_REASONS: FailureReason {
        Expired, MaxAttemptsExceeded, Permanent, AwaitingConfiguration, OperatorCancelled,
    }
    DURABILITY_POLICIES: MessageDurabilityPolicy { Required, BestEffort, Disabled }
    IMMEDIATE_ACK_REASONS: ImmediateAckReason { WebhookTimeout, PlatformContract }
    DELIVERY_STATUSES: DeliveryStatus {
        HandledVisible, HandledNoSend, Unsupported, NotApplicable, Failed,
    }
    LIVE_MODES: LiveMode { Partial, Block, Progress, Native }
    LIVE_CANCEL_REASONS: LiveCancelReason { Media, Error, ReplyTargetMismatch, Stale, Aborted }
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
