//! Watchers: implicit on spawn, explicit through `sessions_send watch: true`, agent-qualified
//! identity only; global scope gets the log and changesSince but no notices.

use clawgate_awareness::{
    Actor, AwarenessError, NewSession, SessionStatusParams, SessionsSendParams,
};
use clawgate_store::{SignalLogStore, WatchCursorStore, WatchSource};
use clawgate_types::{SessionKey, SessionVisibility, StateVersion};

use crate::helpers::{Harness, key, requester};

fn send(to: &SessionKey, watch: Option<bool>) -> SessionsSendParams {
    SessionsSendParams {
        session_key: to.clone(),
        message: "please rebase".into(),
        watch,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawning_sets_the_parents_cursor_at_the_childs_creation_version() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let spawned = h.spawn(&main, "agent:main:subagent:child").await;
    assert!(spawned.parent_watching);
    let child = &spawned.row.session_key;
    assert_eq!(spawned.row.spawned_by.as_ref(), Some(&main));
    assert_eq!(spawned.row.owner_session_key.as_ref(), Some(&main));
    let cursor = h.store.load_cursor(&main, child).await.unwrap().unwrap();
    assert_eq!(cursor.source, WatchSource::Spawn);
    assert_eq!(cursor.acked_version, spawned.creation_version);
    assert!(spawned.creation_version > StateVersion(0));
    assert!(
        h.texts(&main).is_empty(),
        "the spawn itself is not a notice"
    );
    // The parent's log records the spawn (log only).
    let parent_log = h
        .store
        .events_since(&main, StateVersion(0), 200)
        .await
        .unwrap();
    assert!(
        parent_log
            .events
            .iter()
            .any(|e| e.child_session_key.as_ref() == Some(child))
    );
    h.human(child).await;
    assert_eq!(h.texts(&main).len(), 1, "no manual subscription was needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_watch_starts_at_the_current_version_after_a_successful_send() {
    let h = Harness::new();
    let coordinator = h.create("agent:main:main").await;
    let worker = h.create("agent:main:worker").await;
    for _ in 0..3 {
        h.human(&worker).await; // earlier history
    }
    let req = requester(&coordinator, SessionVisibility::Agent);
    let result = h
        .tools
        .sessions_send(&req, &send(&worker, Some(true)))
        .await
        .unwrap();
    assert_eq!(result.watched, Some(true));
    assert_eq!(
        serde_json::to_value(&result).unwrap(),
        serde_json::json!({"status": "sent", "sessionKey": "agent:main:worker", "watched": true})
    );
    let cursor = h
        .store
        .load_cursor(&coordinator, &worker)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cursor.source, WatchSource::Explicit);
    assert_eq!(
        cursor.acked_version,
        StateVersion(4),
        "created + three earlier changes"
    );
    assert!(
        h.texts(&coordinator).is_empty(),
        "earlier history never notifies"
    );
    h.human(&worker).await;
    assert_eq!(
        h.texts(&coordinator),
        vec![format!(
            "Session \"{worker}\" changed (another actor). Reconcile before acting: session_status sessionKey \"{worker}\" changesSince 4."
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_lands_on_the_session_that_actually_received_the_message() {
    let h = Harness::new();
    let coordinator = h.create("agent:main:main").await;
    let alias = h.create("agent:main:alias").await;
    let real = h.create("agent:main:real").await;
    *h.delivery.redirect.lock().unwrap() = Some((alias.clone(), real.clone()));
    let req = requester(&coordinator, SessionVisibility::Agent);
    let result = h
        .tools
        .sessions_send(&req, &send(&alias, Some(true)))
        .await
        .unwrap();
    assert_eq!(
        (result.session_key.clone(), result.watched),
        (real.clone(), Some(true))
    );
    assert!(
        h.store
            .load_cursor(&coordinator, &real)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        h.store
            .load_cursor(&coordinator, &alias)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_watch_without_the_flag_and_none_after_a_failed_send() {
    let h = Harness::new();
    let coordinator = h.create("agent:main:main").await;
    let worker = h.create("agent:main:worker").await;
    let req = requester(&coordinator, SessionVisibility::Agent);
    let plain = h
        .tools
        .sessions_send(&req, &send(&worker, None))
        .await
        .unwrap();
    assert_eq!(
        plain.watched, None,
        "watched is reported only when the parameter was set"
    );
    assert!(
        serde_json::to_value(&plain)
            .unwrap()
            .get("watched")
            .is_none()
    );
    let off = h
        .tools
        .sessions_send(&req, &send(&worker, Some(false)))
        .await
        .unwrap();
    assert_eq!(off.watched, Some(false));
    assert!(
        h.store
            .load_cursor(&coordinator, &worker)
            .await
            .unwrap()
            .is_none()
    );
    *h.delivery.fail.lock().unwrap() = true;
    let failed = h
        .tools
        .sessions_send(&req, &send(&worker, Some(true)))
        .await;
    assert!(matches!(failed, Err(AwarenessError::Delivery { .. })));
    assert!(
        h.store
            .load_cursor(&coordinator, &worker)
            .await
            .unwrap()
            .is_none(),
        "registered only after a successful send"
    );
    assert_eq!(h.delivery.sent.lock().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_scope_gets_the_log_and_changes_since_but_no_notices() {
    let h = Harness::new();
    // The registered key is agent main's global session (it still reads `global`).
    let global = h
        .awareness
        .create_session(
            NewSession {
                agent_id: Some("main".into()),
                ..NewSession::new(SessionKey::global())
            },
            Actor::system("test"),
        )
        .await
        .unwrap()
        .row
        .session_key;
    assert_eq!(global.as_str(), "global");
    let worker = h.create("agent:main:worker").await;
    let req = requester(&global, SessionVisibility::All);
    let req = clawgate_awareness::Requester {
        a2a_policy: clawgate_types::AgentToAgentPolicy {
            enabled: true,
            allow: vec!["*".into()],
        },
        ..req
    };
    let sent = h
        .tools
        .sessions_send(&req, &send(&worker, Some(true)))
        .await
        .unwrap();
    assert_eq!(
        sent.watched,
        Some(false),
        "a global key is ambiguous between agents: no watch"
    );
    assert!(!h.awareness.watch(&global, &worker).await);
    h.human(&worker).await;
    assert!(h.texts(&global).is_empty());
    assert!(
        h.store
            .cursors_of_watcher(&global)
            .await
            .unwrap()
            .is_empty()
    );
    // The global session's own log and changesSince work.
    h.human(&global).await;
    let status = h
        .tools
        .session_status(
            &req,
            &SessionStatusParams {
                // As the wire says it: the requester's own agent's global session.
                session_key: SessionKey::global(),
                changes_since: Some(StateVersion(0)),
            },
        )
        .await
        .unwrap();
    assert_eq!(status.state_changes.unwrap().events.len(), 2);
    // Unqualified legacy keys cannot watch either.
    let legacy = key("legacy-session");
    assert!(!h.awareness.watch(&legacy, &worker).await);
}
