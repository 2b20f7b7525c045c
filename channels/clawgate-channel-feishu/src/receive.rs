//! Inbound: one decrypted schema 2.0 event → a normalized message.
//!
//! - The event id the engine dedupes on is the **message id** (`om_…`) of an
//!   `im.message.receive_v1` event: a redelivery carries the same `header.event_id` and the same
//!   message, and a re-push of the same message under a new `event_id` must not be answered
//!   twice either, so the message id covers both. `header.event_id` stays in the raw payload.
//! - Text and post messages from a person in a p2p chat (→ direct) or a group (→ group, with
//!   the topic's `thread_id`) are prompts; mention placeholders (`@_user_1`) become `@name`.
//! - Not answered (`ReceiveError::Ignored`, with the reason): other event types, schema 1.0
//!   events, other message types (images, files, stickers…), empty texts, and this bot's own
//!   messages. Messages of other apps are passed on marked as bot-authored.

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

/// The event type of a received message.
pub const MESSAGE_RECEIVED: &str = "im.message.receive_v1";

/// Normalizes the events of one Feishu app.
#[derive(Debug, Clone)]
pub struct FeishuReceiver {
    name: String,
    /// The bot's own open id (`GET /open-apis/bot/v3/info`), when known.
    bot_open_id: Option<String>,
    app_id: String,
}

impl FeishuReceiver {
    pub(crate) fn new(name: &str, app_id: &str, bot_open_id: Option<String>) -> FeishuReceiver {
        FeishuReceiver {
            name: name.to_owned(),
            bot_open_id,
            app_id: app_id.to_owned(),
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

fn str_of(v: &Value, key: &str) -> Option<String> {
    v.get(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The visible text of a `text` or `post` message's content.
fn text_of(message_type: &str, content: &Value, mentions: &[Value]) -> Option<String> {
    let mut text = match message_type {
        "text" => content.get("text")?.as_str()?.to_owned(),
        "post" => {
            // A post is `{title, content: [[element…]…]}`, possibly under a locale key.
            let post = if content.get("content").is_some() {
                content
            } else {
                content.as_object()?.values().next()?
            };
            let mut lines = Vec::new();
            if let Some(title) = post
                .get("title")
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
            {
                lines.push(title.to_owned());
            }
            for line in post.get("content")?.as_array()? {
                let line: String = line
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.get("text").and_then(Value::as_str))
                    .collect();
                lines.push(line);
            }
            lines.join("\n")
        }
        _ => return None,
    };
    for mention in mentions {
        if let (Some(key), Some(name)) = (
            mention.get("key").and_then(Value::as_str),
            mention.get("name").and_then(Value::as_str),
        ) {
            text = text.replace(key, &format!("@{name}"));
        }
    }
    Some(text)
}

impl MessageReceiveAdapter for FeishuReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        if !raw.is_object() {
            return Err(self.malformed("a Feishu event is a JSON object"));
        }
        if raw.get("schema").and_then(Value::as_str) != Some("2.0") {
            return Err(if raw.get("uuid").is_some() {
                self.ignored("a schema 1.0 event (subscribe to 2.0 events)")
            } else {
                self.malformed("not a schema 2.0 event envelope")
            });
        }
        let header = raw
            .get("header")
            .ok_or_else(|| self.malformed("a schema 2.0 event without a header"))?;
        str_of(header, "event_id").ok_or_else(|| self.malformed("an event without an event_id"))?;
        let event_type = str_of(header, "event_type").unwrap_or_default();
        if event_type != MESSAGE_RECEIVED {
            return Err(self.ignored(format!("a {event_type:?} event is not a message")));
        }
        let event = raw
            .get("event")
            .ok_or_else(|| self.malformed("a message event without an `event`"))?;
        let message = event
            .get("message")
            .filter(|m| m.is_object())
            .ok_or_else(|| self.malformed("a message event without a `message` object"))?;
        let message_id = str_of(message, "message_id")
            .ok_or_else(|| self.malformed("a message without a message_id"))?;
        let chat_id = str_of(message, "chat_id")
            .ok_or_else(|| self.malformed("a message without a chat_id"))?;
        let sender = event.get("sender").cloned().unwrap_or(Value::Null);
        let sender_type = str_of(&sender, "sender_type").unwrap_or_default();
        let open_id = sender.get("sender_id").and_then(|s| str_of(s, "open_id"));
        let from_bot = sender_type == "app";
        if from_bot
            && (open_id.is_some() && open_id == self.bot_open_id
                || sender
                    .get("sender_id")
                    .and_then(|s| str_of(s, "app_id"))
                    .as_deref()
                    == Some(self.app_id.as_str()))
        {
            return Err(self.ignored("this bot's own message"));
        }
        let message_type = str_of(message, "message_type").unwrap_or_default();
        let content: Value = str_of(message, "content")
            .and_then(|c| serde_json::from_str(&c).ok())
            .unwrap_or(Value::Null);
        let mentions = message
            .get("mentions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let text = text_of(&message_type, &content, &mentions).ok_or_else(|| {
            self.ignored(format!("a {message_type} message is not a text prompt"))
        })?;
        if text.trim().is_empty() {
            return Err(self.ignored("a message without text"));
        }
        let target = match str_of(message, "chat_type").as_deref() {
            Some("p2p") => MessageTarget::direct(&chat_id),
            Some("group" | "topic_group") => MessageTarget::group(&chat_id),
            other => return Err(self.malformed(format!("an unknown chat_type {other:?}"))),
        }
        .with_thread_id(str_of(message, "thread_id"));
        let mut actor = MessageActor::new(open_id.unwrap_or_default());
        actor.is_bot = from_bot;
        let mut inbound = ChannelMessage::inbound(&message_id, &self.name, target)
            .with_text(text)
            .with_sender(actor)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        inbound.timestamp = str_of(message, "create_time").and_then(|t| t.parse().ok());
        Ok(NormalizedInbound::new(message_id, inbound).by_bot(from_bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use clawgate_types::TargetKind;
    use serde_json::json;

    use super::*;

    fn receiver() -> FeishuReceiver {
        FeishuReceiver::new("feishu", "cli_app", Some("ou_bot".into()))
    }

    fn event(event_id: &str, message: Value, sender: Value) -> Value {
        json!({ "schema": "2.0",
            "header": { "event_id": event_id, "event_type": MESSAGE_RECEIVED,
                "create_time": "1700000000000", "token": "t", "app_id": "cli_app", "tenant_key": "tk" },
            "event": { "sender": sender, "message": message } })
    }

    fn person() -> Value {
        json!({ "sender_id": { "open_id": "ou_ada" }, "sender_type": "user", "tenant_key": "tk" })
    }

    fn text(id: &str, chat_type: &str, text: &str) -> Value {
        json!({ "message_id": id, "chat_id": "oc_1", "chat_type": chat_type,
            "message_type": "text", "create_time": "1700000000000",
            "content": json!({ "text": text }).to_string() })
    }

    #[test]
    fn p2p_group_and_thread_messages_are_prompts_keyed_by_message_id() {
        let r = receiver();
        let dm = r
            .normalize(&event("ev1", text("om_1", "p2p", "hi"), person()))
            .unwrap();
        assert_eq!(dm.event_id, "om_1");
        assert_eq!(dm.message.target.kind, TargetKind::Direct);
        assert_eq!(dm.message.target.id, "oc_1");
        assert!(!dm.is_bot_author);
        let mut threaded = text("om_2", "group", "@_user_1 hello");
        threaded["thread_id"] = json!("omt_1");
        threaded["mentions"] =
            json!([{ "key": "@_user_1", "name": "Bot", "id": { "open_id": "ou_bot" } }]);
        let group = r.normalize(&event("ev2", threaded, person())).unwrap();
        assert_eq!(group.message.target.kind, TargetKind::Group);
        assert_eq!(group.message.target.thread_id.as_deref(), Some("omt_1"));
        assert_eq!(group.message.body.unwrap().text, "@Bot hello");
        // A re-push of the same message under a new event id is the same event.
        let again = r
            .normalize(&event("ev3", text("om_1", "p2p", "hi"), person()))
            .unwrap();
        assert_eq!(again.event_id, dm.event_id);
        let post = json!({ "message_id": "om_4", "chat_id": "oc_1", "chat_type": "p2p",
            "message_type": "post", "content": json!({ "title": "T",
                "content": [[{ "tag": "text", "text": "a" }, { "tag": "a", "text": "b", "href": "x" }]] }).to_string() });
        assert_eq!(
            r.normalize(&event("ev4", post, person()))
                .unwrap()
                .message
                .body
                .unwrap()
                .text,
            "T\nab"
        );
    }

    #[test]
    fn what_is_not_a_prompt_is_ignored_and_garbage_is_malformed() {
        let r = receiver();
        let own = json!({ "sender_id": { "open_id": "ou_bot" }, "sender_type": "app" });
        let image = json!({ "message_id": "om_5", "chat_id": "oc_1", "chat_type": "p2p",
            "message_type": "image", "content": "{\"image_key\":\"img\"}" });
        let mut other_type = event("ev6", text("om_6", "p2p", "x"), person());
        other_type["header"]["event_type"] = json!("im.chat.member.bot.added_v1");
        for ignored in [
            event("ev1", text("om_1", "p2p", "x"), own),
            event("ev2", image, person()),
            event("ev3", text("om_3", "p2p", "   "), person()),
            other_type,
            json!({ "uuid": "u", "event": { "type": "message" } }),
        ] {
            assert!(
                matches!(r.normalize(&ignored), Err(ReceiveError::Ignored { .. })),
                "{ignored}"
            );
        }
        let other_bot = json!({ "sender_id": { "open_id": "ou_other" }, "sender_type": "app" });
        assert!(
            r.normalize(&event("ev7", text("om_7", "group", "beep"), other_bot))
                .unwrap()
                .is_bot_author
        );
        for garbage in [
            json!([]),
            json!({}),
            json!({ "schema": "2.0" }),
            event("ev8", json!({ "chat_id": "oc" }), person()),
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
            &receiver(),
            vec![
                event("ev1", text("om_1", "p2p", "hi"), person()),
                event("ev2", text("om_2", "group", "@_user_1 hello"), person()),
            ],
        );
    }
}
