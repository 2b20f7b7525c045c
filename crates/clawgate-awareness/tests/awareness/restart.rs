//! Restart: pending notices live in memory and are rebuilt from durable cursors; exactly the
//! pending ones come back, once.

use std::sync::Arc;

use clawgate_awareness::AwarenessConfig;

use crate::helpers::Harness;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_pending_notices_come_back_once_after_a_restart() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let a = h
        .spawn(&main, "agent:main:subagent:a")
        .await
        .row
        .session_key;
    let b = h
        .spawn(&main, "agent:main:subagent:b")
        .await
        .row
        .session_key;
    let c = h
        .spawn(&main, "agent:main:subagent:c")
        .await
        .row
        .session_key;
    let nested = h.spawn(&a, "agent:main:subagent:a:w").await.row.session_key;
    h.human(&a).await;
    h.human(&b).await;
    h.human(&nested).await;
    // Every notice of main is consumed before the restart (c's must not come back); a and b
    // then change again and are pending at the "kill".
    h.human(&c).await;
    assert_eq!(h.awareness.consume_notices(&main).await.len(), 3);
    h.human(&a).await;
    h.human(&b).await;
    let mut expected = h.awareness.all_pending_notices();
    expected.sort();
    assert_eq!(
        expected.len(),
        3,
        "a and b for main (reopened), the nested one for a"
    );

    // "Kill": drop the engine and the store; only the database file survives.
    let Harness {
        dir,
        store,
        awareness,
        tools,
        ..
    } = h;
    drop(tools);
    drop(awareness);
    drop(store);
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let h = Harness::on(dir, store, AwarenessConfig::default());
    assert!(
        h.awareness.all_pending_notices().is_empty(),
        "memory starts empty"
    );
    assert_eq!(h.awareness.rebuild_notices().await.unwrap(), 3);
    let mut rebuilt = h.awareness.all_pending_notices();
    rebuilt.sort();
    assert_eq!(
        rebuilt, expected,
        "exactly the pending notices, byte-identical"
    );
    assert_eq!(
        h.heartbeat.count(&main),
        1,
        "the main session is woken for them once"
    );
    assert_eq!(h.heartbeat.count(&a), 0);
    // A second rebuild (another external change) adds nothing and wakes nobody again.
    h.awareness.rebuild_notices().await.unwrap();
    assert_eq!(h.awareness.all_pending_notices().len(), 3);
    assert_eq!(h.heartbeat.count(&main), 1);
    assert_eq!(h.awareness.consume_notices(&main).await.len(), 2);
    assert_eq!(h.awareness.consume_notices(&a).await.len(), 1);
    assert_eq!(
        h.awareness.rebuild_notices().await.unwrap(),
        0,
        "consumed: gone for good"
    );
}
