//! Typed errors: an unreachable server, a held row lock; never the password.

use std::time::Duration;

use clawgate_store::{IntentStore, StoreError};
use clawgate_store_postgres::{PostgresOptions, PostgresStore};
use clawgate_types::IntentStatus;

use crate::common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_unavailable_and_never_shows_the_password() {
    let mut options = PostgresOptions::new(
        "postgres://gw:hunter2-secret@127.0.0.1:1/state",
        common::instance("gw-a"),
    );
    options.connect_timeout = Duration::from_secs(5);
    let error = PostgresStore::open(options.clone()).await.unwrap_err();
    match &error {
        StoreError::Unavailable { database, .. } => assert_eq!(database, "127.0.0.1:1/state"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    for shown in [
        error.to_string(),
        format!("{error:?}"),
        format!("{options:?}"),
    ] {
        assert!(!shown.contains("hunter2"), "the password leaked: {shown}");
    }
}

/// A row another gateway holds past the lock timeout fails the write as `Busy`, naming the
/// timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_past_the_lock_timeout_is_busy() {
    let schema = common::fresh_schema("lock-timeout");
    let mut options = common::options(&schema, "gw-a");
    options.lock_timeout = Duration::from_millis(200);
    let store = PostgresStore::open(options).await.unwrap();
    let mut intent = clawgate_store::testing::sample_intent(1, 1_000);
    store.insert_intent(&intent, None).await.unwrap();

    let mut holder = common::admin().await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        &format!("SELECT 1 FROM {schema}.send_intents WHERE id = $1 FOR UPDATE"),
        &[&intent.id.as_str()],
    )
    .await
    .unwrap();
    intent.status = IntentStatus::Sending;
    let error = store
        .save_intent(&intent, IntentStatus::Pending, None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::Busy {
                timeout_ms: 200,
                ..
            }
        ),
        "{error:?}"
    );
    tx.rollback().await.unwrap();
    store
        .save_intent(&intent, IntentStatus::Pending, None)
        .await
        .expect("the write goes through once the lock is gone");
}
