//! Inbound: one BlueBubbles webhook body (`{type, data}`) → a normalized message.
//!
//! The event id is the message's `guid`, so a second copy of an event (BlueBubbles does not
//! retry, but its webhook and a replay, or two registered URLs, can bring one twice) is one
//! event to the engine, deduped durably.
//!
//! - Answered: `new-message` events with text, from someone else (`isFromMe: false`), in any
//!   chat; with `from_me_is_inbound` (the bot runs on the person's own Apple ID, who writes
//!   from their other devices) `isFromMe: true` ones too — the webhook source has already
//!   dropped the echoes of our own sends ([`crate::EchoCache`]).
//! - Not answered ([`ReceiveError::Ignored`]): `isFromMe` messages otherwise (our own sends,
//!   or someone typing on the bot's Mac), tapbacks (`associatedMessageType`), system and
//!   group-event rows, messages without text (attachments alone), every other event type
//!   (`updated-message`: edits, delivery and read updates; typing; chat changes), and senders
//!   outside `allowed_senders`.
//! - Conversations: the target id is the chat guid (`iMessage;-;+1555…` is direct,
//!   `iMessage;+;chat…` a group); the sender is the handle's address.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

/// The event of a new chat.db row.
pub(crate) const NEW_MESSAGE: &str = "new-message";

/// Normalizes the webhook events of one account.
#[derive(Debug, Clone)]
pub struct ImessageReceiver {
    name: String,
    from_me_is_inbound: bool,
    allowed_senders: BTreeSet<String>,
    bot_senders: BTreeSet<String>,
}

/// Whether a chat guid names a group chat.
pub(crate) fn is_group(chat_guid: &str) -> bool {
    chat_guid.contains(";+;")
}

impl ImessageReceiver {
    pub(crate) fn new(
        name: &str,
        from_me_is_inbound: bool,
        allowed_senders: impl IntoIterator<Item = String>,
        bot_senders: impl IntoIterator<Item = String>,
    ) -> ImessageReceiver {
        ImessageReceiver {
            name: name.to_owned(),
            from_me_is_inbound,
            allowed_senders: allowed_senders.into_iter().collect(),
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

impl MessageReceiveAdapter for ImessageReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let kind = raw
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a webhook body without `type`"))?;
        let data = raw
            .get("data")
            .filter(|d| d.is_object())
            .ok_or_else(|| self.malformed("a webhook body without a `data` object"))?;
        if kind != NEW_MESSAGE {
            return Err(self.ignored(format!("a `{kind}` event is not a new message")));
        }
        let at = |key: &str| data.get(key).and_then(Value::as_str);
        let guid = at("guid")
            .filter(|g| !g.is_empty())
            .ok_or_else(|| self.malformed("a message without guid"))?;
        let from_me = data
            .get("isFromMe")
            .and_then(Value::as_bool)
            .ok_or_else(|| self.malformed("a message without isFromMe"))?;
        if from_me && !self.from_me_is_inbound {
            return Err(self.ignored("a message sent from this account (isFromMe)"));
        }
        let chat = data
            .pointer("/chats/0/guid")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a message without chats[0].guid"))?;
        let flag = |key: &str| data.get(key).and_then(Value::as_bool).unwrap_or(false);
        if data
            .get("associatedMessageType")
            .is_some_and(|t| !t.is_null() && t != "")
        {
            return Err(self.ignored("a tapback (associatedMessageType)"));
        }
        if flag("isSystemMessage")
            || flag("isServiceMessage")
            || data.get("itemType").and_then(Value::as_i64).unwrap_or(0) != 0
        {
            return Err(self.ignored("a system or group-event row"));
        }
        let text = at("text")
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| self.ignored("a message without text"))?;
        let sender = if from_me {
            "me".to_owned()
        } else {
            data.pointer("/handle/address")
                .and_then(Value::as_str)
                .ok_or_else(|| self.malformed("a message from someone without handle.address"))?
                .to_owned()
        };
        if !self.allowed_senders.is_empty() && !self.allowed_senders.contains(&sender) {
            return Err(self.ignored(format!("{sender} is not in allowed_senders")));
        }
        // iMessage does not say who is automated; the operator lists the handles that are.
        let bot = self.bot_senders.contains(&sender);
        let target = if is_group(chat) {
            MessageTarget::group(chat)
        } else {
            MessageTarget::direct(chat)
        };
        let inbound = ChannelMessage::inbound(guid, &self.name, target)
            .with_text(text)
            .with_sender(MessageActor::new(&sender).with_is_bot(bot))
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(guid, inbound).by_bot(bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: &str, from_me: bool, from: &str, text: &str) -> Value {
        json!({ "type": kind, "data": {
            "guid": "G1", "text": text, "isFromMe": from_me, "handle": { "address": from },
            "chats": [{ "guid": "iMessage;-;+15550001111" }], "itemType": 0,
            "associatedMessageType": null, "isSystemMessage": false,
        }})
    }

    #[test]
    fn texts_from_people_are_normalized_and_the_rest_ignored() {
        let r = ImessageReceiver::new("imessage", false, Vec::new(), vec!["+1999".to_owned()]);
        let got = r
            .normalize(&event("new-message", false, "+15550001111", "hi"))
            .unwrap();
        assert_eq!(got.event_id, "G1");
        assert_eq!(
            got.message.target,
            MessageTarget::direct("iMessage;-;+15550001111")
        );
        assert!(!got.is_bot_author);
        assert!(
            r.normalize(&event("new-message", false, "+1999", "beep"))
                .unwrap()
                .is_bot_author
        );
        let mut tapback = event("new-message", false, "+1", "Loved “hi”");
        tapback["data"]["associatedMessageType"] = json!("love");
        for raw in [
            event("new-message", true, "", "our own"),
            event("updated-message", false, "+1", "edited"),
            event("new-message", false, "+1", "  "),
            tapback,
        ] {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Ignored { .. })),
                "{raw}"
            );
        }
        for raw in [
            json!({ "type": "new-message" }),
            json!({ "data": {} }),
            json!({ "type": "new-message", "data": { "isFromMe": false } }),
        ] {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Malformed { .. })),
                "{raw}"
            );
        }
        let self_chat = ImessageReceiver::new("imessage", true, Vec::new(), Vec::new());
        assert_eq!(
            self_chat
                .normalize(&event("new-message", true, "", "from my phone"))
                .unwrap()
                .message
                .sender
                .unwrap()
                .id,
            "me"
        );
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let r = ImessageReceiver::new("imessage", false, Vec::new(), vec!["+1999".to_owned()]);
        clawgate_conformance::fuzz::normalizer_never_panics(
            &r,
            vec![
                event("new-message", false, "+15550001111", "hi"),
                event("new-message", false, "+1999", "beep"),
            ],
        );
    }
}
