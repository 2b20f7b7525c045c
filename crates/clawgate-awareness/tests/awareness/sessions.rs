//! Session identity and lifecycle across agents: each agent's `global`-scope session is its own,
//! and deleting a watched session tells each watcher once.

use std::sync::Arc;

use clawgate_awareness::{
    Actor, AwarenessConfig, AwarenessError, NewSession, SessionStatusParams, SessionsHistoryParams,
    StateChange,
};
use clawgate_store::WatchCursorStore;
use clawgate_types::{SessionKey, SessionVisibility, StateVersion};

use crate::helpers::{Harness, requester};

async fn create_global(h: &Harness, agent: &str) -> SessionKey {
    h.awareness
        .create_session(
            NewSession {
                agent_id: Some(agent.into()),
                ..NewSession::new(SessionKey::global())
            },
            Actor::system("test"),
        )
        .await
        .expect("each agent registers its own global session")
        .row
        .session_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_global_sessions_have_their_own_rows_logs_and_history() {
    let h = Harness::new();
    let alpha = create_global(&h, "alpha").await;
    let beta = create_global(&h, "beta").await;
    assert_ne!(alpha, beta);
    assert_eq!((alpha.as_str(), beta.as_str()), ("global", "global"));
    let again = h
        .awareness
        .create_session(
            NewSession {
                agent_id: Some("alpha".into()),
                ..NewSession::new(SessionKey::global())
            },
            Actor::system("test"),
        )
        .await;
    assert!(
        matches!(again, Err(AwarenessError::AlreadyExists { .. })),
        "the same agent's global session exists once: {again:?}"
    );
    h.human(&alpha).await;
    h.human(&alpha).await;
    h.human(&beta).await;

    // Each agent's session tools, naming `global` as the wire does, see their own session.
    for (own, agent, changes) in [(&alpha, "alpha", 3), (&beta, "beta", 2)] {
        let req = requester(own, SessionVisibility::OwnSession);
        let status = h
            .tools
            .session_status(
                &req,
                &SessionStatusParams {
                    session_key: SessionKey::global(),
                    changes_since: Some(StateVersion(0)),
                },
            )
            .await
            .expect("own session");
        assert_eq!(status.agent_id, agent);
        assert_eq!(status.state_version, StateVersion(changes));
        assert_eq!(
            status
                .state_changes
                .expect("asked for changes")
                .events
                .len(),
            changes as usize,
            "created + the human messages of {agent} only"
        );
        let history = h
            .tools
            .sessions_history(
                &req,
                &SessionsHistoryParams {
                    session_key: SessionKey::global(),
                    limit: None,
                },
            )
            .await
            .expect("own history");
        assert_eq!(history.events.len(), changes as usize);
    }

    // A watcher of alpha's global session hears of alpha's changes only; the global sessions
    // themselves never watch or get notices.
    let ops = h.create("agent:ops:main").await;
    assert!(h.awareness.watch(&ops, &alpha).await);
    h.human(&beta).await;
    assert!(h.texts(&ops).is_empty(), "beta's change is not alpha's");
    h.human(&alpha).await;
    assert_eq!(h.texts(&ops).len(), 1);
    assert!(!h.awareness.watch(&alpha, &ops).await);
    assert!(h.texts(&alpha).is_empty() && h.texts(&beta).is_empty());

    h.awareness
        .delete_session(&alpha, Actor::system("test"))
        .await
        .expect("delete alpha's");
    assert!(h.awareness.session(&alpha).await.expect("read").is_none());
    assert!(h.awareness.session(&beta).await.expect("read").is_some());
}

const DELETED: &str = "Session \"agent:main:subagent:child\" was deleted (by agent:main:janitor). \
                       Its watch has ended: do not wait on it or send to it.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_watched_session_tells_each_watcher_once_but_not_the_deleter() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let peer = h.create("agent:ops:main").await;
    let janitor = h.create("agent:main:janitor").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    assert!(h.awareness.watch(&peer, &child).await);
    assert!(h.awareness.watch(&janitor, &child).await);
    h.human(&child).await;
    assert_eq!(h.texts(&main).len(), 1, "a change notice is pending");

    h.awareness
        .delete_session(&child, Actor::agent(&janitor))
        .await
        .expect("delete");
    assert_eq!(h.texts(&main), vec![DELETED], "replaces the change notice");
    assert_eq!(h.texts(&peer), vec![DELETED]);
    assert!(h.texts(&janitor).is_empty(), "no notice for the deleter");
    assert_eq!(
        h.store.load_cursor(&janitor, &child).await.expect("read"),
        None
    );

    // Later events on the deleted key change nothing: still one, byte-identical notice.
    h.human(&child).await;
    h.awareness
        .record(
            &child,
            StateChange::human_direct_message(Actor::human("user-2"), "qa"),
        )
        .await;
    assert_eq!(h.texts(&main), vec![DELETED]);

    let consumed = h.awareness.consume_notices(&main).await;
    assert_eq!(
        consumed.iter().map(|n| n.text()).collect::<Vec<_>>(),
        vec![DELETED]
    );
    assert_eq!(
        h.store.load_cursor(&main, &child).await.expect("read"),
        None,
        "consumed: the watch is gone"
    );
    assert_eq!(h.awareness.rebuild_notices().await.expect("rebuild"), 1);
    assert!(h.texts(&main).is_empty(), "told once");
    assert_eq!(h.texts(&peer), vec![DELETED], "the peer's is still pending");
    h.human(&child).await;
    assert!(
        h.texts(&main).is_empty(),
        "no further notices for that target"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_notice_survives_a_restart_unchanged() {
    let h = Harness::new();
    let main = h.create("agent:main:main").await;
    let janitor = h.create("agent:main:janitor").await;
    let child = h
        .spawn(&main, "agent:main:subagent:child")
        .await
        .row
        .session_key;
    h.awareness
        .delete_session(&child, Actor::agent(&janitor))
        .await
        .expect("delete");
    let before = h.awareness.all_pending_notices();
    assert_eq!(before.len(), 1);

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
    assert_eq!(h.awareness.rebuild_notices().await.expect("rebuild"), 1);
    assert_eq!(h.awareness.all_pending_notices(), before);
    assert_eq!(h.texts(&main), vec![DELETED]);
    assert_eq!(h.awareness.consume_notices(&main).await, before);
    assert_eq!(h.awareness.rebuild_notices().await.expect("rebuild"), 0);
}
