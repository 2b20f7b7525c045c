//! A real IRC server for tests (feature `testing`): ngircd from Debian (`cargo xtask setup`
//! installs it) on a free loopback port, and a raw-socket client that plays a person in the
//! channel. The channel's own tests and the gateway's run against them.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // A test fixture: failures panic loudly.

mod client;
mod ngircd;

pub use client::Client;
pub use ngircd::{Ngircd, Penalties, SERVER_NAME, free_port};
