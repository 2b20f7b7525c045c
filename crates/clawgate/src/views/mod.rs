//! The operator views: what `clawgate status | outbox | inbox | leases | sessions` show and
//! change, and the operator console's per-minute figures (`metrics`), as plain async functions
//! over the store, the session tools and the lease controller (one submodule per family; the QA
//! channel's views are `crate::qa`'s).
//!
//! The CLI calls them directly on a stopped gateway's state directory; the control API
//! ([`crate::control`]) serves the same functions from a running gateway. Both modes therefore
//! answer with the same wire shapes — the types below (the session tools' results are
//! `clawgate-awareness`'s own, re-exported), whose JSON Schemas `cargo xtask codegen` writes to
//! `docs/schema/`.
//!
//! Invariants:
//! * intent changes go through `IntentStatus::can_transition_to` and the store's compare-and-set:
//!   a concurrent change or a live claim is refused, never overwritten;
//! * the operator is an unsandboxed requester with visibility `all` and every agent allowed —
//!   it sees every session, and nothing else is widened for anyone.

use clawgate_acpx::AcpxError;
use clawgate_awareness::AwarenessError;
use clawgate_store::StoreError;
use serde::{Deserialize, Serialize};

mod inbox;
mod leases;
mod metrics;
mod outbox;
mod sessions;
mod status;

pub use inbox::*;
pub use leases::*;
pub use metrics::*;
pub use outbox::*;
pub use sessions::*;
pub use status::*;

/// Rows a listing returns unless told otherwise.
pub const DEFAULT_LIMIT: u32 = 50;
/// The most rows one listing returns (page with filters beyond that).
pub const MAX_LIMIT: u32 = 1_000;
/// Inbound counts in `status` stop here (the store has no count query; the records carry
/// payloads, so counting means reading them).
pub const INBOUND_COUNT_CAP: u32 = 10_000;
/// Characters of message text shown in listings.
pub const PREVIEW_CHARS: usize = 80;
/// The session key the operator acts as in the session tools (and `session:operator` is the
/// author of what it sends into a conversation).
pub const OPERATOR_SESSION_KEY: &str = "operator";

/// Why a view could not answer. Each message says what to do; the control API maps the kind
/// to an HTTP status ([`ViewError::http_status`]).
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// The change is not legal from the current state, or someone else changed it first.
    #[error("{0}")]
    Conflict(String),
    /// Well-formed, but a value is over a limit (a message longer than the platform takes):
    /// the message names the limit.
    #[error("{0}")]
    Unprocessable(String),
    /// Needs a running gateway (its QA platform, its agents).
    #[error("{0}")]
    NeedsGateway(String),
    /// A platform the gateway talks to failed.
    #[error("{0}")]
    Upstream(String),
    /// The state database is busy or out of reach for now (a lock held, a server away): the
    /// same request may succeed in a moment. Never reported as "not found" or "not visible".
    #[error("{0}")]
    Unavailable(String),
    // Boxed: these are large, and every view returns this error.
    #[error("state database: {0}")]
    Store(Box<StoreError>),
    #[error("session tools: {0}")]
    Sessions(Box<AwarenessError>),
    #[error("agent leases: {0}")]
    Acpx(Box<AcpxError>),
}

impl ViewError {
    pub fn http_status(&self) -> u16 {
        match self {
            ViewError::BadRequest(_) => 400,
            ViewError::NotFound(_) => 404,
            ViewError::Conflict(_) => 409,
            ViewError::Unprocessable(_) => 422,
            ViewError::NeedsGateway(_) => 503,
            ViewError::Upstream(_) => 502,
            ViewError::Unavailable(_) => 503,
            ViewError::Store(_) | ViewError::Sessions(_) | ViewError::Acpx(_) => 500,
        }
    }
}

impl From<StoreError> for ViewError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound { .. } => ViewError::NotFound(error.to_string()),
            StoreError::IntentStatusConflict { .. }
            | StoreError::IllegalTransition { .. }
            | StoreError::ClaimHeld { .. }
            | StoreError::StaleIntent { .. }
            | StoreError::LeaseStateConflict { .. } => ViewError::Conflict(format!(
                "{error}; look again (`clawgate outbox show`) and retry if it still applies"
            )),
            transient if transient.is_transient() => {
                ViewError::Unavailable(format!("{transient} (retry in a moment)"))
            }
            other => ViewError::Store(Box::new(other)),
        }
    }
}

impl From<AwarenessError> for ViewError {
    fn from(error: AwarenessError) -> Self {
        match error {
            AwarenessError::NotVisible { .. } | AwarenessError::UnknownSession { .. } => {
                ViewError::NotFound(format!("{error} (`clawgate sessions list` shows them)"))
            }
            AwarenessError::InvalidInput(_) => ViewError::BadRequest(error.to_string()),
            AwarenessError::Delivery { .. } => ViewError::Upstream(error.to_string()),
            AwarenessError::Store(e) => ViewError::from(e),
            other => ViewError::Sessions(Box::new(other)),
        }
    }
}

impl From<AcpxError> for ViewError {
    fn from(error: AcpxError) -> Self {
        match error {
            AcpxError::Store(e) => ViewError::from(e),
            other => ViewError::Acpx(Box::new(other)),
        }
    }
}

/// Every control API error: the status code says the kind (400 bad parameters or an unknown
/// field, 401 no or wrong token, 404 unknown intent or session, 409 illegal transition or changed
/// meanwhile, 413 a body over the limit, 422 a value over a limit (a message longer than the
/// platform takes), 502 a platform failed, 503 needs what is not there or the state database is
/// busy or out of reach for now), `error` says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    pub error: String,
}

/// Text on one line, at most [`PREVIEW_CHARS`] characters (an ellipsis marks a cut).
pub fn preview(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= PREVIEW_CHARS {
        return line;
    }
    let mut cut: String = line.chars().take(PREVIEW_CHARS - 1).collect();
    cut.push('…');
    cut
}

fn limit_of(limit: Option<u32>) -> Result<u32, ViewError> {
    match limit.unwrap_or(DEFAULT_LIMIT) {
        0 => Err(ViewError::BadRequest("limit must be at least 1".into())),
        n if n > MAX_LIMIT => Err(ViewError::BadRequest(format!(
            "limit {n} is above {MAX_LIMIT}: narrow the listing with a status filter"
        ))),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    #[test]
    fn preview_is_one_line_and_bounded() {
        assert_eq!(preview("  hello\n\tworld  "), "hello world");
        let long = "x".repeat(200);
        let cut = preview(&long);
        assert_eq!(cut.chars().count(), PREVIEW_CHARS);
        assert!(cut.ends_with('…'));
        let exact = "é".repeat(PREVIEW_CHARS);
        assert_eq!(
            preview(&exact),
            exact,
            "multi-byte text at the limit is kept whole"
        );
    }
}
