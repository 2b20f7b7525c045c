//! Cross-crate end-to-end tests with real processes: kill -9 and several writers on one file.
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod store_crash;
