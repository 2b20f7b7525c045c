//! Claim tokens that say which process holds them, so a restarted gateway can tell a dead
//! holder's claims (released at once) from a live peer's (left alone until they expire).
//!
//! A token reads `<worker>/<pid>/<start-ticks>/<unique>`: the pid plus its start time (field 22
//! of `/proc/PID/stat`) identify the process even after its pid is reused.

/// The start time of a process in clock ticks since boot, if it is running.
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and ')': fields count from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// This process's identity part of a token.
pub(crate) fn own_identity() -> String {
    let pid = std::process::id();
    format!("{pid}/{}", start_ticks(pid).unwrap_or(0))
}

/// Whether the token's holder is certainly gone. Unparsable tokens, tokens of this process,
/// and any doubt (no `/proc`) count as alive: their claims simply expire.
pub(crate) fn holder_is_dead(token: &str) -> bool {
    let mut fields = token.rsplitn(4, '/');
    let (Some(_unique), Some(ticks), Some(pid)) = (fields.next(), fields.next(), fields.next())
    else {
        return false;
    };
    let (Ok(ticks), Ok(pid)) = (ticks.parse::<u64>(), pid.parse::<u32>()) else {
        return false;
    };
    if ticks == 0 || !std::path::Path::new("/proc/self/stat").exists() {
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
        let me = format!("gw/{}/x", own_identity());
        assert!(!holder_is_dead(&me), "this process is alive");
        let pid = std::process::id();
        let reused = format!("gw/{pid}/1/x");
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
        let gone = format!("gw/{child_pid}/12345/x");
        assert!(
            holder_is_dead(&gone) || start_ticks(child_pid).is_some(),
            "a reaped child is gone (unless reused)"
        );
        for doubtful in ["", "no-slashes", "gw/abc/1/x", "gw/1/0/x"] {
            assert!(
                !holder_is_dead(doubtful),
                "{doubtful:?} is never declared dead"
            );
        }
    }
}
