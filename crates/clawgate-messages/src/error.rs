//! Errors of the engine itself (delivery failures are outcomes, not errors).

use clawgate_channel_sdk::RenderError;
use clawgate_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum MessagesError {
    /// Durability `required` and the intent could not be written: nothing was sent.
    #[error("send refused: the durable intent could not be written ({0}); nothing was sent")]
    DurabilityUnavailable(#[source] StoreError),
    #[error("no channel adapter is registered for channel {0:?}")]
    NoAdapter(String),
    #[error("message cannot be rendered for channel {channel}: {source}")]
    Render {
        channel: String,
        #[source]
        source: RenderError,
    },
    /// Block streaming could not start: the platform refused to remove the preview showing.
    #[error(
        "block not delivered: the live preview could not be removed first ({0}); it stays \
         recorded, and the final, abandon or send recovery removes it"
    )]
    PreviewNotRemoved(String),
    /// The store failed after the intent existed; the intent is safe and recovery resumes it.
    #[error("state store failed mid-send (the intent is kept; recovery resumes it): {0}")]
    Store(#[from] StoreError),
}
