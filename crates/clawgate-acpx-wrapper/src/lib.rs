//! `clawgate-acpx-wrapper`: the tiny process that stands between the gateway and an ACP adapter.
//!
//! Contract (see the crate README):
//! * the adapter runs in its own process group (`pgid = adapter pid`) and inherits the wrapper's
//!   stdin, stdout and stderr, so ACP JSON-RPC flows straight between gateway and adapter;
//! * the adapter's environment carries `CLAWGATE_ACPX_LEASE_ID` and
//!   `CLAWGATE_GATEWAY_INSTANCE_ID`, an inherited mark the controller checks on group members
//!   whose parent chain no longer reaches the wrapper;
//! * one report line goes to stderr right after the adapter starts:
//!   `clawgate-acpx-wrapper ready {"rootPid":W,"processGroupId":P,"adapterPid":P}`;
//! * TERM, INT and HUP are forwarded to the group; TERM also starts the drain below;
//! * parent death — `PR_SET_PDEATHSIG` (Linux, set from this single thread before anything
//!   else), `getppid()` no longer the original parent, or the reader of stdout gone — and the
//!   adapter's own exit start a drain: TERM to the group, and KILL to the group once the grace
//!   period passed with anyone left; the wrapper exits only after that;
//! * the wrapper's own death (SIGKILL, where no drain can run) takes the adapter with it: the
//!   adapter starts with `PR_SET_PDEATHSIG` = KILL (Linux), armed before its exec;
//! * it decides no session policy.
//!
//! Exit status: the adapter's (128 + signal when it was killed); 2 for a usage error; 3 when
//! the parent was already gone before the adapter started (nothing was started); 4 when the
//! adapter could not be started.

mod args;
mod signals;
mod supervise;

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{
    Pid, Signal, WaitId, WaitIdOptions, WaitOptions, WaitStatus, getpid, getppid,
    kill_process_group, test_kill_process_group, wait, waitid, waitpid,
};

use crate::supervise::{Action, Event, GroupSignal, Supervisor};

/// Environment variable through which the spawner may name the parent the wrapper must outlive
/// no longer than; without it, the parent at start is the original one.
const PARENT_PID_ENV: &str = "CLAWGATE_ACPX_PARENT_PID";
/// How often the loop checks the parent, the adapter and the group.
const TICK: Duration = Duration::from_millis(20);
const REPORT_PREFIX: &str = "clawgate-acpx-wrapper ready ";

/// Runs the wrapper with its arguments (without the program name) and returns its exit status.
///
/// Call it from `main` before any other thread exists (the signal mask is per thread and a
/// thread started later inherits it): the `clawgate-acpx-wrapper` binary does, and so does a
/// multi-call binary that dispatches to it first thing.
pub fn run(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    // Before anything else, while this is the only thread.
    let blocked = match signals::block() {
        Ok(blocked) => blocked,
        Err(error) => return fail(4, &format!("cannot block signals: {error}")),
    };
    let args = match args::parse(args) {
        Ok(args) => args,
        Err(error) => return fail(2, &format!("{error}\n{}", args::USAGE)),
    };
    let original_parent = original_parent();
    if let Err(error) = become_subreaper() {
        return fail(4, &format!("cannot become a child subreaper: {error}"));
    }
    if let Err(error) = arm_parent_death_signal() {
        return fail(4, &format!("cannot set the parent-death signal: {error}"));
    }
    // The death signal never fires when the parent is already gone: check after arming it.
    if parent_gone(original_parent) {
        return fail(
            3,
            "the parent exited before the adapter started; nothing was started",
        );
    }
    let spawned = spawn_adapter(
        &blocked,
        &args.adapter,
        &args.lease_id,
        &args.gateway_instance_id,
    );
    let child = match spawned {
        Ok(child) => child,
        Err(error) => {
            let program = args.adapter[0].to_string_lossy();
            return fail(4, &format!("cannot start adapter {program:?}: {error}"));
        }
    };
    let adapter = child.id();
    report(getpid().as_raw_nonzero().get(), adapter);
    let status = supervise(&blocked, &child, original_parent, args.grace);
    ExitCode::from(status)
}

fn fail(code: u8, message: &str) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "clawgate-acpx-wrapper: {message}");
    ExitCode::from(code)
}

fn original_parent() -> Option<Pid> {
    std::env::var(PARENT_PID_ENV)
        .ok()
        .and_then(|raw| raw.parse::<i32>().ok())
        .and_then(Pid::from_raw)
        .or_else(getppid)
}

fn parent_gone(original: Option<Pid>) -> bool {
    getppid() != original
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn arm_parent_death_signal() -> std::io::Result<()> {
    let signal = Signal::from_named_raw(signals::PARENT_DEATH)
        .ok_or_else(|| std::io::Error::other("no parent-death signal"))?;
    rustix::process::set_parent_process_death_signal(Some(signal))?;
    Ok(())
}

/// Orphaned descendants of the adapter are reparented to the wrapper (not to init): the
/// wrapper reaps them, and the controller still finds them below the wrapper — even those that
/// left the adapter's process group with `setsid`.
#[cfg(any(target_os = "linux", target_os = "android"))]
fn become_subreaper() -> std::io::Result<()> {
    rustix::process::set_child_subreaper(Some(getpid()))?;
    Ok(())
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn become_subreaper() -> std::io::Result<()> {
    Ok(())
}

/// Elsewhere the getppid and stdout checks of the main loop are the only detectors.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn arm_parent_death_signal() -> std::io::Result<()> {
    Ok(())
}

fn spawn_adapter(
    blocked: &signals::Blocked,
    adapter: &[OsString],
    lease: &str,
    instance: &str,
) -> std::io::Result<Child> {
    let (program, rest) = adapter
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty adapter command"))?;
    let mut command = Command::new(program);
    // Called from the main thread, the only one: the adapter's death signal follows it.
    blocked.prepare_child(&mut command, getpid().as_raw_nonzero().get());
    command
        .args(rest)
        .process_group(0)
        .env("CLAWGATE_ACPX_LEASE_ID", lease)
        .env("CLAWGATE_GATEWAY_INSTANCE_ID", instance)
        .env_remove(PARENT_PID_ENV)
        .spawn()
}

/// One line, one `write`: below PIPE_BUF it is never interleaved with the adapter's stderr.
fn report(root: i32, adapter: u32) {
    let line = format!(
        "{REPORT_PREFIX}{{\"rootPid\":{root},\"processGroupId\":{adapter},\"adapterPid\":{adapter}}}\n"
    );
    let _ = std::io::stderr().write_all(line.as_bytes());
}

fn signal_of(signal: GroupSignal) -> Signal {
    match signal {
        GroupSignal::Term => Signal::TERM,
        GroupSignal::Int => Signal::INT,
        GroupSignal::Hup => Signal::HUP,
        GroupSignal::Kill => Signal::KILL,
    }
}

fn event_of(signal: libc::c_int) -> Option<Event> {
    match signal {
        libc::SIGTERM => Some(Event::Forward(GroupSignal::Term)),
        libc::SIGINT => Some(Event::Forward(GroupSignal::Int)),
        libc::SIGHUP => Some(Event::Forward(GroupSignal::Hup)),
        signals::PARENT_DEATH => Some(Event::ParentGone),
        // CHLD only wakes the loop; the adapter's exit is read with waitid below.
        _ => None,
    }
}

/// The main loop. Returns the wrapper's exit status.
fn supervise(
    blocked: &signals::Blocked,
    child: &Child,
    original_parent: Option<Pid>,
    grace: Duration,
) -> u8 {
    let Some(group) = i32::try_from(child.id()).ok().and_then(Pid::from_raw) else {
        return 4;
    };
    let mut machine = Supervisor::new(grace);
    let mut parent_reported = false;
    let mut adapter_exited = false;
    let mut adapter_status: Option<u8> = None;
    loop {
        let mut events = Vec::new();
        // Sleep for one tick, waking early when the reader of our stdout goes away.
        if !parent_reported && stdout_reader_gone(TICK) {
            events.push(Event::ParentGone);
        } else if parent_reported {
            std::thread::sleep(TICK);
        }
        match blocked.take_pending() {
            Ok(signals) => events.extend(signals.into_iter().filter_map(event_of)),
            Err(error) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "clawgate-acpx-wrapper: sigpending: {error}"
                );
            }
        }
        if !parent_reported && parent_gone(original_parent) {
            events.push(Event::ParentGone);
        }
        if events.contains(&Event::ParentGone) {
            parent_reported = true;
        }
        if !adapter_exited && exited_unreaped(group) {
            // Still a zombie: its pid, and so the group id, cannot be recycled yet, which makes
            // the TERM that follows safe.
            adapter_exited = true;
            events.push(Event::AdapterExited);
        }
        let mut exit = apply(&mut machine, events, group);
        // Reap every exited child: the adapter (after the TERM above) and, as a subreaper,
        // orphaned descendants, whose zombies would otherwise keep the group "alive".
        while let Ok(Some((pid, status))) = wait(WaitOptions::NOHANG) {
            if pid == group {
                adapter_status = Some(exit_code(status));
                if !adapter_exited {
                    // Exited between the check above and this wait: drain now.
                    adapter_exited = true;
                    exit |= apply(&mut machine, vec![Event::AdapterExited], group);
                }
            }
        }
        if !exit && machine.draining() {
            let group_alive = adapter_status.is_none() || test_kill_process_group(group).is_ok();
            exit = apply(&mut machine, vec![Event::Tick { group_alive }], group);
        }
        if exit {
            if adapter_status.is_none()
                && let Ok(Some((_, status))) = waitpid(Some(group), WaitOptions::empty())
            {
                adapter_status = Some(exit_code(status));
            }
            return adapter_status.unwrap_or(1);
        }
    }
}

/// Feeds events to the machine and carries out its actions; true when it says exit.
fn apply(machine: &mut Supervisor, events: Vec<Event>, group: Pid) -> bool {
    let mut exit = false;
    for event in events {
        for action in machine.on_event(event, Instant::now()) {
            match action {
                Action::Signal(signal) => {
                    // ESRCH (the group is already empty) is the outcome we want.
                    let _ = kill_process_group(group, signal_of(signal));
                }
                Action::Exit => exit = true,
            }
        }
    }
    exit
}

fn exit_code(status: WaitStatus) -> u8 {
    match (status.exit_status(), status.terminating_signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        _ => 1,
    }
}

fn exited_unreaped(pid: Pid) -> bool {
    matches!(
        waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT
        ),
        Ok(Some(_))
    )
}

/// Waits up to `timeout`; true when stdout is a pipe whose reader has closed (POLLERR).
fn stdout_reader_gone(timeout: Duration) -> bool {
    let stdout = std::io::stdout();
    let fd = stdout.as_fd();
    let mut fds = [PollFd::new(&fd, PollFlags::empty())];
    let spec = Timespec {
        tv_sec: 0,
        tv_nsec: i64::try_from(timeout.as_nanos()).unwrap_or(20_000_000),
    };
    match poll(&mut fds, Some(&spec)) {
        Ok(n) if n > 0 => fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP),
        Ok(_) => false,
        Err(_) => {
            std::thread::sleep(timeout);
            false
        }
    }
}
