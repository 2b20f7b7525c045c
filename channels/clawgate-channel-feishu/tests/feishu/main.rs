//! The Feishu channel against its simulator: the conformance suite, the simulator's own
//! fidelity to the Open Platform facts, sends (uuid, reconciliation, rendering, streaming
//! cards), inbound callbacks (signature, encryption, redelivery, dedupe) and the cross-check
//! with Feishu's official Python SDK.
#![allow(clippy::unwrap_used)]

mod conformance;
mod inbound;
mod lark_oapi;
mod peer;
mod send;
mod simulator;
