//! Inbound: one `messages` notification holding one message → a normalized message.
//!
//! The webhook source splits each delivery into envelopes of one message each (the shape Meta
//! posts, with one `entry`, one `change` and one `messages[]` item), so the event id is the
//! message's `wamid`: every redelivery of it, alone or batched with others, is one event to the
//! engine, deduped durably for as long as Meta retries (7 days).
//!
//! - Senders listed in `bot_senders` (automated numbers the operator knows) are reported as
//!   bots, so `allow_bots` governs them; WhatsApp itself never says.
//! - Conversations are direct: the target is the person's `wa_id` (`from`).
//! - Answered: `text`, a quick-reply `button`, an `interactive` button or list reply, and media
//!   with a caption (the caption is the prompt; the media is not fetched). Not answered
//!   ([`ReceiveError::Ignored`]): reactions, captionless media, locations, contacts, `system`,
//!   `unsupported`, revokes, and anything not for this phone number.
//! - Our own messages never come back as `messages` (statuses are the source's, routed to the
//!   status book); a coexistence echo (`smb_message_echoes`) or a message `from` our own number
//!   is ignored all the same.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

/// Normalizes the notifications of one business phone number.
#[derive(Debug, Clone)]
pub struct WhatsAppReceiver {
    name: String,
    phone_number_id: String,
    allowed_senders: BTreeSet<String>,
    bot_senders: BTreeSet<String>,
}

impl WhatsAppReceiver {
    pub(crate) fn new(
        name: &str,
        phone_number_id: &str,
        allowed_senders: impl IntoIterator<Item = String>,
        bot_senders: impl IntoIterator<Item = String>,
    ) -> WhatsAppReceiver {
        WhatsAppReceiver {
            name: name.to_owned(),
            phone_number_id: phone_number_id.to_owned(),
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

/// The prompt text of a message, by its `type`.
fn text_of(message: &Value, kind: &str) -> Option<String> {
    let at = |pointer: &str| message.pointer(pointer).and_then(Value::as_str);
    let text = match kind {
        "text" => at("/text/body"),
        "button" => at("/button/text"),
        "interactive" => {
            at("/interactive/button_reply/title").or_else(|| at("/interactive/list_reply/title"))
        }
        "image" | "video" | "document" => at(&format!("/{kind}/caption")),
        _ => None,
    }?;
    (!text.trim().is_empty()).then(|| text.to_owned())
}

impl MessageReceiveAdapter for WhatsAppReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        if raw.get("object").and_then(Value::as_str) != Some("whatsapp_business_account") {
            return Err(self.malformed("not a whatsapp_business_account notification"));
        }
        let change = raw
            .pointer("/entry/0/changes/0")
            .ok_or_else(|| self.malformed("a notification without entry[0].changes[0]"))?;
        let field = change.get("field").and_then(Value::as_str).unwrap_or("");
        if field != "messages" {
            return Err(self.ignored(format!("a `{field}` notification is not a message")));
        }
        let value = change
            .get("value")
            .ok_or_else(|| self.malformed("a change without value"))?;
        let number = value
            .pointer("/metadata/phone_number_id")
            .and_then(Value::as_str);
        if number != Some(self.phone_number_id.as_str()) {
            return Err(self.ignored(format!(
                "a notification for phone number {number:?}, not {}",
                self.phone_number_id
            )));
        }
        let Some(message) = value.pointer("/messages/0") else {
            return Err(self.ignored("a status notification: it settles sends, it is not a turn"));
        };
        let id = message
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a message without id"))?;
        let from = message
            .get("from")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a message without from"))?;
        let own = value
            .pointer("/metadata/display_phone_number")
            .and_then(Value::as_str)
            .map(|n| n.trim_start_matches('+'));
        if own == Some(from) {
            return Err(self.ignored("a message from this business number itself"));
        }
        if !self.allowed_senders.is_empty() && !self.allowed_senders.contains(from) {
            return Err(self.ignored(format!("{from} is not in allowed_senders")));
        }
        let kind = message.get("type").and_then(Value::as_str).unwrap_or("");
        let text = text_of(message, kind)
            .ok_or_else(|| self.ignored(format!("a `{kind}` message has no text to answer")))?;
        let name = value
            .get("contacts")
            .and_then(Value::as_array)
            .and_then(|contacts| {
                contacts
                    .iter()
                    .find(|c| c.get("wa_id").and_then(Value::as_str) == Some(from))
            })
            .and_then(|c| c.pointer("/profile/name"))
            .and_then(Value::as_str);
        // WhatsApp does not say who is automated; the operator lists the numbers that are.
        let bot = self.bot_senders.contains(from);
        let mut sender = MessageActor::new(from).with_is_bot(bot);
        if let Some(name) = name {
            sender = sender.with_display_name(name.to_owned());
        }
        let inbound = ChannelMessage::inbound(id, &self.name, MessageTarget::direct(from))
            .with_text(text)
            .with_sender(sender)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(id, inbound).by_bot(bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use serde_json::json;

    fn envelope(message: Value) -> Value {
        json!({
            "object": "whatsapp_business_account",
            "entry": [{ "id": "WABA", "changes": [{ "field": "messages", "value": {
                "messaging_product": "whatsapp",
                "metadata": { "display_phone_number": "15550001111", "phone_number_id": "PN1" },
                "contacts": [{ "profile": { "name": "Ada" }, "wa_id": "4915112345" }],
                "messages": [message],
            }}]}],
        })
    }

    fn receiver() -> WhatsAppReceiver {
        WhatsAppReceiver::new("whatsapp", "PN1", Vec::new(), vec!["4917000".to_owned()])
    }

    #[test]
    fn messages_are_normalized_by_type_and_the_rest_ignored() {
        let r = receiver();
        let text = envelope(
            json!({ "from": "4915112345", "id": "wamid.A", "timestamp": "1",
            "type": "text", "text": { "body": "hello" } }),
        );
        let got = r.normalize(&text).unwrap();
        assert_eq!(got.event_id, "wamid.A");
        assert_eq!(got.message.body.as_ref().unwrap().text, "hello");
        assert_eq!(got.message.target, MessageTarget::direct("4915112345"));
        assert_eq!(
            got.message.sender.as_ref().unwrap().display_name.as_deref(),
            Some("Ada")
        );
        let button = envelope(json!({ "from": "4915112345", "id": "wamid.B", "type":
            "interactive", "interactive": { "type": "button_reply",
            "button_reply": { "id": "b1", "title": "Yes" } } }));
        assert_eq!(
            r.normalize(&button).unwrap().message.body.unwrap().text,
            "Yes"
        );
        for ignored in [
            envelope(
                json!({ "from": "4915112345", "id": "wamid.C", "type": "reaction",
                "reaction": { "message_id": "wamid.A", "emoji": "👍" } }),
            ),
            envelope(
                json!({ "from": "4915112345", "id": "wamid.D", "type": "image",
                "image": { "id": "m1", "mime_type": "image/jpeg" } }),
            ),
            envelope(
                json!({ "from": "15550001111", "id": "wamid.E", "type": "text",
                "text": { "body": "our own" } }),
            ),
        ] {
            assert!(
                matches!(r.normalize(&ignored), Err(ReceiveError::Ignored { .. })),
                "{ignored}"
            );
        }
        let mut status = envelope(json!({}));
        status["entry"][0]["changes"][0]["value"]
            .as_object_mut()
            .unwrap()
            .remove("messages");
        assert!(matches!(
            r.normalize(&status),
            Err(ReceiveError::Ignored { .. })
        ));
        let mut other_number = text.clone();
        other_number["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"] =
            json!("PN2");
        assert!(matches!(
            r.normalize(&other_number),
            Err(ReceiveError::Ignored { .. })
        ));
        assert!(matches!(
            r.normalize(&json!({ "object": "page" })),
            Err(ReceiveError::Malformed { .. })
        ));
        let only_bob =
            WhatsAppReceiver::new("whatsapp", "PN1", vec!["49999".to_owned()], Vec::new());
        assert!(matches!(
            only_bob.normalize(&text),
            Err(ReceiveError::Ignored { .. })
        ));
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let text = envelope(
            json!({ "from": "4915112345", "id": "wamid.A", "timestamp": "1",
            "type": "text", "text": { "body": "hello" } }),
        );
        let button = envelope(json!({ "from": "4915112345", "id": "wamid.B", "type":
            "interactive", "interactive": { "type": "button_reply",
            "button_reply": { "id": "b1", "title": "Yes" } } }));
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(), vec![text, button]);
    }
}
