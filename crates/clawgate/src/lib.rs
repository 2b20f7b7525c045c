//! The clawgate gateway (layer 4): one binary that runs the durable message lifecycle, session
//! awareness and leased ACP agents on an embedded SQLite state directory.
//!
//! * [`config`]: the TOML configuration (every key optional) and its validation;
//! * [`state`]: the state directory, its one-gateway lock and `gateway.json`;
//! * [`gateway`]: start-up order, the receive lanes and the agent turn;
//! * [`chat`]: the web chat page (a person on the QA platform);
//! * [`control`]: the local control API (token-protected, loopback only);
//! * [`serve`]: runs it all until Ctrl-C, then shuts down cleanly.

pub mod chat;
pub mod config;
pub mod control;
pub mod gateway;
pub mod serve;
pub mod state;
