//! The render adapter (the seed's Feishu row: it owns text, card and raw rendering). One unit
//! per chunk, each carrying the `msg_type` and `content` Feishu receives, the plain `text` (for
//! edits and previews) and `renderedAtMs` (when the unit's `uuid` started counting):
//!
//! - plain text (or no format): `msg_type: "text"`, `content: {"text"}`;
//! - `markdown`: `msg_type: "post"` with one `md` element (Feishu renders its Markdown subset);
//! - `card`: `msg_type: "interactive"`, a schema 2.0 card with one markdown element;
//! - raw: a message whose `raw.feishu` is `{msg_type, content}` goes out as given (the
//!   caller owns its validity; Feishu's refusal is an `invalid_payload` failure).
//!
//! The fallback after an `invalid_payload` refusal is plain text.

use std::sync::Arc;

use clawgate_channel_sdk::{MessageRenderAdapter, RenderError, chunk_text};
use clawgate_types::clock::Clock;
use clawgate_types::{
    BatchAtomicity, ChannelMessage, MessageCapabilities, MessagePartKind, RenderedMessageBatch,
    RenderedMessageUnit,
};
use serde_json::{Value, json};

/// Longest text of one unit: a final must also fit the streaming card it may replace.
pub const MAX_TEXT_CHARS: u32 = 4_000;
/// The element id of the text in every card this channel builds.
pub const CARD_ELEMENT_ID: &str = "reply";

/// `clock`'s now in ms since the epoch, as the unit times are kept (a time before 1970 is 0).
pub(crate) fn now_ms(clock: &dyn Clock) -> u64 {
    u64::try_from(clock.now_ms()).unwrap_or(0)
}

/// A schema 2.0 card showing `text` as Markdown; `streaming` sets `config.streaming_mode`.
pub fn card_json(text: &str, streaming: bool) -> Value {
    json!({
        "schema": "2.0",
        "config": {
            "streaming_mode": streaming,
            "summary": { "content": summary(text) },
        },
        "body": { "elements": [
            { "tag": "markdown", "content": text, "element_id": CARD_ELEMENT_ID }
        ] },
    })
}

/// The chat-list preview line of a card.
fn summary(text: &str) -> String {
    text.chars().take(60).collect()
}

/// `(msg_type, content)` of a text in `format`.
pub fn content_of(text: &str, format: Option<&str>) -> (&'static str, String) {
    match format {
        Some("markdown") => (
            "post",
            json!({ "zh_cn": { "content": [[{ "tag": "md", "text": text }]] } }).to_string(),
        ),
        Some("card") => ("interactive", card_json(text, false).to_string()),
        _ => ("text", json!({ "text": text }).to_string()),
    }
}

/// The Feishu renderer.
#[derive(Debug, Clone)]
pub struct FeishuRenderer {
    /// The gateway's clock: `renderedAtMs` starts a unit's uuid window.
    clock: Arc<dyn Clock>,
}

fn unit(index: usize, kind: MessagePartKind, payload: Value) -> RenderedMessageUnit {
    RenderedMessageUnit::new(u32::try_from(index).unwrap_or(u32::MAX), kind, payload)
}

impl FeishuRenderer {
    /// A renderer stamping units with `clock`'s time.
    pub fn new(clock: Arc<dyn Clock>) -> FeishuRenderer {
        FeishuRenderer { clock }
    }

    fn batch(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
        format: Option<&str>,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let rendered_at = now_ms(self.clock.as_ref());
        if let Some(raw) = message.raw.as_ref().and_then(|r| r.get("feishu")) {
            let msg_type = raw["msg_type"].as_str().unwrap_or_default();
            let content = match &raw["content"] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            if !msg_type.is_empty() && !content.is_empty() {
                let kind = if msg_type == "interactive" {
                    MessagePartKind::Card
                } else {
                    MessagePartKind::Text
                };
                let text = message.body.as_ref().map(|b| b.text.clone());
                let payload = json!({ "msg_type": msg_type, "content": content,
                    "text": text, "renderedAtMs": rendered_at });
                return Ok(RenderedMessageBatch::new(
                    vec![unit(0, kind, payload)],
                    BatchAtomicity::AllOrRetryRemaining,
                    idempotency_key,
                ));
            }
        }
        if !message.attachments.is_empty() {
            return Err(RenderError::UnsupportedAttachment(
                "this Feishu channel sends text, posts and cards only".into(),
            ));
        }
        let body = message
            .body
            .as_ref()
            .filter(|b| !b.text.is_empty())
            .ok_or(RenderError::Empty)?;
        let limit = capabilities.text.max_length.unwrap_or(MAX_TEXT_CHARS) as usize;
        let length = body.text.chars().count();
        let chunks = if length > limit {
            if !capabilities.text.chunking {
                return Err(RenderError::TooLong {
                    length,
                    limit: limit as u32,
                });
            }
            chunk_text(&body.text, limit)
        } else {
            vec![body.text.clone()]
        };
        let units = chunks
            .iter()
            .enumerate()
            .map(|(index, chunk)| {
                let (msg_type, content) = content_of(chunk, format);
                let kind = if msg_type == "interactive" {
                    MessagePartKind::Card
                } else {
                    MessagePartKind::Text
                };
                unit(
                    index,
                    kind,
                    json!({ "text": chunk, "msg_type": msg_type, "content": content,
                        "renderedAtMs": rendered_at }),
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

impl MessageRenderAdapter for FeishuRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let format = message.body.as_ref().and_then(|b| b.format.as_deref());
        self.batch(message, capabilities, idempotency_key, format)
    }

    fn render_fallback(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Option<RenderedMessageBatch> {
        let mut plain = message.clone();
        plain.raw = None;
        plain.attachments.clear();
        self.batch(&plain, capabilities, idempotency_key, None).ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use clawgate_types::clock::ManualClock;
    use clawgate_types::{MessageBody, MessageTarget, TextCapabilities};

    use super::*;

    fn renderer() -> FeishuRenderer {
        FeishuRenderer::new(Arc::new(ManualClock::new(1_700_000_000_000)))
    }

    fn message(text: &str, format: Option<&str>) -> ChannelMessage {
        let mut body = MessageBody::new(text);
        body.format = format.map(str::to_owned);
        let mut m = ChannelMessage::outbound("m1", "feishu", MessageTarget::group("oc_1"), "");
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

    #[test]
    fn text_post_card_and_raw_each_render_as_feishu_receives_them() {
        let r = renderer();
        let cases: [(Option<&str>, &str, MessagePartKind); 4] = [
            (None, "text", MessagePartKind::Text),
            (Some("plain"), "text", MessagePartKind::Text),
            (Some("markdown"), "post", MessagePartKind::Text),
            (Some("card"), "interactive", MessagePartKind::Card),
        ];
        for (format, msg_type, kind) in cases {
            let batch = r.render(&message("**hi**", format), &caps(), "k").unwrap();
            let unit = &batch.units[0];
            assert_eq!(unit.payload["msg_type"], msg_type, "{format:?}");
            assert_eq!(unit.kind, kind);
            let content: Value =
                serde_json::from_str(unit.payload["content"].as_str().unwrap()).unwrap();
            let shown = match msg_type {
                "text" => content["text"].clone(),
                "post" => content["zh_cn"]["content"][0][0]["text"].clone(),
                _ => content["body"]["elements"][0]["content"].clone(),
            };
            assert_eq!(shown, "**hi**");
        }
        let mut raw = message("alt", None);
        raw.raw = Some(json!({ "feishu": { "msg_type": "share_chat",
            "content": { "chat_id": "oc_2" } } }));
        let batch = r.render(&raw, &caps(), "k").unwrap();
        assert_eq!(batch.units[0].payload["msg_type"], "share_chat");
        assert_eq!(batch.units[0].payload["content"], r#"{"chat_id":"oc_2"}"#);
        let fallback = r.render_fallback(&raw, &caps(), "k").unwrap();
        assert_eq!(fallback.units[0].payload["msg_type"], "text");
    }

    #[test]
    fn units_are_stamped_with_the_gateways_clock() {
        let clock = Arc::new(ManualClock::new(42_000));
        let r = FeishuRenderer::new(clock.clone());
        let batch = r.render(&message("hi", None), &caps(), "k").unwrap();
        assert_eq!(batch.units[0].payload["renderedAtMs"], 42_000);
        clock.advance(1_000);
        let batch = r.render(&message("hi", None), &caps(), "k").unwrap();
        assert_eq!(batch.units[0].payload["renderedAtMs"], 43_000);
    }

    #[test]
    fn long_text_is_chunked_and_empty_text_refused() {
        let long = "x".repeat(MAX_TEXT_CHARS as usize + 1);
        let batch = renderer()
            .render(&message(&long, None), &caps(), "k")
            .unwrap();
        assert_eq!(batch.units.len(), 2);
        assert!(renderer().render(&message("", None), &caps(), "k").is_err());
    }
}
