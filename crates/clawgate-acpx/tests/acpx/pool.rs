//! `checkout` under an agent's limits with real processes: the starts of different
//! conversations run side by side, and a second turn of a session whose process is starting
//! waits for that process instead of starting another; at the cap, an idle session's process
//! is handed to the waiting session when the agent can close sessions, and ends otherwise.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawgate_acpx::{
    AcpRuntimeHandle, AgentLimits, CloseOutcome, EnsureInput, SessionStart, SessionUse,
    system_table,
};
use clawgate_store::{LeaseStore as _, SessionStore as _};
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::{LeaseState, SessionKey};

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
            reuse_processes: false,
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

/// A controller whose agent may run one process, handing it over when `reuse` allows.
async fn one_process(dir: &Path, reuse: bool) -> (Arc<SqliteStore>, Controller) {
    one_process_timed(dir, reuse, real_timing()).await
}

/// [`one_process`] with the controller's `timing` of process ends.
async fn one_process_timed(
    dir: &Path,
    reuse: bool,
    timing: clawgate_acpx::Timing,
) -> (Arc<SqliteStore>, Controller) {
    let store = store(dir);
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), timing).await;
    gateway.set_limits(
        "codex",
        AgentLimits {
            max_live: Some(1),
            idle_close: None,
            reuse_processes: reuse,
        },
    );
    (store, gateway)
}

/// One turn of `input` on `gateway`: its reply's text.
async fn turn(gateway: &Controller, session: &SessionUse, text: &str) -> String {
    gateway
        .prompt(session.handle(), text, |_| {})
        .await
        .expect("the turn")
        .chunks
        .concat()
}

/// Checks `input`'s session out and gives it back at once: the session is idle, its process
/// live; the handle it had.
async fn idle_session(gateway: &Controller, input: EnsureInput) -> AcpRuntimeHandle {
    let session = gateway.checkout(input).await.expect("the session");
    session.handle().clone()
}

async fn close(gateway: &Controller, session_key: &SessionKey) -> CloseOutcome {
    gateway
        .close_session(session_key, "test over", 3)
        .await
        .expect("the session closes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_an_idle_process_serves_the_waiting_session_and_later_the_first_again() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gateway) = one_process(dir.path(), true).await;
    let sessions = dir.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    let adapter = vec![
        test_agent(),
        "--chunk-ms".into(),
        "0".into(),
        "--sessions-dir".into(),
        sessions.display().to_string(),
    ];
    let a = ensure_input("hand-a", adapter.clone(), dir.path());
    let b = ensure_input("hand-b", adapter, dir.path());

    let a_use = gateway.checkout(a.clone()).await.expect("a's session");
    assert_eq!(turn(&gateway, &a_use, "from a").await, "echo: from a");
    let first = a_use.handle().clone();
    drop(a_use);

    // The cap is one process and a's is idle: b's session is begun on it.
    let b_use = gateway.checkout(b.clone()).await.expect("b's session");
    let handed = b_use.handle().clone();
    assert_eq!(
        (handed.root_pid, &handed.lease_id),
        (first.root_pid, &first.lease_id),
        "b is served by a's process under a's lease"
    );
    assert_eq!(handed.start, SessionStart::New);
    assert_ne!(handed.acp_session_id, first.acp_session_id);
    assert_eq!(turn(&gateway, &b_use, "from b").await, "echo: from b");
    let lease = store.load_lease(&first.lease_id).await.unwrap().unwrap();
    assert_eq!(
        (lease.session_key.clone(), lease.state),
        (b.session_key.clone(), LeaseState::Open),
        "the lease names the session its process serves"
    );
    let b_row = store.load_session(&b.session_key).await.unwrap().unwrap();
    assert_eq!(b_row.lease_id.as_ref(), Some(&first.lease_id));
    drop(b_use);

    // A close of a, which no longer runs, must not end the process that serves b.
    let outcome = gateway
        .close_session(&a.session_key, "test", 2)
        .await
        .unwrap();
    assert!(
        matches!(&outcome, CloseOutcome::Refused(why) if why.contains("serves session")),
        "{outcome:?}"
    );
    assert!(crate::real_processes::alive(first.root_pid));

    // a comes back: b's session is closed on the agent and a's is loaded on the same process.
    let again = gateway
        .checkout(a.clone())
        .await
        .expect("a's session again");
    assert_eq!(again.handle().root_pid, first.root_pid);
    assert_eq!(again.handle().acp_session_id, first.acp_session_id);
    assert_eq!(again.handle().start, SessionStart::Loaded);
    assert_eq!(turn(&gateway, &again, "a again").await, "echo: a again");
    let figures = gateway.figures().await;
    assert_eq!(
        (figures.live, figures.evictions, figures.handovers),
        (1, 2, 2),
        "{figures:?}"
    );
    drop(again);
    let closed = close(&gateway, &a.session_key).await;
    assert!(matches!(closed, CloseOutcome::Closed(_)), "{closed:?}");
    assert!(!crate::real_processes::alive(first.root_pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_process_has_forgotten_the_session_it_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, gateway) = one_process(dir.path(), true).await;
    // No sessions directory: a session lives only in the process's memory, so a load after
    // the session was closed on the agent must fail (it was freed, not kept beside the next).
    let adapter = vec![test_agent(), "--chunk-ms".into(), "0".into()];
    let a = ensure_input("forget-a", adapter.clone(), dir.path());
    let b = ensure_input("forget-b", adapter, dir.path());
    let first = idle_session(&gateway, a.clone()).await;
    drop(gateway.checkout(b).await.expect("b's session"));
    let again = gateway
        .checkout(a.clone())
        .await
        .expect("a's session again");
    assert_eq!(again.handle().root_pid, first.root_pid);
    match &again.handle().start {
        SessionStart::Fresh { previous, why } => {
            assert_eq!(previous, &first.acp_session_id);
            assert!(why.contains("session/load failed"), "{why}");
        }
        other => panic!("a's closed session was still loadable: {other:?}"),
    }
    drop(again);
    close(&gateway, &a.session_key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_session_close_is_ended_and_started_not_handed_over() {
    for (reuse, flag) in [(true, Some("--no-session-close")), (false, None)] {
        let dir = tempfile::tempdir().unwrap();
        let (store, gateway) = one_process(dir.path(), reuse).await;
        let mut adapter = vec![test_agent(), "--chunk-ms".into(), "0".into()];
        adapter.extend(flag.map(str::to_owned));
        let a = ensure_input("end-a", adapter.clone(), dir.path());
        let b = ensure_input("end-b", adapter, dir.path());
        let first = idle_session(&gateway, a).await;
        let b_use = gateway.checkout(b.clone()).await.expect("b's session");
        assert_ne!(
            b_use.handle().root_pid,
            first.root_pid,
            "reuse {reuse}, {flag:?}"
        );
        assert_ne!(b_use.handle().lease_id, first.lease_id);
        assert!(!crate::real_processes::alive(first.root_pid));
        let lease = store.load_lease(&first.lease_id).await.unwrap().unwrap();
        assert_eq!(lease.state, LeaseState::Closed);
        let figures = gateway.figures().await;
        assert_eq!((figures.evictions, figures.handovers), (1, 0));
        drop(b_use);
        close(&gateway, &b.session_key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_refuses_the_new_session_is_closed_and_a_fresh_one_serves_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, gateway) = one_process(dir.path(), true).await;
    let adapter = vec![
        test_agent(),
        "--chunk-ms".into(),
        "0".into(),
        "--sessions-per-process".into(),
        "1".into(),
    ];
    let a = ensure_input("refuse-a", adapter.clone(), dir.path());
    let b = ensure_input("refuse-b", adapter, dir.path());
    let first = idle_session(&gateway, a).await;
    let b_use = gateway.checkout(b.clone()).await.expect("b's session");
    assert_ne!(b_use.handle().root_pid, first.root_pid);
    assert_eq!(turn(&gateway, &b_use, "from b").await, "echo: from b");
    assert!(!crate::real_processes::alive(first.root_pid));
    let lease = store.load_lease(&first.lease_id).await.unwrap().unwrap();
    assert_eq!(lease.state, LeaseState::Closed);
    let figures = gateway.figures().await;
    assert_eq!(
        (figures.live, figures.evictions, figures.handovers),
        (1, 1, 0),
        "{figures:?}"
    );
    drop(b_use);
    close(&gateway, &b.session_key).await;
}

// One thread: between the drop of a's use and a's next checkout nothing else runs, so the
// waiting conversation can only get the process if a's next turn gives it up.
#[tokio::test]
async fn an_idle_process_goes_to_the_waiting_conversation_before_its_own_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, gateway) = one_process(dir.path(), true).await;
    let gateway = Arc::new(gateway);
    let adapter = vec![test_agent(), "--chunk-ms".into(), "0".into()];
    let a = ensure_input("fair-a", adapter.clone(), dir.path());
    let b = ensure_input("fair-b", adapter, dir.path());
    let a_use = gateway.checkout(a.clone()).await.expect("a's session");
    let first = a_use.handle().clone();
    let waiting = tokio::spawn({
        let gateway = gateway.clone();
        async move { gateway.checkout(b).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gateway.figures().await.queued == 0 {
        assert!(std::time::Instant::now() < deadline, "b never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(a_use);
    let own_next =
        tokio::time::timeout(Duration::from_millis(300), gateway.checkout(a.clone())).await;
    assert!(
        own_next.is_err(),
        "a's next turn kept its idle process while b waited: {:?}",
        own_next.map(|u| u.map(|u| u.handle().root_pid).map_err(|e| e.to_string()))
    );
    let b_use = waiting.await.unwrap().expect("b's session");
    assert_eq!(
        b_use.handle().root_pid,
        first.root_pid,
        "b took a's process over"
    );
    drop(b_use);
    close(&gateway, &key("agent:codex:acp:fair-b")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_hand_over_failed_stays_ahead_of_turns_that_came_later() {
    let dir = tempfile::tempdir().unwrap();
    // A grace period of 3 s before KILL: c comes well within it.
    let timing = clawgate_acpx::Timing {
        grace: Duration::from_secs(3),
        ..real_timing()
    };
    let (_store, gateway) = one_process_timed(dir.path(), true, timing).await;
    let gateway = Arc::new(gateway);
    // One session per process: the hand-over of a's process to b is refused. The grandchild
    // ignores TERM, so closing a's process takes the controller's grace period: c comes then.
    let adapter = vec![
        test_agent(),
        "--chunk-ms".into(),
        "0".into(),
        "--sessions-per-process".into(),
        "1".into(),
        "--stubborn-grandchild".into(),
    ];
    let a = ensure_input("order-a", adapter.clone(), dir.path());
    let b = ensure_input("order-b", adapter.clone(), dir.path());
    let c = ensure_input("order-c", adapter, dir.path());
    let first = idle_session(&gateway, a).await;
    let checkout = |input: EnsureInput| {
        let gateway = gateway.clone();
        tokio::spawn(async move { gateway.checkout(input).await })
    };
    let b_turn = checkout(b.clone());
    // b's hand-over was tried (an eviction) and a's process is being closed.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gateway.figures().await.evictions == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "b never tried a's process"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        crate::real_processes::alive(first.root_pid),
        "a's process still closing when c comes"
    );
    let c_turn = checkout(c.clone());
    let b_use = tokio::time::timeout(Duration::from_secs(10), b_turn)
        .await
        .expect("b, first in line, gets the slot before c")
        .unwrap()
        .expect("b's session");
    assert_ne!(b_use.handle().root_pid, first.root_pid, "a fresh process");
    assert!(!c_turn.is_finished(), "c waits behind b");
    assert_eq!(turn(&gateway, &b_use, "from b").await, "echo: from b");
    drop(b_use);
    let c_use = tokio::time::timeout(Duration::from_secs(10), c_turn)
        .await
        .expect("c gets the slot once b's turn is over")
        .unwrap()
        .expect("c's session");
    drop(c_use);
    close(&gateway, &c.session_key).await;
}
