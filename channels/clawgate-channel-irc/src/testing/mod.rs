//! Real IRC servers for tests (feature `testing`): ngircd (plain IRC) and InspIRCd 3 (IRCv3
//! `echo-message`, `labeled-response`, `msgid`), both from Debian (`cargo xtask setup` installs
//! them), on a free loopback port, and a raw-socket client that plays a person in the channel.
//! The channel's own tests and the gateway's run against them.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // A test fixture: failures panic loudly.

mod client;
mod inspircd;
mod ngircd;

pub use client::Client;
pub use inspircd::{Inspircd, Ircv3};
pub use ngircd::{Ngircd, Penalties, SERVER_NAME, free_port};
