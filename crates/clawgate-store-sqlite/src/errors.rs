//! Mapping SQLite failures to the typed [`StoreError`]s users can act on.

use std::path::{Path, PathBuf};

use rusqlite::ErrorCode;

use clawgate_store::StoreError;

/// An error inside a database job: either SQLite's own (mapped once the path is known) or an
/// already typed store error (conflicts, decode failures…).
#[derive(Debug)]
pub(crate) enum DbError {
    Sqlite(rusqlite::Error),
    Store(StoreError),
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        DbError::Sqlite(e)
    }
}

impl From<StoreError> for DbError {
    fn from(e: StoreError) -> Self {
        DbError::Store(e)
    }
}

pub(crate) type DbResult<T> = Result<T, DbError>;

/// Where the database is and how long it waits for locks: what an error message needs.
#[derive(Debug, Clone)]
pub(crate) struct ErrorContext {
    pub(crate) path: PathBuf,
    pub(crate) busy_timeout_ms: u64,
}

/// During open and migration a busy database means another process holds it: "locked".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Open,
    Operate,
}

impl ErrorContext {
    pub(crate) fn map(&self, error: DbError, phase: Phase) -> StoreError {
        match error {
            DbError::Store(e) => e,
            DbError::Sqlite(e) => self.map_sqlite(e, phase),
        }
    }

    pub(crate) fn map_sqlite(&self, error: rusqlite::Error, phase: Phase) -> StoreError {
        let path = self.path.clone();
        let database = self.path.display().to_string();
        let timeout_ms = self.busy_timeout_ms;
        match error.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy) if phase == Phase::Open => StoreError::Locked {
                database,
                timeout_ms,
            },
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy {
                database,
                timeout_ms,
            },
            Some(ErrorCode::ReadOnly) => StoreError::ReadOnly {
                database,
                detail: error.to_string(),
            },
            Some(ErrorCode::DiskFull) => StoreError::DiskFull { database },
            // The WAL index (`-shm`) could not grow: on a full disk that is where SQLite trips
            // first (code 4874), before any write of the database itself.
            Some(ErrorCode::SystemIoFailure) if is_shm_size_failure(&error) => {
                StoreError::DiskFull { database }
            }
            Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) => StoreError::Corrupt {
                database,
                detail: error.to_string(),
            },
            Some(ErrorCode::CannotOpen | ErrorCode::PermissionDenied) => {
                if parent_missing(&path) {
                    StoreError::MissingDirectory {
                        path: parent_of(&path),
                    }
                } else {
                    StoreError::ReadOnly {
                        database,
                        detail: error.to_string(),
                    }
                }
            }
            _ => StoreError::Database {
                database,
                source: Box::new(error),
            },
        }
    }
}

fn is_shm_size_failure(error: &rusqlite::Error) -> bool {
    matches!(error, rusqlite::Error::SqliteFailure(e, _)
        if e.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE)
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn parent_missing(path: &Path) -> bool {
    path.parent()
        .is_some_and(|p| !p.as_os_str().is_empty() && !p.is_dir())
}

/// A copy of a SQLite error, so one failed commit can be reported to every write in its batch.
pub(crate) fn duplicate(error: &rusqlite::Error) -> rusqlite::Error {
    match error {
        rusqlite::Error::SqliteFailure(code, message) => {
            rusqlite::Error::SqliteFailure(*code, message.clone())
        }
        other => rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(other.to_string()),
        ),
    }
}
