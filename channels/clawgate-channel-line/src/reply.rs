//! Reply tokens, modelled as the capability of a reply relation: an inbound event hands the
//! conversation a token that can answer it once, within about a minute, and never again after
//! an unknown outcome. [`LINE_REPLY`] states those constraints; [`ReplyTokens`] holds the
//! tokens the receiver saw; [`LineRenderer`] decides, when the reply's durable intent is
//! written (before any I/O), whether its first call is a reply (with the token, up to five
//! messages) or everything is pushed.
//!
//! The relation is read from the intent's key: a reply is keyed `<channel>:reply:<event>:<n>`
//! and a failure notice `<channel>:failure:<event>`, where `<event>` is the `webhookEventId`
//! the receiver used as the event id. A token is claimed by one key only, so a second
//! generation of a reply, or a notice after a reply, pushes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clawgate_channel_sdk::{MessageRenderAdapter, RenderError, chunk_text};
use clawgate_types::clock::Clock;
use clawgate_types::{
    BatchAtomicity, ChannelMessage, MessageCapabilities, MessagePartKind, RenderedMessageBatch,
    RenderedMessageUnit,
};
use serde_json::{Value, json};

/// Longest text of one LINE text message.
pub const MAX_TEXT_CHARS: u32 = 5_000;
/// Most messages one reply or push call carries.
pub const MAX_MESSAGES_PER_CALL: usize = 5;

/// What a reply relation can do on LINE (platform-apis-wave2 §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplyConstraints {
    /// A token answers once: a second use is refused ("Invalid reply token").
    pub single_use: bool,
    /// How long after the webhook arrived a token is guaranteed to work.
    pub valid_for_ms: u64,
    /// A redelivered webhook's token works one more `valid_for_ms` from the redelivery, but
    /// never later than this after the event.
    pub max_event_age_ms: u64,
    /// Whether a reply whose answer was lost can be sent again with the same token: no, a
    /// token that did its work answers "Invalid reply token" exactly like an expired one.
    pub retry_after_unknown: bool,
    /// Messages one reply carries.
    pub max_messages: usize,
}

/// LINE's reply-token constraints.
pub const LINE_REPLY: ReplyConstraints = ReplyConstraints {
    single_use: true,
    valid_for_ms: 60_000,
    max_event_age_ms: 20 * 60_000,
    retry_after_unknown: false,
    max_messages: MAX_MESSAGES_PER_CALL,
};

/// Now by the gateway's clock, in Unix milliseconds (0 for a clock before 1970).
pub(crate) fn now_ms(clock: &dyn Clock) -> u64 {
    u64::try_from(clock.now_ms()).unwrap_or(0)
}

#[derive(Debug, Clone)]
struct Token {
    token: String,
    usable_until_ms: u64,
    /// The intent key that took it (single use).
    claimed_by: Option<String>,
}

/// The reply tokens of events this process saw, by event id (filled by the receiver,
/// claimed by the renderer).
#[derive(Debug, Clone)]
pub struct ReplyTokens {
    tokens: Arc<Mutex<HashMap<String, Token>>>,
    clock: Arc<dyn Clock>,
}

impl ReplyTokens {
    /// No tokens yet; their ages are read from `clock` (the gateway's).
    pub fn new(clock: Arc<dyn Clock>) -> ReplyTokens {
        ReplyTokens {
            tokens: Arc::default(),
            clock,
        }
    }

    /// Now by the clock the tokens are timed with.
    pub(crate) fn now_ms(&self) -> u64 {
        now_ms(self.clock.as_ref())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Token>> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Event `event_id` brought `token`, usable until `usable_until_ms`. A token seen again
    /// (the event normalized again after a restart, or redelivered) keeps its claim; a
    /// redelivery's later deadline is taken.
    pub(crate) fn offer(&self, event_id: &str, token: &str, usable_until_ms: u64) {
        let now = self.now_ms();
        let mut tokens = self.lock();
        // Expired tokens are kept a while: their claims still tell a re-render who took them.
        tokens.retain(|_, t| {
            t.usable_until_ms
                .saturating_add(LINE_REPLY.max_event_age_ms)
                > now
        });
        let entry = tokens.entry(event_id.to_owned()).or_insert_with(|| Token {
            token: token.to_owned(),
            usable_until_ms,
            claimed_by: None,
        });
        if entry.token != token {
            // A redelivery with a fresh token: the old one is gone.
            entry.token = token.to_owned();
            entry.claimed_by = None;
        }
        entry.usable_until_ms = entry.usable_until_ms.max(usable_until_ms);
    }

    /// The token answering `event_id` for intent `key`, if it is unclaimed (or claimed by this
    /// very key: a render repeated) and still usable at `now`.
    pub(crate) fn claim(&self, event_id: &str, key: &str, now: u64) -> Option<(String, u64)> {
        let mut tokens = self.lock();
        let token = tokens.get_mut(event_id)?;
        if token.usable_until_ms <= now {
            return None;
        }
        match &token.claimed_by {
            Some(by) if by != key => None,
            _ => {
                token.claimed_by = Some(key.to_owned());
                Some((token.token.clone(), token.usable_until_ms))
            }
        }
    }
}

/// The event a reply or failure notice answers, from its intent key.
pub(crate) fn event_of_key(key: &str) -> Option<&str> {
    if let Some((_, rest)) = key.split_once(":reply:") {
        return rest.rsplit_once(':').map(|(event, _)| event);
    }
    key.split_once(":failure:").map(|(_, event)| event)
}

/// The usable-until of a token that arrived at `received_at_ms` for an event of
/// `event_timestamp_ms`, `reply_within_ms` after arrival (a margin under LINE's minute).
pub(crate) fn usable_until(
    received_at_ms: u64,
    event_timestamp_ms: u64,
    reply_within_ms: u64,
) -> u64 {
    let by_arrival = received_at_ms.saturating_add(reply_within_ms.min(LINE_REPLY.valid_for_ms));
    let by_event = event_timestamp_ms.saturating_add(LINE_REPLY.max_event_age_ms);
    by_arrival.min(by_event)
}

/// Text split to 5000 characters; the first call a reply of up to five messages when a token
/// is claimed, every other message a push of its own (one unit per call, so a batch resumes at
/// the first call without a receipt).
#[derive(Debug, Clone)]
pub struct LineRenderer {
    tokens: ReplyTokens,
}

impl LineRenderer {
    pub(crate) fn new(tokens: ReplyTokens) -> LineRenderer {
        LineRenderer { tokens }
    }
}

fn text_message(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

impl MessageRenderAdapter for LineRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        _capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        if !message.attachments.is_empty() {
            return Err(RenderError::UnsupportedAttachment(
                "this LINE channel sends text only (media needs HTTPS URLs LINE fetches)".into(),
            ));
        }
        let text = message
            .body
            .as_ref()
            .map(|b| b.text.as_str())
            .filter(|t| !t.trim().is_empty())
            .ok_or(RenderError::Empty)?;
        let chunks = chunk_text(text, MAX_TEXT_CHARS as usize);
        let now = self.tokens.now_ms();
        let claimed = event_of_key(idempotency_key)
            .and_then(|event| self.tokens.claim(event, idempotency_key, now));
        let mut units = Vec::new();
        let mut rest = chunks.as_slice();
        if let Some((token, usable_until_ms)) = claimed {
            let take = rest.len().min(LINE_REPLY.max_messages);
            let (first, others) = rest.split_at(take);
            units.push(json!({
                "messages": first.iter().map(|c| text_message(c)).collect::<Vec<_>>(),
                "reply": { "token": token, "usableUntilMs": usable_until_ms },
                "renderedAtMs": now,
            }));
            rest = others;
        }
        units.extend(
            rest.iter()
                .map(|c| json!({ "messages": [text_message(c)] })),
        );
        Ok(RenderedMessageBatch::new(
            units
                .into_iter()
                .enumerate()
                .map(|(index, payload)| {
                    RenderedMessageUnit::new(
                        u32::try_from(index).unwrap_or(u32::MAX),
                        MessagePartKind::Text,
                        payload,
                    )
                })
                .collect(),
            BatchAtomicity::AllOrRetryRemaining,
            idempotency_key,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use clawgate_types::MessageTarget;
    use clawgate_types::clock::ManualClock;

    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn tokens() -> ReplyTokens {
        ReplyTokens::new(Arc::new(ManualClock::new(NOW as i64)))
    }

    fn message(text: &str) -> ChannelMessage {
        ChannelMessage::outbound("m", "line", MessageTarget::direct("U1"), text)
    }

    #[test]
    fn the_event_comes_from_reply_and_failure_keys() {
        assert_eq!(event_of_key("line:reply:01HZX:0"), Some("01HZX"));
        assert_eq!(event_of_key("line:line:reply:01HZX:3"), Some("01HZX"));
        assert_eq!(event_of_key("line:failure:01HZX"), Some("01HZX"));
        assert_eq!(event_of_key("line:relay:abc"), None);
    }

    #[test]
    fn a_token_is_claimed_once_and_only_while_fresh() {
        let tokens = tokens();
        let now = NOW;
        tokens.offer("E1", "tok", now + 10_000);
        assert_eq!(
            tokens.claim("E1", "line:reply:E1:0", now),
            Some(("tok".into(), now + 10_000))
        );
        assert_eq!(
            tokens.claim("E1", "line:reply:E1:0", now).map(|t| t.0),
            Some("tok".into())
        );
        assert_eq!(
            tokens.claim("E1", "line:reply:E1:1", now),
            None,
            "single use"
        );
        tokens.offer("E2", "tok2", now + 10_000);
        assert_eq!(
            tokens.claim("E2", "line:reply:E2:0", now + 10_000),
            None,
            "expired"
        );
    }

    #[test]
    fn a_token_lasts_a_minute_from_arrival_and_twenty_from_the_event() {
        assert_eq!(usable_until(1_000, 1_000, 50_000), 51_000);
        assert_eq!(
            usable_until(1_000, 1_000, 90_000),
            61_000,
            "never past LINE's minute"
        );
        // A redelivery 19.5 minutes after the event: only half a minute is left.
        let event = 0;
        let redelivered = 19 * 60_000 + 30_000;
        assert_eq!(usable_until(redelivered, event, 50_000), 20 * 60_000);
    }

    #[test]
    fn a_reply_takes_up_to_five_chunks_and_the_rest_is_pushed() {
        let tokens = tokens();
        tokens.offer("E1", "tok", NOW + 60_000);
        let renderer = LineRenderer::new(tokens);
        let text = "x".repeat(MAX_TEXT_CHARS as usize * 7);
        let caps = MessageCapabilities::default();
        let batch = renderer
            .render(&message(&text), &caps, "line:reply:E1:0")
            .unwrap();
        assert_eq!(batch.units.len(), 3);
        assert_eq!(
            batch.units[0].payload["messages"].as_array().unwrap().len(),
            5
        );
        assert_eq!(batch.units[0].payload["reply"]["token"], "tok");
        for unit in &batch.units[1..] {
            assert_eq!(unit.payload["messages"].as_array().unwrap().len(), 1);
            assert!(unit.payload.get("reply").is_none());
        }
        // Without a token everything is pushed, one message per call.
        let batch = renderer
            .render(&message("hi"), &caps, "line:relay:1")
            .unwrap();
        assert_eq!(batch.units.len(), 1);
        assert!(batch.units[0].payload.get("reply").is_none());
        assert_eq!(
            renderer.render(&message("  "), &caps, "k").unwrap_err(),
            RenderError::Empty
        );
    }
}
