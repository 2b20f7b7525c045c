//! Sending: a reply with the event's token while it is fresh and unused, else a push under an
//! `X-Line-Retry-Key` derived from the unit's key; settling a send whose answer was lost.
//!
//! Which sends can be settled after a lost answer:
//! - a push: yes. The same push is sent again under the same retry key; LINE answers 409 with
//!   the first request's `sentMessages` when the first one was accepted (within 24 hours), or
//!   sends it now when it was not. Either way exactly one copy exists.
//! - a reply: no. LINE has no history to look in, and the token of a reply that landed answers
//!   "Invalid reply token" exactly like an expired one. The unit is parked for an operator
//!   (`after_unknown_reply = "park"`, the default) or pushed, accepting a possible duplicate
//!   (`"push"`).
//!
//! LINE has no edits, deletes or previews for bot messages: the channel declares none, so
//! every reply is one durable final.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageRenderAdapter, Reconciliation, SendContext, SendError,
};
use clawgate_types::clock::Clock;
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities,
    MessageReceiptPart, RenderedMessageUnit, TextCapabilities,
};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::client::{CallError, MessagingApi, Sent};
use crate::journal::ReplyJournal;
use crate::reply::{LineRenderer, MAX_MESSAGES_PER_CALL, MAX_TEXT_CHARS, now_ms};

/// How long LINE remembers a retry key; a reconciliation later than this (with a margin)
/// could duplicate, so it is parked instead.
const RETRY_KEY_WINDOW_MS: u64 = 23 * 60 * 60 * 1_000;

/// What to do with a reply whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AfterUnknownReply {
    /// Leave it to an operator (`clawgate` lists it as unknown): never a duplicate, maybe no
    /// answer.
    #[default]
    Park,
    /// Push it: always an answer, a duplicate when the lost reply did land.
    Push,
}

/// Which call a unit's last attempt in this process was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attempt {
    Reply,
    Push,
}

/// The LINE sender: one channel access token.
pub struct LineAdapter {
    name: String,
    api: MessagingApi,
    capabilities: MessageCapabilities,
    renderer: LineRenderer,
    push: bool,
    after_unknown_reply: AfterUnknownReply,
    attempts: Mutex<HashMap<String, Attempt>>,
    journal: ReplyJournal,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for LineAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineAdapter")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("push", &self.push)
            .field("after_unknown_reply", &self.after_unknown_reply)
            .finish_non_exhaustive()
    }
}

/// What the channel can do, as the engine and the conformance suite read it.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        // Pushes carry X-Line-Retry-Key; an unknown push is settled by sending it again under
        // it. No edits, deletes or previews exist for bot messages.
        .with_delivery(
            DeliveryCapabilities::default()
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

/// The messages of a unit: the renderer's `messages`, or a plain `text` unit.
fn messages_of(unit: &RenderedMessageUnit) -> Result<Vec<Value>, SendError> {
    if let Some(messages) = unit.payload.get("messages").and_then(Value::as_array) {
        if messages.is_empty() || messages.len() > MAX_MESSAGES_PER_CALL {
            return Err(invalid(format!(
                "a LINE call carries 1 to {MAX_MESSAGES_PER_CALL} messages, not {}",
                messages.len()
            )));
        }
        return Ok(messages.clone());
    }
    let text = unit
        .payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a LINE unit needs `messages` or a `text` string"))?;
    Ok(vec![json!({ "type": "text", "text": text })])
}

/// The reply token a unit was rendered with, and until when it is usable.
fn reply_of(unit: &RenderedMessageUnit) -> Option<(String, u64)> {
    let reply = unit.payload.get("reply")?;
    Some((
        reply.get("token")?.as_str()?.to_owned(),
        reply.get("usableUntilMs")?.as_u64()?,
    ))
}

/// The `X-Line-Retry-Key` of a unit: a UUID (version 8, RFC 9562) from SHA-256 of its key,
/// the same on every attempt and after a restart.
pub fn retry_key(unit_key: &str) -> String {
    let digest = Sha256::digest(unit_key.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LineAdapter {
    pub(crate) fn new(
        name: &str,
        api: MessagingApi,
        renderer: LineRenderer,
        push: bool,
        after_unknown_reply: AfterUnknownReply,
        journal: ReplyJournal,
        clock: Arc<dyn Clock>,
    ) -> LineAdapter {
        LineAdapter {
            name: name.to_owned(),
            api,
            capabilities: capabilities(),
            renderer,
            push,
            after_unknown_reply,
            attempts: Mutex::new(HashMap::new()),
            journal,
            clock,
        }
    }

    fn now_ms(&self) -> u64 {
        now_ms(self.clock.as_ref())
    }

    /// The receipt part of a unit LINE created `sent` for: the first message's id, every id
    /// and quote token in `raw`.
    fn part(
        unit: &RenderedMessageUnit,
        sent: &Sent,
        via: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        let first = sent.messages.first().ok_or_else(|| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!("LINE {via}: answered without any sentMessages"),
            )
        })?;
        let mut part = MessageReceiptPart::new(first.id.clone(), unit.kind, unit.index);
        part.raw = Some(json!({
            "via": via,
            "ids": sent.messages.iter().map(|m| m.id.clone()).collect::<Vec<_>>(),
            "quoteTokens": sent.messages.iter().map(|m| m.quote_token.clone()).collect::<Vec<_>>(),
            "requestId": sent.request_id,
            "acceptedRequestId": sent.accepted_request_id,
        }));
        Ok(part)
    }

    async fn push(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        messages: Vec<Value>,
    ) -> Result<MessageReceiptPart, SendError> {
        let key = ctx.unit_key(unit);
        lock(&self.attempts).insert(key.clone(), Attempt::Push);
        let body = json!({ "to": ctx.message.target.id, "messages": messages });
        let sent = self
            .api
            .send("/v2/bot/message/push", &body, Some(&retry_key(&key)))
            .await
            // A refusal, a 5xx included, is safe to try again: the retry key dedupes.
            .map_err(|e| e.into_send_error("push"))?;
        if let Some(accepted) = &sent.accepted_request_id {
            info!(channel = %self.name, %accepted, "LINE had accepted this push before: its first messages are the receipt");
        }
        Self::part(unit, &sent, "push")
    }

    /// The reply call; `Ok(None)` when LINE refused the token (nothing was sent).
    async fn reply(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        token: &str,
        messages: &[Value],
    ) -> Result<Option<MessageReceiptPart>, SendError> {
        let key = ctx.unit_key(unit);
        // Durable before the call: after a crash, or on another gateway, no entry proves the
        // reply never left.
        self.journal.start(&key).await.map_err(|e| {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("LINE reply: the reply journal cannot be written ({e}); not sent"),
            )
        })?;
        lock(&self.attempts).insert(key.clone(), Attempt::Reply);
        let body = json!({ "replyToken": token, "messages": messages });
        let outcome = self.api.send("/v2/bot/message/reply", &body, None).await;
        let definite = match &outcome {
            Ok(_) | Err(CallError::Lost(_)) => false,
            // A server error of the Reply API may come after the reply went out, and a reply
            // cannot be sent twice: unknown.
            Err(CallError::Refused { status, .. }) => *status < 500,
            Err(CallError::Unreachable(_)) => true,
        };
        if definite {
            // Nothing was sent: a later attempt may use the token again, and after a restart
            // this unit is not a reply that may have landed.
            lock(&self.attempts).remove(&key);
            if let Err(error) = self.journal.refused(&key).await {
                warn!(channel = %self.name, %error, "the reply journal was not updated; this reply counts as possibly sent after a restart");
            }
        }
        match outcome {
            Ok(sent) => Self::part(unit, &sent, "reply").map(Some),
            Err(error) if error.is_invalid_reply_token() => Ok(None),
            Err(CallError::Refused {
                status, message, ..
            }) if status >= 500 => {
                Err(CallError::Lost(format!("HTTP {status} {message}")).into_send_error("reply"))
            }
            Err(error) => Err(error.into_send_error("reply")),
        }
    }

    fn no_push(&self, why: &str) -> SendError {
        SendError::before_io(
            DeliveryFailureKind::Permission,
            format!(
                "LINE channel {}: {why}, and push is off for this channel (settings.push = \
                 false): turn push on to answer late",
                self.name
            ),
        )
    }
}

#[async_trait]
impl ChannelMessageAdapter for LineAdapter {
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
        let messages = messages_of(unit)?;
        if let Some((token, usable_until)) = reply_of(unit) {
            let attempted = lock(&self.attempts).get(&ctx.unit_key(unit)).copied();
            match attempted {
                // Sent once with this token and the answer was lost: never with it again.
                Some(Attempt::Reply) => {
                    return Err(SendError::after_io(
                        DeliveryFailureKind::Unknown,
                        "LINE reply: an earlier attempt's outcome is unknown and a reply token \
                         works once",
                    ));
                }
                Some(Attempt::Push) => {}
                None if self.now_ms() < usable_until => {
                    if let Some(part) = self.reply(ctx, unit, &token, &messages).await? {
                        return Ok(part);
                    }
                    warn!(channel = %self.name, "LINE refused the reply token (expired or used); pushing");
                    if !self.push {
                        return Err(self.no_push("LINE refused the reply token"));
                    }
                }
                None if !self.push => return Err(self.no_push("the reply token has expired")),
                None => {}
            }
        } else if !self.push {
            return Err(self.no_push("this message has no reply token"));
        }
        self.push(ctx, unit, messages).await
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let key = ctx.unit_key(unit);
        // This channel never shows previews: nothing of a preview unit was ever sent.
        if key.contains("~preview") {
            return Ok(Reconciliation::NotSent);
        }
        let attempted = lock(&self.attempts).get(&key).copied();
        let maybe_reply = match attempted {
            Some(Attempt::Reply) => true,
            Some(Attempt::Push) => false,
            // Nothing of it went out from this process, and outside a durable intent no
            // process before could have sent it.
            None if ctx.intent_id.is_none() => return Ok(Reconciliation::NotSent),
            None if reply_of(unit).is_some() => {
                // Read from the store: the reply may have been started by another gateway.
                let started = self.journal.started(&key).await.map_err(|e| {
                    SendError::before_io(
                        DeliveryFailureKind::Transient,
                        format!("{e}; the reply is settled once the store answers"),
                    )
                })?;
                // A reply that never started (no journal entry) never left: sending it is
                // safe. One a process before started may have landed.
                if !started {
                    return Ok(Reconciliation::NotSent);
                }
                true
            }
            None => false,
        };
        if maybe_reply && self.after_unknown_reply == AfterUnknownReply::Park {
            warn!(channel = %self.name, unit = %key, "a LINE reply's outcome is unknown and cannot be settled (LINE keeps no history and a used token looks expired): parked for an operator");
            return Ok(Reconciliation::Undecidable);
        }
        if !self.push {
            return Ok(Reconciliation::Undecidable);
        }
        let sent_at = unit
            .payload
            .get("renderedAtMs")
            .and_then(Value::as_u64)
            .or_else(|| ctx.message.timestamp.and_then(|at| u64::try_from(at).ok()));
        if let Some(at) = sent_at
            && self.now_ms().saturating_sub(at) > RETRY_KEY_WINDOW_MS
        {
            warn!(channel = %self.name, unit = %key, "a LINE push's outcome is unknown and its retry key has expired (24 h): parked");
            return Ok(Reconciliation::Undecidable);
        }
        if maybe_reply {
            warn!(channel = %self.name, unit = %key, "a LINE reply's outcome is unknown: pushing it (after_unknown_reply = \"push\"), a duplicate if the reply landed");
        }
        // The same push under the same retry key: LINE's 409 returns the first one's ids, or
        // it is sent now. A refusal settles nothing: asked again later.
        let part = self.push(ctx, unit, messages_of(unit)?).await?;
        Ok(Reconciliation::Sent(Box::new(part)))
    }

    /// LINE cannot edit or delete a bot message, so a preview could never become the final nor
    /// be removed: every reply is sent once, complete.
    fn previews(&self, _message: &ChannelMessage) -> bool {
        false
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(&self.renderer)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn retry_keys_are_stable_uuids_per_unit() {
        let a = retry_key("line:reply:E1:0#0");
        assert_eq!(a, retry_key("line:reply:E1:0#0"));
        assert_ne!(a, retry_key("line:reply:E1:0#1"));
        let groups: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12]);
        assert_eq!(&a[14..15], "8", "version 8");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "RFC variant");
    }

    #[test]
    fn units_carry_one_to_five_messages() {
        let unit =
            |payload| RenderedMessageUnit::new(0, clawgate_types::MessagePartKind::Text, payload);
        assert_eq!(
            messages_of(&unit(json!({ "text": "hi" }))).unwrap().len(),
            1
        );
        let six: Vec<Value> = (0..6)
            .map(|i| json!({ "type": "text", "text": i.to_string() }))
            .collect();
        assert!(messages_of(&unit(json!({ "messages": six }))).is_err());
        assert!(messages_of(&unit(json!({ "messages": [] }))).is_err());
        assert!(messages_of(&unit(json!({}))).is_err());
    }
}
