//! The LINE channel (layer 3): one LINE Official Account's Messaging API channel as a
//! clawgate channel plugin.
//!
//! [`LineFactory`] builds `kind = "line"` accounts from their settings ([`LineSettings`]):
//! the sender ([`LineAdapter`]: a reply with the event's token while it is fresh and unused,
//! else a push under `X-Line-Retry-Key`), the renderer ([`LineRenderer`]: 5000-character
//! chunks, at most five messages per call), the receiver ([`LineReceiver`]) and the source
//! ([`WebhookSource`]: signed webhooks, answered after the durable record). Reply tokens are
//! the capability of the reply relation ([`ReplyConstraints`], [`LINE_REPLY`]). The crate
//! README says which sends can be settled after a lost answer. With the `simulator` feature,
//! [`simulator`] is the Messaging API and webhook sender on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod journal;
mod plugin;
mod receive;
mod reply;
pub mod signature;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{AfterUnknownReply, LineAdapter, retry_key};
pub use plugin::{BotIdentity, DEFAULT_API_BASE, LineFactory, LineSettings};
pub use receive::LineReceiver;
pub use reply::{
    LINE_REPLY, LineRenderer, MAX_MESSAGES_PER_CALL, MAX_TEXT_CHARS, ReplyConstraints, ReplyTokens,
};
pub use source::{MAX_BODY_BYTES, WebhookConfig, WebhookSource};
