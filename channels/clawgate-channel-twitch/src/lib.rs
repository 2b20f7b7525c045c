//! The Twitch channel (layer 3): one bot account in Twitch chat as a clawgate channel plugin.
//!
//! [`TwitchFactory`] builds `kind = "twitch"` accounts from their settings
//! ([`TwitchSettings`]). Chat is read over one TMI (Twitch IRC) connection with
//! `twitch.tv/tags` and `twitch.tv/commands`: message ids come from the `id` tag, our own
//! login's lines are ignored, a message is answered when it mentions the bot. Replies go through
//! Helix "Send Chat Message" by default (a 200 with `is_sent: false` is a refusal with its
//! drop reason, never a success) or as `PRIVMSG`s (a `NOTICE` with a `msg-id` is the refusal),
//! at most 500 characters each, within Twitch's rate limit by user type, and around the 30 s
//! duplicate rule. The crate README has the table of which sends can be settled after a lost
//! answer.

#![warn(missing_docs)]

mod adapter;
mod client;
mod connection;
pub mod limits;
mod plugin;
mod receive;
mod source;

#[cfg(feature = "simulator")]
pub mod simulator;

pub use adapter::{CHUNK_CHARS, MAX_CHARS, TwitchAdapter, TwitchRenderer, split_text};
pub use plugin::{SendVia, TwitchFactory, TwitchLink, TwitchSettings};
pub use receive::{TwitchReceiver, inbound_event};
pub use source::TwitchFeed;
