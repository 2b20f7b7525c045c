//! Sending: `spaces.messages.create` with a `requestId` and a client-assigned `messageId`, both
//! derived from the unit key, so a resend of the same unit can never make a second message;
//! `patch` (`updateMask=text`) for edits, so previews finalize in place; `delete`. An unknown
//! send is settled by `GET spaces/{space}/messages/client-…`: found → sent, 404 → not sent.

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageOriginAdapter, Reconciliation, SendContext, SendError,
};
use clawgate_types::{
    ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, GatewayFailureCode,
    LiveCapabilities, MessageCapabilities, MessageOrigin, MessagePartKind, MessageReceiptPart,
    MessageRelation, RenderedMessageUnit, TextCapabilities, ThreadCapabilities,
};
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::client::{CallError, ChatApi};

/// Longest text of one message this channel sends (chunks beyond it). Google's own ceiling is
/// 32,000 bytes per message; 4,096 characters stay under it in any script.
pub const MAX_TEXT_CHARS: u32 = 4_096;
/// How often an edit or delete whose answer was lost is sent again (both are idempotent).
const REPEATS: u32 = 3;
/// The prefix of every client-assigned id of ours; a gateway-failure notice's adds its marker.
const ID_PREFIX: &str = "client-cg-";
const FAILURE_PREFIX: &str = "client-cgf1";
/// Hex characters of the unit key's hash in an id (160 bits).
const HASH_CHARS: usize = 40;

/// The Google Chat sender: one app's access token.
#[derive(Debug)]
pub struct GoogleChatAdapter {
    name: String,
    api: ChatApi,
    capabilities: MessageCapabilities,
}

fn capabilities() -> MessageCapabilities {
    MessageCapabilities::default()
        .with_text(
            TextCapabilities::default()
                .with_max_length(MAX_TEXT_CHARS)
                .with_chunking(true),
        )
        .with_threads(
            ThreadCapabilities::default()
                .with_reply(true)
                .with_native_thread(true),
        )
        .with_live(
            LiveCapabilities::default()
                .with_edit(true)
                .with_delete(true)
                // 60 writes a minute per space, shared by every app in it.
                .with_max_edits_per_second(1),
        )
        .with_delivery(
            DeliveryCapabilities::default()
                .with_idempotency_key(true)
                .with_retry_after(true)
                .with_receipt_required(true)
                .with_reconcile_unknown_send(true)
                .with_duplicates_acceptable(false),
        )
}

fn invalid(message: impl Into<String>) -> SendError {
    SendError::before_io(DeliveryFailureKind::InvalidPayload, message)
}

fn text_of(unit: &RenderedMessageUnit) -> Result<&str, SendError> {
    unit.payload
        .get("text")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("a Google Chat text unit needs a `text` string"))
}

fn failure_letter(code: GatewayFailureCode) -> char {
    match code {
        GatewayFailureCode::AgentFailedBeforeReply => 'a',
        GatewayFailureCode::MissingApiKey => 'k',
        GatewayFailureCode::ModelLoginExpired => 'l',
        GatewayFailureCode::AgentsBusy => 'b',
        GatewayFailureCode::AgentStillWorking => 'w',
    }
}

fn failure_code(letter: char) -> Option<GatewayFailureCode> {
    Some(match letter {
        'a' => GatewayFailureCode::AgentFailedBeforeReply,
        'k' => GatewayFailureCode::MissingApiKey,
        'l' => GatewayFailureCode::ModelLoginExpired,
        'b' => GatewayFailureCode::AgentsBusy,
        'w' => GatewayFailureCode::AgentStillWorking,
        _ => return None,
    })
}

/// The client-assigned id of the unit under `unit_key`: `client-cg-<hash>`, or for a marked
/// gateway-failure notice `client-cgf1<code>-<hash>` (the marker rides in the id: Chat messages
/// have no free metadata field, and every reader of the message sees its
/// `clientAssignedMessageId`). Lowercase hex of SHA-256, within the 63-character rule.
pub fn message_id_for(unit_key: &str, origin: Option<&MessageOrigin>) -> String {
    let digest = Sha256::digest(unit_key.as_bytes());
    let hash: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let hash = &hash[..HASH_CHARS];
    match origin {
        Some(MessageOrigin::Clawgate(marker))
            if marker.schema_version == clawgate_types::GATEWAY_ORIGIN_SCHEMA_VERSION =>
        {
            format!("{FAILURE_PREFIX}{}-{hash}", failure_letter(marker.code))
        }
        _ => format!("{ID_PREFIX}{hash}"),
    }
}

/// The origin a send context carries (its `origin_metadata`, as [`GoogleChatOrigin`] encoded it).
fn origin_of(ctx: &SendContext) -> Option<MessageOrigin> {
    let value = ctx.origin_metadata.as_ref()?.get("origin")?;
    serde_json::from_value(value.clone()).ok()
}

/// The thread a message goes to: its reply's thread, else its target's.
fn thread_of(message: &ChannelMessage) -> Option<String> {
    let from_relation = match &message.relation {
        Some(MessageRelation::Reply { thread_id, .. }) => thread_id.clone(),
        _ => None,
    };
    from_relation.or_else(|| message.target.thread_id.clone())
}

/// `spaces/{space}` of a target id (given with or without the prefix).
fn space_of(target: &str) -> String {
    if target.starts_with("spaces/") {
        target.to_owned()
    } else {
        format!("spaces/{target}")
    }
}

impl GoogleChatAdapter {
    pub(crate) fn new(name: &str, api: ChatApi) -> GoogleChatAdapter {
        GoogleChatAdapter {
            name: name.to_owned(),
            api,
            capabilities: capabilities(),
        }
    }

    fn part(answer: &Value, unit: &RenderedMessageUnit) -> Result<MessageReceiptPart, SendError> {
        let name = answer["name"].as_str().ok_or_else(|| {
            SendError::after_io(
                DeliveryFailureKind::Unknown,
                "Google Chat answered a message without its name",
            )
        })?;
        let mut part = MessageReceiptPart::new(name, unit.kind, unit.index);
        part.thread_id = answer["thread"]["name"].as_str().map(str::to_owned);
        Ok(part)
    }

    /// The id of `unit` in `ctx`, and the message's resource path.
    fn ids(ctx: &SendContext, unit: &RenderedMessageUnit) -> (String, String) {
        let id = message_id_for(&ctx.unit_key(unit), origin_of(ctx).as_ref());
        let path = format!("{}/messages/{id}", space_of(&ctx.message.target.id));
        (id, path)
    }

    async fn create(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
        text: &str,
    ) -> Result<MessageReceiptPart, SendError> {
        if text.trim().is_empty() {
            return Err(invalid("Google Chat refuses an empty message"));
        }
        let space = space_of(&ctx.message.target.id);
        let (id, path) = Self::ids(ctx, unit);
        let mut body = json!({ "text": text });
        let mut query = vec![("requestId", id.as_str()), ("messageId", id.as_str())];
        if let Some(thread) = thread_of(&ctx.message) {
            // A thread name answers in that thread; anything else is our own key for one.
            body["thread"] = if thread.starts_with("spaces/") {
                json!({ "name": thread })
            } else {
                json!({ "threadKey": thread })
            };
            // The default option starts a new thread whatever `thread` says.
            query.push(("messageReplyOption", "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"));
        }
        match self
            .api
            .call(
                Method::POST,
                &format!("{space}/messages"),
                &query,
                Some(&body),
            )
            .await
        {
            Ok(answer) => Self::part(&answer, unit),
            // Our id is taken: by this very unit, sent before under another request.
            Err(error) if error.status() == Some("ALREADY_EXISTS") => {
                let answer = self
                    .api
                    .call(Method::GET, &path, &[], None)
                    .await
                    .map_err(|e| e.into_send_error("spaces.messages.get"))?;
                Self::part(&answer, unit)
            }
            Err(error) => Err(error.into_send_error("spaces.messages.create")),
        }
    }

    /// Repeats an idempotent call while its answer is lost.
    async fn repeated(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Value, CallError> {
        let mut lost = CallError::Lost("no answer".into());
        for _ in 0..REPEATS {
            match self.api.call(method.clone(), path, query, body).await {
                Err(error @ CallError::Lost(_)) => lost = error,
                other => return other,
            }
        }
        Err(lost)
    }
}

#[async_trait]
impl ChannelMessageAdapter for GoogleChatAdapter {
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
        match unit.kind {
            MessagePartKind::Text | MessagePartKind::Preview => {
                self.create(ctx, unit, text_of(unit)?).await
            }
            other => Err(invalid(format!(
                "this Google Chat channel sends text only, not a {other:?} unit"
            ))),
        }
    }

    async fn edit(
        &self,
        _ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let body = json!({ "text": text_of(unit)? });
        self.repeated(
            Method::PATCH,
            &part.platform_message_id,
            &[("updateMask", "text")],
            Some(&body),
        )
        .await
        .map_err(|e| e.into_send_error("spaces.messages.patch"))?;
        let mut edited = part.clone();
        edited.kind = unit.kind;
        edited.index = unit.index;
        Ok(edited)
    }

    async fn delete(&self, _ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        match self
            .repeated(Method::DELETE, &part.platform_message_id, &[], None)
            .await
        {
            Ok(_) => Ok(()),
            // Gone already (a repeat whose first answer was lost): the outcome wanted.
            Err(error) if error.status() == Some("NOT_FOUND") => Ok(()),
            Err(error) => Err(error.into_send_error("spaces.messages.delete")),
        }
    }

    /// `GET` of the unit's client-assigned id. A 404 proves it is not there, and a resend is
    /// safe even if the first request is still on its way: both carry the same `requestId` and
    /// `messageId`, so whichever lands second answers the first's message.
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        let (_, path) = Self::ids(ctx, unit);
        match self.api.call(Method::GET, &path, &[], None).await {
            Ok(answer) => Ok(Reconciliation::Sent(Box::new(Self::part(&answer, unit)?))),
            Err(error) if error.status() == Some("NOT_FOUND") => Ok(Reconciliation::NotSent),
            Err(error) => Err(error.into_send_error("spaces.messages.get")),
        }
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        Some(&GoogleChatOrigin)
    }
}

/// The origin marker: encoded into the client-assigned message id (see [`message_id_for`]),
/// decoded from an event's or a resource's `clientAssignedMessageId` (or its name's last part).
#[derive(Debug, Clone, Copy, Default)]
pub struct GoogleChatOrigin;

impl MessageOriginAdapter for GoogleChatOrigin {
    fn encode(&self, origin: &MessageOrigin) -> Option<Value> {
        match origin {
            MessageOrigin::Clawgate(_) => {
                Some(json!({ "origin": serde_json::to_value(origin).ok()? }))
            }
            _ => None,
        }
    }

    fn decode(&self, raw: &Value) -> Option<MessageOrigin> {
        let message = raw.get("message").unwrap_or(raw);
        let id = message
            .get("clientAssignedMessageId")
            .and_then(Value::as_str)
            .or_else(|| message.get("name")?.as_str()?.rsplit('/').next())?;
        let rest = id.strip_prefix(FAILURE_PREFIX)?;
        let mut chars = rest.chars();
        let code = failure_code(chars.next()?)?;
        let hash = chars.as_str().strip_prefix('-')?;
        (hash.len() == HASH_CHARS).then(|| MessageOrigin::gateway_failure(code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_client_ids_stable_and_distinct() {
        let a = message_id_for("reply-1#0", None);
        assert_eq!(a, message_id_for("reply-1#0", None));
        assert_ne!(a, message_id_for("reply-1#1", None));
        for id in [
            a,
            message_id_for(
                "x",
                Some(&MessageOrigin::gateway_failure(
                    GatewayFailureCode::MissingApiKey,
                )),
            ),
        ] {
            assert!(id.starts_with("client-") && id.len() <= 63, "{id}");
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
                "{id}"
            );
        }
    }

    #[test]
    fn origin_markers_round_trip_through_the_client_id() {
        for code in [
            GatewayFailureCode::AgentFailedBeforeReply,
            GatewayFailureCode::MissingApiKey,
            GatewayFailureCode::ModelLoginExpired,
            GatewayFailureCode::AgentsBusy,
            GatewayFailureCode::AgentStillWorking,
        ] {
            let origin = MessageOrigin::gateway_failure(code);
            let id = message_id_for("k#0", Some(&origin));
            let event = json!({ "type": "MESSAGE", "message": { "clientAssignedMessageId": id } });
            assert_eq!(GoogleChatOrigin.decode(&event), Some(origin.clone()));
            let resource = json!({ "name": format!("spaces/S/messages/{id}") });
            assert_eq!(GoogleChatOrigin.decode(&resource), Some(origin));
        }
        let plain = json!({ "clientAssignedMessageId": message_id_for("k#0", None) });
        assert_eq!(GoogleChatOrigin.decode(&plain), None);
        // Visible text proves nothing: only the id's marker counts.
        let text_only =
            json!({ "text": "Agent failed before reply.", "name": "spaces/S/messages/abc" });
        assert_eq!(GoogleChatOrigin.decode(&text_only), None);
        assert_eq!(
            GoogleChatOrigin.decode(&json!({ "clientAssignedMessageId": "client-cgf1z-00" })),
            None
        );
    }

    #[test]
    fn a_reply_goes_to_its_thread() {
        let target = clawgate_types::MessageTarget::group("spaces/S");
        let mut message = ChannelMessage::outbound("k", "googlechat", target.clone(), "x");
        assert_eq!(thread_of(&message), None);
        message.target = target.with_thread_id(Some("spaces/S/threads/T"));
        assert_eq!(thread_of(&message).as_deref(), Some("spaces/S/threads/T"));
        assert_eq!(space_of("S"), "spaces/S");
        assert_eq!(space_of("spaces/S"), "spaces/S");
    }
}
