//! `checkout` under an agent's limits with real processes: the starts of different
//! conversations run side by side, and a second turn of a session whose process is starting
//! waits for that process instead of starting another.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawgate_acpx::{AgentLimits, system_table};

use crate::real_processes::{ensure_input, real_timing};
use crate::support::*;

/// An adapter that appends its name to `started` when it runs, then holds its ACP handshake
/// until the file `gate` exists (the test agent only begins once it is exec'd).
fn gated_adapter(dir: &Path, name: &str, gate: &Path) -> Vec<String> {
    let script = format!(
        "echo {name} >> {started}; while [ ! -e {gate} ]; do sleep 0.01; done; exec {agent}",
        started = dir.join("started").display(),
        gate = gate.display(),
        agent = test_agent(),
    );
    vec!["sh".into(), "-c".into(), script]
}

fn started(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("started"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn gateway(dir: &Path) -> Arc<Controller> {
    let gateway = controller(store(dir), system_table(), &wrapper_bin(), real_timing()).await;
    gateway.set_limits(
        "codex",
        AgentLimits {
            max_live: Some(4),
            idle_close: None,
        },
    );
    Arc::new(gateway)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_start_does_not_hold_up_another_conversations_start() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = gateway(dir.path()).await;
    let (gate_a, gate_b) = (dir.path().join("gate-a"), dir.path().join("gate-b"));
    let a = ensure_input(
        "slow-a",
        gated_adapter(dir.path(), "a", &gate_a),
        dir.path(),
    );
    let b = ensure_input(
        "slow-b",
        gated_adapter(dir.path(), "b", &gate_b),
        dir.path(),
    );
    let first = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.checkout(a).await }
    });
    eventually(Duration::from_secs(10), "a's process started", || {
        started(dir.path()) == ["a"]
    })
    .await;
    // a's handshake is held; b's start must not wait for it.
    let second = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.checkout(b).await }
    });
    eventually(
        Duration::from_secs(10),
        "b's process started while a's start is still under way",
        || started(dir.path()).len() == 2,
    )
    .await;
    assert!(
        !first.is_finished(),
        "a's start finished with its gate shut"
    );
    let figures = gateway.figures().await;
    assert_eq!(
        (figures.live, figures.in_use),
        (2, 0),
        "both starts count as live processes"
    );
    std::fs::write(&gate_b, "").unwrap();
    let b_use = second.await.unwrap().expect("b's session");
    std::fs::write(&gate_a, "").unwrap();
    let a_use = first.await.unwrap().expect("a's session");
    assert_ne!(a_use.handle().root_pid, b_use.handle().root_pid);
    let figures = gateway.figures().await;
    assert_eq!((figures.live, figures.in_use), (2, 2));
    drop((a_use, b_use));
    for name in ["slow-a", "slow-b"] {
        gateway
            .close_session(&key(&format!("agent:codex:acp:{name}")), "test over", 2)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_turn_of_a_starting_session_uses_the_process_being_started() {
    let dir = tempfile::tempdir().unwrap();
    let gateway = gateway(dir.path()).await;
    let gate = dir.path().join("gate");
    let input = ensure_input(
        "twice",
        gated_adapter(dir.path(), "once", &gate),
        dir.path(),
    );
    let first = tokio::spawn({
        let (gateway, input) = (gateway.clone(), input.clone());
        async move { gateway.checkout(input).await }
    });
    eventually(Duration::from_secs(10), "the process started", || {
        started(dir.path()) == ["once"]
    })
    .await;
    let second = tokio::spawn({
        let (gateway, input) = (gateway.clone(), input.clone());
        async move { gateway.checkout(input).await }
    });
    std::fs::write(&gate, "").unwrap();
    let first = first.await.unwrap().expect("first turn's session");
    let second = second.await.unwrap().expect("second turn's session");
    assert_eq!(
        first.handle(),
        second.handle(),
        "one process for both turns"
    );
    assert_eq!(
        started(dir.path()),
        ["once"],
        "no second process was started"
    );
    assert_eq!(gateway.figures().await.live, 1);
    drop((first, second));
    gateway
        .close_session(&input.session_key, "test over", 2)
        .await
        .unwrap();
}
