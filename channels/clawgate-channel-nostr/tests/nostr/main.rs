//! The Nostr channel against a real relay in the test process (`nostr-relay-builder`), reached
//! through a proxy that can lose answers or take the relay down: the channel contract suite,
//! and what the contract does not name (a relay's `duplicate:` answer as success, lookups by id
//! after a lost answer, relays down before and after the write, the rule over several relays,
//! the inbound checkpoint).
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod nostr_tools;
mod peer;
mod send;
