//! Direct messages as signed events, built and opened without I/O.
//!
//! - NIP-17: an unsigned kind-14 rumor, sealed (kind 13, NIP-44, signed by us) and gift-wrapped
//!   (kind 1059, NIP-44, signed by a throw-away key, `p`-tagged to the recipient); seal and wrap
//!   carry `created_at` up to two days in the past (NIP-59).
//! - NIP-04 (only when configured): a kind-4 event, AES-CBC content, signed by us.
//!
//! Everything random in an outbound event (the throw-away key, the NIP-44/NIP-04 nonces, the
//! timestamp tweaks) comes from a generator seeded by our secret key and the unit's idempotency
//! key, so the same unit builds the same event id however often it is built. The renderer
//! stores the built event in the intent anyway; the derivation is what makes a unit the engine
//! did not render (a direct send) just as safe to retry.

use nostr_sdk::nostr::secp256k1::rand::{self, CryptoRng, RngCore};
use nostr_sdk::nostr::{SECP256K1, nips::nip04, nips::nip44};
use nostr_sdk::{
    Event, EventBuilder, JsonUtil, Keys, Kind, PublicKey, SecretKey, Tag, Timestamp, UnsignedEvent,
};
use sha2::{Digest, Sha256};

/// NIP-59: seal and wrap timestamps go up to two days into the past.
pub const TWEAK_RANGE_S: u64 = 2 * 24 * 60 * 60;

/// How direct messages are encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DmProtocol {
    /// NIP-17 gift wraps with NIP-44 (the default).
    Nip17,
    /// NIP-04 kind-4 events (deprecated; for old clients only).
    Nip04,
}

/// Why an event could not be built or opened.
#[derive(Debug, thiserror::Error)]
pub enum DmError {
    /// Encryption or decryption failed.
    #[error("encryption: {0}")]
    Crypto(String),
    /// The event could not be signed or parsed.
    #[error("event: {0}")]
    Event(String),
    /// The event is not a direct message to us.
    #[error("{0}")]
    NotForUs(String),
}

/// A deterministic generator: SHA-256 over a seed and a counter.
pub(crate) struct SeededRng {
    seed: [u8; 32],
    counter: u64,
    block: [u8; 32],
    used: usize,
}

impl SeededRng {
    pub(crate) fn new(parts: &[&[u8]]) -> SeededRng {
        let mut hash = Sha256::new();
        hash.update(b"clawgate-nostr-v1");
        for part in parts {
            // Length-prefixed, so no two part lists hash alike.
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        SeededRng {
            seed: hash.finalize().into(),
            counter: 0,
            block: [0; 32],
            used: 32,
        }
    }

    fn next_byte(&mut self) -> u8 {
        if self.used == 32 {
            let mut hash = Sha256::new();
            hash.update(self.seed);
            hash.update(self.counter.to_be_bytes());
            self.block = hash.finalize().into();
            self.counter += 1;
            self.used = 0;
        }
        self.used += 1;
        self.block[self.used - 1]
    }
}

// SHA-256 in counter mode over a seed holding our secret key: unpredictable to anyone without
// the key, which is all the nonces and the throw-away key need.
impl CryptoRng for SeededRng {}

impl RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        let mut bytes = [0; 4];
        self.fill_bytes(&mut bytes);
        u32::from_be_bytes(bytes)
    }

    fn next_u64(&mut self) -> u64 {
        let mut bytes = [0; 8];
        self.fill_bytes(&mut bytes);
        u64::from_be_bytes(bytes)
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for byte in dest {
            *byte = self.next_byte();
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

fn crypto(error: impl std::fmt::Display) -> DmError {
    DmError::Crypto(error.to_string())
}

fn event_error(error: impl std::fmt::Display) -> DmError {
    DmError::Event(error.to_string())
}

fn tweaked(created_at: u64, rng: &mut SeededRng) -> Timestamp {
    Timestamp::from_secs(created_at.saturating_sub(rng.next_u64() % TWEAK_RANGE_S))
}

/// The outbound event of one unit: a gift wrap (NIP-17) or a kind-4 event (NIP-04) carrying
/// `text` from `keys` to `recipient`, written at `created_at` (seconds), derived from
/// `unit_key`.
pub fn build(
    protocol: DmProtocol,
    keys: &Keys,
    recipient: &PublicKey,
    text: &str,
    created_at: u64,
    unit_key: &str,
) -> Result<Event, DmError> {
    let mut rng = SeededRng::new(&[
        keys.secret_key().as_secret_bytes(),
        unit_key.as_bytes(),
        &recipient.to_bytes(),
        text.as_bytes(),
        &created_at.to_be_bytes(),
    ]);
    match protocol {
        DmProtocol::Nip04 => {
            let content = nip04::encrypt_with_rng(&mut rng, keys.secret_key(), recipient, text)
                .map_err(crypto)?;
            EventBuilder::new(Kind::EncryptedDirectMessage, content)
                .tag(Tag::public_key(*recipient))
                .custom_created_at(Timestamp::from_secs(created_at))
                .build(keys.public_key())
                .sign_with_ctx(SECP256K1, &mut rng, keys)
                .map_err(event_error)
        }
        DmProtocol::Nip17 => {
            let mut rumor: UnsignedEvent = EventBuilder::private_msg_rumor(*recipient, text)
                .custom_created_at(Timestamp::from_secs(created_at))
                .build(keys.public_key());
            rumor.ensure_id();
            let sealed = nip44::encrypt_with_rng(
                &mut rng,
                keys.secret_key(),
                recipient,
                rumor.as_json(),
                nip44::Version::V2,
            )
            .map_err(crypto)?;
            let seal = EventBuilder::new(Kind::Seal, sealed)
                .custom_created_at(tweaked(created_at, &mut rng))
                .build(keys.public_key())
                .sign_with_ctx(SECP256K1, &mut rng, keys)
                .map_err(event_error)?;
            let mut secret = [0u8; 32];
            let throwaway = loop {
                rng.fill_bytes(&mut secret);
                if let Ok(key) = SecretKey::from_slice(&secret) {
                    break Keys::new(key);
                }
            };
            let wrapped = nip44::encrypt_with_rng(
                &mut rng,
                throwaway.secret_key(),
                recipient,
                seal.as_json(),
                nip44::Version::V2,
            )
            .map_err(crypto)?;
            EventBuilder::new(Kind::GiftWrap, wrapped)
                .tag(Tag::public_key(*recipient))
                .custom_created_at(tweaked(created_at, &mut rng))
                .build(throwaway.public_key())
                .sign_with_ctx(SECP256K1, &mut rng, &throwaway)
                .map_err(event_error)
        }
    }
}

/// A direct message opened with our key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// The stable id of the message: the rumor's id (the same in every wrap of it) or the
    /// kind-4 event's id.
    pub id: String,
    /// Its author (checked: the seal's signer is the rumor's author).
    pub sender: PublicKey,
    /// When the author says it was written (seconds).
    pub created_at: u64,
    /// The plain text.
    pub text: String,
    /// The rumor's or event's `p` tags.
    pub recipients: Vec<PublicKey>,
}

/// Opens a gift wrap or kind-4 event addressed to `keys`.
pub fn open(keys: &Keys, event: &Event) -> Result<Opened, DmError> {
    match event.kind {
        Kind::GiftWrap => {
            let seal_json = nip44::decrypt(keys.secret_key(), &event.pubkey, &event.content)
                .map_err(|e| {
                    DmError::NotForUs(format!("the gift wrap does not open with our key: {e}"))
                })?;
            let seal = Event::from_json(&seal_json).map_err(event_error)?;
            if seal.kind != Kind::Seal {
                return Err(DmError::Event(format!(
                    "the wrap holds a kind {} event, not a seal",
                    seal.kind
                )));
            }
            seal.verify()
                .map_err(|e| DmError::Event(format!("the seal's signature: {e}")))?;
            let rumor_json =
                nip44::decrypt(keys.secret_key(), &seal.pubkey, &seal.content).map_err(crypto)?;
            let mut rumor = UnsignedEvent::from_json(&rumor_json).map_err(event_error)?;
            if rumor.pubkey != seal.pubkey {
                return Err(DmError::Event(
                    "the rumor's author did not sign its seal (NIP-17 forgery check)".into(),
                ));
            }
            if rumor.kind != Kind::PrivateDirectMessage {
                return Err(DmError::NotForUs(format!(
                    "a kind {} rumor, not a chat message",
                    rumor.kind
                )));
            }
            let id = rumor.id().to_hex();
            Ok(Opened {
                id,
                sender: rumor.pubkey,
                created_at: rumor.created_at.as_secs(),
                recipients: rumor.tags.public_keys().copied().collect(),
                text: rumor.content,
            })
        }
        Kind::EncryptedDirectMessage => {
            event
                .verify()
                .map_err(|e| DmError::Event(format!("signature: {e}")))?;
            let ours = keys.public_key();
            let recipients: Vec<PublicKey> = event.tags.public_keys().copied().collect();
            let peer = if event.pubkey == ours {
                *recipients
                    .first()
                    .ok_or_else(|| DmError::Event("a kind-4 event without a p tag".into()))?
            } else {
                event.pubkey
            };
            let text = nip04::decrypt(keys.secret_key(), &peer, &event.content).map_err(crypto)?;
            Ok(Opened {
                id: event.id.to_hex(),
                sender: event.pubkey,
                created_at: event.created_at.as_secs(),
                recipients,
                text,
            })
        }
        kind => Err(DmError::NotForUs(format!(
            "a kind {kind} event is not a direct message"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_same_unit_builds_the_same_event_and_it_opens_for_the_recipient_only() {
        let (us, person, other) = (Keys::generate(), Keys::generate(), Keys::generate());
        for protocol in [DmProtocol::Nip17, DmProtocol::Nip04] {
            let one = build(
                protocol,
                &us,
                &person.public_key(),
                "hi ü",
                1_700_000_000,
                "k#0",
            )
            .unwrap();
            let again = build(
                protocol,
                &us,
                &person.public_key(),
                "hi ü",
                1_700_000_000,
                "k#0",
            )
            .unwrap();
            assert_eq!(one.id, again.id, "{protocol:?}: same unit, same id");
            assert_eq!(one.as_json(), again.as_json());
            let other_unit = build(
                protocol,
                &us,
                &person.public_key(),
                "hi ü",
                1_700_000_000,
                "k#1",
            )
            .unwrap();
            assert_ne!(one.id, other_unit.id, "another unit key, another event");
            one.verify().unwrap();
            let opened = open(&person, &one).unwrap();
            assert_eq!(opened.text, "hi ü");
            assert_eq!(opened.sender, us.public_key());
            assert_eq!(opened.created_at, 1_700_000_000);
            assert_eq!(opened.recipients, vec![person.public_key()]);
            if protocol == DmProtocol::Nip17 {
                assert_ne!(one.pubkey, us.public_key(), "wrapped by a throw-away key");
                assert!(one.created_at.as_secs() <= 1_700_000_000);
                assert!(one.created_at.as_secs() >= 1_700_000_000 - TWEAK_RANGE_S);
                assert!(open(&other, &one).is_err(), "only the recipient opens it");
            }
        }
    }
}
