//! Durable state for clawgate (layer 1).
//!
//! [`ports`] holds the storage traits the engines use — shaped for their use cases (claim due
//! intents, commit a receipt and a status at once, append an event and advance the head at
//! once…). Backends live in their own crates (`clawgate-store-sqlite`, the embedded default;
//! `clawgate-store-postgres`, for several gateways on one state); none is linked here. With the
//! `testing` feature, [`testing`] ships the conformance suite every backend runs through
//! [`store_conformance_tests!`].
//!
//! Invariants:
//! * a write reported `Ok` is committed (with `synchronous=FULL`, durable across power loss);
//! * no operation is half-applied: each port method is one transaction;
//! * migrations never delete stored intents; stored payloads carry a format version;
//! * the store has no clock: callers pass `now`.

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

pub mod codec;
mod error;
pub mod ids;
pub mod model;
pub mod ports;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{StoreError, StoreResult};
pub use model::*;
pub use ports::*;
