//! The clawgate gateway (layer 4): one binary that runs the durable message lifecycle, session
//! awareness and leased ACP agents on an embedded SQLite state directory.
//!
//! * [`config`]: the TOML configuration (every key optional) and its validation;
//! * [`state`]: the state directory, its one-gateway lock and `gateway.json`;
//! * [`gateway`]: start-up order, the receive lanes and the agent turn;
//! * [`views`]: the operator views (status, outbox, inbox, leases, sessions), shared by the
//!   CLI and the control API;
//! * [`control`]: the local control API (token-protected, loopback only);
//! * [`cli`]: the operator commands, through a running gateway or on its state directory;
//! * [`qa`]: the QA platform's extras (web chat page, `/v1/qa/*` routes, `clawgate qa`, session
//!   delivery into a conversation); only [`serve`] mounts it;
//! * [`serve`]: runs it all until Ctrl-C, then shuts down cleanly;
//! * [`crash_points`]: a test hook that aborts at a chosen durable write or platform call.

pub mod cli;
pub mod config;
pub mod control;
pub mod crash_points;
pub mod gateway;
pub mod qa;
pub mod serve;
pub mod state;
pub mod views;
