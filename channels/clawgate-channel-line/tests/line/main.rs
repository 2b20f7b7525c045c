//! The LINE channel against its simulator: the conformance suite, the simulator's own
//! fidelity to the Messaging API facts, sends (reply, push, retry keys, fallbacks, unknown
//! outcomes), inbound webhooks (signatures, redeliveries, dedupe), the reply journal in the
//! gateway's store, and the cross-check with LINE's official Python SDK.
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod line_bot_sdk;
mod peer;
mod send;
mod simulator;
mod state;
