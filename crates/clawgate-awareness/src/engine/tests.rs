//! The race between an append and the queueing of the notices it opened.

use std::sync::Arc;

use clawgate_types::SessionKey;

use crate::{Actor, Awareness, NewSession, SpawnChild, StateChange};

fn key(text: &str) -> SessionKey {
    SessionKey::parse(text).unwrap()
}

/// The append opens a notice; before `record` queues it, a rebuild (the change feed announces
/// this process's own commits too) queues it and the watcher's turn consumes and acknowledges
/// it. The late queueing must not put the acknowledged notice back: it would be shown twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_consumed_while_its_append_was_queueing_is_not_queued_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let awareness = Arc::new(Awareness::builder(store).build());
    let main = key("agent:main:main");
    awareness
        .create_session(NewSession::new(main.clone()), Actor::system("test"))
        .await
        .unwrap();
    let child = awareness
        .spawn_child(SpawnChild {
            parent: main.clone(),
            child: NewSession::new(key("agent:main:subagent:child")),
        })
        .await
        .unwrap()
        .row
        .session_key;

    let shown = Arc::new(std::sync::Mutex::new(Vec::new()));
    let meanwhile = {
        let (awareness, main, shown) = (awareness.clone(), main.clone(), shown.clone());
        async move {
            awareness.rebuild_notices().await.unwrap();
            let consumed = awareness.consume_notices(&main).await;
            shown.lock().unwrap().extend(consumed);
        }
    };
    awareness
        .record_racing(
            &child,
            StateChange::human_direct_message(Actor::human("user-1"), "telegram"),
            meanwhile,
        )
        .await
        .unwrap();

    assert_eq!(
        shown.lock().unwrap().len(),
        1,
        "the rebuild queued the notice and the turn consumed it"
    );
    assert!(
        awareness.pending_notices(&main).is_empty(),
        "an acknowledged notice is not queued again: {:?}",
        awareness.pending_notices(&main)
    );
    // Nothing is lost either: the next material change opens one notice again.
    awareness
        .record(
            &child,
            StateChange::human_direct_message(Actor::human("user-1"), "telegram"),
        )
        .await
        .unwrap();
    assert_eq!(awareness.pending_notices(&main).len(), 1);
}
