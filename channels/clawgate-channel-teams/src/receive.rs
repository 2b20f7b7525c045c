//! Inbound: one Bot Framework activity → a normalized message.
//!
//! - `message` activities are messages; the event id is `{conversation}|{activity id}` (a
//!   channel's conversation without its `;messageid=` thread part), so a retried POST is one
//!   event to the engine. `conversationUpdate`, `typing`, `messageReaction`, `invoke` and the
//!   rest are not prompts: ignored (their conversation reference is still kept by the source).
//! - Conversations: `personal` → direct; `groupChat` and `channel` → group. In a channel the
//!   answer goes to the message's thread (`;messageid=<root>` of its conversation id, else the
//!   message itself starts one).
//! - The bot's @mention (`<at>…</at>`, named by a `mention` entity for the recipient) is cut
//!   from the text.
//! - The bot's own activities (`from.id` = the recipient) are ignored; Teams does not send them,
//!   this holds if a channel ever did. Other bots (`from.role: bot`) are reported as such.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget, TargetKind};
use serde_json::Value;

/// `19:abc@thread.tacv2;messageid=123` → (`19:abc@thread.tacv2`, `Some("123")`).
pub(crate) fn split_thread(conversation: &str) -> (&str, Option<&str>) {
    match conversation.split_once(";messageid=") {
        Some((base, root)) => (base, Some(root)),
        None => (conversation, None),
    }
}

/// Normalizes the activities of one bot.
#[derive(Debug, Clone)]
pub struct TeamsReceiver {
    name: String,
    app_id: String,
    allowed_conversations: BTreeSet<String>,
}

impl TeamsReceiver {
    pub(crate) fn new(
        name: &str,
        app_id: &str,
        allowed_conversations: impl IntoIterator<Item = String>,
    ) -> TeamsReceiver {
        TeamsReceiver {
            name: name.to_owned(),
            app_id: app_id.to_owned(),
            allowed_conversations: allowed_conversations.into_iter().collect(),
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

/// `text` without the recipient's @mentions.
fn without_mentions(raw: &Value, text: &str, recipient: &str) -> String {
    let mut text = text.to_owned();
    for entity in raw["entities"].as_array().into_iter().flatten() {
        if entity["type"].as_str() == Some("mention")
            && entity["mentioned"]["id"].as_str() == Some(recipient)
            && let Some(shown) = entity["text"].as_str()
        {
            text = text.replace(shown, "");
        }
    }
    text.trim().to_owned()
}

impl MessageReceiveAdapter for TeamsReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let kind = raw
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("an activity has a `type`"))?;
        let Some(id) = raw["id"].as_str().filter(|id| !id.is_empty()) else {
            return Err(self.malformed("an activity without its `id`"));
        };
        let Some(conversation) = raw["conversation"]["id"].as_str() else {
            return Err(self.malformed("an activity without `conversation.id`"));
        };
        if kind != "message" {
            return Err(self.ignored(format!("a {kind} activity is not a prompt")));
        }
        let from = &raw["from"];
        let author = from["id"].as_str().unwrap_or_default();
        let recipient = raw["recipient"]["id"].as_str().unwrap_or_default();
        let own = format!("28:{}", self.app_id);
        if author == recipient || author == own || author == self.app_id {
            return Err(self.ignored("the bot's own activity"));
        }
        let (base, root) = split_thread(conversation);
        if !self.allowed_conversations.is_empty() && !self.allowed_conversations.contains(base) {
            return Err(self.ignored(format!(
                "conversation {base} is not in this channel's allowed_conversations"
            )));
        }
        let text = without_mentions(raw, raw["text"].as_str().unwrap_or_default(), recipient);
        if text.is_empty() {
            return Err(self.ignored("a message without text"));
        }
        let conversation_type = raw["conversation"]["conversationType"]
            .as_str()
            .unwrap_or("personal");
        let (kind, thread) = match conversation_type {
            "personal" => (TargetKind::Direct, None),
            "channel" => (TargetKind::Group, Some(root.unwrap_or(id).to_owned())),
            _ => (TargetKind::Group, None),
        };
        let is_bot = from["role"].as_str() == Some("bot");
        let event_id = format!("{base}|{id}");
        let target = MessageTarget::new(kind, base).with_thread_id(thread);
        let mut sender = MessageActor::new(author).with_is_bot(is_bot);
        if let Some(name) = from["name"].as_str() {
            sender = sender.with_display_name(name);
        }
        let inbound = ChannelMessage::inbound(id, &self.name, target)
            .with_text(text)
            .with_sender(sender)
            // Kept so an unfinished activity can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(event_id, inbound).by_bot(is_bot))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn receiver() -> TeamsReceiver {
        TeamsReceiver::new("teams", "app-1", [])
    }

    fn activity(conversation: Value, text: &str) -> Value {
        json!({
            "type": "message", "id": "1700", "serviceUrl": "http://sim/",
            "channelId": "msteams", "text": text,
            "from": { "id": "29:ada", "name": "Ada", "aadObjectId": "o-1" },
            "recipient": { "id": "28:app-1", "name": "clawgate" },
            "conversation": conversation,
            "entities": [{ "type": "mention", "text": "<at>clawgate</at>",
                "mentioned": { "id": "28:app-1", "name": "clawgate" } }],
        })
    }

    #[test]
    fn a_personal_chat_is_direct_and_a_channel_answers_in_its_thread() {
        let dm = activity(
            json!({ "id": "a:1x", "conversationType": "personal" }),
            "hello",
        );
        let inbound = receiver().normalize(&dm).expect("normalizes");
        assert_eq!(inbound.event_id, "a:1x|1700");
        assert_eq!(inbound.message.target.kind, TargetKind::Direct);
        assert_eq!(inbound.message.target.thread_id, None);
        let post = activity(
            json!({ "id": "19:c@thread.tacv2;messageid=1600", "conversationType": "channel",
                "isGroup": true }),
            "<at>clawgate</at> what now",
        );
        let inbound = receiver().normalize(&post).expect("normalizes");
        assert_eq!(inbound.event_id, "19:c@thread.tacv2|1700");
        assert_eq!(inbound.message.target.id, "19:c@thread.tacv2");
        assert_eq!(inbound.message.target.thread_id.as_deref(), Some("1600"));
        assert_eq!(
            inbound.message.body.map(|b| b.text).as_deref(),
            Some("what now")
        );
    }

    #[test]
    fn other_activities_own_ones_and_garbage() {
        let r = receiver();
        let mut update = activity(json!({ "id": "a:1" }), "");
        update["type"] = json!("conversationUpdate");
        assert!(matches!(
            r.normalize(&update),
            Err(ReceiveError::Ignored { .. })
        ));
        let mut own = activity(json!({ "id": "a:1" }), "mine");
        own["from"] = json!({ "id": "28:app-1" });
        assert!(matches!(
            r.normalize(&own),
            Err(ReceiveError::Ignored { .. })
        ));
        let mut bot = activity(json!({ "id": "a:1" }), "beep");
        bot["from"] = json!({ "id": "28:other", "role": "bot" });
        assert!(r.normalize(&bot).expect("normalizes").is_bot_author);
        let only = TeamsReceiver::new("teams", "app-1", ["a:other".to_owned()]);
        assert!(matches!(
            only.normalize(&activity(json!({ "id": "a:1" }), "hi")),
            Err(ReceiveError::Ignored { .. })
        ));
        for garbage in [
            json!([]),
            json!({ "type": "message" }),
            json!({ "type": "message", "id": "1" }),
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
        let dm = activity(
            json!({ "id": "a:1x", "conversationType": "personal" }),
            "hello",
        );
        let post = activity(
            json!({ "id": "19:c@thread.tacv2;messageid=1600", "conversationType": "channel",
                "isGroup": true }),
            "<at>clawgate</at> what now",
        );
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(), vec![dm, post]);
    }
}
