//! An owned process that outlives KILL, with real processes: a tracer (a thread of this test)
//! holds the agent's grandchild in its `PTRACE_EVENT_EXIT` stop, where neither TERM nor KILL
//! can finish it until the tracer lets go. The close reports it, the lease stays `closing`
//! with it recorded, and a later look closes the lease only once it is gone.
#![allow(unsafe_code)] // ptrace(2) and waitpid(2) through libc: the tracer is the test's tool.

use std::sync::mpsc;
use std::time::Duration;

use clawgate_acpx::{CloseOutcome, Timing, system_table};
use clawgate_store::LeaseStore;
use clawgate_types::{LeaseState, LeaseSurvivor};

use crate::real_processes::{alive, ensure_input};
use crate::support::*;

/// Holds `pid` in its exit stop until the returned sender is used or dropped.
struct Tracer {
    held: mpsc::Receiver<Result<(), String>>,
    release: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Tracer {
    /// Seizes `pid` with `PTRACE_O_TRACEEXIT` from a thread of its own (ptrace requests must
    /// come from the tracing thread); signals are passed on, the exit stop is held.
    fn seize(pid: u32) -> Tracer {
        let (held_tx, held) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let (seized_tx, seized_rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
            // SAFETY: plain syscalls on a pid; no memory is shared with the kernel.
            let seized = unsafe {
                libc::ptrace(
                    libc::PTRACE_SEIZE,
                    pid,
                    std::ptr::null_mut::<libc::c_void>(),
                    libc::PTRACE_O_TRACEEXIT as usize as *mut libc::c_void,
                )
            };
            let _ = seized_tx.send(if seized == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error().to_string())
            });
            if seized != 0 {
                return;
            }
            loop {
                let mut status = 0;
                // SAFETY: `status` is a valid out pointer for the call's duration.
                let waited = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
                if waited != pid || !libc::WIFSTOPPED(status) {
                    let _ = held_tx.send(Err(format!("tracee ended unheld (status {status:#x})")));
                    return;
                }
                let exit_stop = status >> 8 == (libc::SIGTRAP | (libc::PTRACE_EVENT_EXIT << 8));
                if exit_stop {
                    let _ = held_tx.send(Ok(()));
                    // Released, or the test gone (sender dropped): let it finish exiting.
                    let _ = release_rx.recv();
                    // SAFETY: as above.
                    unsafe {
                        libc::ptrace(
                            libc::PTRACE_DETACH,
                            pid,
                            std::ptr::null_mut::<libc::c_void>(),
                            std::ptr::null_mut::<libc::c_void>(),
                        )
                    };
                    return;
                }
                // A signal-delivery stop: deliver the signal (TERM must reach it).
                let signal = libc::WSTOPSIG(status);
                // SAFETY: as above.
                unsafe {
                    libc::ptrace(
                        libc::PTRACE_CONT,
                        pid,
                        std::ptr::null_mut::<libc::c_void>(),
                        signal as usize as *mut libc::c_void,
                    )
                };
            }
        });
        seized_rx
            .recv()
            .expect("tracer thread answers")
            .unwrap_or_else(|e| panic!("PTRACE_SEIZE of pid {pid} failed: {e}"));
        Tracer {
            held,
            release: Some(release),
            thread: Some(thread),
        }
    }

    fn release(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().expect("tracer thread");
        }
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        self.release();
    }
}

fn start_time(pid: u32) -> u64 {
    system_table()
        .open(pid)
        .expect("proc readable")
        .expect("process exists")
        .stat()
        .expect("stat readable")
        .expect("process exists")
        .start_time
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_outliving_kill_keeps_the_lease_closing_until_it_is_gone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path());
    let timing = Timing {
        grace: Duration::from_millis(300),
        kill_wait: Duration::from_millis(500),
        poll: Duration::from_millis(5),
    };
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), timing).await;
    let pid_file = dir.path().join("grandchild.pid");
    let adapter = vec![
        test_agent(),
        "--grandchild".into(),
        "--grandchild-pid-file".into(),
        pid_file.display().to_string(),
    ];
    let input = ensure_input("survivor", adapter, dir.path());
    let handle = gateway
        .ensure_session(input.clone())
        .await
        .expect("ensure session");
    let grandchild = {
        let mut pid = None;
        eventually(Duration::from_secs(5), "grandchild runs sleep", || {
            pid = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok())
                .filter(|&pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|argv| argv.starts_with(b"sleep\0"))
                });
            pid.is_some()
        })
        .await;
        pid.expect("grandchild pid")
    };
    let identity = LeaseSurvivor {
        pid: grandchild,
        start_time: start_time(grandchild),
    };
    let mut tracer = Tracer::seize(grandchild);

    let outcome = gateway
        .close_session(&input.session_key, "test", 2)
        .await
        .expect("close");
    let CloseOutcome::Survived(termination) = &outcome else {
        panic!("the held grandchild must be reported as a survivor: {outcome:?}");
    };
    assert_eq!(termination.survivors, vec![identity], "{termination:?}");
    assert!(
        termination.killed.contains(&grandchild),
        "it was sent KILL: {termination:?}"
    );
    tracer
        .held
        .recv_timeout(Duration::from_secs(5))
        .expect("tracer answers")
        .expect("the grandchild is held in its exit");
    assert!(alive(grandchild), "held in its exit, not gone");
    let lease = store
        .load_lease(&handle.lease_id)
        .await
        .expect("load lease")
        .expect("lease");
    assert_eq!(
        lease.state,
        LeaseState::Closing,
        "never closed with a survivor"
    );
    assert_eq!(lease.ended_at, None);
    assert_eq!(lease.survivors, vec![identity]);

    // The wrapper and adapter are gone; the survivor is still held: a later look keeps it so.
    eventually(Duration::from_secs(5), "wrapper and adapter gone", || {
        !alive(handle.root_pid) && !alive(handle.process_group_id)
    })
    .await;
    let again = gateway.recheck_survivors(3).await.expect("recheck");
    assert!(
        matches!(again.as_slice(), [(id, CloseOutcome::Survived(t))]
            if *id == handle.lease_id && t.survivors == [identity]),
        "{again:?}"
    );
    assert_eq!(
        store
            .load_lease(&handle.lease_id)
            .await
            .expect("load lease")
            .expect("lease")
            .state,
        LeaseState::Closing
    );

    // Let go: the survivor finishes its exit, and the next look closes the lease.
    tracer.release();
    eventually(Duration::from_secs(5), "survivor gone", || {
        !alive(grandchild)
    })
    .await;
    let last = gateway.recheck_survivors(4).await.expect("recheck");
    assert!(
        matches!(last.as_slice(), [(id, CloseOutcome::Closed(_))] if *id == handle.lease_id),
        "{last:?}"
    );
    let lease = store
        .load_lease(&handle.lease_id)
        .await
        .expect("load lease")
        .expect("lease");
    assert_eq!(lease.state, LeaseState::Closed);
    assert_eq!(lease.ended_at, Some(4));
    assert!(lease.survivors.is_empty());
}
