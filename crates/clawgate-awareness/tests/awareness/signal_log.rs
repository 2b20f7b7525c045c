//! The signal log: actors, one-line summaries, run outcomes, dedupe, stateVersion, best effort.

use clawgate_awareness::{Actor, AwarenessConfig, StateChange, one_line};
use clawgate_store::{SessionStore, SignalLogStore};
use clawgate_store_sqlite::SqliteOptions;
use clawgate_types::{
    ActorType, RunOutcome, SessionStateEventKind, SessionVisibility, StateVersion,
};
use std::sync::Arc;

use crate::helpers::{Harness, key, requester};
use clawgate_awareness::{SessionStatusParams, SessionsListParams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_has_an_actor_and_a_one_line_summary() {
    let h = Harness::new();
    let s = h.create("agent:main:main").await;
    let change = StateChange::goal_changed(Actor::human("u-7"), "new goal:\nship it\tnow");
    let event = h.awareness.record(&s, change).await.unwrap().event;
    assert_eq!(event.actor_type, ActorType::Human);
    assert_eq!(event.actor_id.as_deref(), Some("u-7"));
    assert_eq!(
        event.summary, "new goal: ship it now",
        "flattened to one line"
    );
    let human = StateChange::human_direct_message(Actor::human("u-7"), "telegram");
    assert_eq!(
        human.summary, "human message via telegram",
        "metadata, never content"
    );
    assert_eq!(Actor::agent(&s).actor_type, ActorType::Agent);
    assert_eq!(Actor::system("cron").actor_type, ActorType::System);
    let long = one_line(&"x".repeat(1_000));
    assert_eq!(long.chars().count(), clawgate_awareness::MAX_SUMMARY_CHARS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_runs_keep_their_exact_outcome_and_dedupe_keys_return_the_first_row() {
    let h = Harness::new();
    let s = h.create("agent:main:subagent:child").await;
    for outcome in [
        RunOutcome::Cancelled,
        RunOutcome::Timeout,
        RunOutcome::Error,
    ] {
        let e = h
            .awareness
            .record(
                &s,
                StateChange::run_failed(Actor::system("acp"), outcome, "run ended"),
            )
            .await
            .unwrap()
            .event;
        assert_eq!(
            (e.kind, e.outcome),
            (SessionStateEventKind::RunFailed, Some(outcome))
        );
    }
    let change = StateChange::run_completed(Actor::system("acp"), "done").with_dedupe_key("run-9");
    let first = h.awareness.record(&s, change.clone()).await.unwrap();
    let again = h.awareness.record(&s, change).await.unwrap();
    assert!(again.duplicate);
    assert_eq!(again.event, first.event);
    assert_eq!(
        h.store.session_head(&s).await.unwrap().state_version,
        StateVersion(first.event.sequence),
        "a duplicate does not advance the head"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_version_is_listed_once_there_are_changes_and_status_always_reports_it() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    // A row registered directly (no creation event) has no changes yet.
    let quiet = key("agent:main:quiet");
    h.store
        .upsert_session(&clawgate_store::SessionRow {
            session_key: quiet.clone(),
            agent_id: "main".into(),
            owner_session_key: None,
            spawned_by: None,
            parent_session_key: None,
            label: None,
            acp_owner: None,
            lease_id: None,
            acp_session_id: None,
            created_at: 1,
            updated_at: 1,
            reset_at: None,
            deleted_at: None,
        })
        .await
        .unwrap();
    let req = requester(&main, SessionVisibility::Agent);
    let list = h
        .tools
        .sessions_list(&req, &SessionsListParams::default())
        .await
        .unwrap();
    let version_of = |k: &clawgate_types::SessionKey| {
        list.sessions
            .iter()
            .find(|e| e.key == *k)
            .unwrap()
            .state_version
    };
    assert_eq!(
        version_of(&main),
        Some(StateVersion(1)),
        "created: one change"
    );
    assert_eq!(version_of(&quiet), None, "no changes: no stateVersion");
    let json = serde_json::to_value(&list).unwrap();
    assert!(
        json["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e.get("stateVersion").is_none())
    );
    let status = h
        .tools
        .session_status(
            &req,
            &SessionStatusParams {
                session_key: quiet.clone(),
                changes_since: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(status.state_version, StateVersion(0));
    assert_eq!(
        serde_json::to_value(&status).unwrap()["stateVersion"],
        0,
        "always reported"
    );
    h.human(&quiet).await;
    h.human(&quiet).await;
    let status = h
        .tools
        .session_status(
            &req,
            &SessionStatusParams {
                session_key: quiet,
                changes_since: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        status.state_version,
        StateVersion(2),
        "the highest sequence of the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_append_is_swallowed_and_never_fails_the_turn() {
    let dir = tempfile::tempdir().unwrap();
    drop(clawgate_store_sqlite::testing::open_store(dir.path()));
    let pages = std::fs::metadata(dir.path().join("state.db"))
        .unwrap()
        .len()
        / 4096;
    // The database may not grow: appends fail once the existing pages are full (disk full).
    let options = SqliteOptions {
        max_page_count: Some(pages),
        ..SqliteOptions::default()
    };
    let store = Arc::new(clawgate_store_sqlite::testing::open_store_with(
        dir.path(),
        options,
    ));
    let h = Harness::on(dir, store, AwarenessConfig::default());
    let s = key("agent:main:main");
    let mut outcomes = Vec::new();
    for n in 0..2_000 {
        let change =
            StateChange::goal_changed(Actor::human("u"), format!("goal {n} {}", "y".repeat(150)));
        outcomes.push(h.awareness.record(&s, change).await.is_some());
        if !outcomes[n] {
            break;
        }
    }
    assert_eq!(
        outcomes.last(),
        Some(&false),
        "the append eventually failed (disk full)"
    );
    // The engine keeps answering: reads still work and nothing panicked.
    assert!(h.store.session_head(&s).await.is_ok());
}
