//! The Discord channel (layer 3): one bot account of Discord's REST v10 and Gateway as a
//! clawgate channel plugin.
//!
//! [`DiscordFactory`] builds `kind = "discord"` accounts from their settings
//! ([`DiscordSettings`]): the sender ([`DiscordAdapter`]: create with a nonce from the unit's key,
//! edit, delete, previews by edit, lost answers settled from the channel's recent messages), the
//! receiver ([`DiscordReceiver`]), the Gateway feed (identify, heartbeat, resume with the durable
//! `seq`) and the outbound [`EchoRegistry`] that stands in for origin metadata Discord messages
//! cannot carry. With the `simulator` feature, [`simulator`] is a Discord server on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
pub mod echo;
mod plugin;
mod receive;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
pub mod wire;

pub use adapter::{BotCell, DiscordAdapter, MAX_TEXT_CHARS, nonce_of};
pub use echo::EchoRegistry;
pub use plugin::{DEFAULT_API_BASE, DiscordFactory, DiscordSettings};
pub use receive::DiscordReceiver;
pub use source::{INTENTS, SessionRecord};
