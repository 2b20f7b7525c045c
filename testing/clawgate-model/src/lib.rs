//! Exhaustive, bounded model checks of clawgate's two core protocols: the durable send (with
//! crashes, recovery and reconciliation) and the stale-state notice protocol. See README.md.

pub mod checker;
pub mod notice;
pub mod send;

/// The environment variable that deepens every check's bounds (`cargo xtask soak` sets it).
pub const DEPTH_VAR: &str = "CLAWGATE_MODEL_DEPTH";

/// How much deeper than the CI bounds to check: `CLAWGATE_MODEL_DEPTH` (0 when unset).
pub fn depth() -> u8 {
    std::env::var(DEPTH_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}
