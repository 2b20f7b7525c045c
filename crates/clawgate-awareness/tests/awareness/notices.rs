//! The notice protocol: one per pair, byte-stable, frozen watermark, consume = ack, exactly one
//! reopen, no self-notices, heartbeat for main sessions, next turn for nested watchers.

use clawgate_awareness::{Actor, StateChange};
use clawgate_store::WatchCursorStore;
use clawgate_types::StateVersion;

use crate::helpers::{Harness, key};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifying_kinds_open_a_notice_and_log_only_kinds_do_not() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    let system = Actor::system("runtime");
    for change in [
        StateChange::run_completed(system.clone(), "run finished"),
        StateChange::run_failed(
            system.clone(),
            clawgate_types::RunOutcome::Cancelled,
            "cancelled",
        ),
        StateChange::compacted(system.clone(), "history compacted"),
        StateChange::child_spawned(system.clone(), &key("agent:main:subagent:grandchild")),
    ] {
        assert!(h.awareness.record(&child, change).await.is_some());
    }
    assert!(h.texts(&main).is_empty(), "log-only kinds never notify");
    h.awareness
        .record(
            &child,
            StateChange::goal_changed(Actor::human("user-1"), "goal updated"),
        )
        .await
        .unwrap();
    assert_eq!(h.texts(&main).len(), 1, "goal_changed notifies");
    h.awareness.consume_notices(&main).await;
    h.human(&child).await;
    assert_eq!(h.texts(&main).len(), 1, "human_direct_message notifies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_rapid_changes_make_one_byte_identical_line() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let spawned = h.spawn(&main, "agent:main:subagent:child").await;
    let child = spawned.row.session_key;
    h.human(&child).await;
    let first = h.texts(&main);
    for _ in 0..19 {
        h.human(&child).await;
        assert_eq!(
            h.texts(&main),
            first,
            "the pending notice text never changes"
        );
    }
    assert_eq!(first.len(), 1, "one line for twenty changes");
    insta::assert_snapshot!("notice_text", first[0]);
    assert_eq!(
        h.awareness.pending_notices(&main)[0].changes_since,
        spawned.creation_version,
        "the reconcile call starts at what the watcher last acknowledged"
    );
    let cursor = h.store.load_cursor(&main, &child).await.unwrap().unwrap();
    assert_eq!(
        cursor.notified_version,
        Some(StateVersion(spawned.creation_version.0 + 1)),
        "the watermark froze at the first notifying event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuming_acks_and_interleaved_work_opens_exactly_one_more() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    let frozen = h.human(&child).await;
    // Queued; then more material work lands before the watcher's turn consumes it.
    h.human(&child).await;
    let last = h.human(&child).await;
    let consumed = h.awareness.consume_notices(&main).await;
    assert_eq!(consumed.len(), 1);
    let cursor = h.store.load_cursor(&main, &child).await.unwrap().unwrap();
    assert_eq!(
        cursor.acked_version,
        StateVersion(frozen),
        "acked to the frozen watermark"
    );
    let reopened = h.awareness.pending_notices(&main);
    assert_eq!(
        reopened.len(),
        1,
        "exactly one new notice for the remainder"
    );
    assert_eq!(reopened[0].changes_since, StateVersion(frozen));
    assert_eq!(cursor.notified_version, Some(StateVersion(last)));
    h.awareness.consume_notices(&main).await;
    assert!(
        h.texts(&main).is_empty(),
        "nothing interleaved: no further notice"
    );
    let cursor = h.store.load_cursor(&main, &child).await.unwrap().unwrap();
    assert_eq!(
        (cursor.acked_version, cursor.notified_version),
        (StateVersion(last), None)
    );
    assert!(h.awareness.consume_notices(&main).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuming_without_interleaved_work_closes_the_pair() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    h.human(&child).await;
    assert_eq!(h.awareness.consume_notices(&main).await.len(), 1);
    assert!(h.awareness.pending_notices(&main).is_empty());
    assert!(
        h.store
            .cursors_with_pending_notice()
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_is_never_notified_of_its_own_events() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    h.awareness
        .record(
            &child,
            StateChange::goal_changed(Actor::agent(&main), "parent set the goal"),
        )
        .await
        .unwrap();
    assert!(h.texts(&main).is_empty(), "own change: no notice");
    assert_eq!(h.heartbeat.count(&main), 0);
    // Another watcher on the same target does hear about it.
    let peer = h.create("agent:main:peer").await;
    assert!(h.awareness.watch(&peer, &child).await);
    h.awareness
        .record(
            &child,
            StateChange::goal_changed(Actor::agent(&main), "again"),
        )
        .await
        .unwrap();
    assert!(h.texts(&main).is_empty());
    assert_eq!(h.texts(&peer).len(), 1);
    // Own work interleaved with a pending notice does not reopen it either.
    h.human(&child).await;
    h.awareness
        .record(
            &child,
            StateChange::goal_changed(Actor::agent(&main), "mine"),
        )
        .await
        .unwrap();
    assert_eq!(h.awareness.consume_notices(&main).await.len(), 1);
    assert!(
        h.texts(&main).is_empty(),
        "only the watcher's own work came after the watermark"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn main_sessions_are_woken_once_and_nested_watchers_wait_for_their_turn() {
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
    let nested = h
        .spawn(&a, "agent:main:subagent:a:worker")
        .await
        .row
        .session_key;
    for _ in 0..5 {
        h.human(&a).await;
        h.human(&b).await;
        h.human(&nested).await;
    }
    assert_eq!(
        h.heartbeat.count(&main),
        1,
        "woken at once, coalesced across targets"
    );
    assert_eq!(h.texts(&main).len(), 2, "one line per target");
    assert_eq!(h.heartbeat.count(&a), 0, "nested watchers are not woken");
    assert_eq!(
        h.texts(&a).len(),
        1,
        "the nested watcher sees it on its next turn"
    );
    assert_eq!(h.awareness.consume_notices(&a).await.len(), 1);
    h.awareness.consume_notices(&main).await;
    // Both reopened (interleaved work), which is a new notice: the main session is woken again.
    assert_eq!(h.heartbeat.count(&main), 2);
    h.awareness.consume_notices(&main).await;
    h.human(&a).await;
    assert_eq!(
        h.heartbeat.count(&main),
        3,
        "a new notice after consumption wakes again"
    );
}

#[test]
fn notice_text_is_the_pages_line() {
    let notice = clawgate_awareness::Notice {
        watcher: key("agent:main:main"),
        target: key("agent:main:subagent:child"),
        changes_since: StateVersion(12),
        deleted_by: None,
    };
    assert_eq!(
        notice.text(),
        "Session \"agent:main:subagent:child\" changed (another actor). Reconcile before acting: \
         session_status sessionKey \"agent:main:subagent:child\" changesSince 12."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledging_what_was_shown_leaves_a_notice_that_arrived_since_pending() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let first = h
        .spawn(&main, "agent:main:subagent:a")
        .await
        .row
        .session_key;
    let second = h
        .spawn(&main, "agent:main:subagent:b")
        .await
        .row
        .session_key;
    h.human(&first).await;
    // What the turn placed in its prompt.
    let shown = h.awareness.pending_notices(&main);
    assert_eq!(shown.len(), 1);
    // A notice on another target arrives while the agent works.
    h.human(&second).await;
    let acknowledged = h.awareness.acknowledge_notices(&main, &shown).await;
    assert_eq!(acknowledged, shown, "what the agent saw is acknowledged");
    let cursor = h.store.load_cursor(&main, &first).await.unwrap().unwrap();
    assert_eq!(cursor.notified_version, None, "durably acknowledged");
    let left = h.awareness.pending_notices(&main);
    assert_eq!(left.len(), 1, "the unseen notice stays: {left:?}");
    assert_eq!(left[0].target, second);
    let cursor = h.store.load_cursor(&main, &second).await.unwrap().unwrap();
    assert!(cursor.notified_version.is_some(), "still pending durably");
    // Acknowledging the same notices again changes nothing.
    assert!(
        h.awareness
            .acknowledge_notices(&main, &shown)
            .await
            .is_empty()
    );
    assert_eq!(h.awareness.pending_notices(&main), left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notice_links_to_the_targets_status_since_the_acknowledged_version() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let spawned = h.spawn(&main, "agent:main:subagent:a/b?c#d").await;
    h.human(&spawned.row.session_key).await;
    let notice = h.awareness.pending_notices(&main).remove(0);
    let since = spawned.creation_version.0;
    assert_eq!(
        notice.status_url("http://127.0.0.1:4010/"),
        format!(
            "http://127.0.0.1:4010/v1/sessions/agent:main:subagent:a%2Fb%3Fc%23d?changesSince={since}"
        )
    );
    let linked = notice.text_with_link(Some("http://127.0.0.1:4010"));
    assert!(linked.starts_with(&notice.text()), "{linked}");
    assert!(linked.ends_with(&format!(
        " Status: {}",
        notice.status_url("http://127.0.0.1:4010")
    )));
    assert_eq!(notice.text_with_link(None), notice.text());
}
