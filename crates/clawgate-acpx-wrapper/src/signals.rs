//! Receiving TERM/INT/HUP, the parent-death signal and CHLD without signal handlers.
//!
//! The wrapper blocks these signals in its only thread before it does anything else and then
//! collects them synchronously (`sigpending` + `sigwait`) from its main loop, so there is no
//! async-signal-safety question at all. A blocked mask is inherited across fork and exec (std's
//! `Command` does not reset it), so [`Blocked::prepare_child`] clears it in the adapter before
//! `exec` (the real-process tests check that the adapter still dies of TERM), and arms the
//! adapter's own parent-death signal there.
//!
//! Unsafe is allowed in this module only: `pthread_sigmask`, `sigpending`, `sigwait` and
//! `Command::pre_exec` have no safe wrapper in rustix or std. Each call below passes pointers to
//! `sigset_t` values owned by this module (initialized with `sigemptyset` first) and reads
//! nothing else, which is sound; the `pre_exec` hook only makes async-signal-safe system calls
//! (`pthread_sigmask` on a set copied into the closure, `prctl`, `getppid`).
#![allow(unsafe_code)]

use std::io;
use std::mem::MaybeUninit;

/// The signal the kernel sends the wrapper when its parent thread dies (`PR_SET_PDEATHSIG`).
/// A dedicated signal, so parent death is never confused with a TERM the gateway forwards.
pub(crate) const PARENT_DEATH: libc::c_int = libc::SIGUSR2;

const WATCHED: [libc::c_int; 5] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGCHLD,
    PARENT_DEATH,
];

/// The watched signals, blocked for this thread (and every thread it would start).
#[derive(Debug)]
pub(crate) struct Blocked {
    set: libc::sigset_t,
}

fn empty_set() -> io::Result<libc::sigset_t> {
    let mut set = MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `sigemptyset` initializes the set it is given a valid pointer to.
    if unsafe { libc::sigemptyset(set.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: initialized just above.
    Ok(unsafe { set.assume_init() })
}

/// Blocks the watched signals. Call it first thing in `main`, before any thread exists.
pub(crate) fn block() -> io::Result<Blocked> {
    let mut set = empty_set()?;
    for signal in WATCHED {
        // SAFETY: `set` is an initialized sigset_t owned here; `signal` is a valid number.
        if unsafe { libc::sigaddset(&mut set, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: valid pointer to an initialized set; the old mask is not needed (null).
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(Blocked { set })
}

impl Blocked {
    /// Prepares `command`'s child between fork and exec: the watched signals unblocked again,
    /// and (Linux) `PR_SET_PDEATHSIG` = KILL, so the adapter cannot outlive a wrapper that was
    /// itself SIGKILLed (the wrapper's own drain then never runs). `wrapper` is this process's
    /// pid.
    ///
    /// The death signal follows the *thread* that forked: spawn from the wrapper's main thread,
    /// which lives exactly as long as the wrapper. It survives the exec (not of a set-uid or
    /// file-capability program). It reaches the adapter only, not its own children: those stay
    /// in the adapter's group, carrying the lease mark in their environment.
    pub(crate) fn prepare_child(&self, command: &mut std::process::Command, wrapper: libc::pid_t) {
        use std::os::unix::process::CommandExt;
        let set = self.set;
        // SAFETY: runs in the forked child before exec; it only makes the async-signal-safe
        // system calls pthread_sigmask (with a valid pointer to a set the closure owns), prctl
        // and getppid, reads errno, allocates nothing and touches no lock.
        unsafe {
            command.pre_exec(move || {
                let rc = libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                if rc != 0 {
                    return Err(io::Error::from_raw_os_error(rc));
                }
                #[cfg(any(target_os = "linux", target_os = "android"))]
                {
                    let kill = libc::SIGKILL as libc::c_ulong;
                    if libc::prctl(libc::PR_SET_PDEATHSIG, kill, 0, 0, 0) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // Armed for the parent of now only: when the wrapper died between fork and
                    // prctl, the child was already reparented and no signal will come.
                    if libc::getppid() != wrapper {
                        return Err(io::Error::from_raw_os_error(libc::ESRCH));
                    }
                }
                #[cfg(not(any(target_os = "linux", target_os = "android")))]
                let _ = wrapper;
                Ok(())
            });
        }
    }

    /// Every watched signal that is pending now, consumed; never blocks.
    pub(crate) fn take_pending(&self) -> io::Result<Vec<libc::c_int>> {
        let mut taken = Vec::new();
        loop {
            let mut pending = empty_set()?;
            // SAFETY: valid pointer to an initialized set owned here.
            if unsafe { libc::sigpending(&mut pending) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `pending` is initialized; sigismember only reads it.
            let any = WATCHED
                .iter()
                .any(|&signal| unsafe { libc::sigismember(&pending, signal) } == 1);
            if !any {
                return Ok(taken);
            }
            let mut signal: libc::c_int = 0;
            // SAFETY: `self.set` is initialized; a watched signal is pending, so this returns
            // at once with it.
            let rc = unsafe { libc::sigwait(&self.set, &mut signal) };
            if rc != 0 {
                return Err(io::Error::from_raw_os_error(rc));
            }
            taken.push(signal);
        }
    }
}
