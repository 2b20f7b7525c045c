//! Inbound: one webhook event → a normalized message.
//!
//! The source hands each event of a delivery over on its own, as
//! `{"destination", "event", "receivedAtMs"}` (the arrival time makes a reply token's deadline
//! computable again when the event is worked on after a restart).
//!
//! - The event id is the event's `webhookEventId`: a redelivery (`deliveryContext.isRedelivery`)
//!   carries the same one, so the engine's durable dedupe drops it.
//! - Text `message` events from a user (1:1 → direct, the target is the user id), a group or
//!   a multi-person chat (→ group, the target is the group or room id) are prompts; their
//!   `replyToken` is offered to [`ReplyTokens`](crate::ReplyTokens).
//! - Not answered (`ReceiveError::Ignored`, with the reason): other message types (stickers,
//!   images…), `follow` / `unfollow` / `join` / `leave` / `unsend` / `postback` and every other
//!   event type, events in `standby` mode (another module owns the chat), and anything
//!   authored by the bot itself (LINE does not echo bot messages; a `source.userId` equal to
//!   `destination` would be ours).

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

use crate::reply::{ReplyTokens, usable_until};

/// Normalizes the webhook events of one LINE channel.
#[derive(Debug, Clone)]
pub struct LineReceiver {
    name: String,
    tokens: ReplyTokens,
    reply_within_ms: u64,
}

impl LineReceiver {
    pub(crate) fn new(name: &str, tokens: ReplyTokens, reply_within_ms: u64) -> LineReceiver {
        LineReceiver {
            name: name.to_owned(),
            tokens,
            reply_within_ms,
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

impl MessageReceiveAdapter for LineReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let event = raw
            .get("event")
            .filter(|e| e.is_object())
            .ok_or_else(|| self.malformed("a LINE event envelope has an `event` object"))?;
        let str_of = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
        let event_id = str_of(event, "webhookEventId")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| self.malformed("a webhook event without a webhookEventId"))?;
        let kind = str_of(event, "type").unwrap_or_default();
        if kind != "message" {
            return Err(self.ignored(format!("a {kind:?} event is not a message")));
        }
        if str_of(event, "mode").as_deref() == Some("standby") {
            return Err(self.ignored(
                "an event in standby mode (another module owns this chat; it may not be answered)",
            ));
        }
        let message = event
            .get("message")
            .filter(|m| m.is_object())
            .ok_or_else(|| self.malformed("a message event without a `message` object"))?;
        let message_type = str_of(message, "type").unwrap_or_default();
        if message_type != "text" {
            return Err(self.ignored(format!("a {message_type} message is not a text prompt")));
        }
        let message_id =
            str_of(message, "id").ok_or_else(|| self.malformed("a message without an id"))?;
        let text = str_of(message, "text").unwrap_or_default();
        let source = event
            .get("source")
            .ok_or_else(|| self.malformed("a message event without a `source`"))?;
        let user = str_of(source, "userId");
        if user.is_some() && user == str_of(raw, "destination") {
            return Err(self.ignored("the bot's own message"));
        }
        let target = match str_of(source, "type").as_deref() {
            Some("user") => MessageTarget::direct(
                user.clone()
                    .ok_or_else(|| self.malformed("a user source without a userId"))?,
            ),
            Some("group") => MessageTarget::group(
                str_of(source, "groupId")
                    .ok_or_else(|| self.malformed("a group source without a groupId"))?,
            ),
            Some("room") => MessageTarget::group(
                str_of(source, "roomId")
                    .ok_or_else(|| self.malformed("a room source without a roomId"))?,
            ),
            other => return Err(self.malformed(format!("an unknown source type {other:?}"))),
        };
        if text.trim().is_empty() {
            return Err(self.ignored("a message without text"));
        }
        if let Some(token) = str_of(event, "replyToken") {
            let timestamp = event.get("timestamp").and_then(Value::as_u64).unwrap_or(0);
            let received = raw
                .get("receivedAtMs")
                .and_then(Value::as_u64)
                .unwrap_or(timestamp);
            self.tokens.offer(
                &event_id,
                &token,
                usable_until(received, timestamp, self.reply_within_ms),
            );
        }
        // A person in a group may not have consented to share their id: the sender is then
        // unknown, but still a person (LINE delivers no other bots' messages).
        let sender = MessageActor::new(user.unwrap_or_default());
        let inbound = ChannelMessage::inbound(message_id, &self.name, target)
            .with_text(text)
            .with_sender(sender)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(event_id, inbound))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use clawgate_types::TargetKind;
    use serde_json::json;

    use clawgate_types::clock::ManualClock;

    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn tokens() -> ReplyTokens {
        ReplyTokens::new(std::sync::Arc::new(ManualClock::new(NOW as i64)))
    }

    fn receiver(tokens: ReplyTokens) -> LineReceiver {
        LineReceiver::new("line", tokens, 50_000)
    }

    fn envelope(event: Value) -> Value {
        json!({ "destination": "Ubot", "event": event, "receivedAtMs": NOW })
    }

    fn text_event(id: &str, source: Value) -> Value {
        json!({ "type": "message", "mode": "active", "timestamp": NOW, "source": source,
            "webhookEventId": id, "deliveryContext": { "isRedelivery": false },
            "replyToken": format!("token-{id}"),
            "message": { "id": "100", "type": "text", "text": "hello", "quoteToken": "q" } })
    }

    #[test]
    fn users_groups_and_rooms_are_targets_and_tokens_are_offered() {
        let tokens = tokens();
        let r = receiver(tokens.clone());
        let dm = r
            .normalize(&envelope(text_event(
                "E1",
                json!({ "type": "user", "userId": "U1" }),
            )))
            .unwrap();
        assert_eq!(dm.event_id, "E1");
        assert_eq!(dm.message.target.kind, TargetKind::Direct);
        assert_eq!(dm.message.target.id, "U1");
        let group = r
            .normalize(&envelope(text_event(
                "E2",
                json!({ "type": "group", "groupId": "C1", "userId": "U1" }),
            )))
            .unwrap();
        assert_eq!(
            (group.message.target.kind, group.message.target.id.as_str()),
            (TargetKind::Group, "C1")
        );
        let room = r
            .normalize(&envelope(text_event(
                "E3",
                json!({ "type": "room", "roomId": "R1" }),
            )))
            .unwrap();
        assert_eq!(room.message.target.id, "R1");
        assert_eq!(
            tokens.claim("E1", "line:reply:E1:0", NOW).map(|t| t.0),
            Some("token-E1".to_owned())
        );
    }

    #[test]
    fn a_redelivery_is_the_same_event() {
        let r = receiver(tokens());
        let source = json!({ "type": "user", "userId": "U1" });
        let first = text_event("E1", source.clone());
        let mut again = first.clone();
        again["deliveryContext"]["isRedelivery"] = json!(true);
        assert_eq!(
            r.normalize(&envelope(first)).unwrap().event_id,
            r.normalize(&envelope(again)).unwrap().event_id
        );
    }

    #[test]
    fn what_is_not_a_text_prompt_is_ignored_and_garbage_is_malformed() {
        let r = receiver(tokens());
        let user = json!({ "type": "user", "userId": "U1" });
        let mut sticker = text_event("E1", user.clone());
        sticker["message"] =
            json!({ "id": "1", "type": "sticker", "packageId": "1", "stickerId": "1" });
        let mut standby = text_event("E2", user.clone());
        standby["mode"] = json!("standby");
        let own = text_event("E3", json!({ "type": "user", "userId": "Ubot" }));
        for event in [
            sticker,
            standby,
            own,
            json!({ "type": "follow", "webhookEventId": "E4", "source": user, "replyToken": "t" }),
            json!({ "type": "unfollow", "webhookEventId": "E5", "source": user }),
        ] {
            assert!(
                matches!(
                    r.normalize(&envelope(event.clone())),
                    Err(ReceiveError::Ignored { .. })
                ),
                "{event}"
            );
        }
        for garbage in [
            json!({}),
            envelope(json!({ "type": "message" })),
            envelope(
                json!({ "type": "message", "webhookEventId": "E6", "message": { "type": "text", "id": "1", "text": "x" } }),
            ),
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
        let dm = envelope(text_event("E1", json!({ "type": "user", "userId": "U1" })));
        let group = envelope(text_event(
            "E2",
            json!({ "type": "group", "groupId": "C1", "userId": "U1" }),
        ));
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(tokens()), vec![dm, group]);
    }
}
