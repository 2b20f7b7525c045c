//! The Synology Chat channel (layer 3): one Synology Chat server's bot and channel
//! integrations as a clawgate channel plugin.
//!
//! [`SynologyFactory`] builds `kind = "synology"` accounts from their settings
//! ([`SynologySettings`]): the sender ([`SynologyAdapter`]: DMs through the bot's `chatbot`
//! method to the user id `user_list` names, channel answers through the channel's incoming
//! webhook; 2000-character chunks; `success:false` is a failure), the receiver
//! ([`SynologyReceiver`]) and the source ([`WebhookSource`]: the bot's and the outgoing
//! webhooks' form POSTs, token-checked in constant time, answered after the durable record).
//! Synology returns no post ids: the crate README says what a receipt is and why a send whose
//! answer was lost is left to an operator. With the `simulator` feature, [`simulator`] is the
//! DSM Web API and webhook sender on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod plugin;
mod receive;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{MAX_TEXT_CHARS, SynologyAdapter};
pub use plugin::{ChannelSettings, SynologyFactory, SynologySecrets, SynologySettings};
pub use receive::SynologyReceiver;
pub use source::{InboundTokens, MAX_BODY_BYTES, WebhookConfig, WebhookSource};
