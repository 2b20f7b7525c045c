//! The Twitch channel (layer 3): one bot account in Twitch chat as a clawgate channel plugin.

#![warn(missing_docs)]

#[cfg(feature = "simulator")]
pub mod simulator;
