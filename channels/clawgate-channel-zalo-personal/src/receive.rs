//! Inbound: one listener message → a normalized message.
//!
//! The listener hands over `{"thread": "user" | "group", "message": <TMessage>}`. The event
//! id is Zalo's `msgId`, so a message pushed twice is one event to the engine.
//!
//! - Answered: text messages (`content` a string) from people: in a direct chat, from anyone
//!   (or the `allowed_senders`); in a group, only in `allowed_groups`.
//! - Not answered ([`ReceiveError::Ignored`]): the account's own messages (`uidFrom` "0"),
//!   attachments, stickers and other non-text content, groups not listed, senders not allowed.
//! - Senders listed in `bot_senders` are reported as bots (Zalo never says).

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

use crate::source::id_of;

/// Normalizes the listener messages of one account.
#[derive(Debug, Clone)]
pub struct ZaloPersonalReceiver {
    name: String,
    allowed_senders: BTreeSet<String>,
    allowed_groups: BTreeSet<String>,
    bot_senders: BTreeSet<String>,
}

impl ZaloPersonalReceiver {
    pub(crate) fn new(
        name: &str,
        allowed_senders: impl IntoIterator<Item = String>,
        allowed_groups: impl IntoIterator<Item = String>,
        bot_senders: impl IntoIterator<Item = String>,
    ) -> Self {
        ZaloPersonalReceiver {
            name: name.to_owned(),
            allowed_senders: allowed_senders.into_iter().collect(),
            allowed_groups: allowed_groups.into_iter().collect(),
            bot_senders: bot_senders.into_iter().collect(),
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

impl MessageReceiveAdapter for ZaloPersonalReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let group = match raw.get("thread").and_then(Value::as_str) {
            Some("user") => false,
            Some("group") => true,
            _ => return Err(self.malformed("an event without thread user|group")),
        };
        let msg = raw
            .get("message")
            .filter(|m| m.is_object())
            .ok_or_else(|| self.malformed("an event without message"))?;
        let msg_id =
            id_of(msg.get("msgId")).ok_or_else(|| self.malformed("a message without msgId"))?;
        let from =
            id_of(msg.get("uidFrom")).ok_or_else(|| self.malformed("a message without uidFrom"))?;
        if from == "0" {
            return Err(self.ignored("the account's own message"));
        }
        let target = if group {
            let grid = id_of(msg.get("idTo"))
                .ok_or_else(|| self.malformed("a group message without idTo"))?;
            if !self.allowed_groups.contains(&grid) {
                return Err(self.ignored(format!("group {grid} is not in allowed_groups")));
            }
            MessageTarget::group(grid)
        } else {
            MessageTarget::direct(from.clone())
        };
        if !self.allowed_senders.is_empty() && !self.allowed_senders.contains(&from) {
            return Err(self.ignored(format!("{from} is not in allowed_senders")));
        }
        let text = match msg.get("content") {
            Some(Value::String(text)) if !text.trim().is_empty() => text,
            Some(Value::String(_)) => return Err(self.ignored("an empty text")),
            _ => return Err(self.ignored("not a text message (attachment, sticker, …)")),
        };
        let bot = self.bot_senders.contains(&from);
        let mut sender = MessageActor::new(from.clone()).with_is_bot(bot);
        if let Some(name) = msg.get("dName").and_then(Value::as_str) {
            sender = sender.with_display_name(name);
        }
        let inbound = ChannelMessage::inbound(&msg_id, &self.name, target)
            .with_text(text)
            .with_sender(sender)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(msg_id, inbound).by_bot(bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use serde_json::json;

    fn event(thread: &str, from: &str, to: &str, content: Value) -> Value {
        json!({ "thread": thread, "message": {
            "msgId": "7001", "cliMsgId": "1700000000000", "uidFrom": from, "idTo": to,
            "msgType": "webchat", "content": content, "ts": "1700000000000", "dName": "An",
        }})
    }

    #[test]
    fn texts_from_people_are_normalized_and_the_rest_ignored() {
        let r = ZaloPersonalReceiver::new(
            "zp",
            Vec::new(),
            vec!["G1".to_owned()],
            vec!["B1".to_owned()],
        );
        let got = r
            .normalize(&event("user", "U1", "0", json!("xin chào")))
            .unwrap();
        assert_eq!(got.event_id, "7001");
        assert_eq!(got.message.target, MessageTarget::direct("U1"));
        assert_eq!(got.message.body.as_ref().unwrap().text, "xin chào");
        assert!(!got.is_bot_author);
        let in_group = r
            .normalize(&event("group", "U1", "G1", json!("hi")))
            .unwrap();
        assert_eq!(in_group.message.target, MessageTarget::group("G1"));
        assert!(
            r.normalize(&event("user", "B1", "0", json!("beep")))
                .unwrap()
                .is_bot_author
        );
        for raw in [
            event("user", "0", "U1", json!("our own")),
            event("group", "U1", "G2", json!("other group")),
            event("user", "U1", "0", json!({ "href": "https://f/x.png" })),
            event("user", "U1", "0", json!("  ")),
        ] {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Ignored { .. })),
                "{raw}"
            );
        }
        for raw in [
            json!({ "thread": "user" }),
            json!({ "message": {} }),
            json!([1]),
        ] {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Malformed { .. })),
                "{raw}"
            );
        }
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let r = ZaloPersonalReceiver::new(
            "zp",
            Vec::new(),
            vec!["G1".to_owned()],
            vec!["B1".to_owned()],
        );
        clawgate_conformance::fuzz::normalizer_never_panics(
            &r,
            vec![
                event("user", "U1", "0", json!("xin chào")),
                event("group", "U1", "G1", json!("hi")),
            ],
        );
    }
}
