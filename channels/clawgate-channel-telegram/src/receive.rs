//! Inbound: one Bot API `Update` (from `getUpdates` or a webhook) → a normalized message.
//!
//! - Chats: `private` → direct, `group` / `supergroup` → group, `channel` → channel; a forum
//!   topic is the target's thread (`message_thread_id` when `is_topic_message`).
//! - A reply names the answered message (`reply_to_message`), with Telegram's quote.
//! - The event id is `<chat id>:<message id>`: message ids never repeat inside a chat, while
//!   `update_id`s restart at a random number after a week without updates. A webhook
//!   redelivery or a re-polled update carries the same message, so it is deduplicated.
//! - `edited_message` / `edited_channel_post` are ignored, a documented choice: the agent
//!   answered the message as first sent, and answering every correction would reply twice.
//! - Bots never see other bots' messages on Telegram (and never their own), so no echo of the
//!   gateway's own sends can arrive and bot-to-bot loops cannot form here; `from.is_bot` is
//!   still passed on for the engine's bot authorization.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{
    ChannelMessage, MessageActor, MessageQuote, MessageRelation, MessageTarget, TargetKind,
};

use crate::wire::Message;

/// Normalizes the updates of one bot account.
#[derive(Debug, Clone)]
pub struct TelegramReceiver {
    name: String,
    /// Chats answered; empty: every chat.
    allowed_chats: BTreeSet<i64>,
}

impl TelegramReceiver {
    /// The receiver of channel `name`, answering `allowed_chats` (every chat when empty).
    pub fn new(name: &str, allowed_chats: impl IntoIterator<Item = i64>) -> TelegramReceiver {
        TelegramReceiver {
            name: name.to_owned(),
            allowed_chats: allowed_chats.into_iter().collect(),
        }
    }

    fn malformed(&self, reason: impl Into<String>) -> ReceiveError {
        ReceiveError::Malformed {
            channel: self.name.clone(),
            reason: reason.into(),
        }
    }

    fn ignored(&self, reason: impl Into<String>) -> ReceiveError {
        ReceiveError::Ignored {
            channel: self.name.clone(),
            reason: reason.into(),
        }
    }
}

fn target_kind(chat_type: &str) -> TargetKind {
    match chat_type {
        "private" => TargetKind::Direct,
        "channel" => TargetKind::Channel,
        _ => TargetKind::Group,
    }
}

impl MessageReceiveAdapter for TelegramReceiver {
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError> {
        let update = raw
            .as_object()
            .ok_or_else(|| self.malformed("an update is a JSON object"))?;
        if !update
            .get("update_id")
            .is_some_and(serde_json::Value::is_i64)
        {
            return Err(self.malformed("an update needs an integer update_id"));
        }
        let Some(payload) = update.get("message").or_else(|| update.get("channel_post")) else {
            let kind = update
                .keys()
                .find(|k| k.as_str() != "update_id")
                .map_or("empty", String::as_str);
            return Err(self.ignored(format!("a {kind} update is not a new message")));
        };
        let message: Message = serde_json::from_value(payload.clone())
            .map_err(|e| self.malformed(format!("not a Bot API message: {e}")))?;
        if !self.allowed_chats.is_empty() && !self.allowed_chats.contains(&message.chat.id) {
            return Err(self.ignored(format!(
                "chat {} is not in this channel's allowed_chats",
                message.chat.id
            )));
        }
        let Some(text) = message.text.clone().or_else(|| message.caption.clone()) else {
            return Err(self.ignored("a message without text or caption"));
        };
        let topic = message
            .message_thread_id
            .filter(|_| message.is_topic_message == Some(true));
        let mut target =
            MessageTarget::new(target_kind(&message.chat.kind), message.chat.id.to_string())
                .with_thread_id(topic.map(|t| t.to_string()));
        target.label = message
            .chat
            .title
            .clone()
            .or_else(|| message.chat.username.clone());
        let mut inbound =
            ChannelMessage::inbound(message.message_id.to_string(), &self.name, target)
                .with_text(text)
                // Kept so an unfinished event can be worked on again from its durable record.
                .with_raw(raw.clone());
        let is_bot = message.from.as_ref().is_some_and(|f| f.is_bot);
        inbound.sender = match (&message.from, &message.sender_chat) {
            (Some(from), _) => Some({
                let mut actor = MessageActor::new(from.id.to_string()).with_is_bot(from.is_bot);
                actor.display_name = from
                    .username
                    .clone()
                    .or_else(|| Some(from.first_name.clone()).filter(|n| !n.is_empty()));
                actor
            }),
            (None, Some(chat)) => Some(MessageActor::new(chat.id.to_string())),
            (None, None) => None,
        };
        if let Some(replied) = &message.reply_to_message {
            let mut relation = MessageRelation::reply_to(replied.message_id.to_string())
                .with_thread_id(topic.map(|t| t.to_string()));
            if let (MessageRelation::Reply { quote, .. }, Some(q)) = (&mut relation, &message.quote)
            {
                *quote = Some(MessageQuote::new(q.text.clone()));
            }
            inbound.relation = Some(relation);
        }
        Ok(NormalizedInbound::new(
            format!("{}:{}", message.chat.id, message.message_id),
            inbound,
        )
        .by_bot(is_bot))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn receiver() -> TelegramReceiver {
        TelegramReceiver::new("telegram", [])
    }

    fn update(message: serde_json::Value) -> serde_json::Value {
        json!({ "update_id": 10, "message": message })
    }

    #[test]
    fn a_private_message_is_a_direct_conversation_keyed_by_chat_and_message() {
        let raw = update(json!({
            "message_id": 7, "date": 1, "text": "hi",
            "chat": { "id": 42, "type": "private", "username": "ada" },
            "from": { "id": 42, "is_bot": false, "first_name": "Ada", "username": "ada" }
        }));
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.event_id, "42:7");
        assert_eq!(inbound.message.target.kind, TargetKind::Direct);
        assert_eq!(inbound.message.target.id, "42");
        assert_eq!(
            inbound.message.body.as_ref().map(|b| b.text.as_str()),
            Some("hi")
        );
        assert_eq!(inbound.message.raw.as_ref(), Some(&raw));
        assert!(!inbound.is_bot_author);
    }

    #[test]
    fn a_forum_topic_is_the_thread_and_a_reply_names_its_message_and_quote() {
        let raw = update(json!({
            "message_id": 9, "date": 1, "text": "and this?",
            "message_thread_id": 3, "is_topic_message": true,
            "chat": { "id": -1_001_234, "type": "supergroup", "title": "Team", "is_forum": true },
            "from": { "id": 5, "is_bot": false, "first_name": "Bo" },
            "reply_to_message": { "message_id": 8, "date": 1,
                "chat": { "id": -1_001_234, "type": "supergroup" } },
            "quote": { "text": "this" }
        }));
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.message.target.kind, TargetKind::Group);
        assert_eq!(inbound.message.target.thread_id.as_deref(), Some("3"));
        let Some(MessageRelation::Reply {
            reply_to_id,
            quote,
            thread_id,
            ..
        }) = inbound.message.relation
        else {
            panic!("a reply");
        };
        assert_eq!(reply_to_id.as_deref(), Some("8"));
        assert_eq!(thread_id.as_deref(), Some("3"));
        assert_eq!(quote.map(|q| q.text).as_deref(), Some("this"));
    }

    #[test]
    fn a_reply_thread_outside_a_forum_is_not_a_topic() {
        let raw = update(json!({
            "message_id": 9, "date": 1, "text": "x", "message_thread_id": 4,
            "chat": { "id": -1_001_234, "type": "supergroup" },
            "from": { "id": 5, "is_bot": false, "first_name": "Bo" }
        }));
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.message.target.thread_id, None);
    }

    #[test]
    fn edits_other_kinds_and_disallowed_chats_are_ignored_and_garbage_is_malformed() {
        let r = TelegramReceiver::new("telegram", [42]);
        let edited = json!({ "update_id": 1, "edited_message": { "message_id": 1 } });
        assert!(matches!(
            r.normalize(&edited),
            Err(ReceiveError::Ignored { .. })
        ));
        let other = update(json!({
            "message_id": 1, "date": 1, "text": "x", "chat": { "id": 43, "type": "private" }
        }));
        assert!(matches!(
            r.normalize(&other),
            Err(ReceiveError::Ignored { .. })
        ));
        for garbage in [
            json!([]),
            json!({ "message": {} }),
            update(json!({ "message_id": "x" })),
        ] {
            assert!(
                matches!(r.normalize(&garbage), Err(ReceiveError::Malformed { .. })),
                "{garbage}"
            );
        }
    }

    #[test]
    fn a_channel_post_is_a_channel_conversation_by_its_chat() {
        let raw = json!({ "update_id": 3, "channel_post": {
            "message_id": 2, "date": 1, "text": "news",
            "chat": { "id": -1_009, "type": "channel", "title": "News" },
            "sender_chat": { "id": -1_009, "type": "channel" }
        }});
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.message.target.kind, TargetKind::Channel);
        assert_eq!(
            inbound.message.sender.map(|s| s.id).as_deref(),
            Some("-1009")
        );
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let message = json!({
            "message_id": 9, "date": 1, "text": "and this?",
            "message_thread_id": 3, "is_topic_message": true,
            "chat": { "id": -1_001_234, "type": "supergroup", "title": "Team", "is_forum": true },
            "from": { "id": 5, "is_bot": false, "first_name": "Bo", "username": "bo" },
            "reply_to_message": { "message_id": 8, "date": 1,
                "chat": { "id": -1_001_234, "type": "supergroup" } },
            "quote": { "text": "this" }
        });
        let private = json!({
            "message_id": 7, "date": 1, "text": "hi",
            "chat": { "id": 42, "type": "private", "username": "ada" },
            "from": { "id": 42, "is_bot": false, "first_name": "Ada", "username": "ada" }
        });
        clawgate_conformance::fuzz::normalizer_never_panics(
            &receiver(),
            vec![update(message), update(private)],
        );
    }
}
