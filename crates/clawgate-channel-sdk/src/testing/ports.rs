//! Loopback ports for servers a test configures before it starts them (a webhook listener is
//! given `host:port` in its settings, and the platform peer is told the URL first).
//!
//! "Bind port 0, read the port, drop the listener" leaves a gap: until the real server binds,
//! any `bind(0)` of a concurrent test — or the local end of any outgoing connection — may take
//! the same port from the kernel's ephemeral range, and the platform then posts to a stranger.
//! [`reserve_loopback_port`] picks below that range instead, where the kernel never hands out
//! ports by itself, and holds an exclusive lock file per port for the rest of the process, so
//! two test processes (nextest runs each test in its own) never pick the same one.

use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, RandomState};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Mutex;

/// The lowest port handed out (well above the registered services most machines run).
const LOWEST: u16 = 20_000;

/// The lock files of this process's reservations: released when the process ends.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A loopback TCP port nothing listens on, reserved for this process: no other caller of this
/// function (in any process) gets it while this process runs, and the kernel does not give it
/// to `bind(0)` or to an outgoing connection.
///
/// # Panics
/// When no port of the range is free and unreserved (the lock directory unwritable, or
/// thousands of reservations held at once).
#[must_use]
pub fn reserve_loopback_port() -> u16 {
    let highest = ephemeral_low().saturating_sub(1);
    assert!(
        highest > LOWEST + 1_000,
        "the kernel's ephemeral port range starts at {}: no room below it for reserved ports",
        highest + 1
    );
    let dir = std::env::temp_dir().join("clawgate-test-ports");
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("port lock directory {}: {e}", dir.display()));
    let span = u64::from(highest - LOWEST + 1);
    let start = RandomState::new().hash_one(std::process::id()) % span;
    for step in 0..span {
        let port = LOWEST + u16::try_from((start + step) % span).unwrap_or(0);
        let Some(lock) = lock(dir.join(format!("{port}.lock"))) else {
            continue;
        };
        // Reserved by nobody else; still, a service of the machine may listen there.
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            HELD.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(lock);
            return port;
        }
    }
    panic!("no free loopback port between {LOWEST} and {highest}");
}

/// The lock file at `path`, locked exclusively, or None when another holder has it.
fn lock(path: PathBuf) -> Option<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("port lock file {}: {e}", path.display()));
    file.try_lock().ok().map(|()| file)
}

/// The first port of the kernel's ephemeral range (Linux's default where it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_differ_lie_below_the_ephemeral_range_and_are_free() {
        let ports: Vec<u16> = (0..20).map(|_| reserve_loopback_port()).collect();
        let mut distinct = ports.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for port in ports {
            assert!((LOWEST..ephemeral_low()).contains(&port), "{port}");
            TcpListener::bind(("127.0.0.1", port)).expect("a reserved port is free");
        }
    }

    #[test]
    fn a_port_locked_by_another_holder_is_not_handed_out() {
        let dir = std::env::temp_dir().join("clawgate-test-ports");
        let port = reserve_loopback_port();
        // A second open of the same lock file is another open file description: refused
        // while this process holds the first.
        assert!(lock(dir.join(format!("{port}.lock"))).is_none());
    }
}
