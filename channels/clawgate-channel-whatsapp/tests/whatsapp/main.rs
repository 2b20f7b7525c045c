//! The WhatsApp channel against the Cloud API simulator over real HTTP on loopback: the
//! channel contract suite, and the WhatsApp behaviours it does not name (the 24-hour window,
//! error codes, reconciliation from status webhooks, signatures, verification, redeliveries,
//! plain durable finals, the send evidence in the gateway's store).
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod peer;
mod send;
mod state;
