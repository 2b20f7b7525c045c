//! The IRC channel against real servers on loopback — ngircd, and InspIRCd for IRCv3 — the
//! channel contract suite on both, and what the contract does not name (512-byte splitting
//! with multibyte text, flood control under the server's penalties, reconnect after a server
//! restart, nick collision, NOTICE and CTCP, labeled echoes as receipts).
#![allow(clippy::unwrap_used)]

mod behaviour;
mod conformance;
mod ircv3;
mod peer;
mod proxy;
