//! The IRC channel (layer 3): one nick on one IRC server as a clawgate channel plugin.
//!
//! [`IrcFactory`] builds `kind = "irc"` accounts from their settings ([`IrcSettings`]). One
//! connection per account, shared by the sender ([`IrcAdapter`]) and the pushed feed
//! ([`IrcFeed`]): it registers (`NICK`/`USER`, a server password or SASL PLAIN), takes an
//! alternate nick when the nick is in use, joins the configured channels, answers `PING`s,
//! reconnects with backoff and joins again, and writes through a token bucket so the server has
//! no flood to punish. Plain IRC has no message ids and no echo: receipts are synthetic `PING`
//! fences. Where the server grants IRCv3 `echo-message` + `labeled-response`, a line goes
//! labeled and its echo is the receipt, with the echo's `msgid` as the id. Either way, a line
//! whose connection dropped before the server's answer is an unknown outcome, never sent again.
//! The crate README has the table of which sends can be settled after a lost answer.

#![warn(missing_docs)]

mod adapter;
mod connection;
pub mod flood;
pub mod line;
mod plugin;
mod receive;
pub mod register;
mod source;
#[cfg(feature = "testing")]
pub mod testing;

pub use adapter::{IrcAdapter, IrcRenderer};
pub use plugin::{IrcFactory, IrcLink, IrcSettings};
pub use receive::{IrcReceiver, inbound_event, is_channel};
pub use source::IrcFeed;
