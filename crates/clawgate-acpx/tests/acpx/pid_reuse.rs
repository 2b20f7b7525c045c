//! Deterministic PID reuse with real processes: inside a fresh PID namespace
//! (`unshare --user --map-root-user --pid --fork --mount-proc`, checked to work on the project's
//! machines) `/proc/sys/kernel/ns_last_pid` makes the next process get the dead wrapper's pid.
//! The test re-runs itself inside the namespace; outside it, it only launches that run and
//! requires it to pass — an unusable `unshare` fails the test with the reason.

use std::process::{Command, Stdio};
use std::time::Duration;

use clawgate_acpx::evidence::command_hash;
use clawgate_acpx::{CloseOutcome, system_table};
use clawgate_store::{LeaseStore, SessionStore};
use clawgate_types::{AcpxProcessLease, LeaseId, LeaseState};

use crate::real_processes::alive;
use crate::support::*;

const INNER: &str = "CLAWGATE_PIDNS_INNER";
const NAME: &str = "pid_reuse::pid_reused_by_unrelated_and_by_another_gateways_wrapper";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid_reused_by_unrelated_and_by_another_gateways_wrapper() {
    if std::env::var_os(INNER).is_some() {
        inside_namespace().await;
        return;
    }
    let wrapper = wrapper_bin();
    let exe = std::env::current_exe().unwrap();
    let output = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
        ])
        .arg(&exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
        .env(INNER, "1")
        .env("CLAWGATE_TEST_WRAPPER", &wrapper)
        .output()
        .unwrap_or_else(|e| panic!("cannot run unshare (util-linux) for the PID namespace: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "the PID-namespace run failed (is unprivileged user+pid namespace creation allowed?)\n\
         stdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

fn set_last_pid(pid: u32) {
    std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
        .expect("write /proc/sys/kernel/ns_last_pid inside the namespace");
}

async fn inside_namespace() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), fast_timing()).await;
    let wrapper = wrapper_bin();
    let table = system_table();
    for (n, successor) in ["unrelated", "other-gateway"].into_iter().enumerate() {
        let lease_id = LeaseId::parse(format!("lease-reuse-{n}")).unwrap();
        let argv = gateway.wrapper_argv(&lease_id, &["sleep".into(), "600".into()]);
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let stat = table.open(pid).unwrap().unwrap().stat().unwrap().unwrap();
        let lease = AcpxProcessLease {
            lease_id: lease_id.clone(),
            gateway_instance_id: gateway.instance_id().clone(),
            session_key: key(&format!("agent:codex:acp:reuse{n}")),
            wrapper_root: wrapper.parent().unwrap().display().to_string(),
            wrapper_path: wrapper.display().to_string(),
            root_pid: Some(pid),
            root_start_time: Some(stat.start_time),
            boot_id: Some(table.boot_id().unwrap()),
            process_group_id: None,
            command_hash: command_hash(&argv),
            started_at: 1,
            state: LeaseState::Open,
            ended_at: None,
            survivors: Vec::new(),
            stderr_tail: Vec::new(),
        };
        store.insert_lease(&lease).await.unwrap();
        store
            .upsert_session(&session_row(&lease.session_key, Some(lease_id.clone())))
            .await
            .unwrap();
        // Our wrapper dies out of band (KILL, and the wrapper's group with it), and is reaped:
        // its pid is free again.
        child.kill().unwrap();
        child.wait().unwrap();
        eventually(Duration::from_secs(5), "old group gone", || {
            table
                .list()
                .unwrap()
                .iter()
                .all(|s| s.pgid == 1 || s.pid == 1 || s.zombie || s.ppid != pid)
        })
        .await;
        // The next process gets exactly that pid.
        set_last_pid(pid);
        let mut foreign = match successor {
            "unrelated" => Command::new("sleep").arg("600").spawn().unwrap(),
            _ => {
                // Another gateway's wrapper, same wrapper root, its own lease and instance.
                Command::new(&wrapper)
                    .args([
                        "--clawgate-acpx-lease-id",
                        "lease-of-gateway-b",
                        "--clawgate-gateway-instance-id",
                        "instance-b",
                        "--",
                        "sleep",
                        "600",
                    ])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap()
            }
        };
        assert_eq!(
            foreign.id(),
            pid,
            "{successor}: ns_last_pid did not hand out the reused pid"
        );

        let outcome = gateway
            .close_session(&lease.session_key, "test", 2)
            .await
            .unwrap();
        // The successor usually starts in a later clock tick (start time differs: the lease is
        // lost). Within the same 10 ms tick the start time matches, and the executable / argv
        // evidence is what refuses it; the lease then stays open. Both send no signal.
        let state = store.load_lease(&lease_id).await.unwrap().unwrap().state;
        match &outcome {
            CloseOutcome::Lost(_) => assert_eq!(state, LeaseState::Lost),
            CloseOutcome::Refused(why) => {
                assert!(
                    why.contains("not the lease's wrapper") || why.contains("lease id"),
                    "{successor}: {why}"
                );
                assert_eq!(state, LeaseState::Open);
            }
            other => panic!("{successor}: {other:?}"),
        }
        println!("{successor}: pid {pid} reused -> {outcome:?}");
        // Not signalled: still alive well after the controller's grace would have run out.
        assert!(
            alive(pid),
            "{successor}: the process that reused the pid was signalled"
        );
        assert!(
            foreign.try_wait().unwrap().is_none(),
            "{successor}: foreign process exited"
        );
        foreign.kill().unwrap();
        foreign.wait().unwrap();
    }
}
