//! Integration tests of clawgate-acpx: the table-driven process lifecycle simulator, and on
//! Linux real wrapper/adapter/grandchild trees and a real ACP agent process.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test with its message

mod simulator;
mod support;

#[cfg(target_os = "linux")]
mod acp_runtime;
#[cfg(target_os = "linux")]
mod dead_agent;
#[cfg(target_os = "linux")]
mod pid_reuse;
#[cfg(target_os = "linux")]
mod pool;
#[cfg(target_os = "linux")]
mod real_processes;
#[cfg(target_os = "linux")]
mod shared_postgres;
#[cfg(target_os = "linux")]
mod survivors;
