//! The one place a store is opened: `[state] backend` picks the backend, everything after holds
//! it as `Arc<dyn Store>`.

use std::path::Path;
use std::sync::Arc;

use clawgate_store::{MigrationStatus, Store, StoreError};
use clawgate_store_postgres::{PostgresOptions, PostgresStore, PostgresTls};
use clawgate_store_sqlite::{CommitHook, STATE_DB_FILE, SqliteOptions, SqliteStore, Synchronous};
use clawgate_types::GatewayInstanceId;

use crate::config::{Config, PostgresTlsMode, StateBackend, SyncMode};

/// The file in a state directory that keeps this gateway's instance id when the database is
/// shared (a SQLite state keeps it in the database).
pub const INSTANCE_FILE: &str = "instance-id";

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "[state] backend = \"postgres\" takes its connection URL from the environment variable \
         {0}, which is not set: export {0}=postgres://user:password@host:port/dbname (the URL \
         never goes into the configuration file)"
    )]
    MissingUrl(String),
    #[error("cannot keep this gateway's instance id in {path}: {source}")]
    InstanceFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether opening a state may migrate its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Migrations {
    /// Create and migrate as needed: a gateway's start, `clawgate migrate`.
    Apply,
    /// Refuse a schema that is not current (`StoreError::OlderSchema`) and change nothing: an
    /// operator's command on a stopped gateway's state.
    RequireCurrent,
}

/// Opens the store `config` names. `state_dir` is the gateway's own directory, already created
/// and locked by the caller; `commit_hook` is the crash points' hook (SQLite only, where
/// commits are ours to stop).
pub async fn open(
    config: &Config,
    state_dir: &Path,
    migrations: Migrations,
    commit_hook: Option<CommitHook>,
) -> Result<Arc<dyn Store>, OpenError> {
    match config.state.backend {
        StateBackend::Sqlite => {
            let options = SqliteOptions {
                commit_hook,
                ..sqlite_options(config)
            };
            let dir = state_dir.to_path_buf();
            if migrations == Migrations::RequireCurrent {
                require_current_sqlite(&dir.join(STATE_DB_FILE), &options)?;
            }
            // Opening runs migrations and syncs the file: off the runtime's threads.
            let store =
                tokio::task::spawn_blocking(move || SqliteStore::open_state_dir(&dir, options))
                    .await
                    .map_err(|e| StoreError::Backend(Box::new(e)))??;
            Ok(Arc::new(store))
        }
        StateBackend::Postgres => {
            let variable = &config.state.postgres_url_env;
            let url = std::env::var(variable)
                .ok()
                .filter(|url| !url.trim().is_empty())
                .ok_or_else(|| OpenError::MissingUrl(variable.clone()))?;
            let mut options = PostgresOptions::new(url, instance_id(state_dir)?);
            options.pool_size = usize::try_from(config.state.postgres_pool_size).unwrap_or(1);
            options.schema = config.state.postgres_schema.clone();
            options.tls = match config.state.postgres_tls {
                PostgresTlsMode::Auto => PostgresTls::Auto,
                PostgresTlsMode::Require => PostgresTls::Require,
                PostgresTlsMode::Disable => PostgresTls::Disable,
            };
            options.ca_file = config.state.postgres_ca_file.clone();
            options.apply_migrations = migrations == Migrations::Apply;
            Ok(Arc::new(PostgresStore::open(options).await?))
        }
    }
}

/// The SQLite state file holds exactly this build's migrations (a missing file is version 0).
fn require_current_sqlite(db: &Path, options: &SqliteOptions) -> Result<(), StoreError> {
    let statuses = if db.exists() {
        clawgate_store_sqlite::migration_status(db, options)?
    } else {
        Vec::new()
    };
    let found = applied_version(&statuses);
    if found < clawgate_store_sqlite::SCHEMA_VERSION {
        return Err(StoreError::OlderSchema {
            database: db.display().to_string(),
            found,
            needed: clawgate_store_sqlite::SCHEMA_VERSION,
        });
    }
    Ok(())
}

/// The newest applied migration's version (0 when none is).
pub(crate) fn applied_version(statuses: &[MigrationStatus]) -> i64 {
    statuses
        .iter()
        .filter(|m| m.applied_at.is_some())
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
}

/// This gateway's instance id on a shared database: created once, then read from
/// `<state_dir>/instance-id`. Each gateway reaps only its own instance's agent leases, so the
/// id must survive restarts and differ between gateways.
fn instance_id(state_dir: &Path) -> Result<GatewayInstanceId, OpenError> {
    let path = state_dir.join(INSTANCE_FILE);
    let io = |source| OpenError::InstanceFile {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => GatewayInstanceId::parse(text.trim()).map_err(|e| {
            io(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{e}; remove the file to give this gateway a new id"),
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = uuid::Uuid::now_v7().hyphenated().to_string();
            // Written aside and renamed: a crash never leaves half an id.
            let partial = state_dir.join(format!("{INSTANCE_FILE}.partial"));
            std::fs::write(&partial, &id).map_err(io)?;
            std::fs::rename(&partial, &path).map_err(io)?;
            GatewayInstanceId::parse(id).map_err(|e| {
                io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    e.to_string(),
                ))
            })
        }
        Err(e) => Err(io(e)),
    }
}

/// The SQLite options `config` asks for (the `[durability] sync` mode).
pub fn sqlite_options(config: &Config) -> SqliteOptions {
    SqliteOptions {
        synchronous: match config.durability.sync {
            SyncMode::Full => Synchronous::Full,
            SyncMode::Normal => Synchronous::Normal,
        },
        ..SqliteOptions::default()
    }
}
