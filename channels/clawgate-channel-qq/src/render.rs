//! The render adapter (the seed's QQ Bot row: it owns media tags and text as voice). One unit
//! per QQ message, in reading order:
//!
//! - text, chunked at [`MAX_TEXT_CHARS`]: `{"text"}` (sent as `msg_type 0`);
//! - media tags in the text — `<qqimg>URL</qqimg>`, `<qqvideo>URL</qqvideo>`,
//!   `<qqvoice>URL</qqvoice>` — and URL attachments (`image/*`, `video/*` media, voice): a
//!   media unit `{"media": {"file_type", "url"}}`, sent as `msg_type 7` after QQ fetched the
//!   file (`POST …/files` with `srv_send_msg: false`, whose `file_info` the message carries);
//! - text as voice (opt-in: the account's `text_as_voice`, or a message whose body format is
//!   `voice`, when a `tts_command` is configured): each text chunk becomes a voice unit
//!   `{"tts": {"text"}}`; at send time the command turns the text into audio, which is uploaded
//!   as `file_type 3` (`file_data`, base64) and sent as `msg_type 7`.
//!
//! Every unit carries `replyTo`, the inbound message it answers passively (from the reply's
//! relation or key, else the latest message of that chat): chosen once, when the durable batch
//! is written, so every attempt of the unit repeats the same `(msg_id, msg_seq)` pair.
//!
//! The fallback after an `invalid_payload` refusal (a media URL QQ cannot fetch, a TTS command
//! that failed) is the plain text, each tag's URL left in the text.

use std::sync::Arc;

use clawgate_channel_sdk::{MessageRenderAdapter, RenderError, chunk_text};
use clawgate_types::{
    BatchAtomicity, ChannelMessage, MessageCapabilities, MessagePartKind, RenderedMessageBatch,
    RenderedMessageUnit,
};
use serde_json::{Value, json};

use crate::passive::answered_of;
use crate::receive::RecentInbound;

/// Longest text of one unit.
pub const MAX_TEXT_CHARS: u32 = 2_000;
/// Longest text turned into one voice message (a longer text is several).
pub const MAX_VOICE_CHARS: usize = 500;

/// QQ's `file_type` of an image.
pub const FILE_IMAGE: u64 = 1;
/// QQ's `file_type` of a video.
pub const FILE_VIDEO: u64 = 2;
/// QQ's `file_type` of a voice message (QQ plays SILK audio).
pub const FILE_VOICE: u64 = 3;

const TAGS: [(&str, u64); 3] = [
    ("qqimg", FILE_IMAGE),
    ("qqvideo", FILE_VIDEO),
    ("qqvoice", FILE_VOICE),
];

/// A piece of a message, in reading order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Text(String),
    Media { file_type: u64, url: String },
}

/// Splits `text` at its media tags. A tag that is not closed stays text.
pub(crate) fn segments(text: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let next = TAGS
            .iter()
            .filter_map(|(tag, kind)| {
                let open = format!("<{tag}>");
                rest.find(&open).map(|at| (at, *tag, *kind))
            })
            .min_by_key(|(at, _, _)| *at);
        let Some((at, tag, file_type)) = next else {
            break;
        };
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        let inner_start = at + open.len();
        let Some(inner_len) = rest[inner_start..].find(&close) else {
            break;
        };
        let before = &rest[..at];
        if !before.trim().is_empty() {
            out.push(Segment::Text(before.trim().to_owned()));
        }
        let url = rest[inner_start..inner_start + inner_len].trim();
        if !url.is_empty() {
            out.push(Segment::Media {
                file_type,
                url: url.to_owned(),
            });
        }
        rest = &rest[inner_start + inner_len + close.len()..];
    }
    if !rest.trim().is_empty() {
        out.push(Segment::Text(rest.trim().to_owned()));
    }
    out
}

/// The text with every media tag replaced by its URL (the plain fallback).
pub(crate) fn plain_text(text: &str) -> String {
    let mut plain = text.to_owned();
    for (tag, _) in TAGS {
        plain = plain
            .replace(&format!("<{tag}>"), "")
            .replace(&format!("</{tag}>"), "");
    }
    plain
}

/// The QQ renderer of one account.
#[derive(Debug, Clone, Default)]
pub struct QqRenderer {
    /// Text is spoken by the TTS command (every message, not only `voice` ones).
    pub text_as_voice: bool,
    /// A TTS command is configured (without one, nothing is rendered as voice).
    pub tts: bool,
    /// The latest inbound message of each chat (the receiver fills it).
    pub recent: Arc<RecentInbound>,
}

fn unit(index: usize, kind: MessagePartKind, payload: Value) -> RenderedMessageUnit {
    RenderedMessageUnit::new(u32::try_from(index).unwrap_or(u32::MAX), kind, payload)
}

fn media_kind(file_type: u64) -> MessagePartKind {
    if file_type == FILE_VOICE {
        MessagePartKind::Voice
    } else {
        MessagePartKind::Media
    }
}

impl QqRenderer {
    /// Whether `message` is spoken rather than written.
    pub fn speaks(&self, message: &ChannelMessage) -> bool {
        let asked = message
            .body
            .as_ref()
            .and_then(|b| b.format.as_deref())
            .is_some_and(|f| f == "voice");
        self.tts && (self.text_as_voice || asked)
    }

    fn batch(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
        plain: bool,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let text = message.body.as_ref().map_or("", |b| b.text.as_str());
        let speak = !plain && self.speaks(message);
        let parts = if plain {
            let text = plain_text(text);
            if text.trim().is_empty() {
                Vec::new()
            } else {
                vec![Segment::Text(text)]
            }
        } else {
            segments(text)
        };
        let limit = capabilities.text.max_length.unwrap_or(MAX_TEXT_CHARS) as usize;
        let mut units: Vec<(MessagePartKind, Value)> = Vec::new();
        for part in parts {
            match part {
                Segment::Text(text) if speak => {
                    for chunk in chunk_text(&text, MAX_VOICE_CHARS.min(limit)) {
                        units.push((
                            MessagePartKind::Voice,
                            json!({ "tts": { "text": chunk }, "text": chunk }),
                        ));
                    }
                }
                Segment::Text(text) => {
                    let length = text.chars().count();
                    if length > limit && !capabilities.text.chunking {
                        return Err(RenderError::TooLong {
                            length,
                            limit: limit as u32,
                        });
                    }
                    for chunk in chunk_text(&text, limit) {
                        units.push((MessagePartKind::Text, json!({ "text": chunk })));
                    }
                }
                Segment::Media { file_type, url } => units.push((
                    media_kind(file_type),
                    json!({ "media": { "file_type": file_type, "url": url } }),
                )),
            }
        }
        if !plain {
            for attachment in &message.attachments {
                let mime = attachment.mime_type.as_deref().unwrap_or("");
                let file_type = match attachment.kind {
                    MessagePartKind::Voice => FILE_VOICE,
                    MessagePartKind::Media if mime.starts_with("video/") => FILE_VIDEO,
                    MessagePartKind::Media if mime.is_empty() || mime.starts_with("image/") => {
                        FILE_IMAGE
                    }
                    other => {
                        return Err(RenderError::UnsupportedAttachment(format!(
                            "QQ sends images, videos and voice; not {other:?} ({mime})"
                        )));
                    }
                };
                let Some(url) = attachment.url.as_deref() else {
                    return Err(RenderError::UnsupportedAttachment(
                        "QQ fetches media from a URL; this attachment has none".into(),
                    ));
                };
                units.push((
                    media_kind(file_type),
                    json!({ "media": { "file_type": file_type, "url": url } }),
                ));
            }
        }
        if units.is_empty() {
            return Err(RenderError::Empty);
        }
        let reply_to =
            answered_of(message, idempotency_key).or_else(|| self.recent.latest(&message.target));
        Ok(RenderedMessageBatch::new(
            units
                .into_iter()
                .enumerate()
                .map(|(i, (kind, mut payload))| {
                    if let Some(reply_to) = &reply_to {
                        payload["replyTo"] = json!(reply_to);
                    }
                    unit(i, kind, payload)
                })
                .collect(),
            BatchAtomicity::AllOrRetryRemaining,
            idempotency_key,
        ))
    }
}

impl MessageRenderAdapter for QqRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        self.batch(message, capabilities, idempotency_key, false)
    }

    fn render_fallback(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Option<RenderedMessageBatch> {
        self.batch(message, capabilities, idempotency_key, true)
            .ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use clawgate_types::{MessageAttachment, MessageBody, MessageTarget, TextCapabilities};

    use super::*;

    fn message(text: &str, format: Option<&str>) -> ChannelMessage {
        let mut body = MessageBody::new(text);
        body.format = format.map(str::to_owned);
        let mut m = ChannelMessage::outbound("m1", "qq", MessageTarget::direct("U1"), "");
        m.body = Some(body);
        m
    }

    fn caps() -> MessageCapabilities {
        MessageCapabilities::default().with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
    }

    fn shape(batch: &RenderedMessageBatch) -> Vec<(MessagePartKind, Value)> {
        batch
            .units
            .iter()
            .map(|u| (u.kind, u.payload.clone()))
            .collect()
    }

    #[test]
    fn media_tags_become_media_units_in_reading_order() {
        let r = QqRenderer::default();
        let text = "look <qqimg>https://x/cat.png</qqimg> and listen <qqvoice> https://x/a.silk </qqvoice>done <qqimg>unclosed";
        let batch = r.render(&message(text, None), &caps(), "k").unwrap();
        assert_eq!(
            shape(&batch),
            vec![
                (MessagePartKind::Text, json!({ "text": "look" })),
                (
                    MessagePartKind::Media,
                    json!({ "media": { "file_type": 1, "url": "https://x/cat.png" } })
                ),
                (MessagePartKind::Text, json!({ "text": "and listen" })),
                (
                    MessagePartKind::Voice,
                    json!({ "media": { "file_type": 3, "url": "https://x/a.silk" } })
                ),
                (
                    MessagePartKind::Text,
                    json!({ "text": "done <qqimg>unclosed" })
                ),
            ]
        );
        let fallback = r
            .render_fallback(&message(text, None), &caps(), "k")
            .unwrap();
        assert_eq!(fallback.units.len(), 1);
        assert_eq!(
            fallback.units[0].payload["text"],
            "look https://x/cat.png and listen  https://x/a.silk done unclosed"
        );
    }

    #[test]
    fn text_is_spoken_only_when_asked_and_a_tts_command_exists() {
        let cases = [
            (
                "off",
                QqRenderer {
                    text_as_voice: false,
                    tts: true,
                    ..QqRenderer::default()
                },
                None,
                MessagePartKind::Text,
            ),
            (
                "per message",
                QqRenderer {
                    text_as_voice: false,
                    tts: true,
                    ..QqRenderer::default()
                },
                Some("voice"),
                MessagePartKind::Voice,
            ),
            (
                "account-wide",
                QqRenderer {
                    text_as_voice: true,
                    tts: true,
                    ..QqRenderer::default()
                },
                None,
                MessagePartKind::Voice,
            ),
            (
                "no command",
                QqRenderer {
                    text_as_voice: true,
                    tts: false,
                    ..QqRenderer::default()
                },
                Some("voice"),
                MessagePartKind::Text,
            ),
        ];
        for (case, r, format, kind) in cases {
            let batch = r.render(&message("你好", format), &caps(), "k").unwrap();
            assert_eq!(batch.units[0].kind, kind, "{case}");
            if kind == MessagePartKind::Voice {
                assert_eq!(batch.units[0].payload["tts"]["text"], "你好", "{case}");
                let fallback = r
                    .render_fallback(&message("你好", format), &caps(), "k")
                    .unwrap();
                assert_eq!(fallback.units[0].kind, MessagePartKind::Text, "{case}");
            }
        }
    }

    #[test]
    fn attachments_long_text_and_empty_messages() {
        let r = QqRenderer::default();
        let mut m = message("", None);
        m.attachments = vec![
            MessageAttachment::new(MessagePartKind::Media)
                .with_url("https://x/v.mp4")
                .with_mime_type("video/mp4"),
        ];
        let batch = r.render(&m, &caps(), "k").unwrap();
        assert_eq!(batch.units[0].payload["media"]["file_type"], 2);
        m.attachments =
            vec![MessageAttachment::new(MessagePartKind::Media).with_mime_type("image/png")];
        assert!(matches!(
            r.render(&m, &caps(), "k"),
            Err(RenderError::UnsupportedAttachment(_))
        ));
        let long = "x".repeat(MAX_TEXT_CHARS as usize + 1);
        assert_eq!(
            r.render(&message(&long, None), &caps(), "k")
                .unwrap()
                .units
                .len(),
            2
        );
        assert_eq!(
            r.render(&message(" ", None), &caps(), "k"),
            Err(RenderError::Empty)
        );
    }
}
