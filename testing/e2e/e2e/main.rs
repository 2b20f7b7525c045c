//! Cross-crate end-to-end tests with real processes, real SQLite files (and, in
//! `shared_postgres`, a real PostgreSQL server) and the real QA platform over loopback HTTP.
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.
#![allow(unreachable_pub)] // Shared helpers of one test binary.

mod awareness_cross_process;
mod channel_turn;
mod commit_order;
mod harness;
mod live;
mod polling;
mod receive;
mod receive_crash;
mod recovery_pace;
mod send_crash;
mod send_interleavings;
mod send_lifecycle;
mod shared_postgres;
mod store_crash;
