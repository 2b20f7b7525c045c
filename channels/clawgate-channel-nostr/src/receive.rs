//! Inbound: one event a relay served (`{"event": <gift wrap or kind 4>, "relay": url}`) → a
//! normalized direct message.
//!
//! - The raw record keeps the event as the relay served it, still encrypted: it is opened here
//!   with our key each time it is normalized, so no plain text is stored beside it.
//! - The event id of a NIP-17 message is its rumor's id, the same in every gift wrap of it (a
//!   sender's retry that re-wrapped it, the same wrap served by two relays): the engine's
//!   durable dedupe then sees one message.
//! - Our own messages (the copy a client wraps for its sender) are ignored, as are wraps that
//!   do not open with our key, rumors that are not chat messages, and — when `allowed_senders`
//!   is set — everyone else.

use std::collections::BTreeSet;

use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound, ReceiveError};
use clawgate_types::{ChannelMessage, MessageActor, MessageTarget};
use nostr_sdk::{Event, JsonUtil, Keys, PublicKey};
use serde_json::{Value, json};

use crate::dm::{self, DmError, DmProtocol};

/// The event the feed hands the engine for one served event.
pub fn inbound_event(event: &Event, relay: &str) -> Value {
    json!({
        "event": serde_json::from_str::<Value>(&event.as_json()).unwrap_or(Value::Null),
        "relay": relay,
    })
}

/// Normalizes what one key receives.
pub struct NostrReceiver {
    name: String,
    keys: Keys,
    protocol: DmProtocol,
    allowed: BTreeSet<PublicKey>,
    bots: BTreeSet<PublicKey>,
}

impl std::fmt::Debug for NostrReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NostrReceiver")
            .field("name", &self.name)
            .field("public_key", &self.keys.public_key().to_hex())
            .finish_non_exhaustive()
    }
}

impl NostrReceiver {
    /// The receiver of channel `name` for `keys`; `allowed` empty: everyone.
    pub fn new(
        name: &str,
        keys: Keys,
        protocol: DmProtocol,
        allowed: impl IntoIterator<Item = PublicKey>,
    ) -> NostrReceiver {
        NostrReceiver {
            name: name.to_owned(),
            keys,
            protocol,
            allowed: allowed.into_iter().collect(),
            bots: BTreeSet::new(),
        }
    }

    /// Reports messages from `bots` as bot authors (a DM does not say; NIP-24's `bot` flag
    /// lives in profile metadata the channel does not fetch).
    pub fn with_bots(mut self, bots: impl IntoIterator<Item = PublicKey>) -> NostrReceiver {
        self.bots = bots.into_iter().collect();
        self
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

impl MessageReceiveAdapter for NostrReceiver {
    fn normalize(&self, raw: &Value) -> Result<NormalizedInbound, ReceiveError> {
        let event = raw
            .get("event")
            .ok_or_else(|| self.malformed("a Nostr event record needs an `event`"))?;
        let event = Event::from_json(event.to_string())
            .map_err(|e| self.malformed(format!("not a Nostr event: {e}")))?;
        let expected = match self.protocol {
            DmProtocol::Nip17 => nostr_sdk::Kind::GiftWrap,
            DmProtocol::Nip04 => nostr_sdk::Kind::EncryptedDirectMessage,
        };
        if event.kind != expected {
            return Err(self.ignored(format!(
                "a kind {} event; this channel reads {:?} messages (kind {expected})",
                event.kind, self.protocol
            )));
        }
        let ours = self.keys.public_key();
        if event.kind == nostr_sdk::Kind::GiftWrap && event.verify().is_err() {
            return Err(self.malformed("the gift wrap's signature does not verify"));
        }
        let opened = dm::open(&self.keys, &event).map_err(|e| match e {
            DmError::NotForUs(reason) => self.ignored(reason),
            other => self.malformed(other.to_string()),
        })?;
        if opened.sender == ours {
            return Err(self.ignored("our own message"));
        }
        if !opened.recipients.contains(&ours) {
            return Err(self.ignored("a message not addressed to our key"));
        }
        if !self.allowed.is_empty() && !self.allowed.contains(&opened.sender) {
            return Err(self.ignored(format!(
                "{} is not in allowed_senders",
                opened.sender.to_hex()
            )));
        }
        if opened.text.trim().is_empty() {
            return Err(self.ignored("an empty message"));
        }
        let is_bot = self.bots.contains(&opened.sender);
        let sender = opened.sender.to_hex();
        let message = ChannelMessage::inbound(
            opened.id.clone(),
            &self.name,
            MessageTarget::direct(sender.clone()),
        )
        .with_text(opened.text)
        .with_sender(MessageActor::new(sender).with_is_bot(is_bot))
        .with_timestamp(i64::try_from(opened.created_at.saturating_mul(1_000)).unwrap_or(i64::MAX))
        .with_raw(raw.clone());
        Ok(NormalizedInbound::new(opened.id, message).by_bot(is_bot))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn receiver(keys: &Keys) -> NostrReceiver {
        NostrReceiver::new("nostr", keys.clone(), DmProtocol::Nip17, [])
    }

    #[test]
    fn a_gift_wrap_normalizes_to_its_rumor_and_ours_or_others_are_ignored() {
        let (us, person) = (Keys::generate(), Keys::generate());
        let wrap = dm::build(
            DmProtocol::Nip17,
            &person,
            &us.public_key(),
            "hello",
            1_700_000_000,
            "a",
        )
        .unwrap();
        let rewrap = dm::build(
            DmProtocol::Nip17,
            &person,
            &us.public_key(),
            "hello",
            1_700_000_000,
            "b",
        )
        .unwrap();
        let one = receiver(&us)
            .normalize(&inbound_event(&wrap, "ws://r"))
            .unwrap();
        let two = receiver(&us)
            .normalize(&inbound_event(&rewrap, "ws://r"))
            .unwrap();
        assert_ne!(wrap.id, rewrap.id);
        assert_eq!(
            one.event_id, two.event_id,
            "two wraps of one rumor are one message"
        );
        assert_eq!(one.message.body.as_ref().unwrap().text, "hello");
        assert_eq!(one.message.target.id, person.public_key().to_hex());
        let own = dm::build(
            DmProtocol::Nip17,
            &us,
            &us.public_key(),
            "mine",
            1_700_000_000,
            "c",
        )
        .unwrap();
        assert!(matches!(
            receiver(&us).normalize(&inbound_event(&own, "ws://r")),
            Err(ReceiveError::Ignored { .. })
        ));
        let stranger = Keys::generate();
        assert!(matches!(
            receiver(&stranger).normalize(&inbound_event(&wrap, "ws://r")),
            Err(ReceiveError::Ignored { .. })
        ));
        let allowed = NostrReceiver::new(
            "nostr",
            us.clone(),
            DmProtocol::Nip17,
            [stranger.public_key()],
        );
        assert!(matches!(
            allowed.normalize(&inbound_event(&wrap, "ws://r")),
            Err(ReceiveError::Ignored { .. })
        ));
        assert!(matches!(
            receiver(&us).normalize(&json!({"event": {"id": 1}})),
            Err(ReceiveError::Malformed { .. })
        ));
    }

    /// Mutations of these payloads (wrong types, missing fields, huge numbers, long and odd
    /// strings, deep nesting) and arbitrary JSON: a message or a typed error, never a panic.
    #[test]
    fn normalize_never_panics_on_mutated_payloads() {
        let (us, person) = (Keys::generate(), Keys::generate());
        let wrap = dm::build(
            DmProtocol::Nip17,
            &person,
            &us.public_key(),
            "hello",
            1_700_000_000,
            "a",
        )
        .unwrap();
        clawgate_conformance::fuzz::normalizer_never_panics(
            &receiver(&us),
            vec![inbound_event(&wrap, "ws://r")],
        );
    }
}
