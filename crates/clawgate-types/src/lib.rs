//! The clawgate vocabulary (layer 0).
//!
//! Every type that crosses a process boundary — stored payloads, the control API, CLI `--json` —
//! is defined here and serializes to the camelCase JSON shapes of the design pages, so peers in
//! other languages can read it. Invariants of this crate:
//!
//! * no I/O and no async runtime: only data, parsing and pure decisions (time is read only
//!   through the [`clock::Clock`] trait, whose wall-clock implementation lives here so every
//!   layer shares one);
//! * decoding never panics: malformed JSON and unknown enum values become [`WireError`];
//! * the legal [`IntentStatus`] transitions live in one table ([`IntentStatus::can_transition_to`]).
//!
//! # Stability for channel authors
//!
//! The types a channel adapter builds or matches are `#[non_exhaustive]`, so adding a field
//! (a new capability, a new receipt token) or a variant (a new failure class, a new target kind)
//! is not a breaking change for adapters. They are built with constructors and `with_*` setters
//! instead of struct literals — for example
//! `ChannelMessage::outbound(id, channel, MessageTarget::group("room-1"), "hello")`,
//! `MessageReceiptPart::new(platform_id, MessagePartKind::Text, 0).with_edit_token(token)`,
//! `RenderedMessageUnit::text(0, "hello")`, or
//! `MessageCapabilities::default().with_live(LiveCapabilities::default().with_edit(true))` —
//! and their fields stay public to read. A match on a non-exhaustive enum outside this crate
//! needs a wildcard arm; it should do the conservative thing (treat an unknown failure class as
//! a possible platform side effect, an unknown part kind as unsupported), never claim success.
//!
//! ```
//! use clawgate_types::{
//!     ChannelMessage, LiveCapabilities, MessageCapabilities, MessagePartKind,
//!     MessageReceiptPart, MessageRelation, MessageTarget, RenderedMessageUnit,
//! };
//!
//! let reply = ChannelMessage::outbound(
//!     "qa:reply:m-1",
//!     "qa",
//!     MessageTarget::group("room-1").with_thread_id(Some("t-1")),
//!     "on it",
//! )
//! .with_account_id("bot")
//! .with_relation(MessageRelation::reply_to_inbound("m-1"));
//! assert_eq!(reply.body.as_ref().map(|b| b.text.as_str()), Some("on it"));
//!
//! let unit = RenderedMessageUnit::text(0, "on it");
//! let part = MessageReceiptPart::new("p-42", MessagePartKind::Text, unit.index)
//!     .with_thread_id("t-1")
//!     .with_edit_token("tok");
//! assert_eq!(
//!     serde_json::to_value(&part).unwrap(),
//!     serde_json::json!({
//!         "platformMessageId": "p-42", "kind": "text", "index": 0,
//!         "threadId": "t-1", "editToken": "tok",
//!     })
//! );
//!
//! let capabilities = MessageCapabilities::default()
//!     .with_live(LiveCapabilities::default().with_edit(true).with_delete(true));
//! assert!(capabilities.can_edit());
//! ```
//!
//! Non-exhaustive: [`ChannelMessage`], [`MessageTarget`], [`MessageActor`], [`MessageBody`],
//! [`MessageAttachment`], [`MessageQuote`], [`MessageRelation`] (and its variants),
//! [`MessageOrigin`], [`MessageReceiptPart`], [`MessageReceipt`], [`RenderedMessageUnit`],
//! [`RenderedMessageBatch`], [`MessageCapabilities`] and its nested capability structs,
//! [`LiveMessageState`], [`LiveMessageUpdate`], and the enums an adapter matches:
//! [`DeliveryFailureKind`], [`MessagePartKind`], [`TargetKind`], [`SystemReason`], [`LiveMode`],
//! [`LiveCancelReason`], [`ReceiveAckPolicy`], [`ImmediateAckReason`].
//!
//! Deliberately exhaustive, because only the core builds them and a new field or variant there
//! *should* break every match in the workspace until it is handled: the intent record and its
//! lifecycle ([`DurableSendIntent`], [`IntentStatus`], [`IllegalTransition`], [`DeliveryFailure`],
//! [`FailureReason`], [`DeliveryStatus`], [`MessageDurabilityPolicy`]), the gateway's own origin
//! marker ([`GatewayOrigin`] and its enums, versioned by `schemaVersion` instead), session and
//! signal-log records ([`SessionStateEvent`] and its enums), ACP ownership and leases
//! ([`AcpSessionOwner`], [`AcpxProcessLease`], [`LeaseState`]), visibility inputs
//! ([`SessionVisibilityInput`], [`VisibilityRow`], [`AgentToAgentPolicy`],
//! [`SessionVisibility`]), [`BatchAtomicity`] and [`MessageDirection`] (two closed choices), and
//! the error types.
//!
//! `missing_docs` warns (an error under CI's `clippy -D warnings`) on any public item, field or
//! variant without a doc comment: channel authors read these docs as the wire reference.

#![warn(missing_docs)]

/// Generates `with_<field>` setters for a builder-style value: each takes `self`, sets the field
/// and returns the value. `opt` wraps the value in `Some`; `into` takes anything convertible
/// (text fields take `&str` as well as `String`).
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident => $field:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$field = value;
            self
        }
    )*};
    (opt $($(#[$doc:meta])* $name:ident => $field:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: $ty) -> Self {
            self.$field = Some(value);
            self
        }
    )*};
    (opt into $($(#[$doc:meta])* $name:ident => $field:ident: $ty:ty;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(mut self, value: impl Into<$ty>) -> Self {
            self.$field = Some(value.into());
            self
        }
    )*};
}

/// Lists every variant of a `#[non_exhaustive]` field-less enum that this version knows, as
/// `Type::KNOWN`, beside an exhaustive match that stops the build until a new variant is listed
/// (outside the crate no match can be exhaustive, so the guard has to live here).
macro_rules! known_variants {
    ($ty:ident { $($variant:ident),+ $(,)? }) => {
        impl $ty {
            /// Every variant this version of the crate knows, in declaration order; a later
            /// version may know more.
            pub const KNOWN: &'static [$ty] = &[$($ty::$variant),+];
        }

        const _: fn($ty) = |value| match value {
            $($ty::$variant)|+ => (),
        };
    };
}

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod acp;
mod batch;
mod capabilities;
pub mod clock;
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

pub use acp::{AcpBackend, AcpSessionOwner, AcpxProcessLease, LeaseState, LeaseSurvivor};
pub use batch::{
    BatchAtomicity, MessagePartKind, RenderedMessageBatch, RenderedMessageUnit,
    unit_idempotency_key,
};
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
pub use wire::{MAX_JSON_DEPTH, WireError, from_json, from_json_value, to_json};

/// Milliseconds since the Unix epoch, the unit of every timestamp on the wire.
pub type UnixMillis = i64;
