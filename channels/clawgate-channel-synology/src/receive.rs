//! Normalizing Synology Chat's webhook events (the form fields the source checked and turned
//! into JSON: `{"via": "bot" | "outgoing", "fields": {…}}`; the token is not kept).
//!
//! - The event id is the post id (`post_id`): a second delivery of the same post is dropped by
//!   the engine's durable dedupe.
//! - A DM to the bot (`via: "bot"`) is a direct prompt; its target is the person's DSM user name
//!   (`username`), which is what `user_list` resolves to the Chat-internal id `chatbot` needs
//!   (the event's `user_id` is per integration and cannot be used to answer).
//! - A channel post that started with a trigger word (`via: "outgoing"`) is a group prompt;
//!   the target is the `channel_id`.
//! - Not answered (`ReceiveError::Ignored`): posts by the channel's own integrations (user
//!   names listed in `own_usernames`: an incoming webhook's post can set off the channel's own
//!   outgoing webhook) and posts without text.
//! - Posts by `bot_usernames` (other bots and integrations the operator knows) are reported
//!   as bot authors: Synology's events carry no bot flag.

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

/// Normalizes the webhook events of one Synology Chat channel.
#[derive(Debug, Clone)]
pub struct SynologyReceiver {
    name: String,
    own_usernames: Vec<String>,
    bot_usernames: Vec<String>,
}

impl SynologyReceiver {
    /// The receiver of channel `name`, which never answers posts by `own_usernames` and
    /// reports those by `bot_usernames` as bot authors.
    pub fn new(
        name: &str,
        own_usernames: Vec<String>,
        bot_usernames: Vec<String>,
    ) -> SynologyReceiver {
        SynologyReceiver {
            name: name.to_owned(),
            own_usernames,
            bot_usernames,
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

impl MessageReceiveAdapter for SynologyReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let fields = raw
            .get("fields")
            .filter(|f| f.is_object())
            .ok_or_else(|| self.malformed("a Synology Chat event has a `fields` object"))?;
        let field = |key: &str| {
            fields
                .get(key)
                .and_then(Value::as_str)
                .filter(|v| !v.is_empty())
        };
        let post_id = field("post_id")
            .ok_or_else(|| self.malformed("a Synology Chat event without a post_id"))?;
        let username =
            field("username").ok_or_else(|| self.malformed("an event without a username"))?;
        if self.own_usernames.iter().any(|own| own == username) {
            return Err(self.ignored(format!("a post by this channel's own {username:?}")));
        }
        let text = field("text").unwrap_or_default();
        if text.trim().is_empty() {
            return Err(self.ignored("a post without text"));
        }
        let target = match raw.get("via").and_then(Value::as_str) {
            Some("bot") => MessageTarget::direct(username),
            Some("outgoing") => MessageTarget::group(
                field("channel_id")
                    .ok_or_else(|| self.malformed("an outgoing webhook without a channel_id"))?,
            ),
            other => return Err(self.malformed(format!("an unknown event source {other:?}"))),
        };
        let sender = MessageActor::new(field("user_id").unwrap_or(username))
            .with_display_name(username.to_owned())
            .with_is_bot(self.bot_usernames.iter().any(|b| b == username));
        let mut inbound = ChannelMessage::inbound(post_id, &self.name, target)
            .with_text(text)
            .with_sender(sender)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        if let Some(at) = field("timestamp").and_then(|t| t.parse::<i64>().ok()) {
            inbound = inbound.with_timestamp(at);
        }
        let bot = self.bot_usernames.iter().any(|b| b == username);
        Ok(NormalizedInbound::new(format!("post:{post_id}"), inbound).by_bot(bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use clawgate_types::TargetKind;
    use serde_json::json;

    use super::*;

    fn receiver() -> SynologyReceiver {
        SynologyReceiver::new(
            "synology",
            vec!["clawgate-hook".into()],
            vec!["ci-bot".into()],
        )
    }

    fn dm(post: &str, username: &str, text: &str) -> Value {
        json!({ "via": "bot", "fields": { "user_id": "4", "username": username,
            "post_id": post, "timestamp": "1646827836131", "text": text } })
    }

    #[test]
    fn dms_and_channel_posts_are_prompts_keyed_by_post_id() {
        let r = receiver();
        let direct = r.normalize(&dm("146028888128", "mikael", "hello")).unwrap();
        assert_eq!(direct.event_id, "post:146028888128");
        assert_eq!(
            (
                direct.message.target.kind,
                direct.message.target.id.as_str()
            ),
            (TargetKind::Direct, "mikael")
        );
        let channel = r
            .normalize(&json!({ "via": "outgoing", "fields": { "channel_id": "34",
                "channel_name": "Labb", "user_id": "4", "username": "mikael",
                "post_id": "146028888129", "timestamp": "1646827836131", "text": "!ask hi",
                "trigger_word": "!ask" } }))
            .unwrap();
        assert_eq!(
            (
                channel.message.target.kind,
                channel.message.target.id.as_str()
            ),
            (TargetKind::Group, "34")
        );
        assert_eq!(channel.event_id, "post:146028888129");
        assert!(!channel.is_bot_author);
        assert!(
            r.normalize(&dm("146028888130", "ci-bot", "beep"))
                .unwrap()
                .is_bot_author
        );
    }

    #[test]
    fn own_posts_and_empty_posts_are_ignored_and_garbage_is_malformed() {
        let r = receiver();
        for ignored in [
            dm("1", "clawgate-hook", "!ask loop"),
            dm("2", "mikael", "  "),
        ] {
            assert!(
                matches!(r.normalize(&ignored), Err(ReceiveError::Ignored { .. })),
                "{ignored}"
            );
        }
        for garbage in [
            json!({}),
            json!({ "via": "bot", "fields": { "username": "mikael", "text": "x" } }),
            json!({ "via": "elsewhere", "fields": { "post_id": "3", "username": "m", "text": "x" } }),
            json!({ "via": "outgoing", "fields": { "post_id": "3", "username": "m", "text": "x" } }),
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
        let channel = json!({ "via": "outgoing", "fields": { "channel_id": "34",
            "channel_name": "Labb", "user_id": "4", "username": "mikael",
            "post_id": "146028888129", "timestamp": "1646827836131", "text": "!ask hi",
            "trigger_word": "!ask" } });
        clawgate_conformance::fuzz::normalizer_never_panics(
            &receiver(),
            vec![dm("146028888128", "mikael", "hello"), channel],
        );
    }
}
