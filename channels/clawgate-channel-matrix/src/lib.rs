//! The Matrix channel (layer 3): one account on a Matrix homeserver as a clawgate channel
//! plugin, over the client-server API.
//!
//! [`MatrixFactory`] builds `kind = "matrix"` accounts from their settings ([`MatrixSettings`]):
//! the sender ([`MatrixAdapter`]: `m.room.message` events whose transaction id is the unit's
//! idempotency key, replies, threads, HTML, `m.replace` edits, redactions, previews finalized in
//! place or redacted), the receiver ([`MatrixReceiver`]) and the source ([`SyncSource`]: `/sync`
//! from the engine's durable `since` token, invites joined when configured). End-to-end
//! encrypted rooms are refused, not pretended: the channel does not encrypt or decrypt. The
//! crate README says which sends can be settled after a lost answer.

#![warn(missing_docs)]

mod adapter;
mod client;
mod plugin;
mod receive;
mod source;

pub use adapter::{MAX_TEXT_CHARS, MatrixAdapter, MatrixOrigin, ORIGIN_KEY};
pub use plugin::{MAX_POLL_TIMEOUT_S, MatrixFactory, MatrixSettings};
pub use receive::MatrixReceiver;
pub use source::SyncSource;
