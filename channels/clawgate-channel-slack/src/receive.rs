//! Inbound: one Events API envelope → a normalized message.
//!
//! - `message` and `app_mention` events are messages; the event id is `<channel>:<ts>`, so a
//!   retry (`X-Slack-Retry-Num`), the same message resent under another `event_id`, and the
//!   `app_mention` twin of a `message` event are one event to the engine.
//! - Conversations: `im` → direct, every other `channel_type` → group. A thread reply's target
//!   thread is its `thread_ts`; a top-level message in a channel gets its answer in a thread
//!   under it (`reply_in_thread`), a top-level DM at top level.
//! - The rule for `message_changed` / `message_deleted`: ignored. The agent answered the message
//!   as first sent; answering every correction would reply twice, and a deleted question's
//!   answer stays (as on Telegram). Other subtypes (joins, topic changes…) are not prompts.
//! - The bot's own messages (Slack echoes every post to the app: the author is the app's bot
//!   user named in `authorizations`) are ignored. Other apps' messages (`bot_id`, subtype
//!   `bot_message`) are reported as bot-authored; a gateway-failure marker in their `metadata`
//!   is decoded by [`SlackOrigin`](crate::SlackOrigin) so the engine drops marked echoes before
//!   its bot authorization, while an unmarked one with the same text goes through it normally.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget, TargetKind};
use serde_json::Value;

use crate::adapter::Recipients;

/// Normalizes the events of one Slack app.
#[derive(Debug, Clone)]
pub struct SlackReceiver {
    name: String,
    allowed_channels: BTreeSet<String>,
    reply_in_thread: bool,
    /// The bot's own user id, from `auth.test` (the envelope's `authorizations` say it too).
    bot_user_id: Option<String>,
    recipients: Recipients,
}

/// Subtypes that are a person's (or an app's) new message.
const MESSAGE_SUBTYPES: &[&str] = &[
    "bot_message",
    "thread_broadcast",
    "file_share",
    "me_message",
];

impl SlackReceiver {
    pub(crate) fn new(
        name: &str,
        allowed_channels: impl IntoIterator<Item = String>,
        reply_in_thread: bool,
        bot_user_id: Option<String>,
        recipients: Recipients,
    ) -> SlackReceiver {
        SlackReceiver {
            name: name.to_owned(),
            allowed_channels: allowed_channels.into_iter().collect(),
            reply_in_thread,
            bot_user_id,
            recipients,
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

    /// Whether `user` is this app's bot user.
    fn is_self(&self, envelope: &Value, user: Option<&str>) -> bool {
        let Some(user) = user else {
            return false;
        };
        if self.bot_user_id.as_deref() == Some(user) {
            return true;
        }
        envelope["authorizations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|a| a["is_bot"] == Value::Bool(true) && a["user_id"].as_str() == Some(user))
    }
}

impl MessageReceiveAdapter for SlackReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let kind = raw
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("an Events API envelope has a `type`"))?;
        if kind != "event_callback" {
            return Err(self.ignored(format!("a {kind} envelope carries no message")));
        }
        let event = raw
            .get("event")
            .filter(|e| e.is_object())
            .ok_or_else(|| self.malformed("an event_callback without an `event` object"))?;
        let event_type = event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if event_type != "message" && event_type != "app_mention" {
            return Err(self.ignored(format!("a {event_type:?} event is not a message")));
        }
        let subtype = event.get("subtype").and_then(Value::as_str);
        match subtype {
            None => {}
            Some("message_changed" | "message_deleted") => {
                return Err(self.ignored(format!(
                    "{} (an edit or delete is not a new prompt: the first text was answered)",
                    subtype.unwrap_or_default()
                )));
            }
            Some(s) if MESSAGE_SUBTYPES.contains(&s) => {}
            Some(s) => return Err(self.ignored(format!("a {s} message is not a prompt"))),
        }
        let field = |key: &str| event.get(key).and_then(Value::as_str);
        let (Some(channel), Some(ts)) = (field("channel"), field("ts")) else {
            return Err(self.malformed("a message event needs `channel` and `ts`"));
        };
        let user = field("user");
        if self.is_self(raw, user) {
            return Err(self.ignored("the bot's own message"));
        }
        if !self.allowed_channels.is_empty() && !self.allowed_channels.contains(channel) {
            return Err(self.ignored(format!(
                "channel {channel} is not in this channel's allowed_channels"
            )));
        }
        let text = field("text").unwrap_or_default();
        if text.trim().is_empty() {
            return Err(self.ignored("a message without text"));
        }
        let is_bot =
            event.get("bot_id").is_some_and(|b| !b.is_null()) || subtype == Some("bot_message");
        let direct = field("channel_type") == Some("im") || channel.starts_with('D');
        let thread = match field("thread_ts") {
            Some(thread) => Some(thread.to_owned()),
            None if !direct && self.reply_in_thread => Some(ts.to_owned()),
            None => None,
        };
        let kind = if direct {
            TargetKind::Direct
        } else {
            TargetKind::Group
        };
        let mut target = MessageTarget::new(kind, channel).with_thread_id(thread.clone());
        target.space_id = raw
            .get("team_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let author = user
            .or_else(|| field("bot_id"))
            .unwrap_or_default()
            .to_owned();
        if let (Some(thread), false) = (&thread, is_bot) {
            // The person a native stream in this thread answers.
            self.recipients
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert((channel.to_owned(), thread.clone()), author.clone());
        }
        let inbound = ChannelMessage::inbound(ts, &self.name, target)
            .with_text(text)
            .with_sender(MessageActor::new(author).with_is_bot(is_bot))
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(format!("{channel}:{ts}"), inbound).by_bot(is_bot))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn receiver() -> SlackReceiver {
        SlackReceiver::new(
            "slack",
            [],
            true,
            Some("UBOT".into()),
            Recipients::default(),
        )
    }

    fn envelope(event: Value) -> Value {
        json!({ "type": "event_callback", "team_id": "T1", "event_id": "Ev1", "event": event,
                "authorizations": [{ "user_id": "UBOT", "is_bot": true }] })
    }

    #[test]
    fn a_channel_message_answers_in_its_thread_and_a_top_level_dm_at_top_level() {
        let raw = envelope(json!({ "type": "message", "channel": "C1", "user": "U1",
            "text": "hi", "ts": "1.000001", "channel_type": "channel" }));
        let inbound = receiver().normalize(&raw).expect("normalizes");
        assert_eq!(inbound.event_id, "C1:1.000001");
        assert_eq!(inbound.message.target.kind, TargetKind::Group);
        assert_eq!(
            inbound.message.target.thread_id.as_deref(),
            Some("1.000001")
        );
        assert_eq!(inbound.message.target.space_id.as_deref(), Some("T1"));
        let dm = envelope(json!({ "type": "message", "channel": "D1", "user": "U1",
            "text": "hi", "ts": "2.000001", "channel_type": "im" }));
        let inbound = receiver().normalize(&dm).expect("normalizes");
        assert_eq!(inbound.message.target.kind, TargetKind::Direct);
        assert_eq!(inbound.message.target.thread_id, None);
        let reply = envelope(json!({ "type": "message", "channel": "D1", "user": "U1",
            "text": "more", "ts": "3.000001", "thread_ts": "2.000001", "channel_type": "im" }));
        let inbound = receiver().normalize(&reply).expect("normalizes");
        assert_eq!(
            inbound.message.target.thread_id.as_deref(),
            Some("2.000001")
        );
    }

    #[test]
    fn one_message_under_two_event_ids_is_one_event() {
        let event = json!({ "type": "message", "channel": "C1", "user": "U1", "text": "hi",
            "ts": "1.000001" });
        let mut first = envelope(event.clone());
        let mut second = envelope(event);
        first["event_id"] = json!("Ev1");
        second["event_id"] = json!("Ev2");
        assert_eq!(
            receiver().normalize(&first).map(|i| i.event_id),
            receiver().normalize(&second).map(|i| i.event_id)
        );
    }

    #[test]
    fn own_edits_deletes_and_other_subtypes_are_ignored_and_garbage_is_malformed() {
        let r = receiver();
        for event in [
            json!({ "type": "message", "channel": "C1", "user": "UBOT", "bot_id": "B1", "text": "mine", "ts": "1.1" }),
            json!({ "type": "message", "subtype": "message_changed", "channel": "C1", "ts": "1.2",
                    "message": { "text": "edited", "ts": "1.1" } }),
            json!({ "type": "message", "subtype": "message_deleted", "channel": "C1", "ts": "1.3", "deleted_ts": "1.1" }),
            json!({ "type": "message", "subtype": "channel_join", "channel": "C1", "user": "U1", "text": "joined", "ts": "1.4" }),
            json!({ "type": "reaction_added", "user": "U1" }),
        ] {
            assert!(
                matches!(
                    r.normalize(&envelope(event.clone())),
                    Err(ReceiveError::Ignored { .. })
                ),
                "{event}"
            );
        }
        assert!(matches!(
            r.normalize(&json!({ "type": "url_verification", "challenge": "x" })),
            Err(ReceiveError::Ignored { .. })
        ));
        for garbage in [
            json!([]),
            json!({ "type": "event_callback" }),
            envelope(json!({ "type": "message", "text": "x" })),
        ] {
            assert!(
                matches!(r.normalize(&garbage), Err(ReceiveError::Malformed { .. })),
                "{garbage}"
            );
        }
    }

    #[test]
    fn other_apps_are_bot_authors_and_allowed_channels_filter() {
        let raw = envelope(
            json!({ "type": "message", "subtype": "bot_message", "channel": "C1",
            "user": "U9", "bot_id": "B9", "text": "beep", "ts": "1.1" }),
        );
        assert!(
            receiver()
                .normalize(&raw)
                .expect("normalizes")
                .is_bot_author
        );
        let only = SlackReceiver::new(
            "slack",
            ["C2".to_owned()],
            true,
            None,
            Recipients::default(),
        );
        assert!(matches!(
            only.normalize(&raw),
            Err(ReceiveError::Ignored { .. })
        ));
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let channel = envelope(json!({ "type": "message", "channel": "C1", "user": "U1",
            "text": "hi", "ts": "1.000001", "channel_type": "channel" }));
        let reply = envelope(json!({ "type": "message", "channel": "D1", "user": "U1",
            "text": "more", "ts": "3.000001", "thread_ts": "2.000001", "channel_type": "im" }));
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(), vec![channel, reply]);
    }
}
