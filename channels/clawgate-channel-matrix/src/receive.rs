//! Inbound: one room event from `/sync` (with its `room_id` added by the source) → a normalized
//! message.
//!
//! - The event id is Matrix's own `event_id`: unique across the homeserver, the same for every
//!   re-fetch of the event, so a re-polled event is deduplicated by the engine.
//! - The target is the room (a group: Matrix has no direct-chat flag on the event); a threaded
//!   event (`rel_type: m.thread`) names its root as the thread, a reply names the answered event.
//! - Our own events are ignored (a homeserver echoes every event to its sender); edits
//!   (`m.replace`) are ignored, a documented choice: the agent answered the message as first
//!   sent.
//! - Encrypted events (`m.room.encrypted`) are ignored with a warning: the channel does not
//!   decrypt.
//! - Matrix has no bot flag: the accounts named in `bot_users` count as bots, for the
//!   engine's echo and bot authorization.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageRelation, MessageTarget, TargetKind};
use serde_json::Value;
use tracing::warn;

/// Normalizes the room events of one account.
#[derive(Debug, Clone)]
pub struct MatrixReceiver {
    name: String,
    user_id: String,
    allowed_rooms: BTreeSet<String>,
    bot_users: BTreeSet<String>,
}

impl MatrixReceiver {
    /// The receiver of channel `name` for account `user_id`, answering `allowed_rooms` (every
    /// room when empty), counting `bot_users` as bots.
    pub fn new(
        name: &str,
        user_id: &str,
        allowed_rooms: impl IntoIterator<Item = String>,
        bot_users: impl IntoIterator<Item = String>,
    ) -> MatrixReceiver {
        MatrixReceiver {
            name: name.to_owned(),
            user_id: user_id.to_owned(),
            allowed_rooms: allowed_rooms.into_iter().collect(),
            bot_users: bot_users.into_iter().collect(),
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

/// The body without the legacy reply fallback (`> <@user> quoted` lines and a blank line).
fn strip_reply_fallback(body: &str) -> &str {
    if !body.starts_with("> ") {
        return body;
    }
    match body.find("\n\n") {
        Some(end) if body[..end].lines().all(|l| l.starts_with('>')) => &body[end + 2..],
        _ => body,
    }
}

impl MessageReceiveAdapter for MatrixReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let field = |name: &str| raw.get(name).and_then(Value::as_str);
        let (Some(event_id), Some(kind), Some(sender), Some(room)) = (
            field("event_id"),
            field("type"),
            field("sender"),
            field("room_id"),
        ) else {
            return Err(
                self.malformed("a room event needs string event_id, type, sender and room_id")
            );
        };
        if sender == self.user_id {
            return Err(self.ignored("our own event"));
        }
        if !self.allowed_rooms.is_empty() && !self.allowed_rooms.contains(room) {
            return Err(self.ignored(format!(
                "room {room} is not in this channel's allowed_rooms"
            )));
        }
        if kind == "m.room.encrypted" {
            warn!(channel = %self.name, room, event = event_id, "an end-to-end encrypted message was not answered: this channel does not decrypt; use an unencrypted room");
            return Err(self.ignored("an encrypted event (this channel does not decrypt)"));
        }
        if kind != "m.room.message" {
            return Err(self.ignored(format!("a {kind} event is not a message")));
        }
        let content = raw.get("content").and_then(Value::as_object);
        let relates = content.and_then(|c| c.get("m.relates_to"));
        let rel_type = relates
            .and_then(|r| r.get("rel_type"))
            .and_then(Value::as_str);
        if rel_type == Some("m.replace") {
            return Err(self.ignored("an edit of an earlier message"));
        }
        let Some(body) = content.and_then(|c| c.get("body")).and_then(Value::as_str) else {
            return Err(self.ignored("a message without a body (redacted)"));
        };
        let msgtype = content
            .and_then(|c| c.get("msgtype"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !matches!(msgtype, "m.text" | "m.notice" | "m.emote") {
            return Err(self.ignored(format!("a {msgtype} message (text only)")));
        }
        let thread = (rel_type == Some("m.thread"))
            .then(|| {
                relates
                    .and_then(|r| r.get("event_id"))
                    .and_then(Value::as_str)
            })
            .flatten()
            .map(str::to_owned);
        let falling_back = relates
            .and_then(|r| r.get("is_falling_back"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let reply_to = relates
            .and_then(|r| r.pointer("/m.in_reply_to/event_id"))
            .and_then(Value::as_str)
            .filter(|_| !falling_back)
            .map(str::to_owned);
        let target = MessageTarget::new(TargetKind::Group, room).with_thread_id(thread.clone());
        let mut inbound = ChannelMessage::inbound(event_id, &self.name, target)
            .with_text(strip_reply_fallback(body))
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        let is_bot = self.bot_users.contains(sender);
        inbound.sender = Some(MessageActor::new(sender).with_is_bot(is_bot));
        if let Some(reply_to) = reply_to {
            inbound.relation = Some(MessageRelation::reply_to(reply_to).with_thread_id(thread));
        }
        Ok(NormalizedInbound::new(event_id, inbound).by_bot(is_bot))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn receiver() -> MatrixReceiver {
        MatrixReceiver::new("matrix", "@gw:hs", [], ["@otherbot:hs".to_owned()])
    }

    fn event(content: Value) -> Value {
        json!({ "event_id": "$e1", "type": "m.room.message", "sender": "@ada:hs",
                "room_id": "!r:hs", "origin_server_ts": 1, "content": content })
    }

    #[test]
    fn a_text_message_is_a_room_conversation_keyed_by_event_id() {
        let raw = event(json!({ "msgtype": "m.text", "body": "hi" }));
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.event_id, "$e1");
        assert_eq!(inbound.message.target.id, "!r:hs");
        assert_eq!(
            inbound.message.body.as_ref().map(|b| b.text.as_str()),
            Some("hi")
        );
        assert_eq!(inbound.message.raw.as_ref(), Some(&raw));
        assert!(!inbound.is_bot_author);
    }

    #[test]
    fn threads_and_replies_are_recognised_and_fallbacks_stripped() {
        let raw = event(json!({ "msgtype": "m.text", "body": "> <@x:hs> old\n\nnew",
            "m.relates_to": { "rel_type": "m.thread", "event_id": "$root",
                              "is_falling_back": true, "m.in_reply_to": { "event_id": "$root" } } }));
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.message.target.thread_id.as_deref(), Some("$root"));
        assert!(
            inbound.message.relation.is_none(),
            "a thread fallback is no reply"
        );
        assert_eq!(inbound.message.body.map(|b| b.text).as_deref(), Some("new"));
        let reply = event(json!({ "msgtype": "m.text", "body": "yes",
            "m.relates_to": { "m.in_reply_to": { "event_id": "$q" } } }));
        let Some(MessageRelation::Reply { reply_to_id, .. }) = receiver()
            .normalize(&reply)
            .expect("normalizes")
            .message
            .relation
        else {
            panic!("a reply");
        };
        assert_eq!(reply_to_id.as_deref(), Some("$q"));
    }

    #[test]
    fn own_edits_encrypted_and_disallowed_events_are_ignored_and_garbage_is_malformed() {
        let r = MatrixReceiver::new("matrix", "@gw:hs", ["!r:hs".to_owned()], []);
        let mut own = event(json!({ "msgtype": "m.text", "body": "x" }));
        own["sender"] = json!("@gw:hs");
        let edit = event(json!({ "msgtype": "m.text", "body": "* x",
            "m.relates_to": { "rel_type": "m.replace", "event_id": "$e0" } }));
        let mut encrypted =
            event(json!({ "algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "…" }));
        encrypted["type"] = json!("m.room.encrypted");
        let mut elsewhere = event(json!({ "msgtype": "m.text", "body": "x" }));
        elsewhere["room_id"] = json!("!other:hs");
        for ignored in [own, edit, encrypted, elsewhere, event(json!({}))] {
            assert!(
                matches!(r.normalize(&ignored), Err(ReceiveError::Ignored { .. })),
                "{ignored}"
            );
        }
        for garbage in [
            json!([]),
            json!({ "unexpected": [1, 2] }),
            json!({ "event_id": 1 }),
        ] {
            assert!(
                matches!(r.normalize(&garbage), Err(ReceiveError::Malformed { .. })),
                "{garbage}"
            );
        }
    }

    #[test]
    fn configured_bot_accounts_are_bots() {
        let mut raw = event(json!({ "msgtype": "m.notice", "body": "beep" }));
        raw["sender"] = json!("@otherbot:hs");
        assert!(
            receiver()
                .normalize(&raw)
                .expect("normalizes")
                .is_bot_author
        );
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let text = event(json!({ "msgtype": "m.text", "body": "hi" }));
        let thread = event(json!({ "msgtype": "m.text", "body": "> <@x:hs> old\n\nnew",
            "m.relates_to": { "rel_type": "m.thread", "event_id": "$root",
                              "is_falling_back": true, "m.in_reply_to": { "event_id": "$root" } } }));
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(), vec![text, thread]);
    }
}
