//! Writing into a QA conversation as a person: the platform's inbound injection, which the
//! operator's `qa send`, the chat page and `sessions_send` of a running gateway go through.

use std::sync::Arc;

use clawgate_awareness::SessionDelivery;
use clawgate_channel_qa::{InboundRequest, PlatformMessage};
use clawgate_types::SessionKey;

use crate::gateway::Channel;

/// Writes into a QA conversation as a person (the platform's inbound injection).
pub async fn inject(
    channel: &Channel,
    conversation: &str,
    author: &str,
    text: &str,
) -> Result<PlatformMessage, String> {
    let request = InboundRequest {
        text: text.to_owned(),
        author_id: author.to_owned(),
        author_is_bot: false,
        thread_id: None,
        reply_to_id: None,
        metadata: None,
    };
    channel
        .adapter
        .write_as(conversation, &request)
        .await
        .map_err(|e| format!("QA platform: {}", e.message))
}

/// `sessions_send` of a running gateway: a session `agent:<agent>:<channel>:<conversation>`
/// receives the message as an inbound message of its conversation, authored by
/// `session:<from>`, so the agent answers it like any other turn.
#[derive(Debug)]
pub struct ConversationDelivery {
    channels: Vec<Arc<Channel>>,
}

impl ConversationDelivery {
    pub fn new(channels: Vec<Arc<Channel>>) -> ConversationDelivery {
        ConversationDelivery { channels }
    }
}

#[async_trait::async_trait]
impl SessionDelivery for ConversationDelivery {
    async fn deliver(
        &self,
        from: &SessionKey,
        to: &SessionKey,
        message: &str,
    ) -> Result<SessionKey, Box<dyn std::error::Error + Send + Sync>> {
        let not_ours = || {
            format!(
                "session {to} is not a conversation of this gateway's channels (keys look like \
                 agent:<agent>:<channel>:<conversation>)"
            )
        };
        let (channel_name, conversation) = to
            .rest()
            .split_once(':')
            .filter(|_| to.is_agent_qualified())
            .ok_or_else(not_ours)?;
        let channel = self
            .channels
            .iter()
            .find(|c| c.name == channel_name)
            .ok_or_else(not_ours)?;
        inject(channel, conversation, &format!("session:{from}"), message).await?;
        Ok(to.clone())
    }
}
