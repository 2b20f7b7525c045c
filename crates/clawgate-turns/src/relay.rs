//! `sessions_send` into a conversation: the message goes into the target session's
//! conversation through its channel's own send path (durable, keyed), and the session's agent
//! answers it as a turn authored by `session:<from>`.

use std::sync::Arc;

use clawgate_channel_sdk::NormalizedInbound;
use clawgate_messages::SendOptions;
use clawgate_types::{ChannelMessage, MessageBody, MessageDirection, SessionKey};
use tracing::warn;

use crate::{Channel, RelayError, Turns};

impl Turns {
    /// `sessions_send` into a conversation of `channel`: the message is sent there through the
    /// channel's own send path (durable, keyed `<channel>:session-send:<nonce>`), then the
    /// conversation's agent answers it as a turn authored by `session:<from>`. Returns once the
    /// message is delivered; the turn runs on (on the current tokio runtime).
    pub async fn deliver_to_session(
        self: &Arc<Self>,
        channel: &Arc<Channel>,
        conversation: &str,
        from: &SessionKey,
        text: &str,
    ) -> Result<(), RelayError> {
        let author = format!("session:{from}");
        let target = clawgate_types::MessageTarget::group(conversation);
        let key = format!(
            "{}:session-send:{}",
            channel.name,
            nonce().map_err(RelayError::Random)?
        );
        let mut relay = ChannelMessage::outbound(
            &key,
            &channel.name,
            target.clone(),
            format!("{author}: {text}"),
        )
        .with_account_id(&channel.account);
        let options = SendOptions {
            durability: self.durability,
            idempotency_key: Some(key.clone()),
            time_to_live_ms: None,
        };
        self.messenger
            .send(relay.clone(), options)
            .await
            .map_err(|source| RelayError::Send {
                conversation: conversation.to_owned(),
                source,
            })?;
        relay.direction = MessageDirection::Inbound;
        relay.sender = Some(clawgate_types::MessageActor::new(author));
        relay.body = Some(MessageBody::new(text));
        let inbound = NormalizedInbound::new(key, relay);
        // An agent session is logged as itself, so its own message opens no notice for it
        // (self-suppression compares the actor with the watcher's key).
        let actor = from
            .is_agent_qualified()
            .then(|| clawgate_awareness::Actor::agent(from));
        let turns = self.clone();
        let channel = channel.clone();
        tokio::spawn(async move {
            if let Err(e) = turns.turn_by(&channel, inbound, actor).await {
                warn!(error = %e, "the turn for a session message failed");
            }
        });
        Ok(())
    }
}

/// 12 random bytes from the OS, hex (24 characters): a session message's key is unique without
/// a counter shared between processes.
fn nonce() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 12];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
