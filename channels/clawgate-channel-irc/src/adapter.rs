//! Sending: one rendered unit is one `PRIVMSG` line. Text is rendered into lines that fit the
//! 512-byte limit as the server relays them ([`crate::line`]); a multi-line reply is several
//! units of one intent, so a partial batch resumes at the first line without a receipt.
//! A line counts as sent once the server's `PONG` behind it came back without an error numeric
//! for its target (a synthetic, local receipt: plain IRC has no message ids), or, with IRCv3
//! `echo-message` + `labeled-response`, once its labeled echo came back (the echo's `msgid`).

use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageRenderAdapter, RenderError, SendContext, SendError,
};
use clawgate_types::{
    BatchAtomicity, ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities,
    MessagePartKind, MessageReceiptPart, RenderedMessageBatch, RenderedMessageUnit,
    TextCapabilities,
};
use serde_json::{Value, json};

use crate::connection::Connection;
use crate::line::{privmsg, split_text, text_budget, valid_target};

/// What the channel can do, as the engine and the conformance suite read it.
fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        // The limit is in bytes and depends on the target and our prefix, so no character
        // limit is declared: the renderer splits every text to the line limit itself.
        .with_text(TextCapabilities::default().with_chunking(true))
        // No history to search (no `draft/chathistory` on plain IRC or InspIRCd 3), echo or
        // not: an unknown outcome stays unknown and is never repeated.
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(false)
                .with_retry_after(false)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(false)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

/// The IRC sender of one account.
pub struct IrcAdapter {
    name: String,
    connection: Connection,
    capabilities: MessageCapabilities,
    renderer: IrcRenderer,
    /// How long a send waits for the link to come up before it fails as "not sent".
    send_wait: Duration,
}

impl std::fmt::Debug for IrcAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IrcAdapter")
            .field("name", &self.name)
            .field("connection", &self.connection)
            .finish_non_exhaustive()
    }
}

impl IrcAdapter {
    pub(crate) fn new(name: &str, connection: Connection, send_wait: Duration) -> IrcAdapter {
        IrcAdapter {
            name: name.to_owned(),
            renderer: IrcRenderer {
                connection: Some(connection.clone()),
                prefix_len: 0,
            },
            connection,
            capabilities: capabilities(),
            send_wait,
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for IrcAdapter {
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
        let target = ctx.message.target.id.as_str();
        if !valid_target(target) {
            return Err(invalid(format!("{target:?} is not an IRC nick or channel")));
        }
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("an IRC unit needs a `text` string"))?;
        if text.trim().is_empty() {
            return Err(invalid("IRC refuses an empty message (412)"));
        }
        if text.contains(['\r', '\n', '\0']) {
            return Err(invalid("one IRC unit is one line: no CR, LF or NUL"));
        }
        let prefix_len = self
            .connection
            .prefix_len()
            .unwrap_or_else(|| self.connection.planned_prefix_len());
        let budget = text_budget(prefix_len, target);
        if text.len() > budget {
            return Err(invalid(format!(
                "the line is {} bytes; {budget} fit in a PRIVMSG to {target}",
                text.len()
            )));
        }
        let id = self
            .connection
            .send_line(target, privmsg(target, text), self.send_wait)
            .await?;
        Ok(MessageReceiptPart::new(id, unit.kind, unit.index))
    }

    fn previews(&self, _message: &ChannelMessage) -> bool {
        // No edits on IRC: a preview would be a second message.
        false
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(&self.renderer)
    }
}

/// Text → one unit per line piece that fits a PRIVMSG; attachments as their URLs on lines of
/// their own. (The engine stores the rendered batch with the intent, so a retry or a recovery
/// sends the same lines.)
#[derive(Debug, Clone)]
pub struct IrcRenderer {
    /// Where our relayed prefix is learnt.
    connection: Option<Connection>,
    /// The prefix length without a connection.
    prefix_len: usize,
}

impl MessageRenderAdapter for IrcRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        _capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let prefix_len = self
            .connection
            .as_ref()
            .map_or(self.prefix_len, Connection::planned_prefix_len);
        let budget = text_budget(prefix_len, &message.target.id);
        let mut lines = Vec::new();
        if let Some(body) = &message.body {
            lines.extend(split_text(&body.text, budget));
        }
        for attachment in &message.attachments {
            let Some(url) = &attachment.url else {
                return Err(RenderError::UnsupportedAttachment(
                    "IRC carries no files: only attachments with a URL, as a link".to_owned(),
                ));
            };
            lines.extend(split_text(url, budget));
        }
        if lines.is_empty() {
            return Err(RenderError::Empty);
        }
        let units = lines
            .into_iter()
            .enumerate()
            .map(|(index, text)| {
                RenderedMessageUnit::new(
                    u32::try_from(index).unwrap_or(u32::MAX),
                    MessagePartKind::Text,
                    json!({ "text": text }),
                )
            })
            .collect();
        Ok(RenderedMessageBatch::new(
            units,
            BatchAtomicity::AllOrRetryRemaining,
            idempotency_key,
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clawgate_types::{MessageAttachment, MessageTarget};

    use super::*;

    #[test]
    fn multi_line_text_renders_one_unit_per_line_within_the_byte_budget() {
        let renderer = IrcRenderer {
            connection: None,
            prefix_len: 80,
        };
        let long = "ü".repeat(400);
        let message = ChannelMessage::outbound(
            "m",
            "irc",
            MessageTarget::group("#room"),
            format!("first\n\n{long}\nlast"),
        )
        .with_attachment(
            MessageAttachment::new(MessagePartKind::Media).with_url("https://x/y.png"),
        );
        let batch = renderer
            .render(&message, &capabilities(), "key")
            .expect("renders");
        let texts: Vec<&str> = batch
            .units
            .iter()
            .map(|u| u.payload["text"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(texts[0], "first");
        assert_eq!(texts[texts.len() - 2], "last");
        assert_eq!(texts[texts.len() - 1], "https://x/y.png");
        assert_eq!(texts[1..texts.len() - 2].concat(), long);
        let budget = text_budget(80, "#room");
        assert!(texts.iter().all(|t| t.len() <= budget));
        assert!(texts.len() > 4, "the long line is split");
        assert_eq!(
            batch.units.iter().map(|u| u.index).collect::<Vec<_>>(),
            (0..u32::try_from(texts.len()).unwrap_or(0)).collect::<Vec<_>>()
        );
        let empty = ChannelMessage::outbound("m", "irc", MessageTarget::group("#room"), "\n");
        assert_eq!(
            renderer.render(&empty, &capabilities(), "key"),
            Err(RenderError::Empty)
        );
    }
}
