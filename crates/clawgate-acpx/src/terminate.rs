//! Ending a verified tree: children first, TERM, a grace period, re-verification, KILL.
//!
//! Signals only go through handles bound to verified processes. Before KILL the tree is
//! verified again: when the root still matches the lease, the fresh tree (including anything
//! forked during the grace) is killed; when it does not (its identity changed during the
//! grace), the root pid is left alone and only the previously verified descendants that are
//! still alive — through their bound handles — and still in the lease's process group are
//! killed.

use std::time::Duration;

use clawgate_types::{AcpxProcessLease, GatewayInstanceId, LeaseSurvivor};
use tokio::time::Instant;

use crate::table::{Delivery, ProcessHandle, ProcessTable, Sig};
use crate::verify::{OwnedProcess, OwnedTree, Verdict, verify_owned_tree};

/// What a termination did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Termination {
    pub termed: Vec<u32>,
    pub killed: Vec<u32>,
    /// Owned processes still alive after KILL (uninterruptible sleep, held by a tracer), by
    /// pid and start time: the lease must not be closed while any is listed.
    pub survivors: Vec<LeaseSurvivor>,
    /// Why the root was not killed after its identity changed during the grace.
    pub kill_refused: Option<String>,
}

/// Timing of a termination.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub grace: Duration,
    /// How long to wait for KILLed processes to disappear.
    pub kill_wait: Duration,
    pub poll: Duration,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            grace: Duration::from_secs(3),
            kill_wait: Duration::from_secs(2),
            poll: Duration::from_millis(10),
        }
    }
}

fn alive(handle: &dyn ProcessHandle) -> bool {
    // Unreadable counts as alive: we never claim a process is gone without evidence.
    handle
        .stat()
        .map_or(true, |stat| stat.is_some_and(|s| !s.zombie))
}

async fn wait_all_gone(processes: &[&OwnedProcess], within: Duration, poll: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if processes.iter().all(|p| !alive(p.handle.as_ref())) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(poll).await;
    }
}

fn send(process: &OwnedProcess, sig: Sig, lease: &AcpxProcessLease) -> bool {
    match process.handle.signal(sig) {
        Ok(Delivery::Delivered) => true,
        Ok(Delivery::Gone) => false,
        Err(error) => {
            tracing::warn!(lease_id = %lease.lease_id, pid = process.stat.pid, ?sig, %error,
                "signal failed");
            false
        }
    }
}

/// Ends a verified tree. `tree` must come from [`verify_owned_tree`] for the same lease.
pub async fn terminate_tree(
    table: &dyn ProcessTable,
    lease: &AcpxProcessLease,
    instance: &GatewayInstanceId,
    tree: OwnedTree,
    timing: Timing,
) -> Termination {
    let mut report = Termination::default();
    // Descendants are sorted deepest first; the root goes last.
    let order: Vec<&OwnedProcess> = tree.descendants.iter().chain([&tree.root]).collect();
    for process in &order {
        if send(process, Sig::Term, lease) {
            report.termed.push(process.stat.pid);
        }
    }
    if wait_all_gone(&order, timing.grace, timing.poll).await {
        return report;
    }
    let kill_set: Vec<OwnedProcess>;
    let previous: Vec<&OwnedProcess>;
    match verify_owned_tree(table, lease, instance) {
        Verdict::Owned(fresh) => {
            kill_set = fresh.descendants.into_iter().chain([fresh.root]).collect();
            previous = tree
                .descendants
                .iter()
                // Same process = same pid and start time: a reparented one has a new ppid.
                .filter(|old| {
                    !kill_set.iter().any(|new| {
                        new.stat.pid == old.stat.pid && new.stat.start_time == old.stat.start_time
                    })
                })
                .filter(|old| still_in_group(old, lease))
                .collect();
        }
        verdict => {
            let reason = match verdict {
                Verdict::NotOurs(reason) => reason.to_string(),
                Verdict::CannotTell(reason) => reason.to_string(),
                Verdict::Owned(_) => String::new(),
            };
            tracing::warn!(lease_id = %lease.lease_id, pid = tree.root.stat.pid, %reason,
                "root no longer verifies after TERM: it is not killed");
            report.kill_refused = Some(reason);
            kill_set = Vec::new();
            previous = tree
                .descendants
                .iter()
                .filter(|old| still_in_group(old, lease))
                .collect();
        }
    }
    // Children first: leftovers of the first pass, then the fresh tree (deepest first, root last).
    let kill_order: Vec<&OwnedProcess> = previous.into_iter().chain(kill_set.iter()).collect();
    kill_and_watch(lease, kill_order, timing, &mut report).await;
    report
}

/// KILL to each process of `order` still alive (through its bound handle, so never a process
/// that took its pid since), then waits for them; what outlives the wait is recorded as a
/// survivor. Everything alive at KILL time is watched, also where the KILL could not be
/// delivered: an owned process left alive is a survivor either way.
async fn kill_and_watch(
    lease: &AcpxProcessLease,
    order: Vec<&OwnedProcess>,
    timing: Timing,
    report: &mut Termination,
) {
    let mut watched = Vec::new();
    for process in order {
        if !alive(process.handle.as_ref()) {
            continue;
        }
        if send(process, Sig::Kill, lease) {
            report.killed.push(process.stat.pid);
        }
        watched.push(process);
    }
    if !wait_all_gone(&watched, timing.kill_wait, timing.poll).await {
        report.survivors = watched
            .iter()
            .filter(|p| alive(p.handle.as_ref()))
            .map(|p| LeaseSurvivor {
                pid: p.stat.pid,
                start_time: p.stat.start_time,
            })
            .collect();
        tracing::error!(lease_id = %lease.lease_id, survivors = ?report.survivors,
            "owned processes survived KILL");
    }
}

/// Re-verification of a previously verified descendant through its bound handle: still the
/// same process, alive, and still in the lease's process group or a child chain.
fn still_in_group(process: &OwnedProcess, lease: &AcpxProcessLease) -> bool {
    match process.handle.stat() {
        Ok(Some(live)) => {
            !live.zombie
                && live.start_time == process.stat.start_time
                && (Some(live.pgid) == lease.process_group_id || live.pgid == process.stat.pgid)
        }
        _ => false,
    }
}

/// Ends the orphaned processes of a lease whose root is gone (from
/// [`crate::verify::orphaned_members`]): TERM, grace, then KILL to each that is still the same
/// process, through its bound handle.
pub async fn terminate_orphans(
    lease: &AcpxProcessLease,
    orphans: Vec<OwnedProcess>,
    timing: Timing,
) -> Termination {
    let mut report = Termination::default();
    let all: Vec<&OwnedProcess> = orphans.iter().collect();
    for process in &all {
        if send(process, Sig::Term, lease) {
            report.termed.push(process.stat.pid);
        }
    }
    if wait_all_gone(&all, timing.grace, timing.poll).await {
        return report;
    }
    kill_and_watch(lease, all, timing, &mut report).await;
    report
}
