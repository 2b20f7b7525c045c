//! The Nostr channel (layer 3): one key as a clawgate channel plugin, speaking encrypted direct
//! messages over one or more relays.
//!
//! [`NostrFactory`] builds `kind = "nostr"` keys from their settings ([`NostrSettings`]): the
//! sender ([`NostrAdapter`]: NIP-17 gift wraps with NIP-44, or NIP-04 when configured, signed
//! when rendered so the intent stores the event before it is published; the event id is the
//! receipt, a relay's `duplicate:` answer is success, a lost answer is settled by asking each
//! relay for the id), the receiver ([`NostrReceiver`]) and the source ([`NostrFeed`]: a
//! subscription to what is addressed to us, from a durable checkpoint). The crate README says
//! which sends can be settled after a lost answer.

#![warn(missing_docs)]

mod adapter;
pub mod client;
pub mod dm;
mod plugin;
mod receive;
mod source;
#[cfg(feature = "testing")]
pub mod testing;

pub use adapter::{MAX_TEXT_CHARS, NostrAdapter, recipient};
pub use plugin::{NostrFactory, NostrLink, NostrSettings, SentWhen};
pub use receive::{NostrReceiver, inbound_event};
pub use source::NostrFeed;
