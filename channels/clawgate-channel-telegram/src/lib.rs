//! The Telegram channel (layer 3): one bot account of the Bot API as a clawgate channel plugin.
//!
//! [`TelegramFactory`] builds `kind = "telegram"` accounts from their settings
//! ([`TelegramSettings`]): the sender ([`TelegramAdapter`]: `sendMessage`, media by URL,
//! `editMessageText`, `deleteMessage`, `sendChatAction`, previews by message edits or native
//! drafts), the receiver ([`TelegramReceiver`]) and the source (`getUpdates` long polling from
//! the engine's durable watermark, or a webhook). The crate README says which sends can be
//! settled after a lost answer and which cannot. With the `simulator` feature, [`simulator`]
//! is a Bot API server on loopback that behaves like Telegram's, for tests and demos.

#![warn(missing_docs)]

mod adapter;
mod client;
mod migrations;
mod plugin;
mod receive;
mod render;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
pub mod wire;

pub use adapter::{MAX_TEXT_CHARS, TelegramAdapter};
pub use plugin::{BotIdentity, DEFAULT_API_BASE, Mode, TelegramFactory, TelegramSettings};
pub use receive::TelegramReceiver;
pub use render::{MAX_CAPTION_CHARS, TelegramRenderer};
pub use source::{
    MAX_BODY_BYTES, MAX_POLL_TIMEOUT_S, PollingSource, SECRET_HEADER, WebhookConfig, WebhookSource,
};
