//! The Telegram channel (layer 3): the Bot API spoken by a clawgate channel plugin.

#[cfg(feature = "simulator")]
pub mod simulator;
