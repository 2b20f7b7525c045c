//! The Matrix channel against a real Synapse homeserver over loopback: the channel contract
//! suite, and what the contract does not name (transaction-id reconciliation behind a proxy
//! that drops the answer, the redaction fallback, echoes, `/sync` restarts, invites, rate
//! limits, refused tokens and rooms, encrypted rooms).
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod latency;
mod peer;
mod proxy;
mod send;
mod synapse;
