//! An agent process that dies (SIGKILL) between or during turns: the controller notices, resolves
//! its lease, and the next turn runs on a fresh process under a new lease.

use std::sync::Mutex;
use std::time::Duration;

use clawgate_acpx::{AcpxError, Sig, Timing, Verdict, system_table, verify_owned_tree};
use clawgate_store::LeaseStore;
use clawgate_types::{LeaseId, LeaseState};

use crate::real_processes::{alive, ensure_input};
use crate::support::*;

fn timing() -> Timing {
    Timing {
        grace: Duration::from_millis(500),
        kill_wait: Duration::from_secs(5),
        poll: Duration::from_millis(5),
    }
}

/// SIGKILLs the adapter of `lease` — after checking live that it is in the lease's tree.
async fn kill_adapter(
    gateway: &Controller,
    store: &clawgate_store_sqlite::SqliteStore,
    lease: &LeaseId,
) {
    let lease = store.load_lease(lease).await.unwrap().unwrap();
    let adapter = lease.process_group_id.unwrap();
    let Verdict::Owned(tree) =
        verify_owned_tree(system_table().as_ref(), &lease, gateway.instance_id())
    else {
        panic!("the lease's tree is not verifiably ours");
    };
    assert!(
        tree.pids().contains(&adapter),
        "adapter {adapter} not in the tree"
    );
    let handle = system_table().open(adapter).unwrap().unwrap();
    handle.signal(Sig::Kill).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_killed_between_turns_the_next_turn_runs_on_a_new_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), timing()).await;
    let input = ensure_input("killed-between", vec![test_agent()], dir.path());
    let first = gateway.ensure_session(input.clone()).await.unwrap();
    let turn = gateway.prompt(&first, "one", |_| {}).await.unwrap();
    assert_eq!(turn.chunks.concat(), "echo: one");

    kill_adapter(&gateway, &store, &first.lease_id).await;
    // The wrapper ends once its adapter is gone (a zombie until the controller reaps it).
    eventually(Duration::from_secs(5), "wrapper exited", || {
        !alive(first.root_pid)
    })
    .await;

    let second = gateway.ensure_session(input.clone()).await.unwrap();
    assert_ne!(
        second.lease_id, first.lease_id,
        "a fresh process, a new lease"
    );
    assert_ne!(second.root_pid, first.root_pid);
    let turn = gateway.prompt(&second, "two", |_| {}).await.unwrap();
    assert_eq!(turn.chunks.concat(), "echo: two");
    let old = store.load_lease(&first.lease_id).await.unwrap().unwrap();
    assert_eq!(old.state, LeaseState::Lost, "provably gone: {old:?}");
    assert!(old.ended_at.is_some());
    let new = store.load_lease(&second.lease_id).await.unwrap().unwrap();
    assert_eq!(new.state, LeaseState::Open);
    assert_eq!(
        gateway.live_sessions().await,
        vec![input.session_key.clone()]
    );
    gateway
        .close_session(&input.session_key, "test", 3)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_killed_mid_prompt_fails_the_turn_as_agent_exited_and_the_next_turn_works() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path());
    let gateway = controller(store.clone(), system_table(), &wrapper_bin(), timing()).await;
    // 200 words 20 ms apart: four seconds of streaming; the kill comes after the first word.
    let adapter = vec![
        test_agent(),
        "--chunk-ms".into(),
        "20".into(),
        "--words".into(),
        "200".into(),
    ];
    let input = ensure_input("killed-mid-prompt", adapter, dir.path());
    let first = gateway.ensure_session(input.clone()).await.unwrap();

    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    let first_tx = Mutex::new(Some(first_tx));
    let turn = gateway.prompt(&first, "hello there", move |_chunk| {
        if let Some(tx) = first_tx.lock().unwrap().take() {
            let _ = tx.send(());
        }
    });
    let kill = async {
        first_rx.await.unwrap();
        kill_adapter(&gateway, &store, &first.lease_id).await;
    };
    let (turn, ()) =
        tokio::time::timeout(Duration::from_secs(8), async { tokio::join!(turn, kill) })
            .await
            .expect("the prompt must end promptly once its agent is killed, not hang");
    match turn {
        Err(AcpxError::AgentExited {
            session, lease_id, ..
        }) => {
            assert_eq!(session, input.session_key);
            assert_eq!(lease_id, first.lease_id);
        }
        other => panic!("expected AgentExited, got {other:?}"),
    }
    // Resolved before the error was returned, and no longer live.
    let old = store.load_lease(&first.lease_id).await.unwrap().unwrap();
    assert_eq!(old.state, LeaseState::Lost, "provably gone: {old:?}");
    assert!(gateway.live_sessions().await.is_empty());
    assert!(!alive(first.root_pid) && !alive(first.process_group_id));

    // The retried turn runs to the end on a fresh process.
    let second = gateway.ensure_session(input.clone()).await.unwrap();
    assert_ne!(second.lease_id, first.lease_id);
    let turn = gateway.prompt(&second, "again", |_| {}).await.unwrap();
    assert_eq!(turn.chunks.len(), 200);
    assert!(turn.chunks.concat().starts_with("echo: again w1"));
    gateway
        .close_session(&input.session_key, "test", 3)
        .await
        .unwrap();
}
