//! Inbound: one WebSocket `posted` event (its post a JSON string in `data.post`) → a normalized
//! message.
//!
//! - The event id is the post id: a resumed connection's replay and a re-fetch over REST carry
//!   the same post, so either is deduplicated by the engine.
//! - Direct channels (`channel_type` `D`) are direct conversations and always answered; other
//!   channels are groups, answered when the post mentions `@<bot username>` (the leading mention
//!   is taken off the text) unless `require_mention` is off.
//! - Threads: a reply's thread is its `root_id`; a root post in a channel is answered in a thread
//!   under it, a root post in a DM at top level.
//! - The bot's own posts, system posts (`type` `system_…`) and empty posts are ignored; other bot
//!   accounts' posts (`props.from_bot`) are passed on as bot-written, for the engine's echo drop
//!   (the origin marker in `props`), `allow_bots` and loop guard.
//! - `post_edited` and `post_deleted` are ignored: an edit of a question is not answered again
//!   and a deletion does not withdraw an answer (both say so in the reason).

use std::collections::BTreeSet;
use std::sync::Arc;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageRelation, MessageTarget};

use crate::adapter::BotCell;
use crate::wire::Event;

/// Normalizes the posts of one bot account.
#[derive(Debug, Clone)]
pub struct MattermostReceiver {
    name: String,
    bot: Arc<BotCell>,
    require_mention: bool,
    allowed_channels: BTreeSet<String>,
}

/// The text after a mention of `username`, if the text mentions it (`@name` anywhere; taken
/// off when it leads).
fn mentioning<'a>(text: &'a str, username: &str) -> Option<&'a str> {
    let needle = format!("@{username}");
    let ends_name = |rest: &str| {
        rest.chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
    };
    let trimmed = text.trim_start();
    if let Some(rest) = trimmed.strip_prefix(&needle)
        && ends_name(rest)
    {
        return Some(rest.trim_start_matches([':', ',']).trim_start());
    }
    text.match_indices(&needle)
        .any(|(at, _)| ends_name(&text[at + needle.len()..]))
        .then_some(text)
}

impl MattermostReceiver {
    /// The receiver of channel `name` for the bot in `bot`.
    pub fn new(
        name: &str,
        bot: Arc<BotCell>,
        require_mention: bool,
        allowed_channels: impl IntoIterator<Item = String>,
    ) -> MattermostReceiver {
        MattermostReceiver {
            name: name.to_owned(),
            bot,
            require_mention,
            allowed_channels: allowed_channels.into_iter().collect(),
        }
    }

    fn ignored(&self, reason: impl Into<String>) -> ReceiveError {
        ReceiveError::Ignored {
            channel: self.name.clone(),
            reason: reason.into(),
        }
    }
}

impl MessageReceiveAdapter for MattermostReceiver {
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError> {
        let malformed = |reason: String| ReceiveError::Malformed {
            channel: self.name.clone(),
            reason,
        };
        let event: Event = serde_json::from_value(raw.clone())
            .map_err(|e| malformed(format!("not a Mattermost WebSocket event: {e}")))?;
        match event.event.as_str() {
            "posted" => {}
            "post_edited" => {
                return Err(
                    self.ignored("an edited post (the question was answered as first written)")
                );
            }
            "post_deleted" => {
                return Err(self.ignored("a deleted post (an answer already given stays)"));
            }
            other => return Err(self.ignored(format!("a `{other}` event"))),
        }
        let post = event
            .post()
            .ok_or_else(|| malformed("a posted event without a readable data.post".into()))?;
        if post.id.is_empty() || post.channel_id.is_empty() {
            return Err(malformed("a post without id or channel_id".into()));
        }
        if self.bot.id().as_deref() == Some(post.user_id.as_str()) {
            return Err(self.ignored("the bot's own post"));
        }
        if !post.kind.is_empty() {
            return Err(self.ignored(format!("a system post ({})", post.kind)));
        }
        if !self.allowed_channels.is_empty() && !self.allowed_channels.contains(&post.channel_id) {
            return Err(self.ignored(format!(
                "channel {} is not in allowed_channels",
                post.channel_id
            )));
        }
        let direct = event.data.get("channel_type").and_then(|t| t.as_str()) == Some("D");
        let mut text = post.message.as_str();
        if !direct && self.require_mention {
            let Some(username) = self.bot.username() else {
                return Err(
                    self.ignored("the bot's username is not known yet (GET /users/me failed)")
                );
            };
            text = mentioning(text, &username).ok_or_else(|| {
                self.ignored(format!(
                    "a post in channel {} not mentioning @{username} (require_mention is on)",
                    post.channel_id
                ))
            })?;
        }
        if text.trim().is_empty() {
            return Err(self.ignored("a post without text"));
        }
        let thread = if !post.root_id.is_empty() {
            Some(post.root_id.clone())
        } else if direct {
            None
        } else {
            Some(post.id.clone())
        };
        let target = if direct {
            MessageTarget::direct(&post.channel_id)
        } else {
            MessageTarget::group(&post.channel_id)
        }
        .with_thread_id(thread.clone());
        let is_bot = post.from_bot();
        let sender_name = event
            .data
            .get("sender_name")
            .and_then(|s| s.as_str())
            .map(|s| s.trim_start_matches('@').to_owned());
        let mut sender = MessageActor::new(post.user_id.clone()).with_is_bot(is_bot);
        sender.display_name = sender_name;
        let mut inbound = ChannelMessage::inbound(post.id.clone(), &self.name, target)
            .with_text(text)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        inbound.sender = Some(sender);
        inbound.timestamp = Some(post.create_at);
        inbound.relation = Some(MessageRelation::reply_to(post.id.clone()).with_thread_id(thread));
        Ok(NormalizedInbound::new(post.id, inbound).by_bot(is_bot))
    }
}

#[cfg(test)]
mod tests {
    use clawgate_types::TargetKind;
    use serde_json::json;

    use super::*;

    fn receiver(require_mention: bool) -> MattermostReceiver {
        let bot = Arc::new(BotCell::default());
        bot.set("botid", "clawgate");
        MattermostReceiver::new("mattermost", bot, require_mention, Vec::new())
    }

    fn event(kind: &str, channel_type: &str, post: serde_json::Value) -> serde_json::Value {
        json!({ "event": kind, "seq": 4, "broadcast": { "channel_id": post["channel_id"] },
            "data": { "post": post.to_string(), "channel_type": channel_type, "sender_name": "@ada" } })
    }

    #[test]
    fn a_mention_in_a_channel_is_answered_in_its_thread() {
        let raw = event(
            "posted",
            "O",
            json!({ "id": "p1", "channel_id": "c1", "user_id": "u1",
            "message": "@clawgate: what time is it?", "root_id": "", "create_at": 5 }),
        );
        let inbound = receiver(true).normalize(&raw).expect("normalizes");
        assert_eq!(inbound.event_id, "p1");
        assert_eq!(inbound.message.target.kind, TargetKind::Group);
        assert_eq!(inbound.message.target.thread_id.as_deref(), Some("p1"));
        assert_eq!(
            inbound.message.body.as_ref().map(|b| b.text.as_str()),
            Some("what time is it?")
        );
        let reply = event(
            "posted",
            "O",
            json!({ "id": "p2", "channel_id": "c1", "user_id": "u1",
            "message": "and @clawgate again", "root_id": "p1" }),
        );
        let inbound = receiver(true).normalize(&reply).expect("normalizes");
        assert_eq!(inbound.message.target.thread_id.as_deref(), Some("p1"));
    }

    #[test]
    fn unmentioned_own_system_and_edited_posts_are_ignored() {
        let cases = [
            (
                "no mention",
                event(
                    "posted",
                    "O",
                    json!({ "id": "1", "channel_id": "c", "user_id": "u", "message": "hello @clawgatex" }),
                ),
            ),
            (
                "own",
                event(
                    "posted",
                    "D",
                    json!({ "id": "2", "channel_id": "c", "user_id": "botid", "message": "hi" }),
                ),
            ),
            (
                "system",
                event(
                    "posted",
                    "D",
                    json!({ "id": "3", "channel_id": "c", "user_id": "u", "message": "joined", "type": "system_join_channel" }),
                ),
            ),
            (
                "edited",
                event(
                    "post_edited",
                    "D",
                    json!({ "id": "4", "channel_id": "c", "user_id": "u", "message": "x" }),
                ),
            ),
            (
                "deleted",
                event(
                    "post_deleted",
                    "D",
                    json!({ "id": "5", "channel_id": "c", "user_id": "u", "message": "x" }),
                ),
            ),
            (
                "typing",
                json!({ "event": "typing", "data": {}, "broadcast": {} }),
            ),
        ];
        for (case, raw) in cases {
            assert!(
                matches!(
                    receiver(true).normalize(&raw),
                    Err(ReceiveError::Ignored { .. })
                ),
                "{case}"
            );
        }
        assert!(matches!(
            receiver(true).normalize(&json!({ "event": "posted", "data": { "post": "{" } })),
            Err(ReceiveError::Malformed { .. })
        ));
    }

    #[test]
    fn dms_are_direct_at_top_level_and_bots_are_bot_authors() {
        let dm = event(
            "posted",
            "D",
            json!({ "id": "1", "channel_id": "c", "user_id": "u", "message": "hi" }),
        );
        let inbound = receiver(true).normalize(&dm).expect("normalizes");
        assert_eq!(inbound.message.target.kind, TargetKind::Direct);
        assert_eq!(inbound.message.target.thread_id, None);
        let bot = event(
            "posted",
            "O",
            json!({ "id": "2", "channel_id": "c", "user_id": "b2",
            "message": "beep", "props": { "from_bot": "true" } }),
        );
        assert!(
            receiver(false)
                .normalize(&bot)
                .expect("normalizes")
                .is_bot_author
        );
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let mention = event(
            "posted",
            "O",
            json!({ "id": "p1", "channel_id": "c1", "user_id": "u1",
            "message": "@clawgate: what time is it?", "root_id": "", "create_at": 5 }),
        );
        let reply = event(
            "posted",
            "O",
            json!({ "id": "p2", "channel_id": "c1", "user_id": "u1",
            "message": "and @clawgate again", "root_id": "p1" }),
        );
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(true), vec![mention, reply]);
    }
}
