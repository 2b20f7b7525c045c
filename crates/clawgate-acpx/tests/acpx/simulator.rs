//! The process lifecycle simulator: one table, one row per case of the ACP page (plus the
//! identity-change-during-grace case and the guards around them), one assertion loop. Each row
//! builds a simulated process table, stores a lease (and session row) in a real SQLite store,
//! runs close or the startup reaper through the real controller, and checks exactly which
//! processes received which signals, and the lease's final state.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawgate_acpx::evidence::{LEASE_ENV, command_hash, shell_split};
use clawgate_acpx::sim::{Delivered, OnTerm, SimProcess, SimTable};
use clawgate_acpx::{CloseOutcome, ControllerConfig, LifecycleController, Sig};
use clawgate_store::{LeaseStore, SessionStore};
use clawgate_types::{AcpxProcessLease, GatewayInstanceId, LeaseId, LeaseState};

use crate::support::*;

const BOOT: &str = "boot-a";
const ROOT: &str = "/opt/claw gate/bin";
const WRAPPER: &str = "/opt/claw gate/bin/clawgate-acpx-wrapper";
const ADAPTER: &[&str] = &["codex-acp", "--model", "big model"];
const W: u32 = 100;
const A: u32 = 101;
const G: u32 = 102;

#[derive(Debug, Clone, Copy)]
enum Op {
    Close,
    Reap,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Closed,
    /// Signalled, but something outlived KILL: the lease stays `closing`.
    Survived,
    Lost,
    Refused,
    /// The reaper did not even look at the lease.
    Untouched,
}

/// What a row can change in the world.
struct World<'a> {
    table: &'a SimTable,
    lease: &'a mut AcpxProcessLease,
    argv: Vec<String>,
    instance: GatewayInstanceId,
}

impl World<'_> {
    fn wrapper(&self) -> SimProcess {
        SimProcess::new(W, 1, 50, 1_000, WRAPPER).argv(&self.argv)
    }
    fn adapter(&self) -> SimProcess {
        SimProcess::new(A, W, A, 1_001, "/usr/bin/codex-acp")
            .argv(ADAPTER)
            .env(LEASE_ENV, self.lease.lease_id.as_str())
    }
    fn grandchild(&self) -> SimProcess {
        SimProcess::new(G, A, A, 1_002, "/usr/bin/node")
            .env(LEASE_ENV, self.lease.lease_id.as_str())
    }
    fn whole_tree(&self) {
        self.table.spawn(self.wrapper());
        self.table.spawn(self.adapter());
        self.table.spawn(self.grandchild());
    }
    /// Another gateway's wrapper (same root, other lease and instance ids).
    fn foreign_wrapper(&self, pid: u32, start_time: u64) -> SimProcess {
        let argv: Vec<String> = self
            .argv
            .iter()
            .map(|a| {
                if a == self.lease.lease_id.as_str() {
                    "lease-of-gateway-b".to_owned()
                } else if a == self.instance.as_str() {
                    "instance-b".to_owned()
                } else {
                    a.clone()
                }
            })
            .collect();
        SimProcess::new(pid, 1, 70, start_time, WRAPPER).argv(&argv)
    }
}

struct Row {
    name: &'static str,
    op: Op,
    setup: fn(&mut World<'_>),
    outcome: Outcome,
    signals: &'static [(u32, u64, Sig)],
    state: LeaseState,
    /// Processes (pid, start time) that must still be alive at the end.
    survivors: &'static [(u32, u64)],
}

const T: Sig = Sig::Term;
const K: Sig = Sig::Kill;

fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "owned tree: children first, TERM suffices",
            op: Op::Close,
            setup: |w| w.whole_tree(),
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T), (A, 1_001, T), (W, 1_000, T)],
            state: LeaseState::Closed,
            survivors: &[],
        },
        Row {
            name: "pid reused by an unrelated process",
            op: Op::Close,
            setup: |w| {
                w.table
                    .spawn(SimProcess::new(W, 1, W, 9_000, "/usr/bin/vim"))
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[(W, 9_000)],
        },
        Row {
            name: "pid reused by another gateway's wrapper root (same start tick even)",
            op: Op::Close,
            setup: |w| {
                let foreign = w.foreign_wrapper(W, 1_000);
                w.table.spawn(foreign);
            },
            outcome: Outcome::Refused,
            signals: &[],
            state: LeaseState::Open,
            survivors: &[(W, 1_000)],
        },
        Row {
            name: "pid reused by another gateway's wrapper root (later start)",
            op: Op::Reap,
            setup: |w| {
                let foreign = w.foreign_wrapper(W, 5_000);
                w.table.spawn(foreign);
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[(W, 5_000)],
        },
        Row {
            name: "stored command shell-quoted, live argv not: still agrees",
            op: Op::Close,
            setup: |w| {
                // The lease was recorded from a shell-quoted command string; the live argv
                // (from /proc cmdline) has no quotes. Agreement is on the argv, not the text.
                let quoted: Vec<String> = w
                    .argv
                    .iter()
                    .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
                    .collect();
                w.lease.command_hash = command_hash(&shell_split(&quoted.join(" ")).unwrap());
                w.whole_tree();
            },
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T), (A, 1_001, T), (W, 1_000, T)],
            state: LeaseState::Closed,
            survivors: &[],
        },
        Row {
            name: "quoting cannot forge agreement: 'big model' is one argument, not two",
            op: Op::Close,
            setup: |w| {
                let mut split = w.argv.clone();
                let last = split.pop().unwrap();
                split.extend(last.split(' ').map(str::to_owned));
                w.lease.command_hash = command_hash(&split);
                w.whole_tree();
            },
            outcome: Outcome::Refused,
            signals: &[],
            state: LeaseState::Open,
            survivors: &[(W, 1_000), (A, 1_001), (G, 1_002)],
        },
        Row {
            name: "adapter child exits, grandchild stays in the group",
            op: Op::Close,
            setup: |w| {
                w.whole_tree();
                w.table.exit(A);
                // A stranger that joined a group with the same id but carries no lease mark.
                w.table
                    .spawn(SimProcess::new(103, 1, A, 1_003, "/usr/bin/stranger"));
                // One that carries a mark, but another lease's: a mark is not enough.
                w.table.spawn(
                    SimProcess::new(104, 1, A, 1_004, "/usr/bin/node")
                        .env(LEASE_ENV, "lease-of-another"),
                );
            },
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T), (W, 1_000, T)],
            state: LeaseState::Closed,
            survivors: &[(103, 1_003), (104, 1_004)],
        },
        Row {
            name: "a group member under our live adapter carrying another lease's mark",
            op: Op::Close,
            setup: |w| {
                w.whole_tree();
                // Reparented out of the chain, still in the adapter's group, marked for
                // another lease: that lease's process, even while our adapter leads the group.
                w.table.spawn(
                    SimProcess::new(104, 1, A, 1_004, "/usr/bin/node")
                        .env(LEASE_ENV, "lease-of-another"),
                );
            },
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T), (A, 1_001, T), (W, 1_000, T)],
            state: LeaseState::Closed,
            survivors: &[(104, 1_004)],
        },
        Row {
            name: "a descendant carrying another lease's mark, and its unmarked child",
            op: Op::Close,
            setup: |w| {
                w.whole_tree();
                // The agent started another lease's process tree (a nested gateway's wrapper,
                // its own group): it and everything below it belong to that lease.
                w.table.spawn(
                    SimProcess::new(104, A, 104, 1_004, "/usr/bin/nested-wrapper")
                        .env(LEASE_ENV, "lease-of-another"),
                );
                w.table.spawn(SimProcess::new(
                    105,
                    104,
                    104,
                    1_005,
                    "/usr/bin/nested-adapter",
                ));
            },
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T), (A, 1_001, T), (W, 1_000, T)],
            state: LeaseState::Closed,
            survivors: &[(104, 1_004), (105, 1_005)],
        },
        Row {
            name: "parent-death TERM fallback reaches KILL (everyone ignores TERM)",
            op: Op::Reap,
            setup: |w| {
                w.table.spawn(w.wrapper().on_term(OnTerm::Ignore));
                w.table.spawn(w.adapter().on_term(OnTerm::Ignore));
                w.table.spawn(w.grandchild().on_term(OnTerm::Ignore));
            },
            outcome: Outcome::Closed,
            signals: &[
                (G, 1_002, T),
                (A, 1_001, T),
                (W, 1_000, T),
                (G, 1_002, K),
                (A, 1_001, K),
                (W, 1_000, K),
            ],
            state: LeaseState::Closed,
            survivors: &[],
        },
        Row {
            name: "a grandchild outlives KILL: survivor recorded, lease stays closing",
            op: Op::Close,
            setup: |w| {
                w.table.spawn(w.wrapper());
                w.table.spawn(w.adapter());
                w.table.spawn(w.grandchild().outlives_kill());
            },
            outcome: Outcome::Survived,
            signals: &[(G, 1_002, T), (A, 1_001, T), (W, 1_000, T), (G, 1_002, K)],
            state: LeaseState::Closing,
            survivors: &[(G, 1_002)],
        },
        Row {
            name: "process list unavailable",
            op: Op::Reap,
            setup: |w| {
                w.whole_tree();
                w.table.set_unavailable(true);
            },
            outcome: Outcome::Refused,
            signals: &[],
            state: LeaseState::Open,
            survivors: &[(W, 1_000), (A, 1_001), (G, 1_002)],
        },
        Row {
            name: "startup orphan caught mid-exit (no command line left), gone a moment later",
            op: Op::Reap,
            setup: |w| {
                // The wrapper of a gateway killed a moment ago, exiting with it: its memory
                // (argv) is released before it is reaped.
                w.table
                    .spawn(SimProcess::new(W, 1, 50, 1_000, WRAPPER).argv::<&str>(&[]));
                let table = w.table.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    table.exit(W);
                });
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[],
        },
        Row {
            name: "a process with no command line that stays is never signalled",
            op: Op::Reap,
            setup: |w| {
                w.table
                    .spawn(SimProcess::new(W, 1, 50, 1_000, WRAPPER).argv::<&str>(&[]));
            },
            outcome: Outcome::Refused,
            signals: &[],
            state: LeaseState::Open,
            survivors: &[(W, 1_000)],
        },
        Row {
            name: "wrapper gone, the adapter's pid (its group's number) reused by a stranger",
            op: Op::Close,
            setup: |w| {
                w.table
                    .spawn(SimProcess::new(A, 1, A, 9_500, "/usr/bin/vim"))
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[(A, 9_500)],
        },
        Row {
            name: "wrapper gone, the adapter's pid reused by a decoy carrying our lease's mark",
            op: Op::Reap,
            setup: |w| {
                let decoy = SimProcess::new(A, 1, A, 9_600, "/usr/bin/node")
                    .env(LEASE_ENV, w.lease.lease_id.as_str());
                w.table.spawn(decoy);
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[(A, 9_600)],
        },
        Row {
            name: "wrapper and adapter gone, a marked grandchild lives on in the group: ended",
            op: Op::Reap,
            // Reparented to init, still in the adapter's group, carrying the lease's mark.
            setup: |w| {
                w.table.spawn(
                    SimProcess::new(G, 1, A, 1_002, "/usr/bin/node")
                        .env(LEASE_ENV, w.lease.lease_id.as_str()),
                )
            },
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T)],
            state: LeaseState::Closed,
            survivors: &[],
        },
        Row {
            name: "wrapper gone, a marked child in a session of its own lives on: ended",
            op: Op::Close,
            setup: |w| {
                w.table.spawn(
                    SimProcess::new(G, 1, G, 1_003, "/bin/bash")
                        .env(LEASE_ENV, w.lease.lease_id.as_str()),
                )
            },
            outcome: Outcome::Closed,
            signals: &[(G, 1_003, T)],
            state: LeaseState::Closed,
            survivors: &[],
        },
        Row {
            name: "wrapper gone, an unmarked process in the lease's group is left alone",
            op: Op::Reap,
            setup: |w| {
                w.table
                    .spawn(SimProcess::new(G, 1, A, 1_002, "/usr/bin/node"))
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[(G, 1_002)],
        },
        Row {
            name: "wrapper gone, a marked process older than the wrapper is left alone",
            op: Op::Reap,
            setup: |w| {
                w.table.spawn(
                    SimProcess::new(G, 1, A, 900, "/usr/bin/node")
                        .env(LEASE_ENV, w.lease.lease_id.as_str()),
                )
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[(G, 900)],
        },
        Row {
            name: "stale lease whose process is gone",
            op: Op::Close,
            setup: |_| {},
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[],
        },
        Row {
            name: "startup orphan with wrapper, adapter child and grandchild",
            op: Op::Reap,
            setup: |w| w.whole_tree(),
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T), (A, 1_001, T), (W, 1_000, T)],
            state: LeaseState::Closed,
            survivors: &[],
        },
        Row {
            name: "lease identity changes during the TERM grace: pid reused, no KILL to it",
            op: Op::Reap,
            setup: |w| {
                let successor = w.foreign_wrapper(W, 2_000);
                w.table.spawn(
                    w.wrapper()
                        .on_term(OnTerm::ExitAndReuse(Box::new(successor))),
                );
                w.table.spawn(w.adapter().on_term(OnTerm::Ignore));
                w.table.spawn(w.grandchild().on_term(OnTerm::Ignore));
            },
            outcome: Outcome::Closed,
            signals: &[
                (G, 1_002, T),
                (A, 1_001, T),
                (W, 1_000, T),
                (G, 1_002, K),
                (A, 1_001, K),
            ],
            state: LeaseState::Closed,
            survivors: &[(W, 2_000)],
        },
        Row {
            name: "lease identity changes during the TERM grace: root execs something else",
            op: Op::Close,
            setup: |w| {
                w.table.spawn(w.wrapper().on_term(OnTerm::Exec {
                    exe: "/usr/bin/bash".into(),
                    argv: vec!["bash".into()],
                }));
                w.table.spawn(w.adapter());
                w.table.spawn(w.grandchild().on_term(OnTerm::Ignore));
            },
            outcome: Outcome::Closed,
            signals: &[(G, 1_002, T), (A, 1_001, T), (W, 1_000, T), (G, 1_002, K)],
            state: LeaseState::Closed,
            survivors: &[(W, 1_000)],
        },
        Row {
            name: "executable outside the wrapper root",
            op: Op::Close,
            setup: |w| {
                let mut fake = w.wrapper();
                fake.exe = "/tmp/evil/clawgate-acpx-wrapper".into();
                w.table.spawn(fake);
            },
            outcome: Outcome::Refused,
            signals: &[],
            state: LeaseState::Open,
            survivors: &[(W, 1_000)],
        },
        Row {
            name: "lease from a previous boot",
            op: Op::Reap,
            setup: |w| {
                w.lease.boot_id = Some("boot-before".into());
                w.whole_tree();
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[(W, 1_000), (A, 1_001), (G, 1_002)],
        },
        Row {
            name: "wrapper never reported (gateway died between lease and spawn report)",
            op: Op::Reap,
            setup: |w| {
                w.lease.root_pid = None;
                w.lease.root_start_time = None;
                w.lease.boot_id = None;
                w.lease.process_group_id = None;
            },
            outcome: Outcome::Lost,
            signals: &[],
            state: LeaseState::Lost,
            survivors: &[],
        },
        Row {
            name: "another gateway's lease in the same store is never reaped by us",
            op: Op::Reap,
            setup: |w| {
                w.lease.gateway_instance_id = GatewayInstanceId::parse("instance-b").unwrap();
                w.whole_tree();
            },
            outcome: Outcome::Untouched,
            signals: &[],
            state: LeaseState::Open,
            survivors: &[(W, 1_000), (A, 1_001), (G, 1_002)],
        },
        Row {
            name: "closing a session whose lease is another gateway's: refused",
            op: Op::Close,
            setup: |w| {
                w.lease.gateway_instance_id = GatewayInstanceId::parse("instance-b").unwrap();
                w.whole_tree();
            },
            outcome: Outcome::Refused,
            signals: &[],
            state: LeaseState::Open,
            survivors: &[(W, 1_000), (A, 1_001), (G, 1_002)],
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_lifecycle_simulator() {
    for row in rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let table = SimTable::new(BOOT);
        let controller = controller(
            store.clone(),
            Arc::new(table.clone()),
            Path::new(WRAPPER),
            fast_timing(),
        )
        .await;
        let instance = controller.instance_id().clone();
        let lease_id = LeaseId::parse(format!("lease-{}", row.name.len())).unwrap();
        let adapter: Vec<String> = ADAPTER.iter().map(|s| s.to_string()).collect();
        let argv = controller.wrapper_argv(&lease_id, &adapter);
        let mut lease = AcpxProcessLease {
            lease_id: lease_id.clone(),
            gateway_instance_id: instance.clone(),
            session_key: key("agent:codex:acp:1"),
            wrapper_root: ROOT.into(),
            wrapper_path: WRAPPER.into(),
            root_pid: Some(W),
            root_start_time: Some(1_000),
            boot_id: Some(BOOT.into()),
            process_group_id: Some(A),
            command_hash: command_hash(&argv),
            started_at: 1,
            state: LeaseState::Open,
            ended_at: None,
            survivors: Vec::new(),
            stderr_tail: Vec::new(),
        };
        let mut world = World {
            table: &table,
            lease: &mut lease,
            argv,
            instance,
        };
        (row.setup)(&mut world);
        store.insert_lease(&lease).await.unwrap();
        store
            .upsert_session(&session_row(&lease.session_key, Some(lease_id.clone())))
            .await
            .unwrap();

        let outcome = match row.op {
            Op::Close => Some(
                controller
                    .close_session(&lease.session_key, "test", 2)
                    .await
                    .unwrap(),
            ),
            Op::Reap => controller
                .reap_startup_orphans(2)
                .await
                .unwrap()
                .outcomes
                .into_iter()
                .find(|(id, _)| *id == lease_id)
                .map(|(_, outcome)| outcome),
        };
        let kind = match &outcome {
            None => Outcome::Untouched,
            Some(CloseOutcome::Closed(_)) => Outcome::Closed,
            Some(CloseOutcome::Survived(_)) => Outcome::Survived,
            Some(CloseOutcome::Lost(_)) => Outcome::Lost,
            Some(CloseOutcome::Refused(_)) => Outcome::Refused,
            Some(CloseOutcome::AlreadyFinished(_)) => panic!("{}: already finished", row.name),
        };
        assert_eq!(kind, row.outcome, "{}: outcome {outcome:?}", row.name);
        let expected: Vec<Delivered> = row
            .signals
            .iter()
            .map(|&(pid, start_time, sig)| Delivered {
                pid,
                start_time,
                sig,
            })
            .collect();
        assert_eq!(table.delivered(), expected, "{}: signals", row.name);
        let stored = store.load_lease(&lease_id).await.unwrap().unwrap();
        assert_eq!(stored.state, row.state, "{}: lease state", row.name);
        let recorded: Vec<(u32, u64)> = stored
            .survivors
            .iter()
            .map(|s| (s.pid, s.start_time))
            .collect();
        let expected_survivors: &[(u32, u64)] = if row.outcome == Outcome::Survived {
            row.survivors
        } else {
            &[]
        };
        assert_eq!(
            recorded, expected_survivors,
            "{}: recorded survivors",
            row.name
        );
        table.set_unavailable(false);
        for &(pid, start) in row.survivors {
            assert!(
                table.is_alive(pid, start),
                "{}: {pid}@{start} must survive",
                row.name
            );
        }
        let alive: Vec<u32> = table.pids();
        assert_eq!(
            alive.len(),
            row.survivors.len(),
            "{}: nothing owned survives (alive: {alive:?})",
            row.name
        );
    }
}

#[tokio::test]
async fn legacy_record_without_lease_id_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let table = SimTable::new(BOOT);
    table.spawn(SimProcess::new(W, 1, W, 1_000, WRAPPER));
    let controller = controller(
        store.clone(),
        Arc::new(table.clone()),
        Path::new(WRAPPER),
        fast_timing(),
    )
    .await;
    let key = key("agent:codex:acp:legacy");
    store
        .upsert_session(&session_row(&key, None))
        .await
        .unwrap();
    let outcome = controller.close_session(&key, "test", 2).await.unwrap();
    assert!(matches!(outcome, CloseOutcome::Refused(ref why) if why.contains("legacy")));
    assert!(table.delivered().is_empty());
}

/// A retention too long to count in milliseconds (`retention.lease_days =
/// 213503982334601`) keeps every lease; it never wraps into a cutoff after now.
#[tokio::test]
async fn an_enormous_retention_keeps_every_finished_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let mut config = ControllerConfig::new(Path::new(WRAPPER).to_path_buf());
    config.retention = Duration::from_secs(213_503_982_334_601u64.saturating_mul(86_400));
    let controller = LifecycleController::new(store.clone(), Arc::new(SimTable::new(BOOT)), config)
        .await
        .unwrap();
    let now = 1_767_225_600_000;
    let lease = AcpxProcessLease {
        lease_id: LeaseId::parse("closed-yesterday").unwrap(),
        gateway_instance_id: controller.instance_id().clone(),
        session_key: key("agent:codex:acp:r"),
        wrapper_root: ROOT.into(),
        wrapper_path: WRAPPER.into(),
        root_pid: None,
        root_start_time: None,
        boot_id: None,
        process_group_id: None,
        command_hash: "sha256:0".into(),
        started_at: 1,
        state: LeaseState::Closed,
        ended_at: Some(now - 86_400_000),
        survivors: Vec::new(),
        stderr_tail: Vec::new(),
    };
    store.insert_lease(&lease).await.unwrap();
    assert_eq!(controller.prune_finished(now).await.unwrap(), 0);
    assert!(store.load_lease(&lease.lease_id).await.unwrap().is_some());
}

#[tokio::test]
async fn retention_prunes_only_old_finished_leases() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let table = SimTable::new(BOOT);
    let controller = controller(
        store.clone(),
        Arc::new(table),
        Path::new(WRAPPER),
        fast_timing(),
    )
    .await;
    let day = 24 * 3600 * 1000;
    let now = 30 * day;
    for (name, state, ended) in [
        ("old-closed", LeaseState::Closed, Some(now - 8 * day)),
        ("new-lost", LeaseState::Lost, Some(now - day)),
        ("old-open", LeaseState::Open, None),
    ] {
        let lease = AcpxProcessLease {
            lease_id: LeaseId::parse(name).unwrap(),
            gateway_instance_id: controller.instance_id().clone(),
            session_key: key("agent:codex:acp:r"),
            wrapper_root: ROOT.into(),
            wrapper_path: WRAPPER.into(),
            root_pid: None,
            root_start_time: None,
            boot_id: None,
            process_group_id: None,
            command_hash: "sha256:0".into(),
            started_at: 1,
            state,
            ended_at: ended,
            survivors: Vec::new(),
            stderr_tail: Vec::new(),
        };
        store.insert_lease(&lease).await.unwrap();
    }
    assert_eq!(controller.prune_finished(now).await.unwrap(), 1);
    assert!(
        store
            .load_lease(&LeaseId::parse("old-closed").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .load_lease(&LeaseId::parse("new-lost").unwrap())
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        store
            .load_lease(&LeaseId::parse("old-open").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

/// A lease left `closing` with a survivor is closed by a later look once the survivor is gone —
/// also when its pid now names another process (told apart by start time, never signalled) —
/// and not before.
#[tokio::test]
async fn a_later_look_closes_the_lease_once_its_survivors_are_gone() {
    for reused in [false, true] {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(dir.path());
        let table = SimTable::new(BOOT);
        let controller = controller(
            store.clone(),
            Arc::new(table.clone()),
            Path::new(WRAPPER),
            fast_timing(),
        )
        .await;
        let lease_id = LeaseId::parse("lease-survivor").expect("lease id");
        let adapter: Vec<String> = ADAPTER.iter().map(|s| s.to_string()).collect();
        let argv = controller.wrapper_argv(&lease_id, &adapter);
        let lease = AcpxProcessLease {
            lease_id: lease_id.clone(),
            gateway_instance_id: controller.instance_id().clone(),
            session_key: key("agent:codex:acp:survivor"),
            wrapper_root: ROOT.into(),
            wrapper_path: WRAPPER.into(),
            root_pid: Some(W),
            root_start_time: Some(1_000),
            boot_id: Some(BOOT.into()),
            process_group_id: Some(A),
            command_hash: command_hash(&argv),
            started_at: 1,
            state: LeaseState::Open,
            ended_at: None,
            survivors: Vec::new(),
            stderr_tail: Vec::new(),
        };
        let world = World {
            table: &table,
            lease: &mut lease.clone(),
            argv,
            instance: controller.instance_id().clone(),
        };
        table.spawn(world.wrapper());
        table.spawn(world.adapter());
        table.spawn(world.grandchild().outlives_kill());
        store.insert_lease(&lease).await.expect("insert lease");
        store
            .upsert_session(&session_row(&lease.session_key, Some(lease_id.clone())))
            .await
            .expect("upsert session");

        let outcome = controller
            .close_session(&lease.session_key, "test", 2)
            .await
            .expect("close");
        assert!(matches!(outcome, CloseOutcome::Survived(_)), "{outcome:?}");
        // Still there: a later look keeps the lease closing, signals nothing new.
        let signals = table.delivered().len();
        let again = controller.recheck_survivors(3).await.expect("recheck");
        assert!(
            matches!(again.as_slice(), [(id, CloseOutcome::Survived(t))]
                if *id == lease_id && t.survivors.iter().map(|s| s.pid).eq([G])),
            "{again:?}"
        );
        let stored = store
            .load_lease(&lease_id)
            .await
            .expect("load")
            .expect("lease");
        assert_eq!((stored.state, stored.ended_at), (LeaseState::Closing, None));
        assert_eq!(
            table.delivered().len(),
            signals,
            "survivors are only looked at"
        );

        table.exit(G);
        if reused {
            table.spawn(SimProcess::new(G, 1, G, 9_000, "/usr/bin/vim"));
        }
        let last = controller.recheck_survivors(4).await.expect("recheck");
        assert!(
            matches!(last.as_slice(), [(id, CloseOutcome::Closed(_))] if *id == lease_id),
            "reused {reused}: {last:?}"
        );
        let stored = store
            .load_lease(&lease_id)
            .await
            .expect("load")
            .expect("lease");
        assert_eq!(stored.state, LeaseState::Closed, "reused {reused}");
        assert_eq!(stored.ended_at, Some(4));
        assert!(stored.survivors.is_empty());
        assert_eq!(
            table.delivered().len(),
            signals,
            "reused {reused}: no new signal"
        );
        assert!(
            controller
                .recheck_survivors(5)
                .await
                .expect("recheck")
                .is_empty(),
            "a closed lease is not looked at again"
        );
    }
}
