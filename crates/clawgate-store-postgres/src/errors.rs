//! Mapping PostgreSQL failures to the typed [`StoreError`]s users can act on: one place for every
//! SQLSTATE the store treats specially.

use clawgate_store::StoreError;
use tokio_postgres::error::SqlState;

/// An error inside a database job: PostgreSQL's own (mapped once the database is known), an
/// already typed store error (conflicts, decode failures…), or a failure the job asks to be
/// retried from the start (a race another transaction won, as a serialization failure is).
#[derive(Debug)]
pub(crate) enum DbError {
    Pg(tokio_postgres::Error),
    Store(StoreError),
    Retry(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        DbError::Pg(e)
    }
}

impl From<StoreError> for DbError {
    fn from(e: StoreError) -> Self {
        DbError::Store(e)
    }
}

pub(crate) type DbResult<T> = Result<T, DbError>;

/// What an error message needs: the server as `host:port/dbname` (never the password) and the
/// lock timeout the connections run with.
#[derive(Debug, Clone)]
pub(crate) struct ErrorContext {
    pub(crate) database: String,
    pub(crate) lock_timeout_ms: u64,
}

/// How the store reacts to an error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reaction {
    /// Run the whole transaction again (serialization failure, deadlock, a lost race).
    Retry,
    Fail,
}

/// Whether a failed transaction may simply be run again.
pub(crate) fn reaction(error: &DbError) -> Reaction {
    match error {
        DbError::Retry(_) => Reaction::Retry,
        DbError::Pg(e) => match e.code() {
            Some(code)
                if *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::T_R_DEADLOCK_DETECTED =>
            {
                Reaction::Retry
            }
            _ => Reaction::Fail,
        },
        DbError::Store(_) => Reaction::Fail,
    }
}

impl ErrorContext {
    pub(crate) fn map(&self, error: DbError) -> StoreError {
        match error {
            DbError::Store(e) => e,
            DbError::Pg(e) | DbError::Retry(e) => self.map_pg(e),
        }
    }

    /// Retries ran out: the contention did not clear.
    pub(crate) fn busy(&self) -> StoreError {
        StoreError::Busy {
            database: self.database.clone(),
            timeout_ms: self.lock_timeout_ms,
        }
    }

    pub(crate) fn unavailable(&self, detail: impl Into<String>) -> StoreError {
        StoreError::Unavailable {
            database: self.database.clone(),
            detail: detail.into(),
        }
    }

    pub(crate) fn map_pg(&self, error: tokio_postgres::Error) -> StoreError {
        let database = self.database.clone();
        let Some(code) = error.code() else {
            // No SQLSTATE: the connection itself failed (refused, timed out, closed under us,
            // or TLS could not be set up).
            if let Some(detail) = crate::tls::failure_detail(&error) {
                return self.unavailable(detail);
            }
            return self.unavailable(error_chain(&error));
        };
        let detail = || {
            error
                .as_db_error()
                .map_or_else(|| error.to_string(), |db| db.message().to_owned())
        };
        if *code == SqlState::DISK_FULL {
            StoreError::DiskFull { database }
        } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
            StoreError::ReadOnly {
                database,
                detail: detail(),
            }
        } else if *code == SqlState::LOCK_NOT_AVAILABLE
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            self.busy()
        } else if unreachable_server(code) {
            self.unavailable(detail())
        } else {
            StoreError::Database {
                database,
                source: Box::new(ServerError {
                    text: error_chain(&error),
                    error,
                }),
            }
        }
    }

    /// A failure of the pool: no connection in time, or one that could not be made.
    pub(crate) fn map_pool(&self, error: deadpool_postgres::PoolError) -> StoreError {
        match error {
            deadpool_postgres::PoolError::Backend(e) => self.map_pg(e),
            deadpool_postgres::PoolError::Timeout(kind) => self.unavailable(format!(
                "no connection within the connect timeout ({kind:?}): the server does not \
                 answer, or every pooled connection is busy"
            )),
            other => StoreError::Backend(Box::new(other)),
        }
    }
}

/// Server states in which it answers but serves nobody: shutting down, starting, full, the
/// database or role missing, authentication refused. None is this gateway's data's fault.
fn unreachable_server(code: &SqlState) -> bool {
    code.code().starts_with("08")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
        ]
        .contains(code)
}

/// An error and its causes in one line ("error connecting to server: Connection refused").
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The server's error, shown with its message and SQLSTATE (tokio-postgres alone shows
/// "db error"), keeping the original as its source.
#[derive(Debug)]
struct ServerError {
    text: String,
    error: tokio_postgres::Error,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.error.code() {
            Some(code) => write!(f, "{} (SQLSTATE {})", self.text, code.code()),
            None => f.write_str(&self.text),
        }
    }
}

impl std::error::Error for ServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
