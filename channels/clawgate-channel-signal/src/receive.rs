//! Inbound: one `receive` item (`{"envelope": …, "account": …}`) → a normalized message.
//!
//! The event id is Signal's message id, `<source>:<timestamp>` (the author and the sent
//! timestamp their device chose): a redelivery of the envelope carries the same pair, and the
//! engine dedupes it durably.
//!
//! - Answered: a `dataMessage` with text, 1:1 (the target is the sender's number, or ACI when
//!   the number is hidden) or in a group (`groupInfo.groupId`). The message id is the same
//!   `<source>:<timestamp>`, so the reply quotes it.
//! - Not answered ([`ReceiveError::Ignored`]): anything from our own account (a
//!   `syncMessage` copy of what another linked device, or the gateway itself, sent; a
//!   note-to-self), receipts, typing, reactions, stickers and attachments without text, remote
//!   deletes, and edits (`editMessage`): an edit of a message that was already answered is
//!   not a new turn, and the engine does not re-run a finished one; the person writes again
//!   to ask again.
//! - Items for another account of a multi-account daemon are ignored.
//! - Senders listed in `bot_senders` are reported as bots (Signal itself never says).

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use serde_json::Value;

/// Normalizes the `receive` items of one account.
#[derive(Debug, Clone)]
pub struct SignalReceiver {
    name: String,
    account: String,
    allowed_senders: BTreeSet<String>,
    bot_senders: BTreeSet<String>,
}

impl SignalReceiver {
    pub(crate) fn new(
        name: &str,
        account: &str,
        allowed_senders: impl IntoIterator<Item = String>,
        bot_senders: impl IntoIterator<Item = String>,
    ) -> SignalReceiver {
        SignalReceiver {
            name: name.to_owned(),
            account: account.to_owned(),
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

impl MessageReceiveAdapter for SignalReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let envelope = raw
            .get("envelope")
            .filter(|e| e.is_object())
            .ok_or_else(|| self.malformed("a receive item without an envelope"))?;
        if let Some(account) = raw.get("account").and_then(Value::as_str)
            && account != self.account
        {
            return Err(self.ignored(format!("an envelope for {account}, not {}", self.account)));
        }
        let text_field = |key: &str| envelope.get(key).and_then(Value::as_str);
        let number = text_field("sourceNumber").filter(|n| !n.is_empty());
        let source = text_field("source")
            .or(number)
            .or(text_field("sourceUuid"))
            .ok_or_else(|| self.malformed("an envelope without source"))?;
        let timestamp = envelope
            .get("timestamp")
            .and_then(Value::as_u64)
            .ok_or_else(|| self.malformed("an envelope without timestamp"))?;
        if source == self.account || number == Some(self.account.as_str()) {
            return Err(self.ignored(
                "an envelope from our own account (a linked device's sync copy or a note to self)",
            ));
        }
        for (key, what) in [
            ("syncMessage", "a sync message"),
            ("receiptMessage", "a receipt"),
            ("typingMessage", "a typing indicator"),
            ("editMessage", "an edit (only new messages are answered)"),
            ("callMessage", "a call"),
            ("storyMessage", "a story"),
        ] {
            if envelope.get(key).is_some() {
                return Err(self.ignored(format!("{what} is not a turn")));
            }
        }
        let data = envelope
            .get("dataMessage")
            .ok_or_else(|| self.ignored("an envelope without a data message"))?;
        if data.get("remoteDelete").is_some() {
            return Err(self.ignored("a remote delete is not a turn"));
        }
        if data.get("reaction").is_some() {
            return Err(self.ignored("a reaction is not a turn"));
        }
        let text = data
            .get("message")
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| self.ignored("a data message without text"))?;
        let sender_id = number.unwrap_or(source);
        if !self.allowed_senders.is_empty()
            && !self.allowed_senders.contains(sender_id)
            && !self.allowed_senders.contains(source)
        {
            return Err(self.ignored(format!("{sender_id} is not in allowed_senders")));
        }
        let target = match data.pointer("/groupInfo/groupId").and_then(Value::as_str) {
            Some(group) => MessageTarget::group(group),
            None => MessageTarget::direct(sender_id),
        };
        let bot = self.bot_senders.contains(sender_id) || self.bot_senders.contains(source);
        let mut sender = MessageActor::new(sender_id).with_is_bot(bot);
        if let Some(name) = text_field("sourceName").filter(|n| !n.is_empty()) {
            sender = sender.with_display_name(name.to_owned());
        }
        let id = format!("{source}:{timestamp}");
        let inbound = ChannelMessage::inbound(&id, &self.name, target)
            .with_text(text)
            .with_sender(sender)
            // Kept so an unfinished event can be worked on again from its durable record.
            .with_raw(raw.clone());
        Ok(NormalizedInbound::new(id, inbound).by_bot(bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use serde_json::json;

    const ME: &str = "+15550001111";

    fn item(body_key: &str, body: Value) -> Value {
        json!({ "account": ME, "envelope": { "source": "+4915112345",
            "sourceNumber": "+4915112345", "sourceUuid": "u-1", "sourceName": "Ada",
            "sourceDevice": 1, "timestamp": 1_700_000_000_001_u64, body_key: body } })
    }

    fn receiver() -> SignalReceiver {
        SignalReceiver::new("signal", ME, Vec::new(), vec!["+4917000".to_owned()])
    }

    #[test]
    fn data_messages_are_turns_and_the_rest_is_not() {
        let r = receiver();
        let got = r
            .normalize(&item(
                "dataMessage",
                json!({ "timestamp": 1_700_000_000_001_u64, "message": "hi" }),
            ))
            .unwrap();
        assert_eq!(got.event_id, "+4915112345:1700000000001");
        assert_eq!(got.message.target, MessageTarget::direct("+4915112345"));
        assert_eq!(got.message.body.unwrap().text, "hi");
        let group = r
            .normalize(&item(
                "dataMessage",
                json!({ "message": "all",
                "groupInfo": { "groupId": "R3JvdXA=", "type": "DELIVER" } }),
            ))
            .unwrap();
        assert_eq!(group.message.target, MessageTarget::group("R3JvdXA="));
        let cases = [
            (
                "edit",
                item(
                    "editMessage",
                    json!({ "targetSentTimestamp": 1, "dataMessage": { "message": "x" } }),
                ),
            ),
            (
                "sync",
                item("syncMessage", json!({ "sentMessage": { "message": "x" } })),
            ),
            (
                "receipt",
                item(
                    "receiptMessage",
                    json!({ "isDelivery": true, "timestamps": [1] }),
                ),
            ),
            (
                "typing",
                item("typingMessage", json!({ "action": "STARTED" })),
            ),
            (
                "delete",
                item("dataMessage", json!({ "remoteDelete": { "timestamp": 1 } })),
            ),
            (
                "reaction",
                item("dataMessage", json!({ "reaction": { "emoji": "👍" } })),
            ),
            (
                "no text",
                item("dataMessage", json!({ "attachments": [{}] })),
            ),
            (
                "other account",
                json!({ "account": "+1999", "envelope": { "source": "+49", "timestamp": 1, "dataMessage": { "message": "x" } } }),
            ),
            (
                "own account",
                json!({ "account": ME, "envelope": { "source": ME, "timestamp": 1, "dataMessage": { "message": "x" } } }),
            ),
        ];
        for (name, raw) in cases {
            assert!(
                matches!(r.normalize(&raw), Err(ReceiveError::Ignored { .. })),
                "{name}: {:?}",
                r.normalize(&raw)
            );
        }
        for bad in [
            json!({}),
            json!({ "envelope": { "timestamp": 1 } }),
            json!({ "envelope": { "source": "+49" } }),
        ] {
            assert!(
                matches!(r.normalize(&bad), Err(ReceiveError::Malformed { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn bots_are_reported() {
        let r = receiver();
        let mut bot = item("dataMessage", json!({ "message": "beep" }));
        bot["envelope"]["source"] = json!("+4917000");
        bot["envelope"]["sourceNumber"] = json!("+4917000");
        assert!(r.normalize(&bot).unwrap().is_bot_author);
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let direct = item(
            "dataMessage",
            json!({ "timestamp": 1_700_000_000_001_u64, "message": "hi" }),
        );
        let group = item(
            "dataMessage",
            json!({ "message": "all",
                "groupInfo": { "groupId": "R3JvdXA=", "type": "DELIVER" } }),
        );
        clawgate_conformance::fuzz::normalizer_never_panics(&receiver(), vec![direct, group]);
    }
}
