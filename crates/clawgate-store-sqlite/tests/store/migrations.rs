//! Upgrading a database written by an earlier schema: every stored intent survives and reads
//! back through the new indexes.

use clawgate_store::testing::sample_intent;
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_store_sqlite::{MIGRATIONS, SCHEMA_VERSION, STATE_DB_FILE};
use clawgate_types::{ALL_INTENT_STATUSES, to_json};
use rusqlite::params;

/// A state file at schema 1 (as the first release wrote it) holding one intent per status.
fn schema_one_database(dir: &std::path::Path) -> Vec<clawgate_types::DurableSendIntent> {
    let conn = rusqlite::Connection::open(dir.join(STATE_DB_FILE)).unwrap();
    conn.execute_batch(MIGRATIONS[0].sql).unwrap();
    conn.execute_batch(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
             applied_at INTEGER NOT NULL) STRICT;
         INSERT INTO schema_migrations VALUES (1, 'initial', 0);",
    )
    .unwrap();
    ALL_INTENT_STATUSES
        .into_iter()
        .enumerate()
        .map(|(n, status)| {
            let mut intent = sample_intent(n as u64, 1_000 + n as i64);
            intent.status = status;
            conn.execute(
                "INSERT INTO send_intents (id, idempotency_key, channel, account_id, status,
                     attempt, created_at, updated_at, format_version, payload)
                 VALUES (?1, ?2, 'qa', 'bot', ?3, 0, ?4, ?4, 1, ?5)",
                params![
                    intent.id.as_str(),
                    intent.idempotency_key,
                    status.as_str(),
                    intent.created_at,
                    to_json(&intent).unwrap()
                ],
            )
            .unwrap();
            intent
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrading_from_schema_one_keeps_every_intent() {
    let dir = tempfile::tempdir().unwrap();
    let before = schema_one_database(dir.path());
    let store = clawgate_store_sqlite::testing::open_store(dir.path());
    let all = store
        .list_intents(&IntentFilter {
            limit: 100,
            ..IntentFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(all, before, "every intent, in creation order, unchanged");
    for intent in &before {
        let listed = store
            .list_intents(&IntentFilter {
                statuses: vec![intent.status],
                limit: 100,
                ..IntentFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(listed, vec![intent.clone()], "listing {}", intent.status);
    }
    drop(store);
    let conn = rusqlite::Connection::open(dir.path().join(STATE_DB_FILE)).unwrap();
    let version: i64 = conn
        .query_row("SELECT MAX(version) FROM schema_migrations", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let indexes: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'send_intents'
               AND sql IS NOT NULL ORDER BY name",
        )
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        indexes,
        [
            "send_intents_attention",
            "send_intents_created",
            "send_intents_open"
        ]
    );
}

/// A state at schema 5 holding the one `global` session a state could hold then (agent
/// `alpha`'s), with its log and a watcher: after the upgrade it is alpha's global session,
/// with its head, events and cursor, and another agent's `global` is a separate session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_global_session_becomes_its_agents_after_the_upgrade() {
    use clawgate_store::{SessionStore, SignalLogStore, WatchCursorStore};
    use clawgate_types::{SessionKey, StateVersion};

    let dir = tempfile::tempdir().unwrap();
    {
        let conn = rusqlite::Connection::open(dir.path().join(STATE_DB_FILE)).unwrap();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL,
                 applied_at INTEGER NOT NULL) STRICT;",
        )
        .unwrap();
        for m in MIGRATIONS.iter().filter(|m| m.version <= 5) {
            conn.execute_batch(m.sql).unwrap();
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?1, ?2, 0)",
                params![m.version, m.name],
            )
            .unwrap();
        }
        conn.execute_batch(
            r#"INSERT INTO sessions VALUES ('global', 'alpha', NULL, 1,
                   '{"sessionKey":"global","agentId":"alpha","createdAt":1,"updatedAt":1}');
               INSERT INTO session_heads VALUES ('global', 2, 0, 3);
               INSERT INTO session_state_events (session_key, sequence, kind, actor_type,
                   summary, created_at)
               VALUES ('global', 1, 'created', 'system', 'session created', 2),
                      ('global', 2, 'human_direct_message', 'human', 'human message via qa', 3);
               INSERT INTO session_watch_cursors VALUES ('agent:ops:main', 'global', 1, NULL, 1,
                   'explicit', 2, 2);"#,
        )
        .unwrap();
    }
    let store = clawgate_store_sqlite::testing::open_store(dir.path());
    let alpha = SessionKey::global_of("alpha").unwrap();
    let row = store
        .load_session(&alpha)
        .await
        .unwrap()
        .expect("alpha's row");
    assert_eq!(
        (row.session_key, row.agent_id.as_str()),
        (alpha.clone(), "alpha")
    );
    assert_eq!(
        store.session_head(&alpha).await.unwrap().state_version,
        StateVersion(2)
    );
    let events = store
        .events_since(&alpha, StateVersion(0), 10)
        .await
        .unwrap();
    assert_eq!(events.events.len(), 2);
    assert_eq!(store.cursors_on_target(&alpha).await.unwrap().len(), 1);
    let beta = SessionKey::global_of("beta").unwrap();
    assert_eq!(store.load_session(&beta).await.unwrap(), None);
    assert_eq!(
        store.load_session(&SessionKey::global()).await.unwrap(),
        None
    );
    assert_eq!(
        store.session_head(&beta).await.unwrap().state_version,
        StateVersion(0)
    );
}
