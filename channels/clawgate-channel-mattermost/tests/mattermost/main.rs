//! The Mattermost channel against the Mattermost simulator over real HTTP and WebSockets on
//! loopback: the channel contract suite, the simulator's own REST and WebSocket facts (checked
//! with raw HTTP and with the `mattermostdriver` Python client), and the Mattermost behaviours
//! the contract does not name (the pending_post_id window, props-key reconciliation, threads,
//! draft finalization and the fresh-send fallback, resume and re-fetch).
#![allow(clippy::unwrap_used)]

mod conformance;
mod driver;
mod inbound;
mod live;
mod peer;
mod send;
mod simulator;
