//! The QA channel adapter: the channel SDK spoken over the QA platform's HTTP API.

use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageOriginAdapter, MessageReceiveAdapter, NormalizedInbound,
    ReceiveError, Reconciliation, SendContext, SendError, classify_http_status,
};
use clawgate_types::{
    AttachmentCapabilities, DeliveryCapabilities, DeliveryFailureKind, LiveCapabilities,
    MessageAttachment, MessageCapabilities, MessageOrigin, MessagePartKind, MessageReceiptPart,
    MessageRelation, RenderedMessageUnit, TextCapabilities, ThreadCapabilities,
};
use reqwest::StatusCode;

use crate::wire::{
    EditRequest, ErrorBody, MessageAnswer, PlatformAttachment, PlatformMessage, SendRequest,
};

/// The channel name QA messages address.
pub const QA_CHANNEL: &str = "qa";

/// Speaks to a [`QaPlatform`](crate::QaPlatform).
#[derive(Clone)]
pub struct QaAdapter {
    channel: String,
    base_url: String,
    token: String,
    http: reqwest::Client,
    capabilities: MessageCapabilities,
    /// Sends idempotency keys and can reconcile unknown outcomes.
    idempotent: bool,
}

/// Never prints the token: an adapter may end up in a log line.
impl std::fmt::Debug for QaAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QaAdapter")
            .field("channel", &self.channel)
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("idempotent", &self.idempotent)
            .finish_non_exhaustive()
    }
}

/// How long a long poll may take beyond the wait it asked the platform for.
const LONG_POLL_MARGIN: Duration = Duration::from_secs(10);

impl QaAdapter {
    /// The full adapter: idempotency keys on every unit, reconciliation by key lookup.
    pub fn new(base_url: &str, token: &str) -> QaAdapter {
        QaAdapter::build(base_url, token, true, Duration::from_secs(10))
    }

    /// The variant without idempotency keys or reconciliation: unknown outcomes must stay
    /// unknown (never replayed blindly).
    pub fn without_idempotency(base_url: &str, token: &str) -> QaAdapter {
        QaAdapter::build(base_url, token, false, Duration::from_secs(10))
    }

    /// Changes how long one platform call may take before its outcome counts as unknown.
    pub fn with_timeout(self, timeout: Duration) -> QaAdapter {
        QaAdapter::build(&self.base_url, &self.token, self.idempotent, timeout)
    }

    /// Serves another channel name (several QA "platforms" in one gateway).
    pub fn with_channel(mut self, channel: &str) -> QaAdapter {
        channel.clone_into(&mut self.channel);
        self
    }

    fn build(base_url: &str, token: &str, idempotent: bool, timeout: Duration) -> QaAdapter {
        let http = clawgate_channel_sdk::http::loopback_client_builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        QaAdapter {
            channel: QA_CHANNEL.into(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            http,
            capabilities: MessageCapabilities::default()
                .with_text(
                    TextCapabilities::default()
                        .with_max_length(4_000)
                        .with_chunking(true),
                )
                // Files travel by URL (the platform fetches them); nothing is uploaded.
                .with_attachments(
                    AttachmentCapabilities::default()
                        .with_upload(false)
                        .with_remote_url(true)
                        .with_voice(true),
                )
                .with_threads(
                    ThreadCapabilities::default()
                        .with_reply(true)
                        .with_topic(false)
                        .with_native_thread(true),
                )
                .with_live(
                    LiveCapabilities::default()
                        .with_edit(true)
                        .with_delete(true)
                        .with_native_stream(false)
                        .with_progress(false)
                        .with_max_edits_per_second(5),
                )
                .with_delivery(
                    DeliveryCapabilities::default()
                        .with_idempotency_key(idempotent)
                        .with_retry_after(true)
                        .with_receipt_required(true)
                        .with_reconcile_unknown_send(idempotent)
                        .with_duplicates_acceptable(false),
                ),
            idempotent,
        }
    }

    /// What one unit puts on the platform: the text (a caption for media) and the attachments.
    /// Text units carry `text`; every other kind is an attachment (the `DefaultRenderer` shape:
    /// the `MessageAttachment` itself, with an optional `caption` or `text`).
    fn unit_content(
        unit: &RenderedMessageUnit,
    ) -> Result<(String, Vec<PlatformAttachment>), SendError> {
        let text = |key: &str| unit.payload.get(key).and_then(|t| t.as_str());
        if matches!(unit.kind, MessagePartKind::Text | MessagePartKind::Preview) {
            let text = text("text").ok_or_else(|| {
                SendError::before_io(
                    DeliveryFailureKind::InvalidPayload,
                    "a QA text unit needs a `text` string",
                )
            })?;
            return Ok((text.to_owned(), Vec::new()));
        }
        let attachment: MessageAttachment =
            serde_json::from_value(unit.payload.clone()).map_err(|e| {
                SendError::before_io(
                    DeliveryFailureKind::InvalidPayload,
                    format!("a QA {:?} unit must carry an attachment: {e}", unit.kind),
                )
            })?;
        let url = attachment.url.filter(|u| !u.is_empty()).ok_or_else(|| {
            SendError::before_io(
                DeliveryFailureKind::InvalidPayload,
                "the QA platform takes attachments by URL only (no uploads)",
            )
        })?;
        let caption = text("caption").or_else(|| text("text")).unwrap_or_default();
        Ok((
            caption.to_owned(),
            vec![PlatformAttachment {
                kind: attachment.kind,
                url,
                mime_type: attachment.mime_type,
                file_name: attachment.file_name,
            }],
        ))
    }

    fn conversation(ctx: &SendContext) -> &str {
        &ctx.message.target.id
    }

    /// `base/seg/seg/…`, each segment percent-encoded (ids and keys may hold `#`, `:` or `/`).
    fn url(&self, segments: &[&str]) -> Result<reqwest::Url, SendError> {
        let mut url = reqwest::Url::parse(&self.base_url).map_err(|e| {
            SendError::before_io(
                DeliveryFailureKind::InvalidPayload,
                format!("bad QA base URL: {e}"),
            )
        })?;
        url.path_segments_mut()
            .map_err(|()| {
                SendError::before_io(
                    DeliveryFailureKind::InvalidPayload,
                    "QA base URL cannot hold a path",
                )
            })?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    fn part(message: &PlatformMessage, index: u32, kind: MessagePartKind) -> MessageReceiptPart {
        let mut part = MessageReceiptPart::new(message.id.clone(), kind, index);
        part.thread_id = message.thread_id.clone();
        part.reply_to_id = message.reply_to_id.clone();
        part
    }

    /// Turns a transport failure into a classified error: nothing happened if we never connected;
    /// anything later may have reached the platform.
    fn transport_error(error: &reqwest::Error) -> SendError {
        if error.is_connect() {
            SendError::before_io(
                DeliveryFailureKind::Transient,
                format!("QA platform unreachable: {error}"),
            )
        } else {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!("QA platform call failed mid-flight: {error}"),
            )
        }
    }

    /// A definite error answer: the platform refused the call as a whole.
    async fn answer_error(response: reqwest::Response) -> SendError {
        let status = response.status().as_u16();
        let header_retry = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let body = response.json::<ErrorBody>().await.ok();
        let retry_after_secs =
            header_retry.or_else(|| body.as_ref().and_then(|b| b.error.retry_after_secs));
        let (code, message) = body
            .map(|b| (b.error.code, b.error.message))
            .unwrap_or_else(|| ("unknown".into(), format!("HTTP {status}")));
        SendError::before_io(
            classify_http_status(status),
            format!("QA platform answered {status} {code}: {message}"),
        )
        .with_retry_after_ms(retry_after_secs.map(|s| s.saturating_mul(1_000)))
        .with_platform_code(code)
    }

    /// Sends an authenticated call to the platform.
    async fn call(&self, request: reqwest::RequestBuilder) -> Result<reqwest::Response, SendError> {
        request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| Self::transport_error(&e))
    }

    /// A successful answer's body, or the platform's error. `what` names the answer in errors.
    async fn answer<T: serde::de::DeserializeOwned>(
        response: reqwest::Response,
        what: &str,
    ) -> Result<T, SendError> {
        if !response.status().is_success() {
            return Err(Self::answer_error(response).await);
        }
        // The platform acted; if its answer cannot be read, we do not know what it did.
        response.json::<T>().await.map_err(|e| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                format!("QA {what} unreadable: {e}"),
            )
        })
    }

    async fn message_answer(response: reqwest::Response) -> Result<PlatformMessage, SendError> {
        Self::answer::<MessageAnswer>(response, "platform answer")
            .await
            .map(|a| a.message)
    }
}

/// Origin markers travel as message metadata, verbatim.
#[derive(Debug, Clone, Copy)]
struct QaOrigin;

impl MessageOriginAdapter for QaOrigin {
    fn encode(&self, origin: &MessageOrigin) -> Option<serde_json::Value> {
        Some(serde_json::json!({ "clawgateOrigin": origin }))
    }

    fn decode(&self, raw: &serde_json::Value) -> Option<MessageOrigin> {
        serde_json::from_value(raw.get("metadata")?.get("clawgateOrigin")?.clone()).ok()
    }
}

#[async_trait]
impl ChannelMessageAdapter for QaAdapter {
    fn channel(&self) -> &str {
        &self.channel
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let (text, attachments) = Self::unit_content(unit)?;
        let (reply_to_id, relation_thread) = match &ctx.message.relation {
            Some(MessageRelation::Reply {
                reply_to_id,
                thread_id,
                ..
            }) => (reply_to_id.clone(), thread_id.clone()),
            _ => (None, None),
        };
        // The engine encodes the origin marker through `origin()` below.
        let metadata = ctx.origin_metadata.clone();
        let request = SendRequest {
            text,
            attachments,
            thread_id: relation_thread.or_else(|| ctx.message.target.thread_id.clone()),
            reply_to_id,
            metadata,
            idempotency_key: self.idempotent.then(|| ctx.unit_key(unit)),
        };
        let url = self.url(&["api", "conversations", Self::conversation(ctx), "messages"])?;
        let response = self.call(self.http.post(url).json(&request)).await?;
        let message = Self::message_answer(response).await?;
        Ok(Self::part(&message, unit.index, unit.kind))
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let text = unit
            .payload
            .get("text")
            .and_then(|t| t.as_str())
            .unwrap_or_default()
            .to_owned();
        let url = self.url(&[
            "api",
            "conversations",
            Self::conversation(ctx),
            "messages",
            &part.platform_message_id,
        ])?;
        let response = self
            .call(self.http.patch(url).json(&EditRequest { text }))
            .await?;
        let message = Self::message_answer(response).await?;
        Ok(Self::part(&message, part.index, part.kind))
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        let url = self.url(&[
            "api",
            "conversations",
            Self::conversation(ctx),
            "messages",
            &part.platform_message_id,
        ])?;
        let response = self.call(self.http.delete(url)).await?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(Self::answer_error(response).await)
        }
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        if !self.idempotent {
            return Ok(Reconciliation::Unresolved);
        }
        let url = self.url(&["api", "messages", "by-key", &ctx.unit_key(unit)])?;
        let response = self.call(self.http.get(url)).await?;
        match response.status() {
            StatusCode::OK => {
                let message = Self::message_answer(response).await?;
                Ok(Reconciliation::Sent(Box::new(Self::part(
                    &message, unit.index, unit.kind,
                ))))
            }
            // The key index is written in the same step as the message: absent means not sent.
            StatusCode::NOT_FOUND => Ok(Reconciliation::NotSent),
            _ => Ok(Reconciliation::Unresolved),
        }
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        Some(&QaOrigin)
    }
}

impl QaAdapter {
    /// Long-polls the platform's update feed from `offset` (confirming every update below it),
    /// waiting up to `timeout_ms` when there is nothing new.
    pub async fn get_updates(
        &self,
        offset: i64,
        timeout_ms: u64,
    ) -> Result<Vec<crate::Update>, SendError> {
        let mut url = self.url(&["api", "updates"])?;
        url.query_pairs_mut()
            .append_pair("offset", &offset.to_string())
            .append_pair("timeoutMs", &timeout_ms.to_string());
        // The platform may hold the request for the whole wait: the call's own deadline comes
        // on top of it, or every idle long poll would end as a timeout.
        let deadline = Duration::from_millis(timeout_ms).saturating_add(LONG_POLL_MARGIN);
        let response = self.call(self.http.get(url).timeout(deadline)).await?;
        Self::answer::<crate::UpdatesAnswer>(response, "updates")
            .await
            .map(|a| a.result)
    }
}

impl QaAdapter {
    /// `GET /api/conversations/{conv}/messages`: what the platform shows in a conversation.
    pub async fn list_messages(
        &self,
        conversation: &str,
    ) -> Result<Vec<PlatformMessage>, SendError> {
        let url = self.url(&["api", "conversations", conversation, "messages"])?;
        let response = self.call(self.http.get(url)).await?;
        Self::answer::<crate::MessagesAnswer>(response, "messages")
            .await
            .map(|a| a.messages)
    }

    /// `POST /control/conversations/{conv}/inbound`: someone on the platform writes into a
    /// conversation (a person at a terminal or in the web chat, or another session).
    pub async fn write_as(
        &self,
        conversation: &str,
        request: &crate::InboundRequest,
    ) -> Result<PlatformMessage, SendError> {
        let url = self.url(&["control", "conversations", conversation, "inbound"])?;
        let response = self.call(self.http.post(url).json(request)).await?;
        Self::answer::<MessageAnswer>(response, "answer")
            .await
            .map(|a| a.message)
    }
}

/// Inbound QA events are platform messages (as `GET …/messages`, webhooks and polls deliver
/// them). Conversations named `dm-…` are direct chats; every other one is a shared room.
impl MessageReceiveAdapter for QaAdapter {
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError> {
        let message: PlatformMessage =
            serde_json::from_value(raw.clone()).map_err(|e| ReceiveError::Malformed {
                channel: self.channel.clone(),
                reason: e.to_string(),
            })?;
        let kind = if message.conversation_id.starts_with("dm-") {
            clawgate_types::TargetKind::Direct
        } else {
            clawgate_types::TargetKind::Group
        };
        let relation = message.reply_to_id.clone().map(|reply_to| {
            MessageRelation::reply_to(reply_to).with_thread_id(message.thread_id.clone())
        });
        let target = clawgate_types::MessageTarget::new(kind, message.conversation_id.clone())
            .with_thread_id(message.thread_id.clone());
        let mut normalized =
            clawgate_types::ChannelMessage::inbound(message.id.clone(), &self.channel, target)
                .with_text(message.text.clone())
                .with_attachments(
                    message
                        .attachments
                        .iter()
                        .map(|a| {
                            let mut attachment =
                                MessageAttachment::new(a.kind).with_url(a.url.clone());
                            attachment.mime_type = a.mime_type.clone();
                            attachment.file_name = a.file_name.clone();
                            attachment
                        })
                        .collect(),
                )
                .with_raw(raw.clone());
        normalized.sender = message
            .author_id
            .clone()
            .map(|id| clawgate_types::MessageActor::new(id).with_is_bot(message.author_is_bot));
        normalized.relation = relation;
        normalized.origin = QaOrigin.decode(raw);
        Ok(NormalizedInbound::new(message.id.clone(), normalized).by_bot(message.author_is_bot))
    }
}
