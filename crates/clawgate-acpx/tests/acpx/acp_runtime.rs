//! cancel vs close against a real ACP agent process (the workspace's test agent) behind the
//! real wrapper.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema::StopReason;
use clawgate_acpx::{CloseOutcome, Timing, Verdict, system_table, verify_owned_tree};
use clawgate_store::LeaseStore;

use crate::real_processes::{alive, ensure_input};
use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_keeps_the_session_and_processes_close_ends_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let timing = Timing {
        grace: Duration::from_millis(500),
        kill_wait: Duration::from_secs(5),
        poll: Duration::from_millis(5),
    };
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), timing).await;
    let adapter = vec![
        test_agent(),
        "--chunk-ms".into(),
        "20".into(),
        "--words".into(),
        "200".into(),
    ];
    let input = ensure_input("cancel", adapter, dir.path());
    let handle = gateway.ensure_session(input.clone()).await.unwrap();

    // A long streamed turn; cancel it once the first chunks arrived.
    let seen = Arc::new(Mutex::new(0usize));
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let first_tx = Mutex::new(Some(first_tx));
    let counter = seen.clone();
    let turn = gateway.prompt(&handle, "hello there", move |_chunk| {
        *counter.lock().unwrap() += 1;
        if let Some(tx) = first_tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
    });
    let cancel = async {
        first_rx.await.unwrap();
        gateway.cancel_turn(&handle).await.unwrap();
    };
    let (turn, ()) = tokio::join!(turn, cancel);
    let turn = turn.unwrap();
    assert_eq!(turn.stop_reason, StopReason::Cancelled);
    assert!(
        turn.chunks.len() < 200,
        "the turn stopped early ({} chunks)",
        turn.chunks.len()
    );
    assert!(turn.chunks[0].starts_with("echo:"));

    // Same session, same processes: the next turn runs to the end.
    assert!(alive(handle.root_pid) && alive(handle.process_group_id));
    let lease = store.load_lease(&handle.lease_id).await.unwrap().unwrap();
    assert!(matches!(
        verify_owned_tree(system_table().as_ref(), &lease, gateway.instance_id()),
        Verdict::Owned(_)
    ));
    let next = gateway.prompt(&handle, "again", |_| {}).await.unwrap();
    assert_eq!(next.stop_reason, StopReason::EndTurn);
    assert_eq!(next.chunks.len(), 200);
    assert!(next.chunks.concat().starts_with("echo: again w1"));
    assert_eq!(gateway.ensure_session(input.clone()).await.unwrap(), handle);

    // Close ends the processes and the lease.
    let outcome = gateway
        .close_session(&input.session_key, "test", 2)
        .await
        .unwrap();
    assert!(matches!(outcome, CloseOutcome::Closed(_)), "{outcome:?}");
    for pid in [handle.root_pid, handle.process_group_id] {
        eventually(Duration::from_secs(5), "process gone", || !alive(pid)).await;
    }
    assert!(gateway.prompt(&handle, "gone?", |_| {}).await.is_err());
}

/// `session/load` resumes a session with its history, keeps that history out of the next turn,
/// and refuses a session the agent does not know.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_session_replays_history_without_leaking_it_into_the_next_turn() {
    let mut agent = tokio::process::Command::new(test_agent())
        .args(["--chunk-ms", "1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = clawgate_acpx::AcpClient::connect(
        agent.stdin.take().unwrap(),
        agent.stdout.take().unwrap(),
    )
    .await
    .unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let cwd = cwd.path();
    let session = client.new_session(cwd).await.unwrap();
    let first = client
        .prompt(&session, "remember me", |_| {})
        .await
        .unwrap();
    assert_eq!(first.stop_reason, StopReason::EndTurn);

    let history = client
        .load_session(&session, cwd)
        .await
        .unwrap()
        .expect("the agent advertises loadSession");
    assert_eq!(
        history,
        vec![first.chunks.concat()],
        "the earlier reply is replayed once"
    );
    let next = client.prompt(&session, "and now", |_| {}).await.unwrap();
    assert_eq!(
        next.chunks.concat(),
        "echo: and now",
        "history does not leak into the next turn"
    );

    let unknown = client.load_session("sess-999", cwd).await;
    assert!(
        unknown.is_err(),
        "an unknown session is refused: {unknown:?}"
    );
    client.shutdown();
}
