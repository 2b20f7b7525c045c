//! The one place a store is opened: `[state] backend` picks the backend, everything after holds
//! it as `Arc<dyn Store>`.

use std::path::Path;
use std::sync::Arc;

use clawgate_store::{Store, StoreError};
use clawgate_store_sqlite::{CommitHook, SqliteOptions, SqliteStore, Synchronous};

use crate::config::{Config, StateBackend, SyncMode};

/// Opens (creating and migrating if needed) the store `config` names. `state_dir` is the
/// gateway's own directory, already created and locked by the caller; `commit_hook` is the
/// crash points' hook (SQLite only, where commits are ours to stop).
pub async fn open(
    config: &Config,
    state_dir: &Path,
    commit_hook: Option<CommitHook>,
) -> Result<Arc<dyn Store>, StoreError> {
    match config.state.backend {
        StateBackend::Sqlite => {
            let options = SqliteOptions {
                commit_hook,
                ..sqlite_options(config)
            };
            let dir = state_dir.to_path_buf();
            // Opening runs migrations and syncs the file: off the runtime's threads.
            let store =
                tokio::task::spawn_blocking(move || SqliteStore::open_state_dir(&dir, options))
                    .await
                    .map_err(|e| StoreError::Backend(Box::new(e)))??;
            Ok(Arc::new(store))
        }
        StateBackend::Postgres => Err(StoreError::InvalidInput(
            "the PostgreSQL backend is not built into this binary".into(),
        )),
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
