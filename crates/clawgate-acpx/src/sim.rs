//! A simulated process table for the lifecycle simulator suite (and for anyone testing code on
//! top of the controller without real processes).
//!
//! It follows the kernel's rules that matter here: a handle is bound to one process (pid +
//! start time), so after the pid is reused it reads "gone" and signals nobody; an exiting
//! process's children are reparented to pid 1; exited processes are reaped at once. Every
//! delivered signal is recorded with the identity of the process that received it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::table::{Delivery, ProcStat, ProcessHandle, ProcessTable, Read, Sig, TableError};

/// What a simulated process does when it receives TERM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnTerm {
    Exit,
    Ignore,
    /// Exits, and its pid is immediately reused by this other process.
    ExitAndReuse(Box<SimProcess>),
    /// Stays, but execs into another program (same pid and start time, new exe and argv).
    Exec {
        exe: String,
        argv: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimProcess {
    pub pid: u32,
    pub ppid: u32,
    pub pgid: u32,
    pub start_time: u64,
    pub exe: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub on_term: OnTerm,
    /// Stays after KILL (uninterruptible sleep, held by a tracer) until [`SimTable::exit`].
    pub outlives_kill: bool,
}

impl SimProcess {
    pub fn new(pid: u32, ppid: u32, pgid: u32, start_time: u64, exe: &str) -> SimProcess {
        SimProcess {
            pid,
            ppid,
            pgid,
            start_time,
            exe: exe.to_owned(),
            argv: vec![exe.to_owned()],
            env: Vec::new(),
            on_term: OnTerm::Exit,
            outlives_kill: false,
        }
    }

    pub fn argv<S: AsRef<str>>(mut self, argv: &[S]) -> SimProcess {
        self.argv = argv.iter().map(|a| a.as_ref().to_owned()).collect();
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> SimProcess {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    pub fn on_term(mut self, on_term: OnTerm) -> SimProcess {
        self.on_term = on_term;
        self
    }

    /// Neither TERM nor KILL ends it; only [`SimTable::exit`] does.
    pub fn outlives_kill(mut self) -> SimProcess {
        self.on_term = OnTerm::Ignore;
        self.outlives_kill = true;
        self
    }
}

/// One delivered signal: who (pid and start time, so a reused pid is told apart) got what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Delivered {
    pub pid: u32,
    pub start_time: u64,
    pub sig: Sig,
}

#[derive(Debug, Default)]
struct State {
    boot_id: String,
    unavailable: bool,
    processes: BTreeMap<u32, SimProcess>,
    delivered: Vec<Delivered>,
}

impl State {
    fn exit(&mut self, pid: u32) {
        self.processes.remove(&pid);
        for process in self.processes.values_mut() {
            if process.ppid == pid {
                process.ppid = 1;
            }
        }
    }
}

/// The simulated table; clones share one state.
#[derive(Debug, Clone, Default)]
pub struct SimTable {
    state: Arc<Mutex<State>>,
}

impl SimTable {
    pub fn new(boot_id: &str) -> SimTable {
        let table = SimTable::default();
        table.lock().boot_id = boot_id.to_owned();
        table
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a test failure already; keep reporting.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    pub fn spawn(&self, process: SimProcess) {
        self.lock().processes.insert(process.pid, process);
    }

    /// Ends a process without a signal (it exited on its own).
    pub fn exit(&self, pid: u32) {
        self.lock().exit(pid);
    }

    /// Makes every read fail, as an unreadable `/proc` would.
    pub fn set_unavailable(&self, unavailable: bool) {
        self.lock().unavailable = unavailable;
    }

    pub fn delivered(&self) -> Vec<Delivered> {
        self.lock().delivered.clone()
    }

    pub fn is_alive(&self, pid: u32, start_time: u64) -> bool {
        self.lock()
            .processes
            .get(&pid)
            .is_some_and(|p| p.start_time == start_time)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.lock().processes.keys().copied().collect()
    }
}

fn unavailable() -> TableError {
    TableError::new("simulated /proc", "process list unavailable")
}

impl ProcessTable for SimTable {
    fn boot_id(&self) -> Result<String, TableError> {
        let state = self.lock();
        if state.unavailable {
            return Err(unavailable());
        }
        Ok(state.boot_id.clone())
    }

    fn list(&self) -> Result<Vec<ProcStat>, TableError> {
        let state = self.lock();
        if state.unavailable {
            return Err(unavailable());
        }
        Ok(state.processes.values().map(stat_of).collect())
    }

    fn open(&self, pid: u32) -> Read<Box<dyn ProcessHandle>> {
        let state = self.lock();
        if state.unavailable {
            return Err(unavailable());
        }
        Ok(state.processes.get(&pid).map(|p| {
            Box::new(SimHandle {
                table: self.clone(),
                pid,
                start_time: p.start_time,
            }) as Box<dyn ProcessHandle>
        }))
    }
}

fn stat_of(p: &SimProcess) -> ProcStat {
    ProcStat {
        pid: p.pid,
        ppid: p.ppid,
        pgid: p.pgid,
        start_time: p.start_time,
        zombie: false,
    }
}

#[derive(Debug)]
struct SimHandle {
    table: SimTable,
    pid: u32,
    start_time: u64,
}

impl SimHandle {
    fn with<T>(&self, f: impl FnOnce(&SimProcess) -> T) -> Read<T> {
        let state = self.table.lock();
        if state.unavailable {
            return Err(unavailable());
        }
        Ok(state
            .processes
            .get(&self.pid)
            .filter(|p| p.start_time == self.start_time)
            .map(f))
    }
}

impl ProcessHandle for SimHandle {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn stat(&self) -> Read<ProcStat> {
        self.with(stat_of)
    }

    fn exe(&self) -> Read<PathBuf> {
        self.with(|p| PathBuf::from(&p.exe))
    }

    fn cmdline(&self) -> Read<Vec<String>> {
        self.with(|p| p.argv.clone())
    }

    fn environ_var(&self, key: &str) -> Read<Option<String>> {
        self.with(|p| p.env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()))
    }

    fn signal(&self, sig: Sig) -> Result<Delivery, TableError> {
        let mut state = self.table.lock();
        if state.unavailable {
            return Err(unavailable());
        }
        let Some(process) = state
            .processes
            .get(&self.pid)
            .filter(|p| p.start_time == self.start_time)
            .cloned()
        else {
            return Ok(Delivery::Gone);
        };
        state.delivered.push(Delivered {
            pid: self.pid,
            start_time: self.start_time,
            sig,
        });
        match (sig, process.on_term) {
            (Sig::Kill, _) if process.outlives_kill => {}
            (Sig::Kill, _) | (Sig::Term, OnTerm::Exit) => state.exit(self.pid),
            (Sig::Term, OnTerm::Ignore) => {}
            (Sig::Term, OnTerm::ExitAndReuse(next)) => {
                state.exit(self.pid);
                state.processes.insert(next.pid, *next);
            }
            (Sig::Term, OnTerm::Exec { exe, argv }) => {
                if let Some(p) = state.processes.get_mut(&self.pid) {
                    p.exe = exe;
                    p.argv = argv;
                    p.on_term = OnTerm::Ignore;
                }
            }
        }
        Ok(Delivery::Delivered)
    }
}
