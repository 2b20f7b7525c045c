//! The Google Chat channel against the simulator over real HTTP on loopback: the channel
//! contract suite, and the Google Chat behaviours it does not name (reconciliation by the
//! client-assigned id, requestId retries, threads, quota answers, event tokens, redelivery,
//! marked gateway-failure echoes and `allowBots`).
#![allow(clippy::unwrap_used)]

mod auth;
mod conformance;
mod inbound;
mod peer;
mod send;
