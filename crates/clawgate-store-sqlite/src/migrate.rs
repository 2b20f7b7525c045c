//! Numbered SQL migrations embedded in the binary, each applied in its own transaction and
//! recorded in `schema_migrations`. A database written by a newer build is refused.

use clawgate_types::clock::{Clock as _, SystemClock};
use rusqlite::{Connection, OptionalExtension, params};

use super::errors::{DbResult, ErrorContext, Phase};
use clawgate_store::{StoreError, StoreResult};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

/// Every migration this build knows, in order. Append only; never edit an applied one.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: include_str!("../migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "send_status_indexes",
        sql: include_str!("../migrations/0002_send_status_indexes.sql"),
    },
    Migration {
        version: 3,
        name: "index_predicates_without_in",
        sql: include_str!("../migrations/0003_index_predicates_without_in.sql"),
    },
    Migration {
        version: 4,
        name: "watermark_checkpoints",
        sql: include_str!("../migrations/0004_watermark_checkpoints.sql"),
    },
    Migration {
        version: 5,
        name: "account_leases",
        sql: include_str!("../migrations/0005_account_leases.sql"),
    },
    Migration {
        version: 6,
        name: "agent_global_sessions",
        sql: include_str!("../migrations/0006_agent_global_sessions.sql"),
    },
    Migration {
        version: 7,
        name: "channel_state",
        sql: include_str!("../migrations/0007_channel_state.sql"),
    },
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 7;

pub use clawgate_store::MigrationStatus;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT";

fn applied_version(conn: &Connection) -> DbResult<i64> {
    let exists: Option<String> = conn
        .query_row(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if exists.is_none() {
        return Ok(0);
    }
    Ok(conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )?)
}

/// Applies pending migrations; returns the versions applied now.
pub(crate) fn migrate(conn: &mut Connection, ctx: &ErrorContext) -> StoreResult<Vec<i64>> {
    let map = |e| ctx.map(e, Phase::Open);
    let current = applied_version(conn).map_err(map)?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            database: ctx.path.display().to_string(),
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    let mut applied = Vec::new();
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|e| ctx.map_sqlite(e, Phase::Open))?;
        // Another process may have migrated while we waited for the lock.
        let now_current = applied_version(&tx).map_err(map)?;
        if now_current >= migration.version {
            continue;
        }
        let step = || -> DbResult<()> {
            tx.execute_batch(CREATE_TABLE)?;
            tx.execute_batch(migration.sql)?;
            tx.execute(
                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                params![migration.version, migration.name, SystemClock.now_ms()],
            )?;
            Ok(())
        };
        step().map_err(map)?;
        tx.commit().map_err(|e| ctx.map_sqlite(e, Phase::Open))?;
        tracing::info!(path = %ctx.path.display(), version = migration.version, name = migration.name, "applied migration");
        applied.push(migration.version);
    }
    Ok(applied)
}

/// Every known migration with its applied time in this database, plus any unknown newer ones.
pub(crate) fn status(conn: &Connection, ctx: &ErrorContext) -> StoreResult<Vec<MigrationStatus>> {
    let read = || -> DbResult<Vec<MigrationStatus>> {
        let mut recorded: Vec<(i64, String, i64)> = Vec::new();
        if applied_version(conn)? > 0 {
            let mut stmt = conn.prepare(
                "SELECT version, name, applied_at FROM schema_migrations ORDER BY version",
            )?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            for row in rows {
                recorded.push(row?);
            }
        }
        let mut out: Vec<MigrationStatus> = MIGRATIONS
            .iter()
            .map(|m| MigrationStatus {
                version: m.version,
                name: m.name.to_owned(),
                applied_at: recorded.iter().find(|r| r.0 == m.version).map(|r| r.2),
            })
            .collect();
        for (version, name, at) in recorded {
            if !MIGRATIONS.iter().any(|m| m.version == version) {
                out.push(MigrationStatus {
                    version,
                    name,
                    applied_at: Some(at),
                });
            }
        }
        Ok(out)
    };
    read().map_err(|e| ctx.map(e, Phase::Open))
}

#[async_trait::async_trait]
impl clawgate_store::SchemaStore for crate::SqliteStore {
    fn database(&self) -> String {
        self.path().display().to_string()
    }

    fn supported_schema_version(&self) -> i64 {
        SCHEMA_VERSION
    }

    async fn migration_status(&self) -> StoreResult<Vec<MigrationStatus>> {
        let ctx = self.error_context().clone();
        self.read(move |conn| status(conn, &ctx).map_err(super::errors::DbError::from))
            .await
    }
}
