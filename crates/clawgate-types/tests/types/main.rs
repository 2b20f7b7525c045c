//! Integration tests of the clawgate-types vocabulary: wire snapshots, round trips, decoding
//! errors, the intent state machine, session keys, origins and the receipt/batch helpers.

// Tests unwrap on purpose: a panic with the error is the clearest failure report.
#![allow(clippy::unwrap_used)]

mod fixtures;
mod strategies;
mod variants;

mod constructors;
mod errors;
mod fuzz;
mod helpers;
mod intent_transitions;
mod origin;
mod predicates;
mod receipt_batch;
mod roundtrip;
mod session_key;
mod wire_snapshots;
