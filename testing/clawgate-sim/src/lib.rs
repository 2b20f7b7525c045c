//! A deterministic simulation of the durable message lifecycle and the notice protocol: the real send, receive and
//! recovery engines (`clawgate-messages`) on a real (in-memory) SQLite store, with a simulated
//! clock, a simulated platform with scripted faults, and crashes at any durable write — the
//! store's commit hook kills the simulated process right before or right after the chosen
//! commit, and a new process starts on the same state. Everything runs on one thread from one
//! seed: a failing seed replays exactly. See README.md.

mod crash;
pub mod notices;
pub mod platform;
pub mod rng;
pub mod world;

pub use notices::run_notice_seed;
pub use platform::{AdapterKind, Fault, SimPlatform};
pub use world::{Bug, Config, Run, Violation, run_seed};
