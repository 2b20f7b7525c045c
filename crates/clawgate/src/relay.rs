//! `sessions_send` of a running gateway, on any channel kind: the message goes into the target
//! session's conversation through its channel's own send path (durable, keyed), and the
//! session's agent answers it as a turn authored by `session:<from>`.

use std::sync::Arc;

use clawgate_awareness::SessionDelivery;
use clawgate_channel_sdk::NormalizedInbound;
use clawgate_messages::SendOptions;
use clawgate_types::{ChannelMessage, MessageBody, MessageDirection, SessionKey};
use tracing::warn;

use crate::gateway::{Channel, Gateway};

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
            .deliver_to_session(channel, conversation, from, message)
            .await?;
        Ok(to.clone())
    }
}

impl Gateway {
    /// `sessions_send` into a conversation of `channel`: the message is sent there through the
    /// channel's own send path (durable, keyed), then the conversation's agent answers it as a
    /// turn authored by `session:<from>`. Returns once the message is delivered; the turn runs
    /// on.
    pub(crate) async fn deliver_to_session(
        self: &Arc<Self>,
        channel: &Arc<Channel>,
        conversation: &str,
        from: &SessionKey,
        text: &str,
    ) -> Result<(), String> {
        let author = format!("session:{from}");
        let target = clawgate_types::MessageTarget::group(conversation);
        let nonce = crate::gateway::random_token()
            .map_err(|e| format!("cannot read random bytes for the message's key: {e}"))?;
        let key = format!("{}:session-send:{}", channel.name, &nonce[..24]);
        let mut relay = ChannelMessage::outbound(
            &key,
            &channel.name,
            target.clone(),
            format!("{author}: {text}"),
        )
        .with_account_id(&channel.account);
        let options = SendOptions {
            durability: self.turns.durability,
            idempotency_key: Some(key.clone()),
            time_to_live_ms: None,
        };
        self.messenger
            .send(relay.clone(), options)
            .await
            .map_err(|e| format!("the message could not be sent into {conversation}: {e}"))?;
        relay.direction = MessageDirection::Inbound;
        relay.sender = Some(clawgate_types::MessageActor::new(author));
        relay.body = Some(MessageBody::new(text));
        let inbound = NormalizedInbound::new(key, relay);
        let gateway = self.clone();
        let channel = channel.clone();
        tokio::spawn(async move {
            if let Err(e) = gateway.turns.turn(&channel, inbound).await {
                warn!(error = %e, "the turn for a session message failed");
            }
        });
        Ok(())
    }
}
