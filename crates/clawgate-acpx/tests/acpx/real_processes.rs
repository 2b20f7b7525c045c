//! Real wrapper + adapter + grandchild trees on Linux, verified through the live /proc.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use clawgate_acpx::evidence::command_hash;
use clawgate_acpx::{CloseOutcome, EnsureInput, Timing, Verdict, system_table, verify_owned_tree};
use clawgate_store::{LeaseStore, SessionStore};
use clawgate_types::{AcpxProcessLease, LeaseId, LeaseState};

use crate::support::*;

/// Two gateways' controllers on the real process table, each on its own store (or two
/// connections to one shared database); their instance ids differ.
pub(crate) async fn two_gateways(
    store_a: Arc<dyn clawgate_store::Store>,
    store_b: Arc<dyn clawgate_store::Store>,
) -> (Controller, Controller) {
    let a = controller(store_a, system_table(), &wrapper_bin(), real_timing()).await;
    let b = controller(store_b, system_table(), &wrapper_bin(), real_timing()).await;
    assert_ne!(a.instance_id(), b.instance_id());
    (a, b)
}

pub(crate) fn real_timing() -> Timing {
    Timing {
        grace: Duration::from_millis(500),
        kill_wait: Duration::from_secs(5),
        poll: Duration::from_millis(5),
    }
}

pub(crate) fn alive(pid: u32) -> bool {
    let table = system_table();
    table
        .open(pid)
        .ok()
        .flatten()
        .and_then(|h| h.stat().ok().flatten())
        .is_some_and(|s| !s.zombie)
}

fn read_pid_file(path: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `cwd` is the agent's working directory: a test's own temp dir, never a shared one.
pub(crate) fn ensure_input(name: &str, adapter: Vec<String>, cwd: &std::path::Path) -> EnsureInput {
    EnsureInput {
        session_key: key(&format!("agent:codex:acp:{name}")),
        agent_id: "codex".into(),
        owner_session_key: key("agent:main:main"),
        spawned_by: Some(key("agent:main:main")),
        adapter,
        env: clawgate_acpx::AgentEnv::base(),
        cwd: cwd.to_path_buf(),
        now: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_ends_wrapper_adapter_and_grandchild() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), real_timing()).await;
    let pid_file = dir.path().join("grandchild.pid");
    let adapter = vec![
        test_agent(),
        "--grandchild".into(),
        "--grandchild-pid-file".into(),
        pid_file.display().to_string(),
    ];
    let input = ensure_input("close", adapter, dir.path());
    let handle = gateway.ensure_session(input.clone()).await.unwrap();
    // The lease was recorded with the live identity, and the row carries the lease id.
    let lease = store.load_lease(&handle.lease_id).await.unwrap().unwrap();
    assert_eq!(lease.root_pid, Some(handle.root_pid));
    assert_eq!(lease.process_group_id, Some(handle.process_group_id));
    assert!(lease.root_start_time.is_some() && lease.boot_id.is_some());
    let row = store
        .load_session(&input.session_key)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.lease_id, Some(handle.lease_id.clone()));
    assert_eq!(
        row.acp_owner.unwrap().gateway_instance_id,
        *gateway.instance_id()
    );
    // ensure is idempotent while the session lives.
    assert_eq!(gateway.ensure_session(input.clone()).await.unwrap(), handle);
    eventually(Duration::from_secs(5), "grandchild pid file", || {
        read_pid_file(&pid_file).is_some()
    })
    .await;
    let grandchild = read_pid_file(&pid_file).unwrap();
    let tree = match verify_owned_tree(system_table().as_ref(), &lease, gateway.instance_id()) {
        Verdict::Owned(tree) => tree,
        other => panic!("expected an owned tree, got {other:?}"),
    };
    let mut pids = tree.pids();
    pids.sort();
    let mut expected = vec![handle.root_pid, handle.process_group_id, grandchild];
    expected.sort();
    assert_eq!(pids, expected);

    let outcome = gateway
        .close_session(&input.session_key, "test", 2)
        .await
        .unwrap();
    assert!(matches!(outcome, CloseOutcome::Closed(_)), "{outcome:?}");
    for pid in [handle.root_pid, handle.process_group_id, grandchild] {
        eventually(Duration::from_secs(5), "owned process gone", || !alive(pid)).await;
    }
    // The wrapper is this process's child: reaped, not left a zombie in the process table.
    let wrapper = std::path::PathBuf::from(format!("/proc/{}", handle.root_pid));
    eventually(Duration::from_secs(5), "the wrapper reaped", || {
        !wrapper.exists()
    })
    .await;
    let lease = store.load_lease(&handle.lease_id).await.unwrap().unwrap();
    assert_eq!(lease.state, LeaseState::Closed);
    assert_eq!(lease.ended_at, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_never_signals_the_first_ones_tree() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let store_a = store(dir_a.path());
    let store_b = store(dir_b.path());
    let (a, b) = two_gateways(store_a.clone(), store_b.clone()).await;
    let input = ensure_input("two-gateways", vec![test_agent()], dir_a.path());
    let handle = a.ensure_session(input.clone()).await.unwrap();
    let lease_a = store_a.load_lease(&handle.lease_id).await.unwrap().unwrap();
    // Gateway B holds a lease naming A's live wrapper pid, start time and group — its own
    // lease id, its own instance id, the same wrapper root — as after a pid mix-up.
    let mut lease_b = lease_a.clone();
    lease_b.lease_id = LeaseId::parse("lease-of-b").unwrap();
    lease_b.gateway_instance_id = b.instance_id().clone();
    lease_b.command_hash = command_hash(&b.wrapper_argv(&lease_b.lease_id, &[test_agent()]));
    store_b.insert_lease(&lease_b).await.unwrap();
    store_b
        .upsert_session(&session_row(
            &input.session_key,
            Some(lease_b.lease_id.clone()),
        ))
        .await
        .unwrap();
    // And a copy of A's very lease (A's instance id) in B's store.
    store_b.insert_lease(&lease_a).await.unwrap();

    let reap = b.reap_startup_orphans(2).await.unwrap();
    assert_eq!(
        reap.outcomes.len(),
        1,
        "B only looks at its own instance's leases"
    );
    assert!(
        matches!(reap.outcomes[0].1, CloseOutcome::Refused(_)),
        "{reap:?}"
    );
    let close = b
        .close_session(&input.session_key, "test", 2)
        .await
        .unwrap();
    assert!(matches!(close, CloseOutcome::Refused(_)), "{close:?}");
    assert!(alive(handle.root_pid) && alive(handle.process_group_id));
    // A's tree is untouched and still serves prompts.
    let turn = a.prompt(&handle, "still here", |_| {}).await.unwrap();
    assert_eq!(turn.chunks.concat(), "echo: still here");
    assert!(matches!(
        a.close_session(&input.session_key, "test", 3)
            .await
            .unwrap(),
        CloseOutcome::Closed(_)
    ));
}

/// A stand-in gateway process: writes nothing itself; the test records the lease as the dead
/// gateway would have, starts the wrapper under `sh`, then SIGKILLs the `sh`.
struct DeadGateway {
    lease: AcpxProcessLease,
    adapter_pid: u32,
    sh: std::process::Child,
}

async fn start_under_stand_in_gateway(
    gateway: &Controller,
    store: &Arc<clawgate_store_sqlite::SqliteStore>,
    name: &str,
    wrapper_grace_ms: u64,
) -> DeadGateway {
    // Adapter and grandchild both ignore TERM: only a KILL ends them.
    start_script_under_stand_in_gateway(
        gateway,
        store,
        name,
        wrapper_grace_ms,
        "trap '' TERM; sleep 600 & exec sleep 601",
    )
    .await
}

/// As [`start_under_stand_in_gateway`], with `script` (run by `sh -c`) as the adapter.
async fn start_script_under_stand_in_gateway(
    gateway: &Controller,
    store: &Arc<clawgate_store_sqlite::SqliteStore>,
    name: &str,
    wrapper_grace_ms: u64,
    script: &str,
) -> DeadGateway {
    let adapter: Vec<String> = ["sh", "-c", script].iter().map(|s| s.to_string()).collect();
    let lease_id = LeaseId::parse(format!("lease-{name}")).unwrap();
    let mut argv = gateway.wrapper_argv(&lease_id, &adapter);
    let grace_at = argv
        .iter()
        .position(|a| a == "--clawgate-grace-ms")
        .unwrap()
        + 1;
    argv[grace_at] = wrapper_grace_ms.to_string();
    let wrapper = wrapper_bin();
    let mut lease = AcpxProcessLease {
        lease_id: lease_id.clone(),
        gateway_instance_id: gateway.instance_id().clone(),
        session_key: key(&format!("agent:codex:acp:{name}")),
        wrapper_root: wrapper.parent().unwrap().display().to_string(),
        wrapper_path: wrapper.display().to_string(),
        root_pid: None,
        root_start_time: None,
        boot_id: None,
        process_group_id: None,
        command_hash: command_hash(&argv),
        started_at: 1,
        state: LeaseState::Open,
        ended_at: None,
        survivors: Vec::new(),
        stderr_tail: Vec::new(),
    };
    store.insert_lease(&lease).await.unwrap();
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" \"$@\" & wait")
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(sh.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(
        line.trim()
            .strip_prefix(clawgate_acpx::WRAPPER_REPORT_PREFIX)
            .unwrap(),
    )
    .unwrap();
    let root = json["rootPid"].as_u64().unwrap() as u32;
    let group = json["processGroupId"].as_u64().unwrap() as u32;
    let table = system_table();
    lease.root_pid = Some(root);
    lease.root_start_time = Some(
        table
            .open(root)
            .unwrap()
            .unwrap()
            .stat()
            .unwrap()
            .unwrap()
            .start_time,
    );
    lease.boot_id = Some(table.boot_id().unwrap());
    lease.process_group_id = Some(group);
    store.save_lease(&lease, LeaseState::Open).await.unwrap();
    DeadGateway {
        lease,
        adapter_pid: group,
        sh,
    }
}

fn members_of_group(pgid: u32) -> Vec<u32> {
    system_table()
        .list()
        .unwrap()
        .into_iter()
        .filter(|s| s.pgid == pgid && !s.zombie)
        .map(|s| s.pid)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_reap_after_the_gateway_died_closes_the_lease_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), real_timing()).await;
    // The wrapper's own fallback is slow here (60 s), so the reaper is what ends the tree.
    let mut dead = start_under_stand_in_gateway(&gateway, &store, "reap", 60_000).await;
    eventually(Duration::from_secs(5), "adapter and grandchild", || {
        members_of_group(dead.adapter_pid).len() == 2
    })
    .await;
    let owned: Vec<u32> = [dead.lease.root_pid.unwrap()]
        .into_iter()
        .chain(members_of_group(dead.adapter_pid))
        .collect();
    dead.sh.kill().unwrap();
    dead.sh.wait().unwrap();

    // "Restart": a new controller on the same state directory (same instance id).
    let restarted = controller(store.clone(), system_table(), &wrapper_bin(), real_timing()).await;
    assert_eq!(restarted.instance_id(), gateway.instance_id());
    let report = restarted.reap_startup_orphans(5).await.unwrap();
    let (id, outcome) = &report.outcomes[0];
    assert_eq!(*id, dead.lease.lease_id);
    let CloseOutcome::Closed(termination) = outcome else {
        panic!("expected the orphan tree to be closed: {outcome:?}");
    };
    assert_eq!(
        termination.killed.len(),
        3,
        "TERM-ignoring tree needs KILL: {termination:?}"
    );
    for pid in owned {
        eventually(Duration::from_secs(5), "orphan gone", || !alive(pid)).await;
    }
    let lease = store
        .load_lease(&dead.lease.lease_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.state, LeaseState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_gateway_the_wrapper_cleans_its_group_and_the_reaper_marks_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), real_timing()).await;
    let mut dead = start_under_stand_in_gateway(&gateway, &store, "kill9", 200).await;
    eventually(Duration::from_secs(5), "adapter and grandchild", || {
        members_of_group(dead.adapter_pid).len() == 2
    })
    .await;
    let root = dead.lease.root_pid.unwrap();
    dead.sh.kill().unwrap();
    dead.sh.wait().unwrap();
    // Nobody but the wrapper acts here: its TERM is ignored, its KILL fallback must run.
    eventually(
        Duration::from_secs(10),
        "wrapper cleaned its group and exited",
        || members_of_group(dead.adapter_pid).is_empty() && !alive(root),
    )
    .await;
    let report = gateway.reap_startup_orphans(5).await.unwrap();
    assert!(
        matches!(report.outcomes[0].1, CloseOutcome::Lost(_)),
        "{report:?}"
    );
    let lease = store
        .load_lease(&dead.lease.lease_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.state, LeaseState::Lost);
}

/// A grandchild whose environment names another lease (as a process tree of another gateway
/// the agent started would) is not ours: the verified tree leaves it out and the close never
/// signals it, while our wrapper and adapter are ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descendant_marked_for_another_lease_is_never_signalled() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), real_timing()).await;
    let mut dead = start_script_under_stand_in_gateway(
        &gateway,
        &store,
        "foreign-mark",
        60_000,
        // In a session of its own, as another wrapper's adapter would be: the group signals
        // of our wrapper do not reach it, only a verification mistake could.
        "CLAWGATE_ACPX_LEASE_ID=lease-of-another exec setsid sleep 600 & exec sleep 601",
    )
    .await;
    let adapter = dead.adapter_pid;
    let root = dead.lease.root_pid.expect("root pid");
    let mut foreign = None;
    eventually(
        Duration::from_secs(5),
        "the foreign-marked grandchild",
        || {
            foreign = system_table()
                .list()
                .expect("process list")
                .into_iter()
                .find(|s| s.ppid == adapter && !s.zombie)
                .map(|s| s.pid)
                .filter(|&pid| {
                    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                        env.split(|b| *b == 0)
                            .any(|e| e == b"CLAWGATE_ACPX_LEASE_ID=lease-of-another")
                    })
                });
            foreign.is_some()
        },
    )
    .await;
    let foreign = foreign.expect("foreign pid");
    let tree = match verify_owned_tree(system_table().as_ref(), &dead.lease, gateway.instance_id())
    {
        Verdict::Owned(tree) => tree,
        other => panic!("expected an owned tree, got {other:?}"),
    };
    let mut pids = tree.pids();
    pids.sort();
    assert_eq!(
        pids,
        vec![root, adapter],
        "only the wrapper and our adapter"
    );
    drop(tree);

    dead.sh.kill().expect("kill the stand-in gateway");
    dead.sh.wait().expect("reap the stand-in gateway");
    let report = gateway.reap_startup_orphans(5).await.expect("reap");
    let (_, outcome) = report
        .outcomes
        .iter()
        .find(|(id, _)| *id == dead.lease.lease_id)
        .expect("the lease was reaped");
    let CloseOutcome::Closed(termination) = outcome else {
        panic!("expected our tree closed: {outcome:?}");
    };
    assert!(
        !termination.termed.contains(&foreign) && !termination.killed.contains(&foreign),
        "{termination:?}"
    );
    for pid in [root, adapter] {
        eventually(Duration::from_secs(5), "our process gone", || !alive(pid)).await;
    }
    assert!(alive(foreign), "the other lease's process was signalled");
    // Clean up through a handle bound to it.
    let handle = system_table()
        .open(foreign)
        .expect("proc readable")
        .expect("still there");
    handle
        .signal(clawgate_acpx::Sig::Kill)
        .expect("kill the foreign process");
}

/// A start whose `session/new` fails ends the agent's whole tree — a grandchild that ignores
/// TERM and stdin EOF included — through the verified path, and closes the lease (the gateway
/// ended it on purpose and nothing of it is left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_ends_the_whole_tree_and_closes_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), real_timing()).await;
    let pid_file = dir.path().join("grandchild.pid");
    let adapter = vec![
        test_agent(),
        "--sessions-per-process".into(),
        "0".into(),
        "--stubborn-grandchild".into(),
        "--grandchild-pid-file".into(),
        pid_file.display().to_string(),
    ];
    let input = ensure_input("failed-start", adapter, dir.path());
    let error = gateway.ensure_session(input.clone()).await.unwrap_err();
    assert!(error.to_string().contains("session/new"), "{error}");
    let grandchild = read_pid_file(&pid_file).expect("the grandchild started");
    assert!(
        !alive(grandchild),
        "the stubborn grandchild was ended with the tree"
    );
    let row = store
        .load_session(&input.session_key)
        .await
        .unwrap()
        .unwrap();
    let lease = store
        .load_lease(&row.lease_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease.state, LeaseState::Closed, "{lease:?}");
    assert!(
        members_of_group(lease.process_group_id.unwrap()).is_empty(),
        "nothing of the group left"
    );
}

/// A lease already marked `lost` whose wrapper was killed (so it could not drain its group)
/// while a grandchild lived on: the startup reaper (and `leases reap`) finds the grandchild by
/// the lease's mark, ends it and closes the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_ends_what_a_lost_lease_left_alive() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), real_timing()).await;
    let mut dead = start_script_under_stand_in_gateway(
        &gateway,
        &store,
        "lost-orphan",
        60_000,
        "sleep 600 & exec sleep 601",
    )
    .await;
    eventually(Duration::from_secs(5), "adapter and grandchild", || {
        members_of_group(dead.adapter_pid).len() == 2
    })
    .await;
    // KILL the wrapper: it cannot drain; the adapter dies with it (its death signal), the
    // grandchild lives on, reparented.
    let root = dead.lease.root_pid.unwrap();
    let killed = Command::new("kill")
        .args(["-9", &root.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    dead.sh.wait().unwrap();
    eventually(Duration::from_secs(10), "only the grandchild left", || {
        !alive(root) && !alive(dead.adapter_pid) && members_of_group(dead.adapter_pid).len() == 1
    })
    .await;
    let orphan = members_of_group(dead.adapter_pid)[0];
    // What an earlier build recorded for such a start: lost.
    let mut lease = store
        .load_lease(&dead.lease.lease_id)
        .await
        .unwrap()
        .unwrap();
    lease.state = LeaseState::Lost;
    lease.ended_at = Some(3);
    store.save_lease(&lease, LeaseState::Open).await.unwrap();

    let report = gateway.reap_startup_orphans(5).await.unwrap();
    let outcome = report
        .outcomes
        .iter()
        .find(|(id, _)| *id == lease.lease_id)
        .map(|(_, outcome)| outcome.clone());
    assert!(
        matches!(&outcome, Some(CloseOutcome::Closed(t)) if t.termed == [orphan]),
        "{report:?}"
    );
    eventually(Duration::from_secs(5), "the orphan ended", || {
        !alive(orphan)
    })
    .await;
    let lease = store.load_lease(&lease.lease_id).await.unwrap().unwrap();
    assert_eq!(lease.state, LeaseState::Closed);
    // A second reap finds nothing more to do.
    let again = gateway.reap_startup_orphans(6).await.unwrap();
    assert!(
        again.outcomes.iter().all(|(id, _)| *id != lease.lease_id),
        "{again:?}"
    );
}
