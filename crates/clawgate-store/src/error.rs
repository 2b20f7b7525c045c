//! Typed storage errors, the same for every backend. Each one a user can hit names the database
//! (a SQLite file's path, or a PostgreSQL server's `host:port/dbname`, never its password) and
//! what to do about it; a backend's own error is wrapped in [`StoreError::Database`].

use std::path::PathBuf;

use clawgate_types::{IllegalTransition, IntentStatus, LeaseState};

/// Everything a store operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state directory {path} does not exist: create it or pass another --state-dir")]
    MissingDirectory { path: PathBuf },

    #[error(
        "state database {database} is locked by another process (it holds the write lock past \
         the {timeout_ms} ms busy timeout): stop the other gateway or pass another --state-dir"
    )]
    Locked { database: String, timeout_ms: u64 },

    #[error(
        "state database {database} stayed busy past the {timeout_ms} ms busy timeout: another \
         process is writing heavily; retry in a moment, and if it stays busy find that process \
         (`fuser {database}`): only one gateway may write a state directory"
    )]
    Busy { database: String, timeout_ms: u64 },

    #[error(
        "state database {database} is read-only ({detail}): make it writable for this gateway \
         (a file and its directory by this user; on a server, a primary and a role that may \
         write), or use another state"
    )]
    ReadOnly { database: String, detail: String },

    #[error(
        "the disk holding state database {database} is full (or the database hit its size \
         limit): free space and retry; nothing stored was lost, the failed write was rolled back"
    )]
    DiskFull { database: String },

    #[error(
        "state database {database} is corrupt or not a clawgate database ({detail}): it was \
         left untouched; restore it from a backup, or move it aside to start empty"
    )]
    Corrupt { database: String, detail: String },

    #[error(
        "state database {database} has schema version {found}, newer than the {supported} this \
         build knows: run a newer clawgate, or use another state"
    )]
    NewerSchema {
        database: String,
        found: i64,
        supported: i64,
    },

    #[error(
        "state database {database} is at schema version {found}, this build needs {needed}: run \
         `clawgate migrate` first (a gateway's start migrates it too)"
    )]
    OlderSchema {
        database: String,
        found: i64,
        needed: i64,
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

    #[error(
        "cannot reach state database {database} ({detail}): check that the server runs and \
         accepts this gateway's connections; nothing was written"
    )]
    Unavailable { database: String, detail: String },

    /// The backend's own error, for what no variant above describes.
    #[error("state database {database}: {source}")]
    Database {
        database: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A failure around the backend (a worker task that died, a pool that gave no connection).
    #[error("storage backend error: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

impl StoreError {
    /// Whether retrying the same operation later may succeed (contention, not a broken store).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Busy { .. }
                | StoreError::Locked { .. }
                | StoreError::DiskFull { .. }
                | StoreError::Unavailable { .. }
        )
    }
}

pub type StoreResult<T> = Result<T, StoreError>;
