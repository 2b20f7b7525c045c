//! Real-process tests of the wrapper contract (Linux: they read /proc).
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test with its message

mod contract;
mod support;
