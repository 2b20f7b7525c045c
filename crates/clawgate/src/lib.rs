//! The clawgate gateway (layer 4): one binary that runs the durable message lifecycle, session
//! awareness and leased ACP agents on an embedded SQLite state directory.
//!
//! * [`config`]: the TOML configuration (every key optional) and its validation;
//! * [`state`]: the state directory, its one-gateway lock and `gateway.json`;
//! * [`channels`]: the channel kinds of this build (one cargo feature each);
//! * [`gateway`]: start-up order, channels, loops and shutdown;
//! * [`views`]: the operator views (status, outbox, inbox, leases, sessions), shared by the
//!   CLI and the control API;
//! * [`relay`]: `sessions_send` into a conversation of this gateway's channels (the turn engine,
//!   `clawgate-turns`, sends it and runs the turn);
//! * [`control`]: the local control API (token-protected, loopback only);
//! * [`console`]: the operator console in the browser, embedded pages over the control API;
//! * [`cli`]: the operator commands, through a running gateway or on its state directory;
//! * [`qa`]: the QA platform's extras (web chat page, `/v1/qa/*` routes, `clawgate qa`, session
//!   delivery into a conversation); only [`serve`] mounts it;
//! * [`serve`]: runs it all until Ctrl-C, then shuts down cleanly;
//! * [`crash_points`]: a test hook that aborts at a chosen durable write or platform call.

pub mod channels;
pub mod cli;
pub mod config;
pub mod console;
pub mod control;
pub mod crash_points;
pub mod gateway;
pub mod memory;
pub mod ownership;
#[cfg(feature = "channel-qa")]
pub mod qa;
pub mod relay;
pub mod serve;
pub mod state;
pub mod store;
pub mod views;
