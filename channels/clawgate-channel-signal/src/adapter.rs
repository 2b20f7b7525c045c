//! Sending: one `send` per unit, to `recipient` (a 1:1 conversation, by number or ACI) or
//! `groupId`; the first chunk of a reply quotes the message it answers (`quoteTimestamp` +
//! `quoteAuthor`). The receipt of a part is `<account>:<timestamp>`, Signal's own id of the
//! message (author, sent timestamp), which signal-cli picks and answers.
//!
//! Signal has no idempotency key and no way to ask whether a message went out: a send whose
//! answer was lost stays unknown, and the engine parks it for the operator (the capabilities
//! do not declare reconciliation, so it is never asked for or sent again). Finals are plain
//! durable sends: no live previews, although signal-cli can edit (`editTimestamp`), because
//! receiving apps show every edit as "edited" and accept at most 10 of them.

use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelMessageAdapter, SendContext, SendError};
use clawgate_types::{
    DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities, MessagePartKind,
    MessageReceiptPart, MessageTarget, RenderedMessageUnit, TargetKind, TextCapabilities,
    ThreadCapabilities,
};
use serde_json::{Value, json};
use tracing::warn;

use crate::client::{Daemon, result_kind};

/// Longest text of one unit, in characters: 500 characters are at most 2000 UTF-8 bytes, so
/// no chunk crosses signal-cli's inline limit and none goes out as a truncated body with a
/// long-text attachment (which some linked clients show only as a file).
pub const MAX_TEXT_CHARS: u32 = 500;

/// The Signal sender: one account on a signal-cli daemon.
#[derive(Debug)]
pub struct SignalAdapter {
    name: String,
    daemon: Daemon,
    capabilities: MessageCapabilities,
}

fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_threads(ThreadCapabilities::default().with_reply(true))
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(false)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

/// `(author, timestamp)` of a Signal message id `<author>:<timestamp>`.
pub(crate) fn split_id(id: &str) -> Option<(&str, u64)> {
    let (author, timestamp) = id.rsplit_once(':')?;
    Some((author, timestamp.parse().ok()?)).filter(|(a, _)| !a.is_empty())
}

/// The `send` params addressing `target`.
pub(crate) fn address(target: &MessageTarget) -> Result<Value, SendError> {
    if target.id.is_empty() {
        return Err(invalid("a Signal target needs a number, ACI or group id"));
    }
    Ok(match target.kind {
        TargetKind::Direct => json!({ "recipient": [target.id] }),
        TargetKind::Group => json!({ "groupId": target.id }),
        other => {
            return Err(invalid(format!(
                "Signal has 1:1 and group conversations, not {other:?}"
            )));
        }
    })
}

impl SignalAdapter {
    pub(crate) fn new(name: &str, daemon: Daemon) -> SignalAdapter {
        SignalAdapter {
            name: name.to_owned(),
            daemon,
            capabilities: capabilities(),
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for SignalAdapter {
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
        if unit.kind != MessagePartKind::Text {
            return Err(invalid(
                "the Signal channel sends text only (signal-cli attaches local files, not URLs)",
            ));
        }
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a Signal text unit needs a `text` string"))?;
        if text.trim().is_empty() {
            return Err(invalid("signal-cli refuses an empty message"));
        }
        if text.chars().count() > MAX_TEXT_CHARS as usize {
            return Err(invalid(format!(
                "a Signal unit holds at most {MAX_TEXT_CHARS} characters (2000 bytes)"
            )));
        }
        let mut params = address(&ctx.message.target)?;
        params["message"] = json!(text);
        // Only a Signal message can be quoted, and only the first chunk quotes it.
        if let Some((author, timestamp)) = ctx
            .message
            .relation
            .as_ref()
            .and_then(|r| r.reply_to_id())
            .filter(|_| unit.index == 0)
            .and_then(split_id)
        {
            params["quoteTimestamp"] = json!(timestamp);
            params["quoteAuthor"] = json!(author);
        }
        let answer = self
            .daemon
            .call("send", params)
            .await
            .map_err(|e| e.into_send_error("send"))?;
        let timestamp = answer
            .get("timestamp")
            .and_then(Value::as_u64)
            .ok_or_else(|| {
                SendError::after_io(
                    DeliveryFailureKind::Unknown,
                    "signal-cli answered the send without a timestamp",
                )
            })?;
        // Some recipients took it (a group with an unregistered member): the message exists
        // with this id, and sending it again would reach the others twice.
        for result in answer
            .get("results")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let kind = result.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "SUCCESS" {
                let recipient = result
                    .pointer("/recipientAddress/number")
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                warn!(
                    channel = %self.name,
                    timestamp,
                    recipient,
                    result = kind,
                    class = ?result_kind(kind),
                    "a recipient did not get this Signal message; it is not sent again"
                );
            }
        }
        let mut part = MessageReceiptPart::new(
            format!("{}:{timestamp}", self.daemon.account()),
            unit.kind,
            unit.index,
        );
        part.raw = Some(answer);
        Ok(part)
    }

    fn typing_interval(&self) -> Option<Duration> {
        // Signal shows "typing" for 15 s after each start.
        Some(Duration::from_secs(10))
    }

    async fn show_typing(&self, target: &MessageTarget) -> Result<(), SendError> {
        self.daemon
            .call("sendTyping", address(target)?)
            .await
            .map(drop)
            .map_err(|e| e.into_send_error("sendTyping"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn ids_are_author_and_timestamp() {
        assert_eq!(
            split_id("+4915112345:1700000000123"),
            Some(("+4915112345", 1_700_000_000_123))
        );
        assert_eq!(
            split_id("6b1f0c2e-0000-4000-a000-000000000000:5"),
            Some(("6b1f0c2e-0000-4000-a000-000000000000", 5))
        );
        assert_eq!(split_id(":5"), None);
        assert_eq!(split_id("+49"), None);
        assert_eq!(split_id("+49:x"), None);
    }

    #[test]
    fn five_hundred_characters_fit_the_inline_limit() {
        let widest = "𝄞".repeat(MAX_TEXT_CHARS as usize);
        assert!(widest.len() <= 2_000);
    }
}
