//! The render adapter: the default rendering (text chunked to the channel's limit), with the
//! account's model signature appended to the model's own replies.
//!
//! The signature (`signature` setting, e.g. `— claude-sonnet-4`) goes on its own line at the
//! end of the text, once, before chunking (so it lands in the last unit). It is added at render
//! time, and the engine stores the rendered batch with the durable intent: a resend after a
//! restart sends the stored units, so the signature is there exactly once whichever path sends
//! the final. Messages the gateway produces itself (failure notices: they carry an origin
//! marker) are not signed — they are not the model's words.

use clawgate_channel_sdk::{DefaultRenderer, MessageRenderAdapter, RenderError};
use clawgate_types::{ChannelMessage, MessageCapabilities, RenderedMessageBatch};

/// Renders Tlon messages.
#[derive(Debug, Clone, Default)]
pub struct TlonRenderer {
    signature: Option<String>,
}

impl TlonRenderer {
    /// A renderer appending `signature` (when set and not blank) to model replies.
    pub fn new(signature: Option<String>) -> TlonRenderer {
        TlonRenderer {
            signature: signature
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
        }
    }

    /// The configured signature line.
    pub fn signature(&self) -> Option<&str> {
        self.signature.as_deref()
    }

    /// `message` as it is sent: signed when it is the model's reply.
    pub fn signed(&self, message: &ChannelMessage) -> ChannelMessage {
        let mut message = message.clone();
        let Some(signature) = &self.signature else {
            return message;
        };
        if message.origin.is_some() {
            return message;
        }
        if let Some(body) = message.body.as_mut().filter(|b| !b.text.trim().is_empty()) {
            // Idempotent: a text already ending in the signature is not signed twice.
            if !body.text.trim_end().ends_with(signature.as_str()) {
                body.text = format!("{}\n\n{signature}", body.text.trim_end());
            }
        }
        message
    }
}

impl MessageRenderAdapter for TlonRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Result<RenderedMessageBatch, RenderError> {
        DefaultRenderer.render(&self.signed(message), capabilities, idempotency_key)
    }

    fn render_fallback(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        idempotency_key: &str,
    ) -> Option<RenderedMessageBatch> {
        DefaultRenderer.render_fallback(&self.signed(message), capabilities, idempotency_key)
    }
}

#[cfg(test)]
mod tests {
    use clawgate_types::{MessageOrigin, MessageTarget, TextCapabilities};

    use super::*;

    /// Text chunked at 5000 characters, as the channel declares.
    fn caps() -> MessageCapabilities {
        MessageCapabilities::default().with_text(
            TextCapabilities::default()
                .with_max_length(5_000)
                .with_chunking(true),
        )
    }

    fn texts(batch: &RenderedMessageBatch) -> Vec<String> {
        batch
            .units
            .iter()
            .map(|u| u.payload["text"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn model_replies_are_signed_once_notices_never() {
        let renderer = TlonRenderer::new(Some("— test-model".into()));
        let caps = caps();
        let reply = ChannelMessage::outbound("r1", "tlon", MessageTarget::direct("~nec"), "hello");
        let batch = renderer.render(&reply, &caps, "k").expect("renders");
        assert_eq!(texts(&batch), vec!["hello\n\n— test-model".to_owned()]);
        let signed = renderer.signed(&reply);
        let again = renderer.render(&signed, &caps, "k").expect("renders");
        assert_eq!(texts(&again), texts(&batch), "signing is idempotent");
        let mut notice = reply.clone();
        notice.origin = Some(MessageOrigin::Platform);
        let batch = renderer.render(&notice, &caps, "k").expect("renders");
        assert_eq!(texts(&batch), vec!["hello".to_owned()]);
        let plain = TlonRenderer::new(Some("   ".into()));
        assert_eq!(plain.signature(), None);
    }

    #[test]
    fn a_long_reply_carries_the_signature_in_its_last_chunk_only() {
        let renderer = TlonRenderer::new(Some("— m".into()));
        let caps = caps();
        let text = "word ".repeat(2_000);
        let reply = ChannelMessage::outbound("r1", "tlon", MessageTarget::direct("~nec"), &text);
        let texts = texts(&renderer.render(&reply, &caps, "k").expect("renders"));
        assert!(texts.len() > 1);
        let signed: Vec<_> = texts.iter().filter(|t| t.contains("— m")).collect();
        assert_eq!(signed.len(), 1);
        assert!(texts.last().expect("a last chunk").ends_with("— m"));
    }
}
