//! Inbound: one dispatch (`op: 0`) → a normalized message.
//!
//! The event id is the message's id (`d.id`, the `msg_id` replies answer), so every push of the
//! same message — QQ pushes again when a callback is not acknowledged, and may push a message
//! more than once anyway — is one event to the engine, deduplicated durably.
//!
//! - Answered: `C2C_MESSAGE_CREATE` (a person writing to the bot; target: their
//!   `user_openid`) and `GROUP_AT_MESSAGE_CREATE` (a group member @-mentioning the bot; target:
//!   the `group_openid`, sender: the `member_openid`).
//! - Not answered ([`ReceiveError::Ignored`]): every other event (guild messages, friend and
//!   group membership events…), empty texts, people or groups outside the allow lists.
//! - QQ does not say who is automated; `bot_senders` lists the openids that are.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

/// A person writes to the bot.
pub const C2C_MESSAGE_CREATE: &str = "C2C_MESSAGE_CREATE";
/// A group member @-mentions the bot.
pub const GROUP_AT_MESSAGE_CREATE: &str = "GROUP_AT_MESSAGE_CREATE";

/// The latest message each person or group wrote, as this process received it: a message
/// that answers no inbound message by its key or relation (a notice, a relay) is still sent as
/// a passive reply to it, which QQ allows for an hour (C2C) or five minutes (group) and which
/// keeps the active-message quota for when nothing else works. The renderer writes the choice
/// into the durable batch, so every attempt of a unit answers the same message.
#[derive(Debug, Default)]
pub struct RecentInbound(Mutex<HashMap<String, String>>);

impl RecentInbound {
    fn key(target: &MessageTarget) -> String {
        format!("{:?}:{}", target.kind, target.id)
    }

    /// `msg_id` is the latest message written in `target`.
    pub fn saw(&self, target: &MessageTarget, msg_id: &str) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(Self::key(target), msg_id.to_owned());
    }

    /// The latest message written in `target`.
    pub fn latest(&self, target: &MessageTarget) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&Self::key(target))
            .cloned()
    }
}

/// Normalizes the events of one bot.
#[derive(Debug, Clone)]
pub struct QqReceiver {
    name: String,
    recent: Arc<RecentInbound>,
    allowed_users: BTreeSet<String>,
    allowed_groups: BTreeSet<String>,
    bot_senders: BTreeSet<String>,
}

impl QqReceiver {
    pub(crate) fn new(
        name: &str,
        recent: Arc<RecentInbound>,
        allowed_users: impl IntoIterator<Item = String>,
        allowed_groups: impl IntoIterator<Item = String>,
        bot_senders: impl IntoIterator<Item = String>,
    ) -> QqReceiver {
        QqReceiver {
            name: name.to_owned(),
            recent,
            allowed_users: allowed_users.into_iter().collect(),
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

impl MessageReceiveAdapter for QqReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let op = raw
            .get("op")
            .and_then(Value::as_u64)
            .ok_or_else(|| self.malformed("a payload without op"))?;
        if op != 0 {
            return Err(self.ignored(format!("op {op} is not a dispatch")));
        }
        let event = raw
            .get("t")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a dispatch without t"))?;
        let d = raw
            .get("d")
            .filter(|d| d.is_object())
            .ok_or_else(|| self.malformed("a dispatch without d"))?;
        let at = |pointer: &str| d.pointer(pointer).and_then(Value::as_str);
        let (target, from) = match event {
            C2C_MESSAGE_CREATE => {
                let user = at("/author/user_openid")
                    .ok_or_else(|| self.malformed("a C2C message without author.user_openid"))?;
                if !self.allowed_users.is_empty() && !self.allowed_users.contains(user) {
                    return Err(self.ignored(format!("{user} is not in allowed_users")));
                }
                (MessageTarget::direct(user), user)
            }
            GROUP_AT_MESSAGE_CREATE => {
                let group = at("/group_openid")
                    .ok_or_else(|| self.malformed("a group message without group_openid"))?;
                let member = at("/author/member_openid").ok_or_else(|| {
                    self.malformed("a group message without author.member_openid")
                })?;
                if !self.allowed_groups.is_empty() && !self.allowed_groups.contains(group) {
                    return Err(self.ignored(format!("group {group} is not in allowed_groups")));
                }
                (MessageTarget::group(group), member)
            }
            other => {
                return Err(self.ignored(format!("a `{other}` event is not a message to answer")));
            }
        };
        // The id is the event's dedupe key: an empty one would merge every such event into one.
        let msg_id = at("/id")
            .filter(|id| !id.is_empty())
            .ok_or_else(|| self.malformed("a message without d.id"))?;
        // A group @-message starts with a space where the mention was.
        let text = at("/content")
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| self.ignored("a message without text (media only)"))?;
        let bot = self.bot_senders.contains(from);
        self.recent.saw(&target, msg_id);
        let inbound = ChannelMessage::inbound(msg_id, &self.name, target)
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

    fn c2c(id: &str, user: &str, text: &str) -> Value {
        json!({ "op": 0, "id": "C2C_MESSAGE_CREATE:abc", "s": 3, "t": "C2C_MESSAGE_CREATE",
            "d": { "id": id, "content": text, "timestamp": "2026-12-02T17:00:00+08:00",
                "author": { "id": user, "user_openid": user } } })
    }

    #[test]
    fn c2c_and_group_messages_are_normalized_and_the_rest_ignored() {
        let r = QqReceiver::new(
            "qq",
            Arc::default(),
            Vec::new(),
            Vec::new(),
            vec!["BOTU".to_owned()],
        );
        let got = r.normalize(&c2c("ROBOT1.0_m1", "U1", "你好")).unwrap();
        assert_eq!(
            r.recent.latest(&MessageTarget::direct("U1")).as_deref(),
            Some("ROBOT1.0_m1")
        );
        assert_eq!(got.event_id, "ROBOT1.0_m1");
        assert_eq!(got.message.target, MessageTarget::direct("U1"));
        assert_eq!(got.message.body.as_ref().unwrap().text, "你好");
        assert!(
            r.normalize(&c2c("m2", "BOTU", "beep"))
                .unwrap()
                .is_bot_author
        );
        let group = json!({ "op": 0, "t": "GROUP_AT_MESSAGE_CREATE", "d": { "id": "G_m1",
            "content": " hello", "group_openid": "G1", "author": { "member_openid": "M1" } } });
        let got = r.normalize(&group).unwrap();
        assert_eq!(got.message.target, MessageTarget::group("G1"));
        assert_eq!(got.message.body.as_ref().unwrap().text, "hello");
        for raw in [
            json!({ "op": 0, "t": "GUILD_CREATE", "d": {} }),
            json!({ "op": 11 }),
            c2c("m3", "U1", "   "),
        ] {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Ignored { .. })),
                "{raw}"
            );
        }
        for raw in [
            json!({ "t": "C2C_MESSAGE_CREATE" }),
            json!({ "op": 0, "t": "C2C_MESSAGE_CREATE", "d": { "id": "x" } }),
            json!({ "op": 0, "t": "C2C_MESSAGE_CREATE", "d": "nope" }),
            json!([1, 2]),
        ] {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Malformed { .. })),
                "{raw}"
            );
        }
        let only = QqReceiver::new(
            "qq",
            Arc::default(),
            vec!["U9".to_owned()],
            vec!["G9".to_owned()],
            Vec::new(),
        );
        assert!(matches!(
            only.normalize(&c2c("m", "U1", "hi")),
            Err(ReceiveError::Ignored { .. })
        ));
        assert!(matches!(
            only.normalize(&group),
            Err(ReceiveError::Ignored { .. })
        ));
    }

    /// Regression (found by the fuzz target below): a message whose `d.id` was empty was
    /// normalized with an empty event id, the dedupe key every such event would share.
    #[test]
    fn a_message_with_an_empty_id_is_malformed() {
        let r = QqReceiver::new("qq", Arc::default(), Vec::new(), Vec::new(), Vec::new());
        let group = json!({ "op": 0, "t": "GROUP_AT_MESSAGE_CREATE", "d": { "id": "",
            "content": " hello", "group_openid": "G1", "author": { "member_openid": "M1" } } });
        assert!(matches!(
            r.normalize(&group),
            Err(ReceiveError::Malformed { .. })
        ));
        assert!(matches!(
            r.normalize(&c2c("", "U1", "hi")),
            Err(ReceiveError::Malformed { .. })
        ));
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let r = QqReceiver::new(
            "qq",
            Arc::default(),
            Vec::new(),
            Vec::new(),
            vec!["BOTU".to_owned()],
        );
        let group = json!({ "op": 0, "t": "GROUP_AT_MESSAGE_CREATE", "d": { "id": "G_m1",
            "content": " hello", "group_openid": "G1", "author": { "member_openid": "M1" } } });
        clawgate_conformance::fuzz::normalizer_never_panics(
            &r,
            vec![c2c("ROBOT1.0_m1", "U1", "你好"), group],
        );
    }
}
