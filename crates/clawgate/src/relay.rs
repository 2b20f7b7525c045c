//! `sessions_send` of a running gateway, on any channel kind: the target session's key names
//! one of this gateway's channels and a conversation there; the turn engine
//! ([`clawgate_turns::Turns::deliver_to_session`]) sends the message into that conversation
//! through the channel's own send path (durable, keyed), and the session's agent answers it as
//! a turn authored by `session:<from>`.

use std::sync::Arc;

use clawgate_awareness::SessionDelivery;
use clawgate_types::SessionKey;

use crate::gateway::Gateway;

/// Delivers `sessions_send` into a conversation of this gateway's channels.
#[derive(Debug)]
pub struct ConversationDelivery {
    gateway: Arc<Gateway>,
}

impl ConversationDelivery {
    /// Delivery through `gateway`'s channels.
    pub fn new(gateway: Arc<Gateway>) -> ConversationDelivery {
        ConversationDelivery { gateway }
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
            .gateway
            .channels
            .iter()
            .find(|c| c.name == channel_name)
            .ok_or_else(not_ours)?;
        self.gateway
            .turns
            .deliver_to_session(channel, conversation, from, message)
            .await?;
        Ok(to.clone())
    }
}
