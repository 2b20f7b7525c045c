//! Normalizing Talk's events, in both shapes the sources hand on:
//!
//! - `{"via":"webhook","event":{…}}` (bot mode): the Activity Streams 2.0 object Talk POSTs to a
//!   bot — `type` `Create` (a chat message), `Activity` (a system message), `Like`/`Undo`
//!   (reactions), `Join`/`Leave` (the bot enabled in or removed from a conversation); parsed
//!   into [`BotEvent`].
//! - `{"via":"chat","message":{…}}` (user mode): one message object of the OCS chat API
//!   (`id`, `token`, `actorType`, `actorId`, `actorDisplayName`, `timestamp`, `message`,
//!   `messageParameters`, `systemMessage`, `messageType`, `referenceId`); parsed into
//!   [`ChatMessage`].
//!
//! The event id is `talk:<message id>` in both (Talk's message ids are unique on a server), so
//! a second delivery of the same message is dropped by the engine's durable dedupe. The target
//! is the conversation token. Not answered (`ReceiveError::Ignored`): system messages, deleted
//! messages, reactions, joins and leaves, empty messages, and (user mode) the account's own
//! messages. Messages by bots (`actorType` `bots`, Matterbridge's `bridged`, or an Activity
//! Streams `Application` actor) are reported as bot authors.

use std::collections::BTreeMap;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde::Deserialize;
use serde_json::Value;

/// An Activity Streams actor (`{"type":"Person","id":"users/ada","name":"Ada"}`).
#[derive(Debug, Clone, Deserialize)]
pub struct BotActor {
    /// `Person`, `Application`, …
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The attendee type and id, `users/ada`, `guests/<sha1>`, `bots/…`.
    pub id: String,
    /// The display name.
    #[serde(default)]
    pub name: String,
}

/// The `object` of a bot event: the message (or, for `Join`/`Leave`, the conversation).
#[derive(Debug, Clone, Deserialize)]
pub struct BotObject {
    /// The message id (a number in `Create`; the conversation token in `Join`/`Leave`).
    pub id: Value,
    /// `message` for a written message, otherwise a system message identifier.
    #[serde(default)]
    pub name: String,
    /// A JSON string `{"message": …, "parameters": {…}}`.
    #[serde(default)]
    pub content: Option<String>,
    /// `text/markdown` or `text/plain`.
    #[serde(rename = "mediaType", default)]
    pub media_type: Option<String>,
}

/// The conversation of a bot event (`{"type":"Collection","id":<token>,"name":…}`).
#[derive(Debug, Clone, Deserialize)]
pub struct BotTarget {
    /// The conversation token.
    pub id: String,
    /// The conversation's name.
    #[serde(default)]
    pub name: String,
}

/// One webhook event Talk POSTs to a bot.
#[derive(Debug, Clone, Deserialize)]
pub struct BotEvent {
    /// `Create`, `Activity`, `Like`, `Undo`, `Join`, `Leave`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Who did it.
    pub actor: BotActor,
    /// The message.
    pub object: BotObject,
    /// The conversation (absent in `Join`/`Leave`).
    #[serde(default)]
    pub target: Option<BotTarget>,
}

/// The decoded `content` of a message object.
#[derive(Debug, Clone, Default, Deserialize)]
struct Content {
    #[serde(default)]
    message: String,
    #[serde(default)]
    parameters: Value,
}

/// One message of the OCS chat API.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChatMessage {
    /// The message id (unique on the server, increasing).
    pub id: i64,
    /// The conversation token.
    pub token: String,
    /// `users`, `guests`, `bots`, `bridged`, `federated_users`, …
    pub actor_type: String,
    /// The actor's id within its type.
    pub actor_id: String,
    /// The actor's display name.
    #[serde(default)]
    pub actor_display_name: String,
    /// Seconds since the epoch.
    #[serde(default)]
    pub timestamp: i64,
    /// The text, with `{placeholders}` for `messageParameters`.
    #[serde(default)]
    pub message: String,
    /// Mentions, files…: placeholder → `{name, …}` (`[]` when none).
    #[serde(default)]
    pub message_parameters: Value,
    /// Empty for a written message, otherwise the system message identifier.
    #[serde(default)]
    pub system_message: String,
    /// `comment`, `comment_deleted`, `system`, `command`, `voice-message`, …
    #[serde(default)]
    pub message_type: String,
    /// What the sender gave to find the message again (not unique).
    #[serde(default)]
    pub reference_id: Option<String>,
}

/// `text` with `{placeholders}` replaced by the parameters' display names (`@Ada` for a
/// mention shows as `Ada`).
fn render(text: &str, parameters: &Value) -> String {
    let Some(parameters) = parameters.as_object() else {
        return text.to_owned();
    };
    let names: BTreeMap<&str, &str> = parameters
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.get("name")?.as_str()?)))
        .collect();
    let mut out = text.to_owned();
    for (key, name) in names {
        out = out.replace(&format!("{{{key}}}"), name);
    }
    out
}

/// Normalizes the events of one Talk account.
#[derive(Debug, Clone)]
pub struct TalkReceiver {
    name: String,
    /// User mode: the account's own user id (its messages are never answered).
    own_user: Option<String>,
}

impl TalkReceiver {
    /// The receiver of channel `name`; `own_user` is the account's user id in user mode.
    pub fn new(name: &str, own_user: Option<String>) -> TalkReceiver {
        TalkReceiver {
            name: name.to_owned(),
            own_user,
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

    fn webhook(&self, raw: &Value, event: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let event: BotEvent = serde_json::from_value(event.clone())
            .map_err(|e| self.malformed(format!("not a Talk bot event: {e}")))?;
        if event.kind != "Create" {
            return Err(self.ignored(format!("a {} event is not a message", event.kind)));
        }
        if event.object.name != "message" {
            return Err(self.ignored(format!(
                "a {:?} message is not written text",
                event.object.name
            )));
        }
        let id = match &event.object.id {
            Value::Number(n) => n.to_string(),
            Value::String(s) if !s.is_empty() => s.clone(),
            _ => return Err(self.malformed("a Create event without a message id")),
        };
        let target = event
            .target
            .as_ref()
            .filter(|t| !t.id.is_empty())
            .ok_or_else(|| self.malformed("a Create event without a conversation"))?;
        let content: Content = serde_json::from_str(event.object.content.as_deref().unwrap_or(""))
            .map_err(|e| self.malformed(format!("a message whose content is not JSON: {e}")))?;
        let text = render(&content.message, &content.parameters);
        if text.trim().is_empty() {
            return Err(self.ignored("a message without text"));
        }
        let bot = event.actor.kind == "Application"
            || event.actor.id.starts_with("bots/")
            || event.actor.id.starts_with("bridged/");
        let sender = MessageActor::new(&event.actor.id)
            .with_display_name(event.actor.name.clone())
            .with_is_bot(bot);
        let inbound = ChannelMessage::inbound(&id, &self.name, MessageTarget::group(&target.id))
            .with_text(text)
            .with_sender(sender)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(format!("talk:{id}"), inbound).by_bot(bot))
    }

    fn chat(&self, raw: &Value, message: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let message: ChatMessage = serde_json::from_value(message.clone())
            .map_err(|e| self.malformed(format!("not a Talk chat message: {e}")))?;
        if !message.system_message.is_empty() {
            return Err(self.ignored(format!("a system message ({})", message.system_message)));
        }
        if message.message_type != "comment" {
            return Err(self.ignored(format!("a {:?} message", message.message_type)));
        }
        if message.actor_type == "users" && self.own_user.as_deref() == Some(&message.actor_id) {
            return Err(self.ignored("a message by this account itself"));
        }
        let text = render(&message.message, &message.message_parameters);
        if text.trim().is_empty() {
            return Err(self.ignored("a message without text"));
        }
        let bot = matches!(message.actor_type.as_str(), "bots" | "bridged");
        let sender = MessageActor::new(format!("{}/{}", message.actor_type, message.actor_id))
            .with_display_name(message.actor_display_name.clone())
            .with_is_bot(bot);
        let id = message.id.to_string();
        let mut inbound =
            ChannelMessage::inbound(&id, &self.name, MessageTarget::group(&message.token))
                .with_text(text)
                .with_sender(sender)
                .with_raw(raw.clone());
        if message.timestamp > 0 {
            inbound = inbound.with_timestamp(message.timestamp.saturating_mul(1_000));
        }
        Ok(NormalizedInbound::new(format!("talk:{id}"), inbound).by_bot(bot))
    }
}

impl MessageReceiveAdapter for TalkReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        match (raw.get("via").and_then(Value::as_str), raw) {
            (Some("webhook"), _) => self.webhook(
                raw,
                raw.get("event")
                    .ok_or_else(|| self.malformed("a webhook record without its event"))?,
            ),
            (Some("chat"), _) => self.chat(
                raw,
                raw.get("message")
                    .ok_or_else(|| self.malformed("a chat record without its message"))?,
            ),
            (other, _) => Err(self.malformed(format!("an unknown Talk event source {other:?}"))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use serde_json::json;

    use super::*;

    fn create(id: i64, actor: &str, kind: &str, text: &str) -> Value {
        json!({ "via": "webhook", "event": {
            "type": "Create",
            "actor": { "type": kind, "id": actor, "name": "Ada" },
            "object": { "id": id, "name": "message",
                "content": json!({ "message": text, "parameters": {} }).to_string(),
                "mediaType": "text/markdown" },
            "target": { "id": "n3xtc10ud", "name": "Team" } } })
    }

    fn chat(id: i64, actor_type: &str, actor: &str, text: &str) -> Value {
        json!({ "via": "chat", "message": { "id": id, "token": "n3xtc10ud",
            "actorType": actor_type, "actorId": actor, "actorDisplayName": "X",
            "timestamp": 1_700_000_000, "message": text, "messageParameters": [],
            "systemMessage": "", "messageType": "comment", "referenceId": "" } })
    }

    #[test]
    fn webhook_messages_are_prompts_keyed_by_message_id() {
        let r = TalkReceiver::new("nextcloud", None);
        let inbound = r
            .normalize(&create(42, "users/ada", "Person", "hi"))
            .unwrap();
        assert_eq!(inbound.event_id, "talk:42");
        assert_eq!(inbound.message.target.id, "n3xtc10ud");
        assert!(!inbound.is_bot_author);
        assert!(
            r.normalize(&create(43, "bots/x", "Application", "beep"))
                .unwrap()
                .is_bot_author
        );
        let mention = json!({ "via": "webhook", "event": {
            "type": "Create", "actor": { "type": "Person", "id": "users/ada", "name": "Ada" },
            "object": { "id": 44, "name": "message",
                "content": "{\"message\":\"hi {mention-user1}\",\"parameters\":{\"mention-user1\":{\"type\":\"user\",\"id\":\"bob\",\"name\":\"Bob\"}}}" },
            "target": { "id": "t", "name": "T" } } });
        assert_eq!(
            r.normalize(&mention).unwrap().message.body.unwrap().text,
            "hi Bob"
        );
    }

    #[test]
    fn joins_system_messages_and_own_messages_are_ignored_and_garbage_is_malformed() {
        let r = TalkReceiver::new("nextcloud", Some("clawgate".into()));
        let join = json!({ "via": "webhook", "event": { "type": "Join",
            "actor": { "type": "Application", "id": "bots/x", "name": "x" },
            "object": { "id": "n3xtc10ud", "name": "Team" } } });
        let mut system = chat(5, "users", "ada", "You joined");
        system["message"]["systemMessage"] = json!("user_added");
        let mut deleted = chat(6, "users", "ada", "Message deleted by author");
        deleted["message"]["messageType"] = json!("comment_deleted");
        for ignored in [
            join,
            system,
            deleted,
            chat(7, "users", "clawgate", "my own reply"),
            chat(8, "users", "ada", "  "),
        ] {
            assert!(
                matches!(r.normalize(&ignored), Err(ReceiveError::Ignored { .. })),
                "{ignored}"
            );
        }
        assert!(r.normalize(&chat(9, "users", "ada", "hello")).is_ok());
        assert!(
            r.normalize(&chat(10, "bots", "bot-x", "beep"))
                .unwrap()
                .is_bot_author
        );
        for garbage in [
            json!({}),
            json!({ "via": "webhook", "event": { "type": "Create" } }),
            json!({ "via": "webhook", "event": { "type": "Create",
                "actor": { "id": "users/a" }, "object": { "id": 1, "name": "message",
                "content": "not json" }, "target": { "id": "t" } } }),
            json!({ "via": "chat", "message": { "id": "x" } }),
            json!({ "via": "elsewhere" }),
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
        clawgate_conformance::fuzz::normalizer_never_panics(
            &TalkReceiver::new("nextcloud", None),
            vec![
                create(42, "users/ada", "Person", "hi"),
                create(43, "bots/x", "Application", "beep"),
                chat(7, "users", "ada", "hello"),
            ],
        );
    }
}
