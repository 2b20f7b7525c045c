//! Sending: one rendered unit is one signed event (a NIP-17 gift wrap, or a NIP-04 kind-4
//! event when configured) to the conversation's public key.
//!
//! The renderer builds and signs the event, so the engine stores it in the intent before any
//! I/O; every attempt, retry and recovery publishes those exact bytes. A relay that already has
//! the event answers `OK true "duplicate: …"`, which is success: the event id is the receipt
//! and the send is exactly-once by content. A lost `OK` is settled by asking each relay for the
//! id (`REQ {"ids":[id]}`). Nostr has no edit (kind-5 deletion is only a request), so there is
//! no live preview.

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageRenderAdapter, Reconciliation, RenderError, SendContext,
    SendError,
};
use clawgate_types::clock::Clock;
use clawgate_types::{
    BatchAtomicity, ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities,
    MessagePartKind, MessageReceiptPart, RenderedMessageBatch, RenderedMessageUnit,
    TextCapabilities,
};
use nostr_sdk::{Event, JsonUtil, Keys, PublicKey};
use serde_json::{Value, json};

use crate::client::{Lookup, Relays};
use crate::dm::{self, DmProtocol, SeededRng};

/// The longest text one event carries: relays commonly refuse events over 64 KiB, and a gift
/// wrap's double NIP-44 base64 grows the text about 1.8 times.
pub const MAX_TEXT_CHARS: u32 = 16_000;

fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(TextCapabilities::default().with_max_length(MAX_TEXT_CHARS))
        .with_delivery(
            DeliveryCapabilities::default()
                // The unit key derives the event; the same key publishes the same id.
                .with_idempotency_key(true)
                .with_retry_after(false)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

/// A conversation id as a public key (hex or `npub`).
pub fn recipient(id: &str) -> Result<PublicKey, String> {
    PublicKey::parse(id).map_err(|e| format!("{id:?} is not a Nostr public key (hex or npub): {e}"))
}

/// The moment a unit was written, for a unit the renderer did not build: the message's own
/// time, else the intent id's (UUID v7 carries its creation time), else — a direct send with
/// neither — a time derived from the unit key, so a retry still builds the same event.
fn fallback_created_at(ctx: &SendContext, unit_key: &str) -> u64 {
    if let Some(ms) = ctx.message.timestamp {
        return u64::try_from(ms / 1_000).unwrap_or(0);
    }
    if let Some(id) = &ctx.intent_id {
        let hex: String = id
            .to_string()
            .chars()
            .filter(|c| *c != '-')
            .take(12)
            .collect();
        if let Ok(ms) = u64::from_str_radix(&hex, 16) {
            return ms / 1_000;
        }
    }
    use nostr_sdk::nostr::secp256k1::rand::RngCore;
    // Within the year before 2026-01-01.
    1_767_225_600 - SeededRng::new(&[unit_key.as_bytes()]).next_u64() % 31_536_000
}

/// The Nostr sender of one key.
pub struct NostrAdapter {
    name: String,
    keys: Keys,
    protocol: DmProtocol,
    relays: Relays,
    capabilities: MessageCapabilities,
    /// The gateway's clock: the time of a message that carries none.
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for NostrAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret key stays out.
        f.debug_struct("NostrAdapter")
            .field("name", &self.name)
            .field("public_key", &self.keys.public_key().to_hex())
            .field("protocol", &self.protocol)
            .field("relays", &self.relays.urls())
            .finish_non_exhaustive()
    }
}

impl NostrAdapter {
    pub(crate) fn new(
        name: &str,
        keys: Keys,
        protocol: DmProtocol,
        relays: Relays,
        clock: Arc<dyn Clock>,
    ) -> NostrAdapter {
        NostrAdapter {
            name: name.to_owned(),
            keys,
            protocol,
            relays,
            capabilities: capabilities(),
            clock,
        }
    }

    /// The event a unit publishes: the one stored in it, else the one derived from its key.
    fn event_of(&self, ctx: &SendContext, unit: &RenderedMessageUnit) -> Result<Event, SendError> {
        let to = recipient(&ctx.message.target.id).map_err(invalid)?;
        if let Some(stored) = unit.payload.get("event") {
            let event = Event::from_json(stored.to_string())
                .map_err(|e| invalid(format!("the stored event does not parse: {e}")))?;
            if !event.tags.public_keys().any(|p| *p == to) {
                return Err(invalid("the stored event is addressed to another key"));
            }
            return Ok(event);
        }
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a Nostr unit needs a `text` string"))?;
        if text.is_empty() {
            return Err(invalid("a direct message needs text"));
        }
        let key = ctx.unit_key(unit);
        let created_at = unit
            .payload
            .get("created_at")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| fallback_created_at(ctx, &key));
        dm::build(self.protocol, &self.keys, &to, text, created_at, &key)
            .map_err(|e| invalid(format!("the event could not be built: {e}")))
    }
}

#[async_trait]
impl ChannelMessageAdapter for NostrAdapter {
    fn channel(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let event = self.event_of(ctx, unit)?;
        let accepted = self.relays.publish(&event).await?;
        tracing::debug!(event = %event.id, relays = accepted.len(), "published");
        Ok(
            MessageReceiptPart::new(event.id.to_hex(), unit.kind, unit.index).with_raw(json!({
                "relays": accepted.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })),
        )
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let event = self.event_of(ctx, unit)?;
        let lookups = self.relays.lookup(&event.id).await;
        let found = lookups.iter().filter(|(_, l)| *l == Lookup::Found).count();
        if found >= self.relays.needed() {
            return Ok(Reconciliation::Sent(Box::new(MessageReceiptPart::new(
                event.id.to_hex(),
                unit.kind,
                unit.index,
            ))));
        }
        if lookups
            .iter()
            .all(|(_, l)| *l != Lookup::Found && !matches!(l, Lookup::Unknown(_)))
            || (found > 0
                && lookups
                    .iter()
                    .all(|(_, l)| !matches!(l, Lookup::Unknown(_))))
        {
            // Every relay answered and too few hold it: publishing the same event again
            // cannot duplicate it.
            return Ok(Reconciliation::NotSent);
        }
        for (url, lookup) in &lookups {
            if let Lookup::Unknown(why) = lookup {
                tracing::info!(relay = %url, event = %event.id, "lookup unanswered: {why}");
            }
        }
        Ok(Reconciliation::Unresolved)
    }

    fn previews(&self, _message: &ChannelMessage) -> bool {
        // No edits on Nostr: a preview would be a second message.
        false
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(self)
    }
}

/// Text (attachments as their URLs) → one unit holding the signed event, built here so the
/// engine stores it with the intent before the first send.
impl MessageRenderAdapter for NostrAdapter {
    fn render(
        &self,
        message: &ChannelMessage,
        _capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let mut lines: Vec<&str> = Vec::new();
        if let Some(body) = message.body.as_ref().filter(|b| !b.text.trim().is_empty()) {
            lines.push(&body.text);
        }
        for attachment in &message.attachments {
            let Some(url) = &attachment.url else {
                return Err(RenderError::UnsupportedAttachment(
                    "a Nostr DM carries no files: only attachments with a URL, as a link".into(),
                ));
            };
            lines.push(url);
        }
        if lines.is_empty() {
            return Err(RenderError::Empty);
        }
        let text = lines.join("\n");
        let length = text.chars().count();
        if length > MAX_TEXT_CHARS as usize {
            return Err(RenderError::TooLong {
                length,
                limit: MAX_TEXT_CHARS,
            });
        }
        let key = clawgate_types::unit_idempotency_key(idempotency_key, 0);
        let created_at = message
            .timestamp
            .and_then(|ms| u64::try_from(ms / 1_000).ok())
            .unwrap_or_else(|| u64::try_from(self.clock.now_ms() / 1_000).unwrap_or(0));
        let mut payload = json!({ "text": text, "created_at": created_at });
        // A target that is not a key fails at send time with its reason (InvalidPayload).
        if let Ok(to) = recipient(&message.target.id) {
            let event = dm::build(self.protocol, &self.keys, &to, &text, created_at, &key)
                .ok()
                .and_then(|event| serde_json::from_str::<Value>(&event.as_json()).ok());
            if let Some(event) = event {
                payload["event"] = event;
            }
        }
        Ok(RenderedMessageBatch::new(
            vec![RenderedMessageUnit::new(0, MessagePartKind::Text, payload)],
            BatchAtomicity::AllOrRetryRemaining,
            idempotency_key,
        ))
    }
}
