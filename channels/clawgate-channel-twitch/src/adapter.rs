//! Sending: one rendered unit is one chat message of at most 500 characters, through Helix
//! "Send Chat Message" (default) or as a `PRIVMSG` on the TMI connection.
//!
//! - A dropped message (Helix `is_sent: false`, or a `NOTICE` with a `msg-id` before our
//!   `PING`'s `PONG`) is a definite refusal of its class ([`crate::limits::drop_error`]),
//!   never a success.
//! - Twitch's rate limit is kept here: 20 messages per 30 s, 100 where the bot is broadcaster,
//!   moderator or VIP (from `USERSTATE`); a send waits for a slot up to `send_wait_ms`, then
//!   fails as rate-limited with the wait as its retry-after.
//! - The 30 s duplicate rule: a text identical to our previous one in the channel within 30 s
//!   gets an invisible suffix ([`crate::limits::DUPLICATE_SUFFIX`]); a `msg_duplicate` drop
//!   anyway (our memory of the previous text does not survive a restart) is retried once with
//!   the suffix toggled — safe, the drop says nothing was posted.
//! - Replies go as `reply_parent_message_id` / `@reply-parent-msg-id`, on the first unit.
//! - No edit, no delete, no previews. An unknown outcome (the answer lost after the request
//!   went out) stays unknown: Twitch has no idempotency key, and matching our own relayed
//!   messages by text cannot be exact (the same text may be sent twice a minute apart).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageRenderAdapter, RenderError, SendContext, SendError,
};
use clawgate_types::{
    BatchAtomicity, ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, MessageCapabilities,
    MessagePartKind, MessageReceiptPart, MessageRelation, RenderedMessageBatch,
    RenderedMessageUnit, TextCapabilities,
};
use serde_json::{Value, json};

use crate::client::{Helix, Sent};
use crate::connection::Connection;
use crate::limits::{
    DUPLICATE_SUFFIX, ELEVATED_LIMIT, NORMAL_LIMIT, RateWindow, avoid_duplicate, drop_error,
    without_suffix,
};

/// Twitch's limit, in characters.
pub const MAX_CHARS: usize = 500;
/// What the renderer puts in one unit: room left for the duplicate suffix.
pub const CHUNK_CHARS: usize = MAX_CHARS - 2;

fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                // Two characters stay free for the duplicate suffix.
                .with_max_length(CHUNK_CHARS as u32)
                .with_chunking(true),
        )
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

/// How messages go out.
#[derive(Debug, Clone)]
pub(crate) enum Transport {
    /// Helix, as `sender_id`.
    Helix { helix: Helix, sender_id: String },
    /// `PRIVMSG` on the TMI connection.
    Irc,
}

#[derive(Debug, Default)]
struct Local {
    window: RateWindow,
    /// Per channel: our last accepted text and when.
    last: BTreeMap<String, (String, Instant)>,
    nonce: u64,
}

/// The Twitch sender of one account.
pub struct TwitchAdapter {
    name: String,
    connection: Connection,
    transport: Transport,
    capabilities: MessageCapabilities,
    renderer: TwitchRenderer,
    send_wait: Duration,
    rate_limit: bool,
    local: Mutex<Local>,
}

impl std::fmt::Debug for TwitchAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TwitchAdapter")
            .field("name", &self.name)
            .field("connection", &self.connection)
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

impl TwitchAdapter {
    pub(crate) fn new(
        name: &str,
        connection: Connection,
        transport: Transport,
        send_wait: Duration,
        rate_limit: bool,
    ) -> TwitchAdapter {
        TwitchAdapter {
            name: name.to_owned(),
            connection,
            transport,
            capabilities: capabilities(),
            renderer: TwitchRenderer,
            send_wait,
            rate_limit,
            local: Mutex::new(Local::default()),
        }
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for a slot in the 30 s window (until `deadline`), then takes it.
    async fn slot(&self, channel: &str, deadline: Instant) -> Result<(), SendError> {
        if !self.rate_limit {
            return Ok(());
        }
        let limit = if self.connection.facts(channel).elevated || channel == self.connection.login()
        {
            ELEVATED_LIMIT
        } else {
            NORMAL_LIMIT
        };
        loop {
            let now = Instant::now();
            let wait = {
                let mut local = self.local();
                let wait = local.window.wait(limit, now);
                if wait.is_zero() {
                    local.window.take(now);
                    return Ok(());
                }
                wait
            };
            if now + wait > deadline {
                return Err(SendError::before_io(
                    DeliveryFailureKind::RateLimit,
                    format!(
                        "Twitch's chat limit ({limit} messages per 30 s) is reached: the next \
                         slot is in {wait:?}"
                    ),
                )
                .with_retry_after_ms(Some(
                    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX).max(1),
                )));
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// One attempt to post `text`; Ok(None) is a `msg_duplicate` drop.
    async fn post(
        &self,
        channel: &str,
        text: &str,
        reply: Option<&str>,
        deadline: Instant,
    ) -> Result<Result<String, SendError>, SendError> {
        self.slot(channel, deadline).await?;
        let wait = deadline.saturating_duration_since(Instant::now());
        match &self.transport {
            Transport::Helix { helix, sender_id } => {
                let room = self.connection.room_id(channel, wait).await?;
                match helix
                    .send_chat_message(&room, sender_id, text, reply)
                    .await
                    .map_err(crate::client::CallError::into_send_error)?
                {
                    Sent::Sent(id) => Ok(Ok(id)),
                    Sent::Dropped { code, message } => {
                        Ok(Err(drop_error(&code, &message, "Helix")))
                    }
                }
            }
            Transport::Irc => {
                let nonce = {
                    let mut local = self.local();
                    local.nonce += 1;
                    local.nonce
                };
                let mut tags = format!("@client-nonce=cg{nonce}");
                if let Some(parent) = reply {
                    tags.push_str(&format!(";reply-parent-msg-id={parent}"));
                }
                let line = format!("{tags} PRIVMSG #{channel} :{text}");
                match self.connection.send_line(channel, line, wait).await {
                    Ok(id) => Ok(Ok(id)),
                    Err(error)
                        if error
                            .platform_code
                            .as_deref()
                            .is_some_and(|c| c.starts_with("msg_")) =>
                    {
                        Ok(Err(error))
                    }
                    Err(error) => Err(error),
                }
            }
        }
    }
}

/// The channel login a target names (`#name` or `name`).
fn channel_of(target: &str) -> Result<String, SendError> {
    let name = target.trim_start_matches('#').to_ascii_lowercase();
    let valid = (1..=25).contains(&name.len())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(name)
    } else {
        Err(invalid(format!(
            "{target:?} is not a Twitch channel (#login)"
        )))
    }
}

#[async_trait]
impl ChannelMessageAdapter for TwitchAdapter {
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
        let channel = channel_of(&ctx.message.target.id)?;
        if !self.connection.configured(&channel) {
            // Twitch needs the room id the join brings (Helix) or the join itself (IRC).
            return Err(SendError::before_io(
                DeliveryFailureKind::NotFound,
                format!("#{channel} is not one of this account's channels: add it to `channels`"),
            ));
        }
        let text = unit
            .payload
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a Twitch unit needs a `text` string"))?;
        if text.trim().is_empty() {
            return Err(invalid("Twitch refuses an empty message"));
        }
        if text.contains(['\r', '\n', '\0']) {
            return Err(invalid("one Twitch message is one line: no CR, LF or NUL"));
        }
        if text.chars().count() > CHUNK_CHARS {
            return Err(invalid(format!(
                "the message is {} characters; Twitch takes {MAX_CHARS}",
                text.chars().count()
            )));
        }
        let reply = match &ctx.message.relation {
            Some(MessageRelation::Reply {
                reply_to_id: Some(id),
                ..
            }) if unit.index == 0 => Some(id.as_str()),
            _ => None,
        };
        let deadline = Instant::now() + self.send_wait;
        let first = {
            let local = self.local();
            avoid_duplicate(text, local.last.get(&channel), Instant::now())
        };
        let mut sending = first;
        let mut retried = false;
        let id = loop {
            match self.post(&channel, &sending, reply, deadline).await? {
                Ok(id) => break id,
                Err(error)
                    if error.platform_code.as_deref() == Some("msg_duplicate") && !retried =>
                {
                    // Nothing was posted: the same text, told apart by the suffix, may go.
                    retried = true;
                    sending = if sending.ends_with(DUPLICATE_SUFFIX) {
                        without_suffix(&sending).to_owned()
                    } else {
                        format!("{sending}{DUPLICATE_SUFFIX}")
                    };
                }
                Err(error) => return Err(error),
            }
        };
        self.local().last.insert(channel, (sending, Instant::now()));
        Ok(MessageReceiptPart::new(id, unit.kind, unit.index))
    }

    fn previews(&self, _message: &ChannelMessage) -> bool {
        // No edits on Twitch: a preview would be a second message.
        false
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        Some(&self.renderer)
    }
}

/// Text → units of at most [`CHUNK_CHARS`] characters, split at a space where one is near;
/// line breaks become spaces (a Twitch message is one line); attachments as their URLs.
#[derive(Debug, Clone, Copy, Default)]
pub struct TwitchRenderer;

/// Splits `text` into pieces of at most `max` characters, at the last space of a piece when
/// there is one in its second half.
pub fn split_text(text: &str, max: usize) -> Vec<String> {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let chars: Vec<char> = flat.chars().collect();
    let mut pieces = Vec::new();
    let mut start = 0;
    while start < chars.len() {
        let mut end = (start + max).min(chars.len());
        if end < chars.len()
            && let Some(space) = chars[start..end].iter().rposition(|c| *c == ' ')
            && space > max / 2
        {
            end = start + space;
        }
        let piece: String = chars[start..end].iter().collect();
        let piece = piece.trim().to_owned();
        if !piece.is_empty() {
            pieces.push(piece);
        }
        start = end;
        while chars.get(start) == Some(&' ') {
            start += 1;
        }
    }
    pieces
}

impl MessageRenderAdapter for TwitchRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        _capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let mut text = message
            .body
            .as_ref()
            .map(|b| b.text.clone())
            .unwrap_or_default();
        for attachment in &message.attachments {
            let Some(url) = &attachment.url else {
                return Err(RenderError::UnsupportedAttachment(
                    "Twitch chat carries no files: only attachments with a URL, as a link"
                        .to_owned(),
                ));
            };
            text.push(' ');
            text.push_str(url);
        }
        let pieces = split_text(&text, CHUNK_CHARS);
        if pieces.is_empty() {
            return Err(RenderError::Empty);
        }
        let units = pieces
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
    fn long_text_splits_at_spaces_into_pieces_that_fit_with_the_suffix() {
        let words = "lorem ipsum dolor ".repeat(80);
        let pieces = split_text(&format!("first line\n{words}"), CHUNK_CHARS);
        assert!(pieces.len() >= 3, "{}", pieces.len());
        assert!(pieces.iter().all(|p| p.chars().count() <= CHUNK_CHARS));
        assert!(pieces[0].starts_with("first line lorem"));
        assert_eq!(pieces.join(" "), format!("first line {}", words.trim_end()));
        let unbroken = "ü".repeat(1200);
        let pieces = split_text(&unbroken, CHUNK_CHARS);
        assert_eq!(pieces.concat(), unbroken);
        assert_eq!(pieces[0].chars().count(), CHUNK_CHARS);
    }

    #[test]
    fn attachments_render_as_links_and_an_empty_text_is_refused() {
        let message = ChannelMessage::outbound("m", "twitch", MessageTarget::group("#c"), "see")
            .with_attachment(
                MessageAttachment::new(MessagePartKind::Media).with_url("https://x/y.png"),
            );
        let batch = TwitchRenderer
            .render(&message, &capabilities(), "k")
            .unwrap();
        assert_eq!(batch.units[0].payload["text"], "see https://x/y.png");
        let empty = ChannelMessage::outbound("m", "twitch", MessageTarget::group("#c"), " \n ");
        assert_eq!(
            TwitchRenderer.render(&empty, &capabilities(), "k"),
            Err(RenderError::Empty)
        );
    }

    #[test]
    fn channel_targets_are_logins() {
        assert_eq!(channel_of("#ClawChan").unwrap(), "clawchan");
        assert!(channel_of("#no spaces").is_err());
        assert!(channel_of("").is_err());
    }
}
