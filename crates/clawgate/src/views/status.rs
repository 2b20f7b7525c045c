//! `clawgate status`, `GET /v1/status`: the state directory at a glance.

use std::collections::BTreeMap;
use std::path::Path;

use clawgate_store::{InboundStatus, Store, StoreError};
use clawgate_types::{IntentStatus, LeaseState, UnixMillis};
use serde::{Deserialize, Serialize};

use super::{INBOUND_COUNT_CAP, ViewError};

/// `GET /v1/status`, `clawgate status`: the state directory at a glance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    /// Absolute path of the state directory.
    pub state_dir: String,
    /// Whether a gateway runs on the state directory (holds its lock).
    pub running: bool,
    /// The running gateway, when one answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<GatewayInfo>,
    /// Highest applied migration of the state database.
    pub schema_version: i64,
    /// The schema version this build writes.
    pub supported_schema_version: i64,
    /// Send intents per status, keyed by the `IntentStatus` values (every status, zero
    /// included).
    pub intents: BTreeMap<IntentStatus, u64>,
    /// Of the `pending` intents: live replies still streaming, with no final yet (nothing to
    /// send; left by a dead gateway, recovery cancels them and their turns run again); counted
    /// up to 10 000.
    pub replies_streaming: u64,
    /// Inbound events recorded but not finished (processed again by the next gateway start);
    /// counted up to 10 000.
    pub inbound_unfinished: u64,
    /// Inbound events that failed too often and wait for an operator; counted up to 10 000.
    pub inbound_dead_lettered: u64,
    /// Agent process leases still `open` or `closing`.
    pub open_leases: u64,
    /// Sessions in the registry (not deleted).
    pub sessions: u64,
}

/// The running gateway's process and counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayInfo {
    pub pid: u32,
    /// Base URL of the chat page and the control API.
    pub url: String,
    pub started_at: UnixMillis,
    pub turns_in_flight: u64,
    pub turns_completed: u64,
    pub turns_failed: u64,
    /// Live agent sessions (one agent process tree each).
    #[serde(default)]
    pub agent_sessions_live: u64,
    /// Of those, serving a turn right now.
    #[serde(default)]
    pub agent_sessions_in_use: u64,
    /// Turns waiting for a session: every session of their agent is busy at `max_live`.
    #[serde(default)]
    pub turns_queued: u64,
    /// Sessions closed for idleness since the start (`agents[].idle_close_secs`).
    #[serde(default)]
    pub idle_closes: u64,
    /// Idle sessions closed to make room for a waiting turn since the start.
    #[serde(default)]
    pub evictions: u64,
    /// Of those, the ones whose agent process went on to serve the waiting turn's session
    /// (`agents[].reuse_processes`) instead of ending.
    #[serde(default)]
    pub handovers: u64,
    /// Turns an agent refused because it is not logged in (not retried; the person told once).
    #[serde(default)]
    pub agent_auth_failures: u64,
    /// Prompts cancelled at their agent's `turn_timeout_secs`.
    #[serde(default)]
    pub turn_deadlines: u64,
    /// Turns a person (`/stop`) or an operator cancelled.
    #[serde(default)]
    pub turns_cancelled: u64,
    /// The configured channels, in configuration order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<ChannelSummary>,
}

/// One configured channel of the running gateway (its live state — polling, webhook, socket,
/// rate-limit backoff — is not reported yet).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChannelSummary {
    pub name: String,
    /// The channel kind (`qa`, `telegram`…).
    pub kind: String,
    pub account: String,
    /// The agent that answers on it.
    pub agent: String,
    /// What the channel says about itself (where it connects; never a secret).
    pub description: String,
}

pub async fn status(
    store: &dyn Store,
    state_dir: &Path,
    gateway: Option<GatewayInfo>,
) -> Result<StatusView, ViewError> {
    let migrations = store.migration_status().await?;
    let schema_version = migrations
        .iter()
        .filter(|m| m.applied_at.is_some())
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    let mut intents: BTreeMap<IntentStatus, u64> = clawgate_types::ALL_INTENT_STATUSES
        .into_iter()
        .map(|s| (s, 0))
        .collect();
    intents.extend(store.count_intents_by_status().await?);
    let count_inbound = |status| async move {
        let records = store.list_inbound(Some(status), INBOUND_COUNT_CAP).await?;
        Ok::<u64, StoreError>(records.len() as u64)
    };
    let open_leases = store
        .list_leases(None, &[LeaseState::Open, LeaseState::Closing])
        .await?
        .len() as u64;
    Ok(StatusView {
        state_dir: state_dir.display().to_string(),
        running: gateway.is_some(),
        gateway,
        schema_version,
        supported_schema_version: store.supported_schema_version(),
        intents,
        replies_streaming: store
            .list_intents(&clawgate_store::IntentFilter {
                statuses: vec![IntentStatus::Pending],
                limit: INBOUND_COUNT_CAP,
                ..clawgate_store::IntentFilter::default()
            })
            .await?
            .iter()
            .filter(|i| i.awaits_final())
            .count() as u64,
        inbound_unfinished: count_inbound(InboundStatus::Received).await?,
        inbound_dead_lettered: count_inbound(InboundStatus::DeadLettered).await?,
        open_leases,
        sessions: store.list_sessions().await?.len() as u64,
    })
}
