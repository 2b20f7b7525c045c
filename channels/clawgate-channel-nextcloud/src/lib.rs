//! The Nextcloud Talk channel (layer 3): one Talk account as a clawgate channel plugin, as a
//! webhook bot or as a Talk user.
//!
//! [`NextcloudFactory`] builds `kind = "nextcloud"` accounts from their settings
//! ([`NextcloudSettings`], `mode = "bot" | "user"`):
//!
//! - **bot**: [`WebhookSource`] takes Talk's signed webhooks (HMAC over random ‖ body, checked in
//!   constant time before parsing; answered 200 only after the durable record — Talk waits 5 s
//!   and never retries); [`TalkAdapter`] sends signed bot messages (HMAC over random ‖ text)
//!   with a `referenceId`, which is the receipt (the bot API returns no id); a lost answer is
//!   undecidable (no history for bots) and parked.
//! - **user**: [`ChatPoller`] long-polls the OCS chat API (`lookIntoFuture`,
//!   `lastKnownMessageId` as the durable watermark); [`TalkAdapter`] sends chat messages whose
//!   id is the receipt, edits and deletes live previews, and settles a lost answer by reading
//!   history for its `referenceId`.
//!
//! [`TalkReceiver`] normalizes both event shapes. With the `simulator` feature, [`simulator`] is a
//! Talk server (both APIs and the webhook sender) on loopback.

#![warn(missing_docs)]

mod adapter;
mod journal;
mod ocs;
mod plugin;
mod poll;
mod receive;
pub mod sign;
#[cfg(feature = "simulator")]
pub mod simulator;
mod webhook;

pub use adapter::{DELETE_WINDOW, EDIT_WINDOW, MAX_MESSAGE_CHARS, TalkAdapter};
pub use plugin::{NextcloudFactory, NextcloudSecret, NextcloudSettings, TalkMode};
pub use poll::ChatPoller;
pub use receive::{BotActor, BotEvent, BotObject, BotTarget, ChatMessage, TalkReceiver};
pub use webhook::{MAX_BODY_BYTES, WebhookConfig, WebhookSource};
