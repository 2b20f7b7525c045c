//! Migrations: once under concurrent opens, checksums checked on every open, newer schemas
//! refused.

use clawgate_store::StoreError;
use clawgate_store_postgres::{MIGRATIONS, PostgresStore, SCHEMA_VERSION};

use crate::common;

/// Gateways starting at the same moment on an empty schema: every open succeeds and each
/// migration is applied exactly once (without the advisory lock the losers fail creating tables
/// that already exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_opens_migrate_once() {
    for round in 0..5 {
        let schema = common::fresh_schema(&format!("concurrent-open-{round}"));
        let opens: Vec<_> = (0..4)
            .map(|n| {
                let options = common::options(&schema, &format!("gw-{n}"));
                tokio::spawn(PostgresStore::open(options))
            })
            .collect();
        for open in opens {
            open.await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}: a concurrent open failed: {e}"));
        }
        let admin = common::admin().await;
        let rows = admin
            .query(
                &format!(
                    "SELECT version, checksum FROM {schema}.clawgate_schema_migrations \
                     ORDER BY version"
                ),
                &[],
            )
            .await
            .unwrap();
        let recorded: Vec<(i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let expected: Vec<(i64, String)> = MIGRATIONS
            .iter()
            .map(|m| (m.version, m.checksum()))
            .collect();
        assert_eq!(
            recorded, expected,
            "round {round}: each migration recorded once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_applied_migration_is_refused() {
    let schema = common::fresh_schema("tampered");
    drop(common::open(&schema, "gw-a").await);
    common::admin()
        .await
        .execute(
            &format!(
                "UPDATE {schema}.clawgate_schema_migrations SET checksum = 'edited' \
                 WHERE version = 1"
            ),
            &[],
        )
        .await
        .unwrap();
    let error = PostgresStore::open(common::options(&schema, "gw-a"))
        .await
        .unwrap_err();
    match &error {
        StoreError::Corrupt { database, detail } => {
            assert!(database.contains(&schema), "{database}");
            assert!(
                detail.contains("applied migration 1 (initial) has checksum edited")
                    && detail.contains("changed after it was applied"),
                "{detail}"
            );
        }
        other => panic!("expected the changed migration to be refused, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_a_newer_build_is_refused() {
    let schema = common::fresh_schema("newer");
    drop(common::open(&schema, "gw-a").await);
    let newer = SCHEMA_VERSION + 1;
    common::admin()
        .await
        .execute(
            &format!(
                "INSERT INTO {schema}.clawgate_schema_migrations \
                 (version, name, checksum, applied_at) VALUES ($1, 'from_the_future', 'x', 0)"
            ),
            &[&newer],
        )
        .await
        .unwrap();
    let error = PostgresStore::open(common::options(&schema, "gw-a"))
        .await
        .unwrap_err();
    assert!(
        matches!(error, StoreError::NewerSchema { found, supported, .. }
            if found == newer && supported == SCHEMA_VERSION),
        "{error:?}"
    );
}

/// An open that may not migrate (an operator's command on a stopped state) refuses a missing
/// or older schema without creating or changing anything, and opens a current one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_without_migrating_refuses_an_older_schema_and_changes_nothing() {
    let schema = common::fresh_schema("read-only-open");
    let reading = || {
        let mut options = common::options(&schema, "operator");
        options.apply_migrations = false;
        PostgresStore::open(options)
    };
    let admin = common::admin().await;
    let schema_exists = || async {
        admin
            .query_one(
                "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
                &[&schema],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 1
    };
    let error = reading()
        .await
        .expect_err("an empty database is not current");
    assert!(
        matches!(error, StoreError::OlderSchema { found: 0, needed, .. } if needed == SCHEMA_VERSION),
        "{error}"
    );
    assert!(error.to_string().contains("clawgate migrate"), "{error}");
    assert!(!schema_exists().await, "nothing was created");

    drop(common::open(&schema, "gw-a").await);
    // As if this build's last migration had not been applied yet.
    admin
        .execute(
            &format!(
                "DELETE FROM {schema}.clawgate_schema_migrations WHERE version = {SCHEMA_VERSION}"
            ),
            &[],
        )
        .await
        .unwrap();
    let error = reading().await.expect_err("one migration behind");
    assert!(
        matches!(error, StoreError::OlderSchema { found, .. } if found == SCHEMA_VERSION - 1),
        "{error}"
    );
    let recorded: i64 = admin
        .query_one(
            &format!("SELECT count(*) FROM {schema}.clawgate_schema_migrations"),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, SCHEMA_VERSION - 1, "the refusal applied nothing");

    drop(common::open(&schema, "gw-a").await);
    reading()
        .await
        .expect("a current schema opens without migrating");
}
