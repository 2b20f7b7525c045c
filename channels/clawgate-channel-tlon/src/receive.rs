//! Normalizing what the subscriptions deliver. The source hands each diff over as
//! `{"app": "chat" | "channels", "event": <the diff's json>}`.
//!
//! - `chat` (DMs): `{"whom": "~ship", "id": "~author/<@ud>", "response": {"add": {"essay" |
//!   "memo": {content, author, sent}, "time"}}}` → a direct prompt from `whom`; the event id is
//!   the writ id (a redelivery is dropped by the engine's durable dedupe).
//! - `channels` (groups): `{"nest", "response": {"post": {"id", "r-post": {"set": {"essay",
//!   "seal"}}}}}` is a top-level post; `… "r-post": {"reply": {"id", "r-reply": {"set":
//!   {"memo" | "reply-essay", "seal"}}}}` a thread reply. Answered when it mentions our ship,
//!   when it is in a thread we take part in ([`ParticipatedThreads`]), or in a channel listed as
//!   open; the reply goes into the post's thread. The event id is `<nest>/<post id>`.
//! - Never answered (`Ignored`): our own posts and DMs (the firehose echoes them), edits,
//!   deletions, reactions, DM invites, posts without text.
//! - A bot's messages carry its profile as the author (`{ship, nickname, avatar}` \[obs\]):
//!   reported as bot authors.

use std::collections::BTreeSet;
use std::sync::Arc;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

use crate::aura::ship;
use crate::story;
use crate::threads::ParticipatedThreads;

struct Essay {
    author: String,
    bot: bool,
    text: String,
    sent: Option<i64>,
}

/// Normalizes one Tlon account's subscription events.
#[derive(Debug, Clone)]
pub struct TlonReceiver {
    name: String,
    our: String,
    open_channels: BTreeSet<String>,
    threads: Arc<ParticipatedThreads>,
}

impl TlonReceiver {
    /// The receiver of channel `name` for ship `our`; posts in `open_channels` are answered
    /// without a mention.
    pub fn new(
        name: &str,
        our: &str,
        open_channels: impl IntoIterator<Item = String>,
        threads: Arc<ParticipatedThreads>,
    ) -> TlonReceiver {
        TlonReceiver {
            name: name.to_owned(),
            our: ship(our),
            open_channels: open_channels.into_iter().collect(),
            threads,
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

    /// The essay's author, whether it is a bot, its text and sent time.
    fn essay(&self, essay: &Value) -> Result<Essay, ReceiveError> {
        let (author, bot) = match essay.get("author") {
            Some(Value::String(s)) => (ship(s), false),
            // A bot's author is its profile, `{ship, nickname, avatar}` \[obs\].
            Some(Value::Object(map)) => (
                map.get("ship")
                    .and_then(Value::as_str)
                    .map(ship)
                    .ok_or_else(|| self.malformed("an author object without a ship"))?,
                true,
            ),
            _ => return Err(self.malformed("a Tlon message without an author")),
        };
        let text = essay
            .get("content")
            .and_then(story::to_text)
            .ok_or_else(|| self.malformed("a Tlon message whose content is not a story"))?;
        let sent = essay.get("sent").and_then(Value::as_i64);
        Ok(Essay {
            author,
            bot,
            text,
            sent,
        })
    }

    fn message(
        &self,
        id: &str,
        target: MessageTarget,
        author: &str,
        text: &str,
        sent: Option<i64>,
        raw: &Value,
    ) -> ChannelMessage {
        let mut message = ChannelMessage::inbound(id, &self.name, target)
            .with_text(text)
            .with_sender(MessageActor::new(author).with_display_name(author.to_owned()))
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        if let Some(at) = sent {
            message = message.with_timestamp(at);
        }
        message
    }

    fn dm(&self, event: &Value, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        if event.is_array() {
            return Err(self.ignored("a DM invite list"));
        }
        let whom = event
            .get("whom")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a chat event without `whom`"))?;
        let id = event
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a chat event without a writ id"))?;
        let Some(add) = event.pointer("/response/add") else {
            return Err(self.ignored("a DM change that is not a new message"));
        };
        let essay = add
            .get("essay")
            .or_else(|| add.get("memo"))
            .ok_or_else(|| self.malformed("a DM `add` without its essay"))?;
        let Essay {
            author,
            bot,
            text,
            sent,
        } = self.essay(essay)?;
        if author == self.our {
            return Err(self.ignored("our own DM"));
        }
        if !whom.starts_with('~') {
            return Err(self.ignored("a group DM (club): not answered"));
        }
        if text.trim().is_empty() {
            return Err(self.ignored("a DM without text"));
        }
        let target = MessageTarget::direct(ship(whom));
        Ok(NormalizedInbound::new(
            format!("dm:{id}"),
            self.message(id, target, &author, &text, sent, raw),
        )
        .by_bot(bot))
    }

    fn addressed(&self, text: &str, content: Option<&Value>) -> bool {
        content.is_some_and(|c| story::mentions(c).contains(&self.our))
            || text
                .split(|c: char| c.is_whitespace() || c == ',' || c == ':')
                .any(|word| word == self.our)
    }

    fn post(&self, event: &Value, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let nest = event
            .get("nest")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a channels event without a nest"))?;
        let post = event
            .pointer("/response/post")
            .ok_or_else(|| self.ignored("a channel change that is not about a post"))?;
        let post_id = post
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("a post event without an id"))?;
        let change = post
            .get("r-post")
            .ok_or_else(|| self.malformed("a post event without `r-post`"))?;
        let (event_id, thread, essay, in_thread) = if let Some(set) = change.get("set") {
            let Some(essay) = set.get("essay") else {
                return Err(self.ignored("a deleted post"));
            };
            (format!("post:{nest}/{post_id}"), post_id, essay, false)
        } else if let Some(reply) = change.get("reply") {
            let reply_id = reply
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| self.malformed("a reply event without an id"))?;
            let Some(essay) = reply
                .pointer("/r-reply/set")
                .and_then(|s| s.get("memo").or_else(|| s.get("reply-essay")))
            else {
                return Err(self.ignored("a reply change that is not a new reply"));
            };
            (format!("post:{nest}/{reply_id}"), post_id, essay, true)
        } else {
            return Err(self.ignored("a reaction or edit"));
        };
        let Essay {
            author,
            bot,
            text,
            sent,
        } = self.essay(essay)?;
        if author == self.our {
            return Err(self.ignored("our own post"));
        }
        if text.trim().is_empty() {
            return Err(self.ignored("a post without text"));
        }
        let answered = self.addressed(&text, essay.get("content"))
            || (in_thread && self.threads.contains(nest, thread))
            || self.open_channels.contains(nest);
        if !answered {
            return Err(self.ignored(
                "a group post that does not mention us, outside the threads we take part in",
            ));
        }
        let mut target = MessageTarget::group(nest);
        target.thread_id = Some(thread.to_owned());
        let id = event_id.rsplit('/').next().unwrap_or(post_id).to_owned();
        Ok(NormalizedInbound::new(
            event_id.clone(),
            self.message(&id, target, &author, &text, sent, raw),
        )
        .by_bot(bot))
    }
}

impl MessageReceiveAdapter for TlonReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let event = raw
            .get("event")
            .ok_or_else(|| self.malformed("an event without its `event` body"))?;
        match raw.get("app").and_then(Value::as_str) {
            Some("chat") => self.dm(event, raw),
            Some("channels") => self.post(event, raw),
            other => Err(self.malformed(format!("an event of an unknown agent {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Mutations of a DM and a channel post (wrong types, missing fields, huge numbers, long
    /// and odd strings, deep nesting) and arbitrary JSON: a message or a typed error, never a
    /// panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let essay = json!({ "author": "~nec", "sent": 1_700_000_000_000_i64,
            "content": [{ "inline": ["hello", { "break": null }, { "ship": "~zod" }, "there"] }] });
        let dm = json!({ "app": "chat", "event": { "whom": "~nec", "id": "~nec/170.141",
            "response": { "add": { "essay": essay } } } });
        let post = json!({ "app": "channels", "event": { "nest": "chat/~zod/room",
            "response": { "post": { "id": "170.142",
                "r-post": { "set": { "essay": essay } } } } } });
        let receiver = TlonReceiver::new(
            "tlon",
            "~zod",
            ["chat/~zod/room".to_owned()],
            Arc::default(),
        );
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver, vec![dm, post]);
    }
}
