//! A deterministic simulation of the durable message lifecycle: the real send, receive and
//! recovery engines (`clawgate-messages`) on a real (in-memory) SQLite store, with a simulated
//! clock, a simulated platform with scripted faults, and crashes at any durable write — the
//! store's commit hook kills the simulated process right before or right after the chosen
//! commit, and a new process starts on the same state. Everything runs on one thread from one
//! seed: a failing seed replays exactly. See README.md.

pub mod platform;
pub mod rng;
pub mod world;

pub use platform::{AdapterKind, Fault, SimPlatform};
pub use world::{Bug, Config, Run, Violation, run_seed};
