//! Inbound: one `PRIVMSG` Twitch relayed (with its IRCv3 tags) → a normalized message.
//!
//! - The feed wraps each line as `{"line", "login"}` ([`inbound_event`]); the event id is the
//!   message's own `id` tag, so the same message is the same event however often it is seen.
//! - A line in a channel is answered when it mentions us (`@login` anywhere, or `login:` /
//!   `login,` at the start; the leading mention is taken off the text), or every line with
//!   `answer_all`.
//! - Our own login's lines (Helix sends relayed back, a second connection) are never answered;
//!   logins in `bot_logins` are reported as bot authors. `/me` (CTCP ACTION) is not answered.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use irc_proto::{Command, Message, Prefix};
use serde_json::{Value, json};

/// The event the feed hands the engine for one relayed line.
pub fn inbound_event(line: &str, own_login: &str) -> Value {
    json!({ "line": line, "login": own_login })
}

/// The text after a mention of `login`, if the text mentions it.
fn mentioning<'a>(text: &'a str, login: &str) -> Option<&'a str> {
    let lower = text.to_ascii_lowercase();
    let ends_word = |end: usize| {
        lower[end..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
    };
    // At the start (`@login`, `login:`, `login,`): the mention is taken off.
    let lead = if lower.starts_with('@') { 1 } else { 0 };
    if lower[lead..].starts_with(login) && ends_word(lead + login.len()) {
        let rest = &text[lead + login.len()..];
        if lead == 1 || rest.starts_with([':', ',']) {
            let rest = rest.strip_prefix([':', ',']).unwrap_or(rest);
            return Some(rest.trim_start());
        }
    }
    let at = format!("@{login}");
    let mut from = 0;
    while let Some(found) = lower[from..].find(&at) {
        let end = from + found + at.len();
        if ends_word(end) {
            return Some(text);
        }
        from = end;
    }
    None
}

/// Normalizes what one Twitch account receives.
#[derive(Debug, Clone)]
pub struct TwitchReceiver {
    name: String,
    answer_all: bool,
    allowed_channels: BTreeSet<String>,
    bot_logins: BTreeSet<String>,
}

impl TwitchReceiver {
    /// The receiver of channel `name`.
    pub fn new(
        name: &str,
        answer_all: bool,
        allowed_channels: impl IntoIterator<Item = String>,
        bot_logins: impl IntoIterator<Item = String>,
    ) -> TwitchReceiver {
        let normal = |s: String| s.trim_start_matches('#').to_ascii_lowercase();
        TwitchReceiver {
            name: name.to_owned(),
            answer_all,
            allowed_channels: allowed_channels.into_iter().map(normal).collect(),
            bot_logins: bot_logins.into_iter().map(normal).collect(),
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

fn tag<'a>(message: &'a Message, key: &str) -> Option<&'a str> {
    message
        .tags
        .as_ref()?
        .iter()
        .find(|t| t.0 == key)
        .and_then(|t| t.1.as_deref())
        .filter(|v| !v.is_empty())
}

impl MessageReceiveAdapter for TwitchReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let field = |key: &str| {
            raw.get(key)
                .and_then(Value::as_str)
                .ok_or_else(|| self.malformed(format!("a Twitch event needs a `{key}` string")))
        };
        let line = field("line")?;
        let own = field("login")?.to_ascii_lowercase();
        let message: Message = line
            .parse()
            .map_err(|e| self.malformed(format!("not a TMI line: {e}")))?;
        let Command::PRIVMSG(to, text) = &message.command else {
            return Err(self.ignored("not a PRIVMSG"));
        };
        let Some(Prefix::Nickname(login, _, _)) = &message.prefix else {
            return Err(self.ignored("a line from the server, not from a person"));
        };
        let login = login.to_ascii_lowercase();
        let id = tag(&message, "id")
            .ok_or_else(|| self.malformed("a PRIVMSG without an `id` tag (twitch.tv/tags off?)"))?;
        if login == own {
            return Err(self.ignored("our own message"));
        }
        if text.starts_with('\u{1}') {
            return Err(self.ignored("a /me action is not answered"));
        }
        let Some(channel) = to.strip_prefix('#') else {
            return Err(self.ignored(format!("a line to {to}, not into a channel")));
        };
        let channel = channel.to_ascii_lowercase();
        if !self.allowed_channels.is_empty() && !self.allowed_channels.contains(&channel) {
            return Err(self.ignored(format!("#{channel} is not in allowed_channels")));
        }
        let text = match mentioning(text, &own) {
            Some(rest) => rest,
            None if self.answer_all => text.as_str(),
            None => {
                return Err(self.ignored(format!(
                    "a message in #{channel} not mentioning @{own} (answer_all is off)"
                )));
            }
        };
        if text.trim().is_empty() {
            return Err(self.ignored("a mention without a message"));
        }
        let is_bot = self.bot_logins.contains(&login);
        let mut sender = MessageActor::new(login.clone()).with_is_bot(is_bot);
        if let Some(name) = tag(&message, "display-name") {
            sender = sender.with_display_name(name);
        }
        let inbound =
            ChannelMessage::inbound(id, &self.name, MessageTarget::group(format!("#{channel}")))
                .with_text(text)
                .with_sender(sender)
                // Kept so an unfinished event can be worked on again from its durable record.
                .with_raw(raw.clone());
        Ok(NormalizedInbound::new(id, inbound).by_bot(is_bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clawgate_types::TargetKind;

    use super::*;

    fn receiver(answer_all: bool) -> TwitchReceiver {
        TwitchReceiver::new("twitch", answer_all, [], ["otherbot".to_owned()])
    }

    fn line(login: &str, text: &str) -> Value {
        inbound_event(
            &format!(
                "@badges=;display-name=Ada;id=9f1c-77;room-id=42;tmi-sent-ts=1;user-id=1001 \
                 :{login}!{login}@{login}.tmi.twitch.tv PRIVMSG #clawchan :{text}"
            ),
            "claw_bot",
        )
    }

    fn text(inbound: &NormalizedInbound) -> &str {
        inbound
            .message
            .body
            .as_ref()
            .map_or("", |b| b.text.as_str())
    }

    #[test]
    fn a_mention_is_a_message_in_the_channel_with_twitchs_id() {
        let inbound = receiver(false)
            .normalize(&line("ada", "@claw_bot what time is it?"))
            .unwrap();
        assert_eq!(inbound.event_id, "9f1c-77");
        assert_eq!(inbound.message.id, "9f1c-77");
        assert_eq!(inbound.message.target.kind, TargetKind::Group);
        assert_eq!(inbound.message.target.id, "#clawchan");
        assert_eq!(text(&inbound), "what time is it?");
        let inside = receiver(false)
            .normalize(&line("ada", "hey @Claw_Bot, hi"))
            .unwrap();
        assert_eq!(text(&inside), "hey @Claw_Bot, hi");
        let colon = receiver(false)
            .normalize(&line("ada", "claw_bot: hi"))
            .unwrap();
        assert_eq!(text(&colon), "hi");
    }

    #[test]
    fn chatter_own_lines_actions_and_other_channels_are_ignored() {
        let allowed = TwitchReceiver::new("twitch", false, ["#elsewhere".to_owned()], []);
        for (receiver, event) in [
            (receiver(false), line("ada", "just chatting")),
            (receiver(false), line("ada", "@claw_botty hi")),
            (receiver(true), line("claw_bot", "@claw_bot my own line")),
            (receiver(true), line("ada", "\u{1}ACTION waves\u{1}")),
            (allowed, line("ada", "@claw_bot hi")),
            (receiver(true), line("ada", "@claw_bot")),
        ] {
            assert!(
                matches!(
                    receiver.normalize(&event),
                    Err(ReceiveError::Ignored { .. })
                ),
                "{event}"
            );
        }
        assert_eq!(
            text(
                &receiver(true)
                    .normalize(&line("ada", "just chatting"))
                    .unwrap()
            ),
            "just chatting"
        );
    }

    #[test]
    fn listed_bots_are_bot_authors_and_untagged_lines_are_malformed() {
        let inbound = receiver(true).normalize(&line("otherbot", "beep")).unwrap();
        assert!(inbound.is_bot_author);
        for garbage in [
            json!([]),
            json!({ "line": ":a!a@a PRIVMSG #c :x" }),
            inbound_event(
                ":ada!ada@ada.tmi.twitch.tv PRIVMSG #c :@claw_bot hi",
                "claw_bot",
            ),
        ] {
            assert!(
                matches!(
                    receiver(true).normalize(&garbage),
                    Err(ReceiveError::Malformed { .. })
                ),
                "{garbage}"
            );
        }
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        clawgate_conformance::fuzz::normalizer_never_panics(
            &receiver(false),
            vec![
                line("ada", "@claw_bot what time is it?"),
                line("ada", "hey @Claw_Bot, hi"),
            ],
        );
    }
}
