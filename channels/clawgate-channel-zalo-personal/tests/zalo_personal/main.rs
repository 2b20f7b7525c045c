//! The Zalo Personal channel against the Zalo Web simulator over real HTTP and WebSocket on
//! loopback: the channel contract suite, and what it does not name (the login, encrypted
//! parameters and frames, sends settled by the echo of their client id, the single-session
//! listener that a second login takes over, network drops, the send book in the gateway's
//! store), and the cross-check of the simulator with zca-js, the client existing integrations
//! use.
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod peer;
mod send;
mod session;
mod simulator;
mod state;
mod zca_js;
