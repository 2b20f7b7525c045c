//! The Slack channel against the Slack simulator over real HTTP on loopback: the channel
//! contract suite, and the Slack behaviours it does not name (reconciliation by metadata key,
//! origin marks and bot rooms, native streams vs draft previews by thread shape, signatures
//! and replays, retries and resends of events).
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod live;
mod peer;
mod send;
