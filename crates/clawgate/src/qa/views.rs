//! The QA views: what `clawgate qa` and the chat page show and write, as plain async functions
//! over a running gateway's QA channel (the platform lives in it) and its store.

use std::sync::Arc;

use clawgate_channel_sdk::ChannelMessageAdapter as _;
use clawgate_store::IntentStore;
use clawgate_types::{IntentStatus, MessageOrigin};
use serde::{Deserialize, Serialize};

use crate::gateway::Channel;
use crate::views::{OPERATOR_SESSION_KEY, ViewError};

/// `POST /v1/qa/send` body: write into a QA conversation as a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QaSendBody {
    /// Letters, digits, `-` and `_`.
    pub conversation: String,
    pub text: String,
    /// Author id on the platform (default `operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Channel name (default: the first configured channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

/// `GET /v1/qa/messages` query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QaMessagesParams {
    pub conversation: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

/// `GET /v1/qa/messages`: what a QA conversation shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QaConversation {
    pub channel: String,
    pub conversation: String,
    pub messages: Vec<QaMessage>,
}

/// One message of a QA conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QaMessage {
    pub id: String,
    /// Platform sequence number of its creation.
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_id: Option<String>,
    /// Written by the gateway's bot (the agent's reply).
    pub from_agent: bool,
    pub text: String,
    pub edits: u32,
    pub state: QaMessageState,
    /// The gateway's marker the platform carries with the message, on the gateway's own
    /// notices (an agent that failed, every agent busy): a bot in a shared room drops their echo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<MessageOrigin>,
}

/// Where a QA message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QaMessageState {
    /// A person's message.
    Sent,
    /// An agent's live preview: its reply intent is not sent yet.
    Streaming,
    /// An agent's final reply (its intent is sent).
    Final,
}

fn valid_conversation(conversation: &str) -> Result<(), ViewError> {
    let ok = !conversation.is_empty()
        && conversation.len() <= 128
        && conversation
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(ViewError::BadRequest(format!(
            "conversation {conversation:?}: 1 to 128 letters, digits, - and _"
        )))
    }
}

/// The named channel, or the first.
pub fn pick_channel<'a>(
    channels: &'a [Arc<Channel>],
    name: Option<&str>,
) -> Result<&'a Arc<Channel>, ViewError> {
    let names = || {
        channels
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        None => channels
            .iter()
            .find(|c| super::qa_handle(c).is_ok())
            .ok_or_else(|| ViewError::NotFound("no QA channel is configured".into())),
        Some(name) => channels.iter().find(|c| c.name == name).ok_or_else(|| {
            ViewError::NotFound(format!("no channel {name:?}; configured: {}", names()))
        }),
    }
}

pub async fn qa_send(channel: &Channel, body: &QaSendBody) -> Result<QaMessage, ViewError> {
    valid_conversation(&body.conversation)?;
    if body.text.trim().is_empty() {
        return Err(ViewError::BadRequest("the message is empty".into()));
    }
    let author = body.author.as_deref().unwrap_or(OPERATOR_SESSION_KEY);
    let message = super::inject(channel, &body.conversation, author, &body.text).await?;
    Ok(QaMessage {
        id: message.id,
        seq: message.seq,
        author_id: message.author_id,
        from_agent: message.author_is_bot,
        text: message.text,
        edits: message.edits,
        state: QaMessageState::Sent,
        origin: None,
    })
}

pub async fn qa_messages<S: IntentStore + ?Sized>(
    store: &S,
    channel: &Channel,
    conversation: &str,
) -> Result<QaConversation, ViewError> {
    valid_conversation(conversation)?;
    let adapter = &super::qa_handle(channel)
        .map_err(ViewError::BadRequest)?
        .adapter;
    let listed = adapter
        .list_messages(conversation)
        .await
        .map_err(|e| ViewError::Upstream(format!("QA platform: {}", e.message)))?;
    let mut messages = Vec::with_capacity(listed.len());
    for message in listed {
        // Read back as the channel reads a marker on any event of its platform.
        let origin = adapter.origin().and_then(|marker| {
            serde_json::to_value(&message)
                .ok()
                .and_then(|raw| marker.decode(&raw))
        });
        let from_agent = message.author_is_bot || message.author_id.is_none();
        let state = if from_agent {
            agent_message_state(store, message.idempotency_key.as_deref()).await
        } else {
            QaMessageState::Sent
        };
        messages.push(QaMessage {
            id: message.id,
            seq: message.seq,
            author_id: message.author_id,
            from_agent,
            text: message.text,
            edits: message.edits,
            state,
            origin,
        });
    }
    Ok(QaConversation {
        channel: channel.name.clone(),
        conversation: conversation.to_owned(),
        messages,
    })
}

/// `final` once the reply intent behind an agent message is sent, `streaming` before.
async fn agent_message_state<S: IntentStore + ?Sized>(
    store: &S,
    unit_key: Option<&str>,
) -> QaMessageState {
    let Some(intent_key) = unit_key.and_then(clawgate_messages::intent_key_of_unit) else {
        return QaMessageState::Final;
    };
    match store.find_intent_by_key(intent_key).await {
        Ok(Some(intent)) if intent.status != IntentStatus::Sent => QaMessageState::Streaming,
        _ => QaMessageState::Final,
    }
}
