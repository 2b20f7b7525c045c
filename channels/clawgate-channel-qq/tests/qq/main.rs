//! The QQ Bot channel against the QQ Bot simulator over real HTTP on loopback: the channel
//! contract suite, and the QQ behaviours it does not name (passive replies settled by the
//! 40054005 repeat, active messages within a quota and parked when their answer is lost, C2C
//! stream previews with the accumulator-timeout fallback final, media tags and text as voice,
//! Ed25519-signed callbacks and their redelivery, the journal in the gateway's store), and the
//! cross-check of the simulator with Tencent's own Python SDK (qq-botpy).
#![allow(clippy::unwrap_used)]

mod botpy;
mod conformance;
mod inbound;
mod live;
mod peer;
mod send;
mod simulator;
mod state;
