//! The faults users hit: each gives a typed error that names the file, and loses nothing stored.

use std::time::Duration;

use clawgate_store::testing::sample_intent;
use clawgate_store::{IntentStore, StoreError};
use clawgate_store_sqlite::{STATE_DB_FILE, SqliteOptions, SqliteStore};

fn quick() -> SqliteOptions {
    SqliteOptions {
        busy_timeout: Duration::from_millis(200),
        ..SqliteOptions::default()
    }
}

fn must_fail(result: Result<SqliteStore, StoreError>) -> StoreError {
    match result {
        Ok(_) => panic!("opening must fail"),
        Err(e) => e,
    }
}

#[test]
fn missing_directory_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("nope");
    let err = must_fail(SqliteStore::open_state_dir(&gone, quick()));
    assert!(
        matches!(&err, StoreError::MissingDirectory { path } if path == &gone),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("nope") && err.to_string().contains("--state-dir"),
        "{err}"
    );
}

#[test]
fn corrupt_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_DB_FILE);
    let garbage = b"this is not a sqlite database, it is a text file someone put here\n".repeat(64);
    std::fs::write(&path, &garbage).unwrap();
    let err = must_fail(SqliteStore::open_state_dir(dir.path(), quick()));
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        garbage,
        "the corrupt file was not modified"
    );
}

#[tokio::test]
async fn read_only_file_is_refused_without_touching_it() {
    let dir = tempfile::tempdir().unwrap();
    let intent = sample_intent(1, 1_000);
    {
        let store = SqliteStore::open_state_dir(dir.path(), quick()).unwrap();
        store.insert_intent(&intent, None).await.unwrap();
    }
    let path = dir.path().join(STATE_DB_FILE);
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&path, perms.clone()).unwrap();
    let err = must_fail(SqliteStore::open_state_dir(dir.path(), quick()));
    assert!(matches!(err, StoreError::ReadOnly { .. }), "{err:?}");
    assert!(
        err.to_string().contains("read-only") && err.to_string().contains("state.db"),
        "{err}"
    );
    #[allow(clippy::permissions_set_readonly_false)] // Restoring write access for the owner.
    perms.set_readonly(false);
    std::fs::set_permissions(&path, perms).unwrap();
    let store = SqliteStore::open_state_dir(dir.path(), quick()).unwrap();
    assert_eq!(
        store.load_intent(&intent.id).await.unwrap(),
        Some(intent),
        "nothing was lost"
    );
}

#[tokio::test]
async fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    drop(SqliteStore::open_state_dir(dir.path(), quick()).unwrap());
    let conn = rusqlite::Connection::open(dir.path().join(STATE_DB_FILE)).unwrap();
    conn.execute(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, 'future', 0)",
        [],
    )
    .unwrap();
    drop(conn);
    let err = must_fail(SqliteStore::open_state_dir(dir.path(), quick()));
    assert!(
        matches!(
            err,
            StoreError::NewerSchema {
                found: 99,
                supported: clawgate_store_sqlite::SCHEMA_VERSION,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("newer clawgate"), "{err}");
}

#[test]
fn database_held_by_another_process_at_open_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(STATE_DB_FILE);
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .unwrap();
    other
        .execute_batch("BEGIN IMMEDIATE; CREATE TABLE squatter (x INTEGER);")
        .unwrap();
    let err = must_fail(SqliteStore::open_state_dir(dir.path(), quick()));
    assert!(
        matches!(
            err,
            StoreError::Locked {
                timeout_ms: 200,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("locked by another process"),
        "{err}"
    );
    other.execute_batch("ROLLBACK").unwrap();
    assert!(
        SqliteStore::open_state_dir(dir.path(), quick()).is_ok(),
        "opens once the lock is gone"
    );
}

#[tokio::test]
async fn write_lock_held_past_timeout_is_busy_and_neighbours_recover() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open_state_dir(dir.path(), quick()).unwrap();
    let other = rusqlite::Connection::open(dir.path().join(STATE_DB_FILE)).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let err = store
        .insert_intent(&sample_intent(1, 1), None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Busy { .. }), "{err:?}");
    assert!(err.is_transient());
    other.execute_batch("COMMIT").unwrap();
    store
        .insert_intent(&sample_intent(1, 1), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn full_database_fails_the_write_and_keeps_committed_rows() {
    let dir = tempfile::tempdir().unwrap();
    let capped = SqliteOptions {
        max_page_count: Some(40),
        ..quick()
    };
    let store = SqliteStore::open_state_dir(dir.path(), capped).unwrap();
    let mut committed = Vec::new();
    let mut full = None;
    for n in 0..10_000 {
        let mut intent = sample_intent(n, n as i64);
        intent.message.body.as_mut().unwrap().text = "x".repeat(2_000);
        match store.insert_intent(&intent, None).await {
            Ok(_) => committed.push(intent),
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    let err = full.expect("the size cap must be reached");
    assert!(matches!(err, StoreError::DiskFull { .. }), "{err:?}");
    assert!(err.to_string().contains("full"), "{err}");
    assert!(!committed.is_empty());
    drop(store);
    let store = SqliteStore::open_state_dir(dir.path(), quick()).unwrap();
    for intent in &committed {
        assert_eq!(
            store.load_intent(&intent.id).await.unwrap().as_ref(),
            Some(intent),
            "acknowledged rows survive"
        );
    }
}
