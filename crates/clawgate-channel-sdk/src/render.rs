//! The default renderer: text split to the channel's limit, attachments as media units, and the
//! origin marker carried on every unit so no chunk loses it.

use clawgate_types::{
    BatchAtomicity, ChannelMessage, MessageCapabilities, MessagePartKind, RenderedMessageBatch,
    RenderedMessageUnit,
};
use serde_json::json;

use crate::{MessageRenderAdapter, RenderError};

/// Splits `text` into chunks of at most `limit` characters, preferring to break after a newline,
/// then after a space, in the second half of a chunk; never splits inside a character.
pub fn chunk_text(text: &str, limit: usize) -> Vec<String> {
    let limit = limit.max(1);
    let mut chunks = Vec::new();
    let mut rest = text;
    while rest.chars().count() > limit {
        // Byte offset of the limit-th character.
        let hard = rest
            .char_indices()
            .nth(limit)
            .map_or(rest.len(), |(i, _)| i);
        let window = &rest[..hard];
        let half = window.char_indices().nth(limit / 2).map_or(0, |(i, _)| i);
        let cut = window[half..]
            .rfind('\n')
            .or_else(|| window[half..].rfind(' '))
            .map_or(hard, |i| half + i + 1);
        chunks.push(rest[..cut].to_owned());
        rest = &rest[cut..];
    }
    if !rest.is_empty() || chunks.is_empty() {
        chunks.push(rest.to_owned());
    }
    chunks
}

/// Renders text and attachments generically; channels with richer formats bring their own.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultRenderer;

impl MessageRenderAdapter for DefaultRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        let origin = message
            .origin
            .as_ref()
            .map(|o| serde_json::to_value(o).unwrap_or_default());
        let format = message.body.as_ref().and_then(|b| b.format.clone());
        let mut units = Vec::new();
        if let Some(body) = message.body.as_ref().filter(|b| !b.text.is_empty()) {
            let length = body.text.chars().count();
            let chunks = match capabilities.text.max_length {
                Some(limit) if length > limit as usize => {
                    if !capabilities.text.chunking {
                        return Err(RenderError::TooLong { length, limit });
                    }
                    chunk_text(&body.text, limit as usize)
                }
                _ => vec![body.text.clone()],
            };
            for chunk in chunks {
                units.push((
                    MessagePartKind::Text,
                    json!({ "text": chunk, "format": format }),
                ));
            }
        }
        for attachment in &message.attachments {
            let supported = capabilities.attachments.as_ref().is_some_and(|a| {
                if attachment.url.is_some() {
                    a.remote_url
                } else {
                    a.upload
                }
            });
            if !supported {
                return Err(RenderError::UnsupportedAttachment(format!(
                    "{:?}",
                    attachment.kind
                )));
            }
            units.push((
                attachment.kind,
                serde_json::to_value(attachment).unwrap_or_default(),
            ));
        }
        if units.is_empty() {
            return Err(RenderError::Empty);
        }
        Ok(RenderedMessageBatch::new(
            units
                .into_iter()
                .enumerate()
                .map(|(index, (kind, mut payload))| {
                    if let (Some(origin), Some(map)) = (&origin, payload.as_object_mut()) {
                        map.insert("origin".into(), origin.clone());
                    }
                    RenderedMessageUnit::new(
                        u32::try_from(index).unwrap_or(u32::MAX),
                        kind,
                        payload,
                    )
                })
                .collect(),
            BatchAtomicity::AllOrRetryRemaining,
            idempotency_key,
        ))
    }

    fn render_fallback(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Option<RenderedMessageBatch> {
        // Plain text only: drop the formatting the platform may have rejected.
        let mut plain = message.clone();
        if let Some(body) = plain.body.as_mut() {
            body.format = Some("plain".into());
        }
        plain.attachments.clear();
        self.render(&plain, capabilities, idempotency_key).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_respect_the_limit_and_rejoin_to_the_text() {
        let cases: &[(&str, usize)] = &[
            ("", 5),
            ("short", 10),
            ("exactly10!", 10),
            ("one two three four five six seven", 10),
            ("line one\nline two\nline three", 12),
            ("ééééééééééééééééé", 4),
            ("nospacesatallinthislongword", 7),
        ];
        for (text, limit) in cases {
            let chunks = chunk_text(text, *limit);
            assert_eq!(chunks.concat(), *text, "{text:?} rejoins");
            for chunk in &chunks {
                assert!(chunk.chars().count() <= *limit, "{chunk:?} within {limit}");
            }
            assert!(!chunks.is_empty());
        }
        assert_eq!(
            chunk_text("aaaa bbbb cccc", 10),
            vec!["aaaa bbbb ", "cccc"],
            "breaks at a space"
        );
    }
}
