//! Claim tokens that say which process holds them, so a restarted gateway can tell a dead
//! holder's claims (released at once) from a live peer's (left alone until they expire).
//!
//! A token reads `<worker>/<machine>/<pid>/<start-ticks>/<unique>`: the pid plus its start time
//! (field 22 of `/proc/PID/stat`) identify the process even after its pid is reused, and
//! `<machine>` (the kernel's boot id and the PID namespace) says where that pid means anything.
//! Gateways sharing one database across machines or containers see each other's claims: a pid
//! of another machine is never looked up here (it would look dead), so such claims are freed
//! only by their deadline.

use std::sync::OnceLock;

/// The start time of a process in clock ticks since boot, if it is running.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and ')': fields count from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Where this process's pids mean something: the boot id (one per machine and boot) and the
/// PID namespace's inode (one per container). `None` when either cannot be read.
fn machine() -> Option<&'static str> {
    static MACHINE: OnceLock<Option<String>> = OnceLock::new();
    MACHINE
        .get_or_init(|| {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            let namespace = std::fs::read_link("/proc/self/ns/pid").ok()?;
            // `pid:[4026531836]`: the digits.
            let inode: String = namespace
                .to_string_lossy()
                .chars()
                .filter(char::is_ascii_digit)
                .collect();
            let boot: String = boot.trim().chars().filter(|c| *c != '-').collect();
            (!boot.is_empty() && !inode.is_empty()).then(|| format!("{boot}.{inode}"))
        })
        .as_deref()
}

/// This process's identity part of a token: `<machine>/<pid>/<start-ticks>`.
pub(crate) fn own_identity() -> String {
    let pid = std::process::id();
    format!(
        "{}/{pid}/{}",
        machine().unwrap_or("unknown"),
        start_ticks(pid).unwrap_or(0)
    )
}

/// Whether the token's holder is certainly gone. Unparsable tokens, tokens of another machine
/// or container, tokens of this process, and any doubt (no `/proc`) count as alive: their
/// claims simply expire.
pub(crate) fn holder_is_dead(token: &str) -> bool {
    let mut fields = token.rsplitn(5, '/');
    let (Some(_unique), Some(ticks), Some(pid), Some(host)) =
        (fields.next(), fields.next(), fields.next(), fields.next())
    else {
        return false;
    };
    if machine().is_none_or(|here| here != host) {
        return false;
    }
    let (Ok(ticks), Ok(pid)) = (ticks.parse::<u64>(), pid.parse::<u32>()) else {
        return false;
    };
    if ticks == 0 {
        return false;
    }
    match start_ticks(pid) {
        None => true,
        // A different start time: the pid was reused by another process.
        Some(now) => now != ticks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_of_live_dead_and_reused_pids() {
        let here = machine().expect("this machine has /proc");
        let me = format!("gw/{}/x", own_identity());
        assert!(!holder_is_dead(&me), "this process is alive");
        let pid = std::process::id();
        let reused = format!("gw/{here}/{pid}/1/x");
        assert!(
            holder_is_dead(&reused),
            "same pid, another start time: a reused pid"
        );
        // Spawn and reap a child: its pid is then free.
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let child_pid = child.id();
        child.wait().expect("reap");
        let gone = format!("gw/{here}/{child_pid}/12345/x");
        assert!(
            holder_is_dead(&gone) || start_ticks(child_pid).is_some(),
            "a reaped child is gone (unless reused)"
        );
        for doubtful in ["", "no-slashes", "gw/abc/1/x", "gw/1/0/x", "gw/123/456/x"] {
            assert!(
                !holder_is_dead(doubtful),
                "{doubtful:?} is never declared dead"
            );
        }
    }

    #[test]
    fn a_pid_of_another_machine_is_never_looked_up_here() {
        // A pid that is free here (a reaped child) held by a gateway on another machine, or in
        // another PID namespace: its claims wait for their deadline.
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let child_pid = child.id();
        child.wait().expect("reap");
        let here = machine().expect("this machine has /proc");
        for elsewhere in [
            "0123456789abcdef0123456789abcdef.4026531836".to_owned(),
            format!("{here}0"),
            "unknown".to_owned(),
        ] {
            let token = format!("gw/{elsewhere}/{child_pid}/12345/x");
            assert!(!holder_is_dead(&token), "{token} is left to its deadline");
        }
    }
}
