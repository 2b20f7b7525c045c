//! Writing into a QA conversation as a person: the platform's inbound injection, which the
//! operator's `qa send` and the chat page go through.

use std::sync::Arc;

use clawgate_channel_qa::{InboundRequest, PlatformMessage, QaHandle};

use clawgate_types::DeliveryFailureKind;

use crate::gateway::Channel;
use crate::views::ViewError;

/// Writes into a QA conversation as a person (the platform's inbound injection). What the
/// platform refuses is the caller's to fix (a message over its length limit: 422 naming the
/// limit; another refused payload: 400; an unknown target: 404); only a platform that failed
/// is `Upstream` (502).
pub async fn inject(
    channel: &Channel,
    conversation: &str,
    author: &str,
    text: &str,
) -> Result<PlatformMessage, ViewError> {
    let request = InboundRequest {
        text: text.to_owned(),
        author_id: author.to_owned(),
        author_is_bot: false,
        thread_id: None,
        reply_to_id: None,
        metadata: None,
    };
    qa_handle(channel)
        .map_err(ViewError::BadRequest)?
        .adapter
        .write_as(conversation, &request)
        .await
        .map_err(|e| {
            let message = format!("QA platform: {}", e.message);
            match (e.platform_code.as_deref(), e.kind) {
                (Some("message_too_long"), _) => ViewError::Unprocessable(format!(
                    "{message}: shorten the message or send it in parts"
                )),
                (_, DeliveryFailureKind::InvalidPayload) => ViewError::BadRequest(message),
                (_, DeliveryFailureKind::NotFound) => ViewError::NotFound(message),
                _ => ViewError::Upstream(message),
            }
        })
}

/// The QA side of a channel: its adapter and platform, when the channel is of kind `qa`.
pub fn qa_handle(channel: &Channel) -> Result<Arc<QaHandle>, String> {
    channel.plugin.extension::<QaHandle>().ok_or_else(|| {
        format!(
            "channel {} is not a QA channel (kind {}): the QA views and the chat page need one",
            channel.name, channel.kind
        )
    })
}

/// The bearer token of the platform `channel` runs embedded (none for another kind, or a QA
/// channel on an external platform).
pub fn embedded_platform_token(channel: &Channel) -> Option<String> {
    let handle = qa_handle(channel).ok()?;
    handle.platform.as_ref().map(|p| p.token().to_owned())
}

/// Whether any configured channel is a QA channel (the chat page and `/v1/qa` are mounted
/// only then).
pub fn has_qa_channel(channels: &[Arc<Channel>]) -> bool {
    channels.iter().any(|c| qa_handle(c).is_ok())
}
