//! The Zalo OA channel against the OA simulator over real HTTP on loopback: the channel
//! contract suite, and the Zalo behaviours it does not name (failures in HTTP 200 bodies,
//! the 7-day window, access-token refresh with rotating refresh tokens, reconciliation from
//! `oa_send_text` echoes, signatures, redeliveries, plain durable finals), and the
//! cross-check of the simulator with a Zalo client someone else wrote.
#![allow(clippy::unwrap_used)]

mod conformance;
mod cross_check;
mod inbound;
mod legacy;
mod peer;
mod send;
mod simulator;
mod tokens;
