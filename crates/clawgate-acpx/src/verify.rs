//! `verify_owned_tree`: does the live process tree still belong to this lease of this gateway?
//!
//! Live evidence only, read through a handle bound to the root process:
//! boot id and start time (same process as recorded), executable = the lease's wrapper path
//! under its wrapper root, argv carrying this lease id and this gateway's instance id, command
//! hash agreement. Descendants come from the process table: processes whose parent chain
//! reaches the verified root, plus members of the lease's process group — all of them when the
//! group leader is a live child of the root, otherwise only those whose environment carries
//! this lease id (an adapter's grandchild outliving the adapter). A descendant whose
//! environment carries *another* lease's id is that lease's, never ours, and so is everything
//! below it.
//!
//! The answer is three-way; only [`Verdict::Owned`] ever leads to a signal.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

use clawgate_types::{AcpxProcessLease, GatewayInstanceId};

use crate::evidence::{INSTANCE_FLAG, LEASE_ENV, LEASE_FLAG, command_hash, is_under, wrapper_flag};
use crate::table::{ProcStat, ProcessHandle, ProcessTable, TableError};

/// A process that matched the lease, with the handle that is bound to it.
#[derive(Debug)]
pub struct OwnedProcess {
    pub stat: ProcStat,
    pub handle: Box<dyn ProcessHandle>,
    /// Distance from the root (root 0); group members whose parent chain is broken count as
    /// deepest, so "children first" signals them first.
    pub depth: u32,
}

/// The verified tree: the wrapper root and its live descendants.
#[derive(Debug)]
pub struct OwnedTree {
    pub root: OwnedProcess,
    pub descendants: Vec<OwnedProcess>,
}

impl OwnedTree {
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.descendants.iter().map(|p| p.stat.pid).collect();
        pids.push(self.root.stat.pid);
        pids
    }
}

/// Why a lease's live evidence does not match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotOurs {
    /// The lease belongs to another gateway instance.
    ForeignLease { owner: String },
    /// The wrapper never reported its pid (the gateway stopped before it could record it).
    NeverReported,
    /// Recorded in another boot: that process cannot exist any more.
    OtherBoot { recorded: String, current: String },
    /// No process with the recorded pid (or only its zombie).
    ProcessGone { pid: u32 },
    /// The pid now names another process (different start time).
    PidReused { pid: u32, recorded: u64, live: u64 },
    /// Same process, but the executable is not the lease's wrapper under its root.
    Executable { pid: u32, live: String },
    /// The argv lacks this lease id or carries another one.
    LeaseArgument { pid: u32, live: Option<String> },
    /// The argv carries another gateway's instance id (or none).
    InstanceArgument { pid: u32, live: Option<String> },
    /// The argv does not hash to the lease's command hash.
    CommandHash { pid: u32 },
}

impl NotOurs {
    /// True when the leased process provably no longer exists (the lease can be marked lost).
    pub fn process_gone(&self) -> bool {
        matches!(
            self,
            NotOurs::NeverReported
                | NotOurs::OtherBoot { .. }
                | NotOurs::ProcessGone { .. }
                | NotOurs::PidReused { .. }
        )
    }
}

impl fmt::Display for NotOurs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotOurs::ForeignLease { owner } => {
                write!(f, "lease belongs to gateway instance {owner}")
            }
            NotOurs::NeverReported => f.write_str("the wrapper never reported a root pid"),
            NotOurs::OtherBoot { recorded, current } => {
                write!(f, "recorded in boot {recorded}, now boot {current}")
            }
            NotOurs::ProcessGone { pid } => write!(f, "root pid {pid} is gone"),
            NotOurs::PidReused {
                pid,
                recorded,
                live,
            } => write!(
                f,
                "pid {pid} was reused (start time {live}, lease recorded {recorded})"
            ),
            NotOurs::Executable { pid, live } => {
                write!(
                    f,
                    "pid {pid} runs {live}, not the lease's wrapper under its root"
                )
            }
            NotOurs::LeaseArgument { pid, live } => {
                write!(f, "pid {pid} carries lease id {live:?}, not this lease")
            }
            NotOurs::InstanceArgument { pid, live } => {
                write!(
                    f,
                    "pid {pid} carries gateway instance id {live:?}, not ours"
                )
            }
            NotOurs::CommandHash { pid } => {
                write!(
                    f,
                    "pid {pid}'s argv does not match the lease's command hash"
                )
            }
        }
    }
}

/// Why nothing can be decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CannotTell {
    Unreadable(TableError),
    /// The lease lacks the start time or boot id needed to tell processes apart.
    IncompleteLease,
    /// The process has no command line left: it is exiting (its memory is released before it
    /// becomes a zombie). Asking again a moment later tells.
    Exiting {
        pid: u32,
    },
}

impl fmt::Display for CannotTell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CannotTell::Unreadable(error) => write!(f, "{error}"),
            CannotTell::IncompleteLease => {
                f.write_str("the lease has a pid but no start time or boot id")
            }
            CannotTell::Exiting { pid } => {
                write!(f, "pid {pid} has no command line left: it is exiting")
            }
        }
    }
}

#[derive(Debug)]
pub enum Verdict {
    Owned(OwnedTree),
    NotOurs(NotOurs),
    CannotTell(CannotTell),
}

impl From<TableError> for Verdict {
    fn from(error: TableError) -> Verdict {
        Verdict::CannotTell(CannotTell::Unreadable(error))
    }
}

macro_rules! read {
    ($e:expr, $gone:expr) => {
        match $e {
            Ok(Some(value)) => value,
            Ok(None) => return Verdict::NotOurs($gone),
            Err(error) => return Verdict::from(error),
        }
    };
}

/// Verifies the live tree of `lease` for gateway `instance`.
pub fn verify_owned_tree(
    table: &dyn ProcessTable,
    lease: &AcpxProcessLease,
    instance: &GatewayInstanceId,
) -> Verdict {
    if lease.gateway_instance_id != *instance {
        return Verdict::NotOurs(NotOurs::ForeignLease {
            owner: lease.gateway_instance_id.to_string(),
        });
    }
    let Some(pid) = lease.root_pid else {
        return Verdict::NotOurs(NotOurs::NeverReported);
    };
    let (Some(start_time), Some(boot_id)) = (lease.root_start_time, lease.boot_id.as_deref())
    else {
        return Verdict::CannotTell(CannotTell::IncompleteLease);
    };
    let current = match table.boot_id() {
        Ok(id) => id,
        Err(error) => return error.into(),
    };
    if current != boot_id {
        return Verdict::NotOurs(NotOurs::OtherBoot {
            recorded: boot_id.to_owned(),
            current,
        });
    }
    let gone = NotOurs::ProcessGone { pid };
    let handle = read!(table.open(pid), gone);
    let stat = read!(handle.stat(), gone);
    if stat.zombie {
        return Verdict::NotOurs(gone);
    }
    if stat.start_time != start_time {
        return Verdict::NotOurs(NotOurs::PidReused {
            pid,
            recorded: start_time,
            live: stat.start_time,
        });
    }
    let exe = read!(handle.exe(), gone.clone());
    if exe != Path::new(&lease.wrapper_path) || !is_under(&exe, Path::new(&lease.wrapper_root)) {
        return Verdict::NotOurs(NotOurs::Executable {
            pid,
            live: exe.display().to_string(),
        });
    }
    let argv = read!(handle.cmdline(), gone.clone());
    if argv.is_empty() {
        // Mid-exit: nothing left to compare. Gone or a zombie by now is gone; still there is
        // not evidence of anything.
        return match handle.stat() {
            Ok(Some(stat)) if !stat.zombie => Verdict::CannotTell(CannotTell::Exiting { pid }),
            Ok(_) => Verdict::NotOurs(gone),
            Err(error) => error.into(),
        };
    }
    let live_lease = wrapper_flag(&argv, LEASE_FLAG);
    if live_lease != Some(lease.lease_id.as_str()) {
        return Verdict::NotOurs(NotOurs::LeaseArgument {
            pid,
            live: live_lease.map(str::to_owned),
        });
    }
    let live_instance = wrapper_flag(&argv, INSTANCE_FLAG);
    if live_instance != Some(instance.as_str()) {
        return Verdict::NotOurs(NotOurs::InstanceArgument {
            pid,
            live: live_instance.map(str::to_owned),
        });
    }
    if command_hash(&argv) != lease.command_hash {
        return Verdict::NotOurs(NotOurs::CommandHash { pid });
    }
    let root = OwnedProcess {
        stat,
        handle,
        depth: 0,
    };
    match descendants(table, &root.stat, lease) {
        Ok(descendants) => Verdict::Owned(OwnedTree { root, descendants }),
        Err(error) => error.into(),
    }
}

/// Live descendants of a verified root, each re-read through its own handle.
fn descendants(
    table: &dyn ProcessTable,
    root: &ProcStat,
    lease: &AcpxProcessLease,
) -> Result<Vec<OwnedProcess>, TableError> {
    let all = table.list()?;
    let by_pid: HashMap<u32, &ProcStat> = all.iter().map(|p| (p.pid, p)).collect();
    // Depth through the parent chain; a child is never older than its parent, which keeps a
    // recycled pid in the chain from adopting strangers.
    let depth_of = |start: &ProcStat| -> Option<u32> {
        let mut depth = 0;
        let mut current = start;
        let mut seen = HashSet::new();
        loop {
            if current.pid == root.pid {
                return (current.start_time == root.start_time).then_some(depth);
            }
            if !seen.insert(current.pid) {
                return None;
            }
            let parent = by_pid.get(&current.ppid)?;
            if parent.start_time > current.start_time {
                return None;
            }
            depth += 1;
            current = parent;
        }
    };
    let mut chosen: Vec<(ProcStat, u32, bool)> = Vec::new();
    let group = lease.process_group_id;
    let leader_is_ours = group.is_some_and(|pgid| {
        by_pid
            .get(&pgid)
            .is_some_and(|leader| leader.ppid == root.pid && depth_of(leader) == Some(1))
    });
    for stat in &all {
        if stat.pid == root.pid || stat.zombie {
            continue;
        }
        if let Some(depth) = depth_of(stat) {
            chosen.push((*stat, depth, false));
        } else if group == Some(stat.pgid) && stat.start_time >= root.start_time {
            // Reparented group member: ours when the group's leader is our live adapter, or
            // (leader gone) when it carries this lease's environment mark.
            chosen.push((*stat, u32::MAX, !leader_is_ours));
        }
    }
    let mut out = Vec::new();
    // Processes whose environment names another lease: that lease's, not ours, and so is
    // everything whose parent chain runs through them (an agent that started a nested
    // gateway's wrapper, say).
    let mut foreign = HashSet::new();
    for (stat, depth, needs_mark) in chosen {
        let Some(handle) = table.open(stat.pid)? else {
            continue;
        };
        // The handle is bound to whatever has the pid now: it must be the process we listed.
        match handle.stat()? {
            Some(live) if live.start_time == stat.start_time && !live.zombie => {}
            _ => continue,
        }
        if needs_mark {
            match handle.environ_var(LEASE_ENV)? {
                Some(Some(value)) if value == lease.lease_id.as_str() => {}
                _ => continue,
            }
        } else {
            // The parent chain (or our live group leader) is the evidence here; an unreadable
            // environment does not weaken it, but a mark of another lease contradicts it.
            match handle.environ_var(LEASE_ENV) {
                Ok(Some(Some(value))) if value != lease.lease_id.as_str() => {
                    foreign.insert(stat.pid);
                    continue;
                }
                Ok(None) => continue,
                _ => {}
            }
        }
        out.push(OwnedProcess {
            stat,
            handle,
            depth,
        });
    }
    if !foreign.is_empty() {
        out.retain(|p| !chain_passes(&by_pid, &p.stat, root.pid, &foreign));
    }
    out.sort_by(|a, b| b.depth.cmp(&a.depth).then(a.stat.pid.cmp(&b.stat.pid)));
    Ok(out)
}

/// True when the parent chain from `start` up to `root` (exclusive) runs through one of
/// `through`. Only called for chains already checked to reach the root (or for group members
/// whose chain breaks off, which then simply ends).
fn chain_passes(
    by_pid: &HashMap<u32, &ProcStat>,
    start: &ProcStat,
    root: u32,
    through: &HashSet<u32>,
) -> bool {
    let mut seen = HashSet::new();
    let mut current = start.ppid;
    while current != root && seen.insert(current) {
        if through.contains(&current) {
            return true;
        }
        match by_pid.get(&current) {
            Some(parent) => current = parent.ppid,
            None => return false,
        }
    }
    false
}

/// The live processes of a lease that outlived its root: the wrapper is gone (killed before it
/// could drain its group, say) and an adapter's children live on, reparented — in the lease's
/// process group, or in sessions of their own (an agent's shell started with `setsid`). Each
/// is ours only with all of: this instance's lease, the recorded boot, a start no earlier than
/// the root's, and this lease's id in its environment (the wrapper's mark, inherited). Anything
/// else, and anything whose environment cannot be read, is left alone. The caller has
/// established that the root itself is gone.
pub fn orphaned_members(
    table: &dyn ProcessTable,
    lease: &AcpxProcessLease,
    instance: &GatewayInstanceId,
) -> Result<Vec<OwnedProcess>, TableError> {
    let (Some(root_start), Some(boot_id)) = (lease.root_start_time, lease.boot_id.as_deref())
    else {
        return Ok(Vec::new());
    };
    if lease.gateway_instance_id != *instance || table.boot_id()? != boot_id {
        return Ok(Vec::new());
    }
    let listed = table.list()?;
    let mut marked = marked_processes(table, &listed, root_start);
    Ok(take_marked(&mut marked, &listed, lease, root_start))
}

/// Every live process started at or after `since` whose environment carries a lease mark, by
/// lease id, with a handle bound to it. One pass over the table serves many leases.
pub(crate) fn marked_processes(
    table: &dyn ProcessTable,
    listed: &[ProcStat],
    since: u64,
) -> HashMap<String, Vec<OwnedProcess>> {
    let mut marked: HashMap<String, Vec<OwnedProcess>> = HashMap::new();
    for stat in listed.iter().filter(|s| !s.zombie && s.start_time >= since) {
        let Ok(Some(handle)) = table.open(stat.pid) else {
            continue;
        };
        // The handle is bound to whatever has the pid now: it must be the process listed.
        match handle.stat() {
            Ok(Some(live)) if live.start_time == stat.start_time && !live.zombie => {}
            _ => continue,
        }
        let Ok(Some(Some(lease_id))) = handle.environ_var(LEASE_ENV) else {
            continue;
        };
        marked.entry(lease_id).or_default().push(OwnedProcess {
            stat: *stat,
            handle,
            depth: u32::MAX,
        });
    }
    marked
}

/// The processes of `marked` that are `lease`'s orphans (not its root, started no earlier).
///
/// The adapter, its group's leader, dies with the wrapper (its death signal is KILL), and the
/// kernel hands out a group's number again only once the group is empty. So with the root gone,
/// a live process whose pid is the lease's group number is never the adapter: the group was
/// emptied and its number reused, and nothing in that group now is ours, whatever its
/// environment says (a decoy can carry a mark).
pub(crate) fn take_marked(
    marked: &mut HashMap<String, Vec<OwnedProcess>>,
    listed: &[ProcStat],
    lease: &AcpxProcessLease,
    root_start: u64,
) -> Vec<OwnedProcess> {
    let recycled = lease
        .process_group_id
        .filter(|pgid| listed.iter().any(|s| s.pid == *pgid && !s.zombie));
    let mut out: Vec<OwnedProcess> = marked
        .remove(lease.lease_id.as_str())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.stat.start_time >= root_start && Some(p.stat.pid) != lease.root_pid)
        .filter(|p| recycled.is_none_or(|group| p.stat.pgid != group))
        .collect();
    out.sort_by_key(|p| p.stat.pid);
    out
}
