//! Integration tests of the QA platform over real HTTP on 127.0.0.1.
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod attachments;
mod conformance;
mod faults;
mod fuzz;
mod polling;
mod restart;
