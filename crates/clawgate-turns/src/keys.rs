//! The keys a turn writes under: the conversation's session, each generation of an event's
//! reply, the failure notice of a dead-lettered event, and the reply message built on them.

use clawgate_channel_sdk::NormalizedInbound;
use clawgate_types::{ChannelMessage, SessionKey};

use crate::{Channel, TurnError};

/// `agent:<agent>:<channel>:<conversation>` (characters a key refuses become `_`).
pub fn session_key_for(
    agent_id: &str,
    channel: &str,
    conversation: &str,
) -> Result<SessionKey, TurnError> {
    let clean: String = conversation
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() || c == ':' {
                '_'
            } else {
                c
            }
        })
        .collect();
    SessionKey::for_agent(agent_id, &format!("{channel}:{clean}"))
        .map_err(|e| TurnError::Session(e.to_string()))
}

/// `<channel>:reply:<event>:<generation>`: the idempotency key of one generation of an event's
/// reply. A generation is passed over only once its stream is cancelled.
pub fn reply_key(channel: &str, event_id: &str, generation: u32) -> String {
    format!("{channel}:reply:{event_id}:{generation}")
}

/// `<channel>:failure:<event>`: the idempotency key of a dead-lettered event's notice.
pub fn failure_key(channel: &str, event_id: &str) -> String {
    format!("{channel}:failure:{event_id}")
}

/// The idempotency key of the one "agents are busy, your message is queued" notice of `event_id`.
pub fn busy_key(channel: &str, event_id: &str) -> String {
    format!("{channel}:busy:{event_id}")
}

/// The idempotency key of the one "the agent is still working" notice of `event_id` (sent only
/// where the reply's preview cannot carry it).
pub fn progress_key(channel: &str, event_id: &str) -> String {
    format!("{channel}:progress:{event_id}")
}

/// The outbound message answering `inbound` on `channel` under `reply_key`, with `text`.
pub fn reply_message(
    channel: &Channel,
    inbound: &NormalizedInbound,
    reply_key: &str,
    text: &str,
) -> ChannelMessage {
    // Stable per reply key: the intent and the platform's idempotency key follow it.
    ChannelMessage::outbound(
        reply_key,
        &channel.name,
        inbound.message.target.clone(),
        text,
    )
    .with_account_id(&channel.account)
}

#[cfg(test)]
mod tests {
    use clawgate_channel_sdk::testing::{MemoryChannel, MemoryPlatform};
    use clawgate_types::{MessageDirection, MessageTarget};

    use super::*;

    #[test]
    fn session_keys_are_agent_qualified_and_clean() {
        let key = session_key_for("main", "qa", "dm web:1").expect("key");
        assert_eq!(key.as_str(), "agent:main:qa:dm_web_1");
    }

    #[test]
    fn a_session_key_the_registry_refuses_is_a_session_error() {
        let error = session_key_for("", "qa", "dm").expect_err("an empty agent id");
        assert!(matches!(error, TurnError::Session(_)), "{error:?}");
        assert!(
            error.to_string().starts_with("session registry: "),
            "{error}"
        );
    }

    #[test]
    fn reply_and_failure_keys_name_channel_event_and_generation() {
        assert_eq!(reply_key("qa", "u-17", 0), "qa:reply:u-17:0");
        assert_eq!(reply_key("qa-second", "u-17", 3), "qa-second:reply:u-17:3");
        assert_eq!(failure_key("qa", "u-17"), "qa:failure:u-17");
    }

    #[test]
    fn a_reply_goes_back_to_the_conversation_from_the_channel_account() {
        let plugin = MemoryChannel::new("memory-two", MemoryPlatform::new()).plugin();
        let channel = Channel::new("memory-two", "memory", "two", "main", plugin, 3);
        let asked = ChannelMessage::outbound(
            "in-1",
            "memory-two",
            MessageTarget::group("room-1"),
            "hello",
        );
        let inbound = NormalizedInbound::new("u-1", asked);
        let key = reply_key(&channel.name, &inbound.event_id, 0);
        let reply = reply_message(&channel, &inbound, &key, "hi there");
        assert_eq!(reply.id, "memory-two:reply:u-1:0");
        assert_eq!(reply.channel, "memory-two");
        assert_eq!(reply.account_id.as_deref(), Some("two"));
        assert_eq!(reply.target, MessageTarget::group("room-1"));
        assert_eq!(reply.direction, MessageDirection::Outbound);
        assert_eq!(
            reply.body.as_ref().map(|b| b.text.as_str()),
            Some("hi there")
        );
    }
}
