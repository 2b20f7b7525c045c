//! The IRC channel against a real ngircd on loopback: the channel contract suite, and what the
//! contract does not name (512-byte splitting with multibyte text, flood control under the
//! server's penalties, reconnect after a server restart, nick collision, NOTICE and CTCP).
#![allow(clippy::unwrap_used)]

mod behaviour;
mod conformance;
mod peer;
mod proxy;
