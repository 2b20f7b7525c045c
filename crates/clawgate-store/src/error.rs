//! Typed storage errors. Each one a user can hit names the file and what to do about it.

use std::path::PathBuf;

use clawgate_types::{IllegalTransition, IntentStatus, LeaseState};

/// Everything a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state directory {path} does not exist: create it or pass another --state-dir")]
    MissingDirectory { path: PathBuf },

    #[error(
        "state database {path} is locked by another process (it holds the write lock past the \
         {timeout_ms} ms busy timeout): stop the other gateway or pass another --state-dir"
    )]
    Locked { path: PathBuf, timeout_ms: u64 },

    #[error(
        "state database {path} stayed busy past the {timeout_ms} ms busy timeout: another \
         process is writing heavily; retry, or raise the busy timeout"
    )]
    Busy { path: PathBuf, timeout_ms: u64 },

    #[error(
        "state database {path} is read-only ({detail}): make the file and its directory \
         writable by this user, or pass another --state-dir"
    )]
    ReadOnly { path: PathBuf, detail: String },

    #[error(
        "the disk holding state database {path} is full (or the database hit its size limit): \
         free space and retry; nothing stored was lost, the failed write was rolled back"
    )]
    DiskFull { path: PathBuf },

    #[error(
        "state database {path} is corrupt or not a SQLite database ({detail}): it was left \
         untouched; restore it from a backup, or move it aside to start empty"
    )]
    Corrupt { path: PathBuf, detail: String },

    #[error(
        "state database {path} has schema version {found}, newer than the {supported} this \
         build knows: run a newer clawgate, or use another --state-dir"
    )]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },

    #[error(
        "stored {what} {id} uses payload format {found}, newer than the {supported} this build \
         reads: run a newer clawgate (the row was left untouched)"
    )]
    NewerPayloadFormat {
        what: &'static str,
        id: String,
        found: i64,
        supported: i64,
    },

    #[error("stored {what} {id} cannot be decoded: {source}")]
    Decode {
        what: &'static str,
        id: String,
        #[source]
        source: clawgate_types::WireError,
    },

    #[error("no {what} with id {id}")]
    NotFound { what: &'static str, id: String },

    #[error("send intent {id} is {actual}, expected {expected}: another worker changed it first")]
    IntentStatusConflict {
        id: String,
        expected: IntentStatus,
        actual: IntentStatus,
    },

    #[error("send intent {id}: {source}")]
    IllegalTransition {
        id: String,
        #[source]
        source: IllegalTransition,
    },

    #[error(
        "send intent {id} is already at attempt {stored_attempt}, so attempt {attempt} from this \
         worker's copy is stale: another worker took it in between"
    )]
    StaleIntent {
        id: String,
        attempt: u32,
        stored_attempt: u32,
    },

    #[error("send intent {id} is claimed by {holder} until {until_ms}: another worker owns it")]
    ClaimHeld {
        id: String,
        holder: String,
        until_ms: i64,
    },

    #[error("lease {id} is {actual}, expected {expected}")]
    LeaseStateConflict {
        id: String,
        expected: LeaseState,
        actual: LeaseState,
    },

    #[error("invalid input to the store: {0}")]
    InvalidInput(String),

    #[error("the store's writer has stopped (the gateway is shutting down or the writer crashed)")]
    WriterStopped,

    #[error("state database {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },

    /// A backend other than SQLite reports its own error here.
    #[error("storage backend error: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    /// Whether retrying the same operation later may succeed (contention, not a broken store).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Busy { .. } | StoreError::Locked { .. } | StoreError::DiskFull { .. }
        )
    }
}

pub type StoreResult<T> = Result<T, StoreError>;
