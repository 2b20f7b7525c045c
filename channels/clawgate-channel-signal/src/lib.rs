//! The Signal channel (layer 3): one Signal account on a signal-cli JSON-RPC daemon as a
//! clawgate channel plugin.
//!
//! [`SignalFactory`] builds `kind = "signal"` accounts from their settings
//! ([`SignalSettings`]): the sender ([`SignalAdapter`]: `send` to a number or a group, text
//! chunked so no message exceeds signal-cli's 2000-byte inline limit, quoted replies, receipts
//! as (account, timestamp)), the receiver ([`SignalReceiver`]: data messages answered, sync
//! copies, receipts, typing, edits and deletes not) and the source ([`ReceiveSource`]:
//! `subscribeReceive` on the daemon's TCP socket, with the daemon in `--receive-mode=manual`
//! so nothing is lost while the gateway is away). The crate README says which sends can be
//! settled after a lost answer (none). With the `simulator` feature, [`simulator`] is the
//! daemon on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod plugin;
mod receive;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{MAX_TEXT_CHARS, SignalAdapter};
pub use plugin::{SignalFactory, SignalSettings};
pub use receive::SignalReceiver;
pub use source::ReceiveSource;
