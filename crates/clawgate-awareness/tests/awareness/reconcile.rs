//! Reconciliation: `session_status changesSince` returns at most 200 typed events, moves no
//! cursor, and reports an exact historyGap from the prune watermark.

use clawgate_awareness::{
    Actor, AwarenessConfig, RetentionPolicy, SessionStatusParams, StateChange,
};
use clawgate_store::WatchCursorStore;
use clawgate_types::{SessionKey, SessionVisibility, StateVersion};

use crate::helpers::{Harness, requester};

fn since(key: &SessionKey, version: u64) -> SessionStatusParams {
    SessionStatusParams {
        session_key: key.clone(),
        changes_since: Some(StateVersion(version)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_since_json_matches_the_page_shape() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    h.clock.advance(60_000);
    h.human(&child).await;
    h.awareness
        .record(
            &child,
            StateChange::run_failed(
                Actor::system("acp"),
                clawgate_types::RunOutcome::Timeout,
                "run timed out",
            ),
        )
        .await
        .unwrap();
    h.awareness
        .record(
            &child,
            StateChange::goal_changed(Actor::human("user-1"), "goal updated"),
        )
        .await
        .unwrap();
    let req = requester(&main, SessionVisibility::Tree);
    let status = h
        .tools
        .session_status(&req, &since(&child, 1))
        .await
        .unwrap();
    insta::assert_json_snapshot!("changes_since", status);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_200_events_with_truncated_and_no_cursor_moves() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    for _ in 0..250 {
        h.human(&child).await;
    }
    let before = h.store.load_cursor(&main, &child).await.unwrap();
    let req = requester(&main, SessionVisibility::Tree);
    let status = h
        .tools
        .session_status(&req, &since(&child, 1))
        .await
        .unwrap();
    let changes = status.state_changes.unwrap();
    assert_eq!(changes.events.len(), 200);
    assert!(changes.truncated);
    assert_eq!(changes.events[0].sequence, 2);
    assert_eq!(status.state_version, StateVersion(251));
    let rest = h
        .tools
        .session_status(&req, &since(&child, 201))
        .await
        .unwrap();
    let rest = rest.state_changes.unwrap();
    assert_eq!((rest.events.len(), rest.truncated), (50, false));
    assert_eq!(
        h.store.load_cursor(&main, &child).await.unwrap(),
        before,
        "no cursor moved"
    );
    assert_eq!(h.texts(&main).len(), 1, "the notice is still pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_gap_comes_from_the_prune_watermark() {
    let config = AwarenessConfig {
        retention: RetentionPolicy {
            max_rows: 6,
            ..RetentionPolicy::default()
        },
        ..AwarenessConfig::default()
    };
    let h = Harness::with_config(config);
    let a = h.create("agent:main:a").await; // a: 1
    for _ in 0..9 {
        h.human(&a).await; // a: 2..=10
    }
    let b = h.create("agent:main:b").await; // b: 1 (newest rows are kept)
    let report = h.awareness.apply_retention().await.unwrap();
    assert_eq!(report.events_deleted, 5, "11 rows down to the 6-row cap");
    let req = requester(&a, SessionVisibility::Agent);
    let gap = |v| {
        let req = req.clone();
        let key = a.clone();
        let tools = &h.tools;
        async move {
            tools
                .session_status(&req, &since(&key, v))
                .await
                .unwrap()
                .state_changes
                .unwrap()
        }
    };
    assert!(
        gap(4).await.history_gap,
        "sequence 5 was pruned: 4 is before retained history"
    );
    let exact = gap(5).await;
    assert!(!exact.history_gap, "everything after 5 is retained");
    assert_eq!(exact.events.first().unwrap().sequence, 6);
    // A session whose log was never pruned has no gap even from 0 — the gap is not inferred
    // from sequence numbers.
    let b_status = h.tools.session_status(&req, &since(&b, 0)).await.unwrap();
    assert!(!b_status.state_changes.unwrap().history_gap);
}
