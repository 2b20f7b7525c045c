//! Numbered SQL migrations embedded in the binary, applied under a PostgreSQL advisory lock (two
//! gateways starting at once migrate once), each in its own transaction, recorded with its
//! SHA-256 in `clawgate_schema_migrations`. Every open checks the recorded checksums: an applied
//! migration that changed is refused, as is a schema written by a newer build.

use std::time::{SystemTime, UNIX_EPOCH};

use clawgate_store::{StoreError, StoreResult};
use sha2::{Digest, Sha256};
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::errors::{DbError, DbResult, ErrorContext};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// The SHA-256 of the migration's SQL, in lower-case hex (what the table records).
    pub fn checksum(&self) -> String {
        hex(&Sha256::digest(self.sql.as_bytes()))
    }
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
        name: "account_leases",
        sql: include_str!("../migrations/0002_account_leases.sql"),
    },
    Migration {
        version: 3,
        name: "quiet_send_path",
        sql: include_str!("../migrations/0003_quiet_send_path.sql"),
    },
    Migration {
        version: 4,
        name: "agent_global_sessions",
        sql: include_str!("../migrations/0004_agent_global_sessions.sql"),
    },
    Migration {
        version: 5,
        name: "channel_state",
        sql: include_str!("../migrations/0005_channel_state.sql"),
    },
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = 5;

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS clawgate_schema_migrations (
    version    BIGINT PRIMARY KEY,
    name       TEXT NOT NULL,
    checksum   TEXT NOT NULL,
    applied_at BIGINT NOT NULL
)";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The advisory-lock key of one schema's migrations: gateways on other schemas of the same
/// database do not wait for each other.
fn lock_key(schema: &str) -> i64 {
    let digest = Sha256::digest(format!("clawgate-migrate:{schema}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Connects a client outside the pool, its connection driven by a task of its own.
pub(crate) async fn connect(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    ctx: &ErrorContext,
) -> StoreResult<Client> {
    let (client, connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| ctx.map_pg(e))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "PostgreSQL connection closed");
        }
    });
    Ok(client)
}

/// Creates the schema if needed and applies pending migrations; returns the schema's name.
pub(crate) async fn migrate(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    schema: Option<&str>,
    ctx: &ErrorContext,
) -> StoreResult<String> {
    let mut client = connect(config, tls, ctx).await?;
    let schema = schema_name(&client, schema, ctx).await?;
    // Waits as long as another gateway migrates (no lock timeout for this one lock).
    client
        .batch_execute("SET lock_timeout = 0")
        .await
        .map_err(|e| ctx.map_pg(e))?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&lock_key(&schema)])
        .await
        .map_err(|e| ctx.map_pg(e))?;
    let outcome = migrate_locked(&mut client, &schema, ctx).await;
    // Closing the session would release the lock too; unlocking says so at once.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&lock_key(&schema)])
        .await;
    outcome?;
    unlocked.map_err(|e| ctx.map_pg(e))?;
    Ok(schema)
}

/// The schema named in the options, else the first of the server's `search_path`.
async fn schema_name(
    client: &Client,
    schema: Option<&str>,
    ctx: &ErrorContext,
) -> StoreResult<String> {
    match schema {
        Some(schema) => Ok(schema.to_owned()),
        None => client
            .query_one("SELECT current_schema()", &[])
            .await
            .map_err(|e| ctx.map_pg(e))?
            .try_get::<_, Option<String>>(0)
            .map_err(|e| ctx.map_pg(e))?
            .ok_or_else(|| {
                StoreError::InvalidInput(
                    "the server's search_path names no existing schema: set a schema in the \
                     PostgreSQL options"
                        .into(),
                )
            }),
    }
}

/// Checks, changing nothing, that the schema holds exactly this build's migrations; returns
/// the schema's name. A missing schema or migrations table is version 0.
pub(crate) async fn require_current(
    config: &tokio_postgres::Config,
    tls: &MakeRustlsConnect,
    schema: Option<&str>,
    ctx: &ErrorContext,
) -> StoreResult<String> {
    let client = connect(config, tls, ctx).await?;
    let schema = schema_name(&client, schema, ctx).await?;
    let table = format!("\"{schema}\".clawgate_schema_migrations");
    let exists: Option<String> = client
        .query_one("SELECT to_regclass($1)::text", &[&table])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| ctx.map_pg(e))?;
    let applied = if exists.is_some() {
        client
            .batch_execute(&format!("SET search_path TO \"{schema}\""))
            .await
            .map_err(|e| ctx.map_pg(e))?;
        applied(&client).await.map_err(|e| ctx.map(e))?
    } else {
        Vec::new()
    };
    check_applied(&applied, &schema, ctx)?;
    let found = applied.last().map_or(0, |m| m.0);
    if found < SCHEMA_VERSION {
        return Err(StoreError::OlderSchema {
            database: format!("{} (schema {schema})", ctx.database),
            found,
            needed: SCHEMA_VERSION,
        });
    }
    Ok(schema)
}

async fn migrate_locked(client: &mut Client, schema: &str, ctx: &ErrorContext) -> StoreResult<()> {
    let map = |e: DbError| ctx.map(e);
    // The name was checked to need no quoting (or came from the server's own search_path).
    let setup = format!(
        "CREATE SCHEMA IF NOT EXISTS \"{schema}\"; SET search_path TO \"{schema}\"; {CREATE_TABLE}"
    );
    client
        .batch_execute(&setup)
        .await
        .map_err(|e| ctx.map_pg(e))?;
    let applied = applied(client).await.map_err(map)?;
    check_applied(&applied, schema, ctx)?;
    let current = applied.last().map_or(0, |m| m.0);
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        let step = async {
            let tx = client.transaction().await?;
            tx.batch_execute(migration.sql).await?;
            tx.execute(
                "INSERT INTO clawgate_schema_migrations (version, name, checksum, applied_at)
                 VALUES ($1, $2, $3, $4)",
                &[
                    &migration.version,
                    &migration.name,
                    &migration.checksum(),
                    &now_ms(),
                ],
            )
            .await?;
            tx.commit().await?;
            DbResult::Ok(())
        };
        step.await.map_err(map)?;
        tracing::info!(database = %ctx.database, schema, version = migration.version, name = migration.name, "applied migration");
    }
    Ok(())
}

/// Every known migration with its applied time, plus any newer ones a newer build recorded.
pub(crate) async fn status(client: &Client) -> DbResult<Vec<clawgate_store::MigrationStatus>> {
    let rows = client
        .query(
            "SELECT version, name, applied_at FROM clawgate_schema_migrations ORDER BY version",
            &[],
        )
        .await?;
    let mut recorded: Vec<(i64, String, i64)> = Vec::new();
    for row in &rows {
        recorded.push((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?));
    }
    let mut out: Vec<clawgate_store::MigrationStatus> = MIGRATIONS
        .iter()
        .map(|m| clawgate_store::MigrationStatus {
            version: m.version,
            name: m.name.to_owned(),
            applied_at: recorded
                .iter()
                .find(|(v, _, _)| *v == m.version)
                .map(|(_, _, at)| *at),
        })
        .collect();
    out.extend(
        recorded
            .into_iter()
            .filter(|(v, _, _)| *v > SCHEMA_VERSION)
            .map(|(version, name, at)| clawgate_store::MigrationStatus {
                version,
                name,
                applied_at: Some(at),
            }),
    );
    Ok(out)
}

/// `(version, name, checksum)` of every recorded migration, in order.
async fn applied(client: &Client) -> DbResult<Vec<(i64, String, String)>> {
    let rows = client
        .query(
            "SELECT version, name, checksum FROM clawgate_schema_migrations ORDER BY version",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
}

/// Refuses a schema written by a newer build, and one whose applied migrations differ from
/// this build's (edited after they were applied, or another program's).
fn check_applied(
    applied: &[(i64, String, String)],
    schema: &str,
    ctx: &ErrorContext,
) -> StoreResult<()> {
    let found = applied.last().map_or(0, |m| m.0);
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            database: format!("{} (schema {schema})", ctx.database),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, name, checksum) in applied {
        let known = MIGRATIONS.iter().find(|m| m.version == *version);
        let Some(known) = known else {
            return Err(corrupt(
                ctx,
                schema,
                format!("it records migration {version} ({name}), which this build does not have"),
            ));
        };
        let expected = known.checksum();
        if *checksum != expected {
            return Err(corrupt(
                ctx,
                schema,
                format!(
                    "applied migration {version} ({name}) has checksum {checksum}, but this \
                     build's migration {version} ({}) has {expected}: the migration was changed \
                     after it was applied, so the schema may not be what this build expects",
                    known.name
                ),
            ));
        }
    }
    Ok(())
}

fn corrupt(ctx: &ErrorContext, schema: &str, detail: String) -> StoreError {
    StoreError::Corrupt {
        database: format!("{} (schema {schema})", ctx.database),
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_from_one_without_gaps() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i64::try_from(i).unwrap_or(-1) + 1, "{}", m.name);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn lock_keys_differ_per_schema() {
        assert_ne!(lock_key("a"), lock_key("b"));
        assert_eq!(lock_key("a"), lock_key("a"));
    }
}
