//! Inbound: one line the server relayed (`PRIVMSG` or `NOTICE`) → a normalized message.
//!
//! - The feed wraps each line as `{"id", "line", "own_nick"}` ([`inbound_event`]): IRC has no
//!   message ids, so the id is the connection's own counter, stable for the event's durable
//!   record (a redelivery of the same record has the same id).
//! - `PRIVMSG` to our nick is a direct conversation with the sender; to a channel, a group
//!   conversation in that channel. In a channel only lines addressed to us (`nick: …` or
//!   `nick, …`) are answered unless `answer_all`; the address is taken off the text.
//! - `NOTICE` is never answered (RFC 2812 §3.3.2: no automatic reply to a notice, the rule that
//!   keeps bots from answering each other forever), and neither is CTCP (`\x01…\x01`: VERSION,
//!   PING, ACTION).
//! - Plain IRC says nothing of bots: nicks listed in `bot_nicks` are reported as bot authors, and
//!   a line from our own nick (a second connection of the same nick, a bouncer) is ignored.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use irc_proto::{Command, Message, Prefix};
use serde_json::{Value, json};

/// The event the feed hands the engine for one relayed line.
pub fn inbound_event(line: &str, own_nick: &str, id: &str) -> Value {
    json!({ "id": id, "line": line, "own_nick": own_nick })
}

/// Whether `name` is a channel (RFC 2812 §1.3: `#`, `&`, `+` or `!`).
pub fn is_channel(name: &str) -> bool {
    name.starts_with(['#', '&', '+', '!'])
}

/// The text after an address to `nick` (`nick: text`, `nick, text`), if the line is one.
fn addressed_to<'a>(text: &'a str, nick: &str) -> Option<&'a str> {
    let head = text.get(..nick.len())?;
    if !head.eq_ignore_ascii_case(nick) {
        return None;
    }
    let rest = &text[nick.len()..];
    let rest = rest.strip_prefix([':', ','])?;
    Some(rest.trim_start())
}

/// Normalizes what one IRC account receives.
#[derive(Debug, Clone)]
pub struct IrcReceiver {
    name: String,
    answer_all: bool,
    /// Channels answered (lowercase); empty: every channel we are in.
    allowed_channels: BTreeSet<String>,
    bot_nicks: BTreeSet<String>,
}

impl IrcReceiver {
    /// The receiver of channel `name`.
    pub fn new(
        name: &str,
        answer_all: bool,
        allowed_channels: impl IntoIterator<Item = String>,
        bot_nicks: impl IntoIterator<Item = String>,
    ) -> IrcReceiver {
        IrcReceiver {
            name: name.to_owned(),
            answer_all,
            allowed_channels: allowed_channels
                .into_iter()
                .map(|c| c.to_ascii_lowercase())
                .collect(),
            bot_nicks: bot_nicks
                .into_iter()
                .map(|n| n.to_ascii_lowercase())
                .collect(),
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

impl MessageReceiveAdapter for IrcReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let field = |key: &str| {
            raw.get(key)
                .and_then(Value::as_str)
                .ok_or_else(|| self.malformed(format!("an IRC event needs a `{key}` string")))
        };
        let id = field("id")?;
        let line = field("line")?;
        let own_nick = field("own_nick")?;
        let message: Message = line
            .parse()
            .map_err(|e| self.malformed(format!("not an IRC line: {e}")))?;
        let Some(Prefix::Nickname(nick, user, host)) = &message.prefix else {
            return Err(self.ignored("a line from the server, not from a person"));
        };
        let (to, text) = match &message.command {
            Command::PRIVMSG(to, text) => (to, text),
            Command::NOTICE(..) => {
                return Err(self.ignored("a NOTICE is never answered (RFC 2812 §3.3.2)"));
            }
            _ => return Err(self.ignored("not a PRIVMSG")),
        };
        if text.starts_with('\u{1}') {
            return Err(self.ignored("a CTCP request is not answered"));
        }
        if nick.eq_ignore_ascii_case(own_nick) {
            return Err(self.ignored("our own line"));
        }
        let (target, text) = if is_channel(to) {
            if !self.allowed_channels.is_empty()
                && !self.allowed_channels.contains(&to.to_ascii_lowercase())
            {
                return Err(self.ignored(format!("{to} is not in allowed_channels")));
            }
            let text = match addressed_to(text, own_nick) {
                Some(rest) => rest,
                None if self.answer_all => text.as_str(),
                None => {
                    return Err(self.ignored(format!(
                        "a line in {to} not addressed to {own_nick} (answer_all is off)"
                    )));
                }
            };
            (MessageTarget::group(to.clone()), text)
        } else if to.eq_ignore_ascii_case(own_nick) {
            (MessageTarget::direct(nick.clone()), text.as_str())
        } else {
            return Err(self.ignored(format!("a line to {to}, not to us")));
        };
        if text.trim().is_empty() {
            return Err(self.ignored("an address without a message"));
        }
        let is_bot = self.bot_nicks.contains(&nick.to_ascii_lowercase());
        let sender = MessageActor::new(nick.clone())
            .with_is_bot(is_bot)
            .with_display_name(format!("{nick}!{user}@{host}"));
        let inbound = ChannelMessage::inbound(id, &self.name, target)
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

    fn receiver(answer_all: bool) -> IrcReceiver {
        IrcReceiver::new("irc", answer_all, [], ["otherbot".to_owned()])
    }

    fn event(line: &str) -> Value {
        inbound_event(line, "claw", "1-7")
    }

    fn text(inbound: &NormalizedInbound) -> &str {
        inbound
            .message
            .body
            .as_ref()
            .map_or("", |b| b.text.as_str())
    }

    #[test]
    fn a_private_line_is_a_direct_conversation_with_the_sender() {
        let inbound = receiver(false)
            .normalize(&event(":ada!~ada@host PRIVMSG claw :hi there"))
            .unwrap();
        assert_eq!(inbound.event_id, "1-7");
        assert_eq!(inbound.message.target.kind, TargetKind::Direct);
        assert_eq!(inbound.message.target.id, "ada");
        assert_eq!(text(&inbound), "hi there");
        assert!(!inbound.is_bot_author);
    }

    #[test]
    fn channel_lines_are_answered_when_addressed_or_with_answer_all() {
        let addressed = event(":ada!~ada@host PRIVMSG #room :Claw: what time is it?");
        let inbound = receiver(false).normalize(&addressed).unwrap();
        assert_eq!(inbound.message.target.kind, TargetKind::Group);
        assert_eq!(inbound.message.target.id, "#room");
        assert_eq!(text(&inbound), "what time is it?");
        let comma = event(":ada!~ada@host PRIVMSG #room :claw, hi");
        assert_eq!(text(&receiver(false).normalize(&comma).unwrap()), "hi");
        let chatter = event(":ada!~ada@host PRIVMSG #room :clawing at the door");
        assert!(matches!(
            receiver(false).normalize(&chatter),
            Err(ReceiveError::Ignored { .. })
        ));
        let inbound = receiver(true).normalize(&chatter).unwrap();
        assert_eq!(text(&inbound), "clawing at the door");
    }

    #[test]
    fn notices_ctcp_our_own_lines_and_other_channels_are_ignored() {
        let allowed = IrcReceiver::new("irc", true, ["#Room".to_owned()], []);
        for line in [
            ":ada!~ada@host NOTICE claw :hello",
            ":ada!~ada@host PRIVMSG claw :\u{1}VERSION\u{1}",
            ":ada!~ada@host PRIVMSG #room :\u{1}ACTION waves\u{1}",
            ":claw!~claw@host PRIVMSG #room :claw: my own line",
            ":ada!~ada@host PRIVMSG #elsewhere :claw: hi",
            ":irc.test PRIVMSG claw :from the server",
            ":ada!~ada@host PRIVMSG someoneelse :hi",
        ] {
            assert!(
                matches!(
                    allowed.normalize(&event(line)),
                    Err(ReceiveError::Ignored { .. })
                ),
                "{line}"
            );
        }
        assert!(
            allowed
                .normalize(&event(":ada!~ada@host PRIVMSG #ROOM :hi"))
                .is_ok()
        );
    }

    #[test]
    fn listed_bots_are_bot_authors_and_garbage_is_malformed() {
        let inbound = receiver(true)
            .normalize(&event(":OtherBot!~b@host PRIVMSG claw :beep"))
            .unwrap();
        assert!(inbound.is_bot_author);
        for garbage in [
            json!([]),
            json!({ "line": ":a!b@c PRIVMSG claw :x" }),
            json!({ "id": "1", "own_nick": "claw", "line": "" }),
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
                event(":ada!~ada@host PRIVMSG claw :hi there"),
                event(":ada!~ada@host PRIVMSG #room :Claw: what time is it?"),
            ],
        );
    }
}
