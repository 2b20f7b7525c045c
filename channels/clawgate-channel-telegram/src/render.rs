//! Rendering for Telegram: text in chunks of 4096 characters, and one attachment with a short
//! text as a single media message carrying the text as its caption (≤ 1024 characters).

use clawgate_channel_sdk::{DefaultRenderer, MessageRenderAdapter, RenderError};
use clawgate_types::{
    BatchAtomicity, ChannelMessage, MessageCapabilities, RenderedMessageBatch, RenderedMessageUnit,
};

/// Longest caption of a media message.
pub const MAX_CAPTION_CHARS: usize = 1024;

/// The Telegram renderer.
#[derive(Debug, Clone, Copy, Default)]
pub struct TelegramRenderer;

impl MessageRenderAdapter for TelegramRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let text = message.body.as_ref().map_or("", |b| b.text.as_str());
        if let [attachment] = message.attachments.as_slice()
            && attachment.url.is_some()
            && !text.is_empty()
            && text.chars().count() <= MAX_CAPTION_CHARS
        {
            // Checked the same way the default renderer checks any attachment.
            let mut media_only = message.clone();
            media_only.body = None;
            let batch = DefaultRenderer.render(&media_only, capabilities, idempotency_key)?;
            let mut unit: RenderedMessageUnit = batch.units[0].clone();
            if let Some(map) = unit.payload.as_object_mut() {
                map.insert("caption".into(), text.into());
                if let Some(format) = message.body.as_ref().and_then(|b| b.format.clone()) {
                    map.insert("format".into(), format.into());
                }
            }
            return Ok(RenderedMessageBatch::new(
                vec![unit],
                BatchAtomicity::AllOrRetryRemaining,
                idempotency_key,
            ));
        }
        DefaultRenderer.render(message, capabilities, idempotency_key)
    }

    fn render_fallback(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Option<RenderedMessageBatch> {
        DefaultRenderer.render_fallback(message, capabilities, idempotency_key)
    }
}

#[cfg(test)]
mod tests {
    use clawgate_types::{MessageAttachment, MessagePartKind, MessageTarget};

    use super::*;

    fn message(text: &str, urls: &[&str]) -> ChannelMessage {
        ChannelMessage::outbound("m", "telegram", MessageTarget::group("-1"), text)
            .with_attachments(
                urls.iter()
                    .map(|u| MessageAttachment::new(MessagePartKind::Media).with_url(*u))
                    .collect(),
            )
    }

    fn render(message: &ChannelMessage) -> RenderedMessageBatch {
        let capabilities = clawgate_types::MessageCapabilities::default()
            .with_text(
                clawgate_types::TextCapabilities::default()
                    .with_max_length(4096)
                    .with_chunking(true),
            )
            .with_attachments(
                clawgate_types::AttachmentCapabilities::default().with_remote_url(true),
            );
        TelegramRenderer
            .render(message, &capabilities, "k")
            .expect("renders")
    }

    #[test]
    fn one_attachment_with_a_short_text_is_one_captioned_media_message() {
        let batch = render(&message("look", &["http://x/a.png"]));
        assert_eq!(batch.units.len(), 1);
        assert_eq!(batch.units[0].kind, MessagePartKind::Media);
        assert_eq!(batch.units[0].payload["caption"], "look");
    }

    #[test]
    fn a_text_over_the_caption_limit_goes_as_its_own_message() {
        let long = "x".repeat(MAX_CAPTION_CHARS + 1);
        let batch = render(&message(&long, &["http://x/a.png"]));
        assert_eq!(batch.units.len(), 2);
        assert_eq!(batch.units[0].kind, MessagePartKind::Text);
        assert!(batch.units[1].payload.get("caption").is_none());
    }

    #[test]
    fn long_text_is_chunked_at_4096() {
        let batch = render(&message(&"word ".repeat(2000), &[]));
        assert_eq!(batch.units.len(), 3);
        for unit in &batch.units {
            assert!(unit.payload["text"].as_str().expect("text").chars().count() <= 4096);
        }
    }
}
