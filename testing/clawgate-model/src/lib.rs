//! Exhaustive, bounded model checks of clawgate's two core protocols: the durable send (with
//! crashes, recovery and reconciliation) and the stale-state notice protocol. See README.md.

pub mod checker;
pub mod send;
