//! Retention: 30 days and 50,000 rows by default; heads stay monotonic; cursors expire with
//! retention, go with a watcher's reset, and are deleted with either session.

use std::time::Duration;

use clawgate_awareness::{AwarenessConfig, RetentionPolicy};
use clawgate_store::{SignalLogStore, WatchCursorStore};
use clawgate_types::StateVersion;

use crate::helpers::Harness;

#[test]
fn defaults_are_thirty_days_and_fifty_thousand_rows() {
    let policy = RetentionPolicy::default();
    assert_eq!(policy.max_age, Duration::from_secs(30 * 24 * 3600));
    assert_eq!(policy.max_rows, 50_000);
    assert_eq!(AwarenessConfig::default().changes_limit, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn age_pruning_keeps_heads_monotonic_and_expires_idle_cursors() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    h.human(&child).await;
    let head = h.store.session_head(&child).await.unwrap().state_version;
    h.clock.advance(31 * 24 * 3_600_000);
    let report = h.awareness.apply_retention().await.unwrap();
    assert!(report.events_deleted >= 2, "events past 30 days are gone");
    assert_eq!(
        report.cursors_deleted, 1,
        "the idle cursor expired with them"
    );
    assert!(
        h.awareness.pending_notices(&main).is_empty(),
        "its notice left the queue"
    );
    let after = h.store.session_head(&child).await.unwrap();
    assert_eq!(after.state_version, head, "the head survives pruning");
    let next = h.human(&child).await;
    assert_eq!(next, head.0 + 1, "and keeps counting up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_cap_is_configurable() {
    let config = AwarenessConfig {
        retention: RetentionPolicy {
            max_rows: 10,
            max_age: Duration::from_secs(3600),
        },
        ..AwarenessConfig::default()
    };
    let h = Harness::with_config(config);
    let s = h.create("agent:main:main").await;
    for _ in 0..24 {
        h.human(&s).await;
    }
    assert_eq!(
        h.awareness.apply_retention().await.unwrap().events_deleted,
        15
    );
    let all = h
        .store
        .events_since(&s, StateVersion(0), 200)
        .await
        .unwrap();
    assert_eq!(all.events.len(), 10);
    assert!(all.history_gap);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_removes_the_watchers_cursors_and_delete_removes_both_sides() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    let grandchild = h
        .spawn(&child, "agent:main:subagent:child:g")
        .await
        .row
        .session_key;
    h.human(&grandchild).await;
    h.human(&child).await;
    assert_eq!(h.texts(&child).len(), 1);
    h.awareness.reset_session(&child).await.unwrap();
    assert!(h.store.cursors_of_watcher(&child).await.unwrap().is_empty());
    assert!(
        h.texts(&child).is_empty(),
        "the reset watcher's notices are gone"
    );
    assert_eq!(h.texts(&main).len(), 1, "cursors on the reset session stay");
    h.awareness
        .delete_session(&child, clawgate_awareness::Actor::agent(&main))
        .await
        .unwrap();
    assert!(h.store.cursors_on_target(&child).await.unwrap().is_empty());
    assert!(
        h.texts(&main).is_empty(),
        "the deleter's own watch ends without a notice"
    );
    assert!(h.awareness.session(&child).await.unwrap().is_none());
}
