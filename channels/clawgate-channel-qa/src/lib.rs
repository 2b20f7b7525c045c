//! The QA platform and its adapter (layer 3): the contract target for every lifecycle behaviour.
//!
//! [`QaPlatform`] is a real HTTP chat service on loopback with fault injection and a durable log
//! of what landed, so a test can count exactly how many times a message reached the platform.
//! [`QaAdapter`] implements the channel SDK against it and declares its capabilities honestly;
//! [`QaAdapter::without_idempotency`] is the variant that cannot reconcile unknown outcomes.

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod adapter;
mod platform;
mod plugin;
mod wire;

pub use adapter::{QA_CHANNEL, QaAdapter};
pub use platform::{QaPlatform, QaPlatformConfig};
pub use plugin::{QaFactory, QaFeed, QaHandle, QaSettings, platform_state_file};
pub use wire::{
    ApiError, EditRequest, ErrorBody, Fault, FaultMode, InboundRequest, LogEntry, LogEvent,
    MessageAnswer, MessagesAnswer, PlatformAttachment, PlatformMessage, SendRequest, Update,
    UpdatesAnswer,
};
