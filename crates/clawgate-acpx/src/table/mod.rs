//! The process table seam: the same verification runs against the live `/proc` ([`linux`]) and
//! against a simulated table (`crate::sim`, feature `testing`).
//!
//! A [`ProcessHandle`] is bound to one process (on Linux an fd of `/proc/PID`): reading through
//! it after the process was reaped reports it gone, and signalling through it can never reach
//! a process that later received the same pid.

#[cfg(target_os = "linux")]
pub mod linux;

use std::fmt::Debug;
use std::path::PathBuf;

/// What `/proc/PID/stat` says about one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcStat {
    pub pid: u32,
    pub ppid: u32,
    pub pgid: u32,
    /// Clock ticks since boot (field 22). With the boot id, (pid, start time) names one process.
    pub start_time: u64,
    /// Exited, not yet reaped: nothing left to signal.
    pub zombie: bool,
}

/// The signals the controller sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sig {
    Term,
    Kill,
}

/// Outcome of a signal sent through a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Delivered,
    /// The process the handle is bound to no longer exists; nobody was signalled.
    Gone,
}

/// The process table could not be read: verification answers "cannot tell".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("process table unreadable ({what}): {detail}")]
pub struct TableError {
    pub what: String,
    pub detail: String,
}

impl TableError {
    pub fn new(what: impl Into<String>, detail: impl ToString) -> TableError {
        TableError {
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}

/// `Ok(None)`: the process is gone.
pub type Read<T> = Result<Option<T>, TableError>;

/// A live process table. Reads are point-in-time; identity checks go through handles.
pub trait ProcessTable: Send + Sync + Debug {
    /// The id of the running boot (`/proc/sys/kernel/random/boot_id`).
    fn boot_id(&self) -> Result<String, TableError>;

    /// Every process's stat line (used only to find descendants of a verified root).
    fn list(&self) -> Result<Vec<ProcStat>, TableError>;

    /// A handle bound to the process that has `pid` now; `Ok(None)` when there is none.
    fn open(&self, pid: u32) -> Read<Box<dyn ProcessHandle>>;
}

/// One process, bound for the handle's lifetime.
pub trait ProcessHandle: Send + Sync + Debug {
    fn pid(&self) -> u32;
    fn stat(&self) -> Read<ProcStat>;
    /// The executable path (`/proc/PID/exe`), without a trailing " (deleted)".
    fn exe(&self) -> Read<PathBuf>;
    /// The exact argv (`/proc/PID/cmdline`): no quoting to confuse.
    fn cmdline(&self) -> Read<Vec<String>>;
    /// One environment variable (`/proc/PID/environ`); `Ok(Some(None))` when it is unset.
    fn environ_var(&self, key: &str) -> Read<Option<String>>;
    fn signal(&self, sig: Sig) -> Result<Delivery, TableError>;
}

/// A table for platforms where clawgate cannot read live process metadata: every question is
/// answered "unreadable", so verification says "cannot tell" and nothing is ever signalled.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnsupportedTable;

impl ProcessTable for UnsupportedTable {
    fn boot_id(&self) -> Result<String, TableError> {
        Err(unsupported())
    }
    fn list(&self) -> Result<Vec<ProcStat>, TableError> {
        Err(unsupported())
    }
    fn open(&self, _pid: u32) -> Read<Box<dyn ProcessHandle>> {
        Err(unsupported())
    }
}

fn unsupported() -> TableError {
    TableError::new(
        "platform",
        "no /proc on this platform: process ownership cannot be verified, so nothing is signalled",
    )
}

/// The live table of this platform: `/proc` on Linux, [`UnsupportedTable`] elsewhere.
pub fn system_table() -> std::sync::Arc<dyn ProcessTable> {
    #[cfg(target_os = "linux")]
    {
        std::sync::Arc::new(linux::ProcFs)
    }
    #[cfg(not(target_os = "linux"))]
    {
        std::sync::Arc::new(UnsupportedTable)
    }
}

/// Parses a `/proc/PID/stat` line. The comm field may hold spaces and `)`: split after the
/// last `)`. Fields after it start at field 3 (state).
pub fn parse_stat(pid: u32, line: &str) -> Option<ProcStat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    let state = *fields.first()?;
    Some(ProcStat {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        pgid: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
        zombie: state == "Z" || state == "X",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses_from_the_last_paren() {
        let line = "42 (we ird) (x) S 7 40 40 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 1 2";
        let stat = parse_stat(42, line).expect("parses");
        assert_eq!(
            (stat.ppid, stat.pgid, stat.start_time, stat.zombie),
            (7, 40, 123456, false)
        );
        let zombie = "9 (z) Z 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 0 0";
        assert!(parse_stat(9, zombie).expect("parses").zombie);
        assert_eq!(parse_stat(1, "1 (short) S 0"), None);
    }
}
