//! Inbound: one OA webhook event → a normalized message.
//!
//! The event id is the message's `msg_id`, so every redelivery of it (Zalo posts again when
//! it is not answered 200 within about 2 seconds) is one event to the engine, deduped durably.
//!
//! - Answered: `user_send_text` from a person to this OA (`recipient.id` is the OA).
//! - Not answered ([`ReceiveError::Ignored`]): `oa_send_text` (the OA's own sends, ours
//!   included, which the webhook source writes to the echo book instead), follows, reads,
//!   `user_received_message`, stickers, images and every other event, events of another app,
//!   and people outside `allowed_senders`.
//! - Senders listed in `bot_senders` (automated accounts the operator knows) are reported as
//!   bots, so `allow_bots` governs them; Zalo itself never says.
//! - Conversations are direct: the target is the person's OA-scoped user id (`sender.id`).

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

/// The event of a person writing text to the OA.
pub(crate) const USER_SEND_TEXT: &str = "user_send_text";
/// The event of the OA sending text (through the API, ours, or from the OA chat console).
pub(crate) const OA_SEND_TEXT: &str = "oa_send_text";

/// Normalizes the webhook events of one OA.
#[derive(Debug, Clone)]
pub struct ZaloReceiver {
    name: String,
    app_id: String,
    oa_id: Option<String>,
    allowed_senders: BTreeSet<String>,
    bot_senders: BTreeSet<String>,
}

impl ZaloReceiver {
    pub(crate) fn new(
        name: &str,
        app_id: &str,
        oa_id: Option<String>,
        allowed_senders: impl IntoIterator<Item = String>,
        bot_senders: impl IntoIterator<Item = String>,
    ) -> ZaloReceiver {
        ZaloReceiver {
            name: name.to_owned(),
            app_id: app_id.to_owned(),
            oa_id,
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

impl MessageReceiveAdapter for ZaloReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let at = |pointer: &str| raw.pointer(pointer).and_then(Value::as_str);
        let event =
            at("/event_name").ok_or_else(|| self.malformed("an event without event_name"))?;
        let app_id = at("/app_id");
        if app_id.is_some_and(|id| id != self.app_id) {
            return Err(self.ignored(format!("an event of app {app_id:?}, not {}", self.app_id)));
        }
        if event == OA_SEND_TEXT {
            return Err(
                self.ignored("the OA's own message (an echo settles sends; it is not a turn)")
            );
        }
        if event != USER_SEND_TEXT {
            return Err(self.ignored(format!("a `{event}` event is not a text to answer")));
        }
        let from = at("/sender/id").ok_or_else(|| self.malformed("an event without sender.id"))?;
        if let (Some(oa), Some(to)) = (self.oa_id.as_deref(), at("/recipient/id"))
            && oa != to
        {
            return Err(self.ignored(format!("a message to OA {to}, not {oa}")));
        }
        if self.oa_id.as_deref() == Some(from) {
            return Err(self.ignored("a message from the OA itself"));
        }
        let msg_id =
            at("/message/msg_id").ok_or_else(|| self.malformed("a message without msg_id"))?;
        if !self.allowed_senders.is_empty() && !self.allowed_senders.contains(from) {
            return Err(self.ignored(format!("{from} is not in allowed_senders")));
        }
        let text = at("/message/text")
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| self.ignored("a user_send_text without text"))?;
        // Zalo does not say who is automated; the operator lists the user ids that are.
        let bot = self.bot_senders.contains(from);
        let inbound = ChannelMessage::inbound(msg_id, &self.name, MessageTarget::direct(from))
            .with_text(text)
            .with_sender(MessageActor::new(from).with_is_bot(bot))
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

    fn event(name: &str, from: &str, to: &str, text: &str) -> Value {
        json!({
            "app_id": "APP", "user_id_by_app": "552177279717587730", "event_name": name,
            "timestamp": "1700000000000", "sender": { "id": from }, "recipient": { "id": to },
            "message": { "msg_id": "m1", "text": text },
        })
    }

    #[test]
    fn texts_from_people_are_normalized_and_the_rest_ignored() {
        let r = ZaloReceiver::new(
            "zalo",
            "APP",
            Some("OA".into()),
            Vec::new(),
            vec!["B1".to_owned()],
        );
        let got = r
            .normalize(&event("user_send_text", "U1", "OA", "xin chào"))
            .unwrap();
        assert_eq!(got.event_id, "m1");
        assert_eq!(got.message.body.as_ref().unwrap().text, "xin chào");
        assert_eq!(got.message.target, MessageTarget::direct("U1"));
        assert!(!got.is_bot_author);
        assert!(
            r.normalize(&event("user_send_text", "B1", "OA", "beep"))
                .unwrap()
                .is_bot_author
        );
        let ignored = [
            event("oa_send_text", "OA", "U1", "our reply"),
            event("user_send_sticker", "U1", "OA", ""),
            event("follow", "U1", "OA", ""),
            event("user_send_text", "U1", "OTHER_OA", "hi"),
            event("user_send_text", "U1", "OA", "   "),
            event("user_send_text", "OA", "OA", "hi"),
            json!({ "app_id": "OTHER", "event_name": "user_send_text" }),
        ];
        for raw in ignored {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Ignored { .. })),
                "{raw}"
            );
        }
        assert!(matches!(
            r.normalize(&json!({ "app_id": "APP" })),
            Err(ReceiveError::Malformed { .. })
        ));
        let only_bob = ZaloReceiver::new("zalo", "APP", None, vec!["BOB".to_owned()], Vec::new());
        assert!(matches!(
            only_bob.normalize(&event("user_send_text", "U1", "OA", "hi")),
            Err(ReceiveError::Ignored { .. })
        ));
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let r = ZaloReceiver::new(
            "zalo",
            "APP",
            Some("OA".into()),
            Vec::new(),
            vec!["B1".to_owned()],
        );
        clawgate_conformance::fuzz::normalizer_never_panics(
            &r,
            vec![
                event("user_send_text", "U1", "OA", "xin chào"),
                event("user_send_text", "B1", "OA", "beep"),
            ],
        );
    }
}
