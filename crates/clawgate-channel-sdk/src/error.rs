//! Errors adapters return, classified so the engine can apply its failure policy.

use clawgate_types::DeliveryFailureKind;

/// Whether a failed platform call may have had an effect on the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideEffect {
    /// Proven: nothing reached the platform (connection refused, request never written,
    /// rejected by the platform with a definite error). Retrying cannot duplicate.
    None,
    /// The platform may have acted (timeout after the request was written, connection dropped
    /// before the answer, unparseable answer). Retrying blindly could duplicate.
    Possible,
}

/// A classified send failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?} failure: {message}")]
#[non_exhaustive]
pub struct SendError {
    /// The failure class the engine's retry policy keys on.
    pub kind: DeliveryFailureKind,
    /// What happened, for logs and operators (never a secret).
    pub message: String,
    /// Whether the platform may have acted.
    pub side_effect: SideEffect,
    /// The platform asked to wait this long before retrying.
    pub retry_after_ms: Option<u64>,
    /// Platform status or error code.
    pub platform_code: Option<String>,
}

impl SendError {
    /// A failure proven to have happened before anything reached the platform.
    pub fn before_io(kind: DeliveryFailureKind, message: impl Into<String>) -> SendError {
        SendError {
            kind,
            message: message.into(),
            side_effect: SideEffect::None,
            retry_after_ms: None,
            platform_code: None,
        }
    }

    /// A failure after which the platform may have acted.
    pub fn after_io(kind: DeliveryFailureKind, message: impl Into<String>) -> SendError {
        SendError {
            side_effect: SideEffect::Possible,
            ..SendError::before_io(kind, message)
        }
    }

    /// The adapter does not implement an optional operation.
    pub fn unsupported(channel: &str, operation: &str) -> SendError {
        SendError::before_io(
            DeliveryFailureKind::InvalidPayload,
            format!("channel {channel} does not support {operation}"),
        )
    }

    /// The platform's requested wait (`Retry-After`).
    pub fn with_retry_after_ms(mut self, ms: Option<u64>) -> SendError {
        self.retry_after_ms = ms;
        self
    }

    /// The platform's own status or error code.
    pub fn with_platform_code(mut self, code: impl Into<String>) -> SendError {
        self.platform_code = Some(code.into());
        self
    }
}

/// The usual meaning of an HTTP status for a platform API call. A definite answer from the
/// platform means the request was processed (or refused) as a whole.
pub fn classify_http_status(status: u16) -> DeliveryFailureKind {
    match status {
        400 | 413 | 415 | 422 => DeliveryFailureKind::InvalidPayload,
        401 => DeliveryFailureKind::Auth,
        403 => DeliveryFailureKind::Permission,
        404 | 410 => DeliveryFailureKind::NotFound,
        409 => DeliveryFailureKind::Conflict,
        429 => DeliveryFailureKind::RateLimit,
        408 | 500..=599 => DeliveryFailureKind::Transient,
        _ => DeliveryFailureKind::Unknown,
    }
}

/// A message could not be rendered for this channel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The text is over the limit and the channel cannot split it.
    #[error(
        "message text is {length} characters, over the channel's limit of {limit}, and the \
         channel cannot split messages"
    )]
    TooLong {
        /// The text's length in characters.
        length: usize,
        /// The channel's limit.
        limit: u32,
    },
    /// An attachment the channel cannot carry (the reason names it).
    #[error("channel cannot carry this attachment: {0}")]
    UnsupportedAttachment(String),
    /// No text and no attachments.
    #[error("message has nothing to send (no text and no attachments)")]
    Empty,
}

/// An inbound platform payload could not be normalized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiveError {
    /// The payload is not an event of this platform's shape.
    #[error("malformed {channel} event: {reason}")]
    Malformed {
        /// The channel that received it.
        channel: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A well-formed event the channel does not answer (a kind it does not handle, a chat it
    /// is not allowed in): finished without a turn.
    #[error("{channel} event ignored: {reason}")]
    Ignored {
        /// The channel that received it.
        channel: String,
        /// Why it is not answered.
        reason: String,
    },
}
