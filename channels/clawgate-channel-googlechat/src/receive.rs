//! Inbound: one interaction event → a normalized message.
//!
//! - `MESSAGE` events are messages; the event id is the message's name
//!   (`spaces/*/messages/*`), so a redelivery is one event to the engine. `ADDED_TO_SPACE`,
//!   `REMOVED_FROM_SPACE`, `CARD_CLICKED` and the rest are not prompts: ignored.
//! - Spaces: a direct message (`spaceType: DIRECT_MESSAGE`, legacy `type: DM`) → direct,
//!   every other space → group. In a group space the answer goes to the message's thread
//!   (`reply_in_thread`); in a direct message at top level.
//! - The text is `argumentText` (the text without the app's @mention) when it has any.
//! - The app's own messages (sender = `app_user`) are ignored. Other apps' messages
//!   (`sender.type: BOT`) are reported as bot-authored; a gateway-failure marker in their
//!   client-assigned id is decoded by [`GoogleChatOrigin`](crate::GoogleChatOrigin), so the
//!   engine drops marked echoes in rooms before its `allowBots` check, while an unmarked bot
//!   message with the same text goes through that check normally.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget, TargetKind};
use serde_json::Value;

/// Normalizes the events of one Chat app.
#[derive(Debug, Clone)]
pub struct GoogleChatReceiver {
    name: String,
    allowed_spaces: BTreeSet<String>,
    reply_in_thread: bool,
    app_user: Option<String>,
}

impl GoogleChatReceiver {
    pub(crate) fn new(
        name: &str,
        allowed_spaces: impl IntoIterator<Item = String>,
        reply_in_thread: bool,
        app_user: Option<String>,
    ) -> GoogleChatReceiver {
        GoogleChatReceiver {
            name: name.to_owned(),
            allowed_spaces: allowed_spaces.into_iter().collect(),
            reply_in_thread,
            app_user,
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

fn is_direct(space: &Value) -> bool {
    space["spaceType"].as_str() == Some("DIRECT_MESSAGE")
        || space["type"].as_str() == Some("DM")
        || space["singleUserBotDm"].as_bool() == Some(true)
}

impl MessageReceiveAdapter for GoogleChatReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let kind = raw
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("an interaction event has a `type`"))?;
        if kind != "MESSAGE" {
            return Err(self.ignored(format!("a {kind} event is not a prompt")));
        }
        let message = raw
            .get("message")
            .filter(|m| m.is_object())
            .ok_or_else(|| self.malformed("a MESSAGE event without a `message` object"))?;
        let Some(name) = message["name"].as_str() else {
            return Err(self.malformed("a message without its `name`"));
        };
        let space = if message["space"].is_object() {
            &message["space"]
        } else {
            &raw["space"]
        };
        let Some(space_name) = space["name"].as_str() else {
            return Err(self.malformed("a MESSAGE event without its space's `name`"));
        };
        let sender = if message["sender"].is_object() {
            &message["sender"]
        } else {
            &raw["user"]
        };
        let author = sender["name"].as_str().unwrap_or_default();
        if self.app_user.as_deref() == Some(author) {
            return Err(self.ignored("the app's own message"));
        }
        if !self.allowed_spaces.is_empty() && !self.allowed_spaces.contains(space_name) {
            return Err(self.ignored(format!(
                "space {space_name} is not in this channel's allowed_spaces"
            )));
        }
        let argument = message["argumentText"].as_str().map(str::trim);
        let text = argument
            .filter(|t| !t.is_empty())
            .or_else(|| message["text"].as_str().map(str::trim))
            .unwrap_or_default();
        if text.is_empty() {
            return Err(self.ignored("a message without text"));
        }
        let is_bot = sender["type"].as_str() == Some("BOT");
        let direct = is_direct(space);
        let thread = message["thread"]["name"].as_str();
        let answer_thread = match (direct, thread) {
            (false, Some(thread)) if self.reply_in_thread => Some(thread.to_owned()),
            // A reply in a DM thread stays in it.
            (true, Some(thread)) if message["threadReply"].as_bool() == Some(true) => {
                Some(thread.to_owned())
            }
            _ => None,
        };
        let kind = if direct {
            TargetKind::Direct
        } else {
            TargetKind::Group
        };
        let target = MessageTarget::new(kind, space_name).with_thread_id(answer_thread);
        let inbound = ChannelMessage::inbound(name, &self.name, target)
            .with_text(text)
            .with_sender(MessageActor::new(author).with_is_bot(is_bot))
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(name, inbound).by_bot(is_bot))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn receiver() -> GoogleChatReceiver {
        GoogleChatReceiver::new("googlechat", [], true, Some("users/app".into()))
    }

    fn event(space: Value, sender: Value, text: &str) -> Value {
        json!({ "type": "MESSAGE", "space": space, "user": sender, "message": {
            "name": "spaces/S/messages/M.M", "text": text, "argumentText": text,
            "sender": sender, "space": space,
            "thread": { "name": "spaces/S/threads/T" }, "threadReply": false,
        } })
    }

    fn room() -> Value {
        json!({ "name": "spaces/S", "type": "ROOM", "spaceType": "SPACE" })
    }

    fn person() -> Value {
        json!({ "name": "users/1", "type": "HUMAN" })
    }

    #[test]
    fn a_room_message_answers_in_its_thread_and_a_dm_at_top_level() {
        let inbound = receiver()
            .normalize(&event(room(), person(), "hi"))
            .expect("normalizes");
        assert_eq!(inbound.event_id, "spaces/S/messages/M.M");
        assert_eq!(inbound.message.target.id, "spaces/S");
        assert_eq!(inbound.message.target.kind, TargetKind::Group);
        assert_eq!(
            inbound.message.target.thread_id.as_deref(),
            Some("spaces/S/threads/T")
        );
        assert!(!inbound.is_bot_author);
        let dm = json!({ "name": "spaces/D", "type": "DM", "spaceType": "DIRECT_MESSAGE" });
        let inbound = receiver()
            .normalize(&event(dm, person(), "hi"))
            .expect("normalizes");
        assert_eq!(inbound.message.target.kind, TargetKind::Direct);
        assert_eq!(inbound.message.target.thread_id, None);
    }

    #[test]
    fn argument_text_drops_the_mention() {
        let mut raw = event(room(), person(), "@clawgate what time is it");
        raw["message"]["argumentText"] = json!(" what time is it");
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(
            inbound.message.body.map(|b| b.text).as_deref(),
            Some("what time is it")
        );
    }

    #[test]
    fn other_events_own_messages_and_garbage() {
        let r = receiver();
        for kind in ["ADDED_TO_SPACE", "REMOVED_FROM_SPACE", "CARD_CLICKED"] {
            let raw = json!({ "type": kind, "space": room(), "user": person() });
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Ignored { .. })),
                "{kind}"
            );
        }
        let own = event(
            room(),
            json!({ "name": "users/app", "type": "BOT" }),
            "mine",
        );
        assert!(matches!(
            r.normalize(&own),
            Err(ReceiveError::Ignored { .. })
        ));
        let bot = event(room(), json!({ "name": "users/9", "type": "BOT" }), "beep");
        assert!(r.normalize(&bot).expect("normalizes").is_bot_author);
        let only = GoogleChatReceiver::new("googlechat", ["spaces/other".to_owned()], true, None);
        assert!(matches!(
            only.normalize(&event(room(), person(), "hi")),
            Err(ReceiveError::Ignored { .. })
        ));
        for garbage in [
            json!([]),
            json!({ "type": "MESSAGE" }),
            json!({ "type": "MESSAGE", "message": { "text": "x" } }),
        ] {
            assert!(
                matches!(r.normalize(&garbage), Err(ReceiveError::Malformed { .. })),
                "{garbage}"
            );
        }
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let dm = json!({ "name": "spaces/D", "type": "DM", "spaceType": "DIRECT_MESSAGE" });
        clawgate_conformance::fuzz::normalizer_never_panics(
            &receiver(),
            vec![event(room(), person(), "hi"), event(dm, person(), "hello")],
        );
    }
}
