//! Integration tests of clawgate-awareness on real SQLite files: the awareness and visibility
//! lines of the test plan, the visibility matrix, snapshots, and restart rebuild.
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod helpers;
mod notices;
mod reconcile;
mod restart;
mod retention;
mod sessions;
mod signal_log;
mod visibility;
mod watchers;
