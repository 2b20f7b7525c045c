//! `clawgate inbox`, `GET /v1/inbox`: the inbound event records.

use clawgate_store::{InboundRecord, InboundStatus, InboundStore};
use clawgate_types::UnixMillis;
use serde::{Deserialize, Serialize};

use super::{ViewError, limit_of, preview};

/// Where an inbound event is in its processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InboxStatus {
    /// Recorded, not finished (processed again after a restart).
    Received,
    /// Handled: a redelivery is a duplicate.
    Completed,
    /// Failed too many times; kept for operators, never retried automatically.
    DeadLettered,
}

impl From<InboundStatus> for InboxStatus {
    fn from(status: InboundStatus) -> Self {
        match status {
            InboundStatus::Received => InboxStatus::Received,
            InboundStatus::Completed => InboxStatus::Completed,
            InboundStatus::DeadLettered => InboxStatus::DeadLettered,
        }
    }
}

impl From<InboxStatus> for InboundStatus {
    fn from(status: InboxStatus) -> Self {
        match status {
            InboxStatus::Received => InboundStatus::Received,
            InboxStatus::Completed => InboundStatus::Completed,
            InboxStatus::DeadLettered => InboundStatus::DeadLettered,
        }
    }
}

/// `GET /v1/inbox` query, `clawgate inbox list` options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboxListParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<InboxStatus>,
    /// At most this many records (default 50, at most 1000), newest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/inbox`: inbound event records, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboxList {
    pub records: Vec<InboundSummary>,
    pub more: bool,
}

/// One inbound event record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundSummary {
    pub channel: String,
    pub account_id: String,
    pub event_id: String,
    pub status: InboxStatus,
    /// Processing attempts that ended so far.
    pub attempts: u32,
    /// The first error of a failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The conversation (target id) it came from, when the record says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<String>,
    pub received_at: UnixMillis,
    pub updated_at: UnixMillis,
    /// The message text, whitespace collapsed, at most 80 characters.
    pub preview: String,
}

impl InboundSummary {
    pub fn of(record: &InboundRecord) -> InboundSummary {
        // The payload is the normalized message (a `ChannelMessage`), kept as JSON.
        let text = record
            .payload
            .pointer("/body/text")
            .and_then(|t| t.as_str())
            .unwrap_or_default();
        InboundSummary {
            channel: record.channel.clone(),
            account_id: record.account_id.clone(),
            event_id: record.event_id.clone(),
            status: record.status.into(),
            attempts: record.attempts,
            last_error: record.last_error.clone(),
            conversation: record
                .payload
                .pointer("/target/id")
                .and_then(|t| t.as_str())
                .map(str::to_owned),
            received_at: record.received_at,
            updated_at: record.updated_at,
            preview: preview(text),
        }
    }
}

pub async fn inbox_list<S: InboundStore + ?Sized>(
    store: &S,
    params: &InboxListParams,
) -> Result<InboxList, ViewError> {
    let limit = limit_of(params.limit)?;
    let mut records = store
        .list_inbound(params.status.map(Into::into), limit + 1)
        .await?;
    let more = records.len() > limit as usize;
    records.truncate(limit as usize);
    Ok(InboxList {
        records: records.iter().map(InboundSummary::of).collect(),
        more,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    #[test]
    fn inbound_summary_reads_the_normalized_message() {
        let record = InboundRecord {
            channel: "qa".into(),
            account_id: "default".into(),
            event_id: "7".into(),
            status: InboundStatus::DeadLettered,
            attempts: 5,
            payload: serde_json::json!({"target": {"id": "room"}, "body": {"text": "hi\nthere"}}),
            last_error: Some("agent crashed".into()),
            received_at: 1,
            updated_at: 2,
        };
        let summary = InboundSummary::of(&record);
        assert_eq!(summary.status, InboxStatus::DeadLettered);
        assert_eq!(summary.conversation.as_deref(), Some("room"));
        assert_eq!(summary.preview, "hi there");
        assert_eq!(
            serde_json::to_value(&summary).unwrap()["status"],
            "dead_lettered"
        );
    }
}
