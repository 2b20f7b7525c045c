//! What the awareness API can fail with. Appends to the signal log never appear here: they are
//! best effort and never fail the caller's turn.

use clawgate_store::StoreError;
use clawgate_types::SessionKey;

/// Errors of the registry and the session tools.
#[derive(Debug, thiserror::Error)]
pub enum AwarenessError {
    /// Deliberately the same answer for "missing" and "hidden": a requester must not learn that
    /// a session it may not see exists.
    #[error(
        "session {key} does not exist or is not visible to {requester}: check the key, or the \
         configuration's `[sessions] visibility` and `[sessions] a2a` (agent-to-agent policy)"
    )]
    NotVisible {
        key: SessionKey,
        requester: SessionKey,
    },

    #[error("session {key} already exists: reset or delete it first, or use another key")]
    AlreadyExists { key: SessionKey },

    #[error("session {key} does not exist")]
    UnknownSession { key: SessionKey },

    #[error("invalid input: {0}")]
    InvalidInput(String),

    #[error("sessions_send to {key} was not delivered: {source}")]
    Delivery {
        key: SessionKey,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error(transparent)]
    Store(#[from] StoreError),
}

pub type AwarenessResult<T> = Result<T, AwarenessError>;
