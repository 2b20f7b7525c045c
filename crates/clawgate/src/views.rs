//! The operator views: what `clawgate status | outbox | inbox | leases | sessions | qa` show and
//! change, as plain async functions over the store, the session tools and the lease controller.
//!
//! The CLI calls them directly on a stopped gateway's state directory; the control API
//! ([`crate::control`]) serves the same functions from a running gateway. Both modes therefore
//! answer with the same wire shapes — the types below (the session tools' results are
//! `clawgate-awareness`'s own, re-exported), whose JSON Schemas `cargo xtask codegen` writes to
//! `docs/schema/`.
//!
//! Invariants:
//! * intent changes go through `IntentStatus::can_transition_to` and the store's compare-and-set:
//!   a concurrent change or a live claim is refused, never overwritten;
//! * the operator is an unsandboxed requester with visibility `all` and every agent allowed —
//!   it sees every session, and nothing else is widened for anyone.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use clawgate_acpx::{AcpxError, CloseOutcome, LifecycleController};
use clawgate_awareness::{self as aw, AwarenessError, AwarenessStore, Requester, SessionTools};
use clawgate_store::{
    InboundRecord, InboundStatus, InboundStore, InstanceStore, IntentFilter, IntentStore,
    LeaseStore, SessionStore, SqliteOptions, SqliteStore, StoreError,
};
use clawgate_types::{
    AcpxProcessLease, AgentToAgentPolicy, DeliveryFailure, DeliveryFailureKind, DurableSendIntent,
    FailureReason, IntentId, IntentStatus, LeaseId, LeaseState, SessionKey, SessionVisibility,
    StateVersion, UnixMillis,
};
use serde::{Deserialize, Serialize};

use crate::config::SessionsSection;

/// Rows a listing returns unless told otherwise.
pub const DEFAULT_LIMIT: u32 = 50;
/// The most rows one listing returns (page with filters beyond that).
pub const MAX_LIMIT: u32 = 1_000;
/// Inbound counts in `status` stop here (the store has no count query; the records carry
/// payloads, so counting means reading them).
pub const INBOUND_COUNT_CAP: u32 = 10_000;
/// Characters of message text shown in listings.
pub const PREVIEW_CHARS: usize = 80;
/// The session key the operator acts as in the session tools (and `session:operator` is the
/// author of what it sends into a conversation).
pub const OPERATOR_SESSION_KEY: &str = "operator";

/// Why a view could not answer. Each message says what to do; the control API maps the kind
/// to an HTTP status ([`ViewError::http_status`]).
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    /// The change is not legal from the current state, or someone else changed it first.
    #[error("{0}")]
    Conflict(String),
    /// Needs a running gateway (its QA platform, its agents).
    #[error("{0}")]
    NeedsGateway(String),
    /// A platform the gateway talks to failed.
    #[error("{0}")]
    Upstream(String),
    // Boxed: these are large, and every view returns this error.
    #[error("state database: {0}")]
    Store(Box<StoreError>),
    #[error("session tools: {0}")]
    Sessions(Box<AwarenessError>),
    #[error("agent leases: {0}")]
    Acpx(Box<AcpxError>),
}

impl ViewError {
    pub fn http_status(&self) -> u16 {
        match self {
            ViewError::BadRequest(_) => 400,
            ViewError::NotFound(_) => 404,
            ViewError::Conflict(_) => 409,
            ViewError::NeedsGateway(_) => 503,
            ViewError::Upstream(_) => 502,
            ViewError::Store(_) | ViewError::Sessions(_) | ViewError::Acpx(_) => 500,
        }
    }
}

impl From<StoreError> for ViewError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::NotFound { .. } => ViewError::NotFound(error.to_string()),
            StoreError::IntentStatusConflict { .. }
            | StoreError::IllegalTransition { .. }
            | StoreError::ClaimHeld { .. }
            | StoreError::StaleIntent { .. }
            | StoreError::LeaseStateConflict { .. } => ViewError::Conflict(format!(
                "{error}; look again (`clawgate outbox show`) and retry if it still applies"
            )),
            other => ViewError::Store(Box::new(other)),
        }
    }
}

impl From<AwarenessError> for ViewError {
    fn from(error: AwarenessError) -> Self {
        match error {
            AwarenessError::NotVisible { .. } | AwarenessError::UnknownSession { .. } => {
                ViewError::NotFound(format!("{error} (`clawgate sessions list` shows them)"))
            }
            AwarenessError::InvalidInput(_) => ViewError::BadRequest(error.to_string()),
            AwarenessError::Delivery { .. } => ViewError::Upstream(error.to_string()),
            AwarenessError::Store(e) => ViewError::from(e),
            other => ViewError::Sessions(Box::new(other)),
        }
    }
}

impl From<AcpxError> for ViewError {
    fn from(error: AcpxError) -> Self {
        match error {
            AcpxError::Store(e) => ViewError::from(e),
            other => ViewError::Acpx(Box::new(other)),
        }
    }
}

/// Every control API error: the status code says the kind (400 bad parameters, 401 no or
/// wrong token, 404 unknown intent or session, 409 illegal transition or changed meanwhile,
/// 502 a platform failed, 503 needs what is not there), `error` says what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    pub error: String,
}

// ---------------------------------------------------------------------------------------------
// Status

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
}

pub async fn status(
    store: &SqliteStore,
    state_dir: &Path,
    gateway: Option<GatewayInfo>,
) -> Result<StatusView, ViewError> {
    let db = store.path().to_path_buf();
    let migrations = tokio::task::spawn_blocking(move || {
        clawgate_store::sqlite::migration_status(&db, &SqliteOptions::default())
    })
    .await
    .map_err(|e| ViewError::from(StoreError::Backend(Box::new(e))))??;
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
        supported_schema_version: clawgate_store::sqlite::SCHEMA_VERSION,
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

// ---------------------------------------------------------------------------------------------
// Outbox

/// `GET /v1/outbox` query, `clawgate outbox list` options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxListParams {
    /// Comma-separated statuses (`failed,unknown_after_send`); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// At most this many intents (default 50, at most 1000), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/outbox`: send intents, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxList {
    pub intents: Vec<IntentSummary>,
    /// More intents match than the limit allowed.
    pub more: bool,
}

/// One send intent as a listing shows it (`GET /v1/outbox/{id}` has the whole intent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IntentSummary {
    pub id: IntentId,
    pub status: IntentStatus,
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// The conversation (target id) the message goes to.
    pub target: String,
    pub idempotency_key: String,
    /// Send attempts so far.
    pub attempt: u32,
    /// Class of the last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_kind: Option<DeliveryFailureKind>,
    /// Why the intent failed (beyond the class of its last attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<FailureReason>,
    /// The adapter's description of the last failure (never message content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<UnixMillis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
    pub created_at: UnixMillis,
    pub updated_at: UnixMillis,
    /// A live reply whose stream has not produced its final: nothing to send. If its gateway
    /// is gone, recovery removes its preview and cancels it, and the message's turn runs again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub awaits_final: bool,
    /// The message text, whitespace collapsed, at most 80 characters.
    pub preview: String,
}

impl IntentSummary {
    pub fn of(intent: &DurableSendIntent) -> IntentSummary {
        let failure = intent.failure.as_ref();
        let text = match &intent.message.body {
            Some(body) => body.text.clone(),
            // A batch rendered without a body (media…): show what its units say.
            None => intent
                .batch
                .iter()
                .flat_map(|b| &b.units)
                .filter_map(|u| u.payload.get("text").and_then(|t| t.as_str()))
                .collect::<Vec<_>>()
                .join(" "),
        };
        IntentSummary {
            id: intent.id.clone(),
            status: intent.status,
            channel: intent.channel.clone(),
            account_id: intent.account_id.clone(),
            target: intent.message.target.id.clone(),
            idempotency_key: intent.idempotency_key.clone(),
            attempt: intent.attempt,
            failure_kind: failure.map(|f| f.kind),
            failure_reason: failure.and_then(|f| f.reason),
            failure_message: failure.map(|f| f.message.clone()),
            next_attempt_at: intent.next_attempt_at,
            expires_at: intent.expires_at,
            created_at: intent.created_at,
            updated_at: intent.updated_at,
            awaits_final: intent.awaits_final(),
            preview: preview(&text),
        }
    }
}

/// `POST /v1/outbox/{id}/retry` and `/cancel`: what changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxAction {
    pub intent: IntentSummary,
    pub previous_status: IntentStatus,
    /// Something the operator should know about the change (a possible duplicate…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// Text on one line, at most [`PREVIEW_CHARS`] characters (an ellipsis marks a cut).
pub fn preview(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= PREVIEW_CHARS {
        return line;
    }
    let mut cut: String = line.chars().take(PREVIEW_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// Parses `failed,unknown_after_send` (spaces allowed).
pub fn parse_statuses(text: &str) -> Result<Vec<IntentStatus>, ViewError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            IntentStatus::parse(s).ok_or_else(|| {
                let known: Vec<&str> = clawgate_types::ALL_INTENT_STATUSES
                    .iter()
                    .map(|s| s.as_str())
                    .collect();
                ViewError::BadRequest(format!(
                    "unknown intent status {s:?}: use one of {}",
                    known.join(", ")
                ))
            })
        })
        .collect()
}

fn limit_of(limit: Option<u32>) -> Result<u32, ViewError> {
    match limit.unwrap_or(DEFAULT_LIMIT) {
        0 => Err(ViewError::BadRequest("limit must be at least 1".into())),
        n if n > MAX_LIMIT => Err(ViewError::BadRequest(format!(
            "limit {n} is above {MAX_LIMIT}: narrow the listing with a status filter"
        ))),
        n => Ok(n),
    }
}

pub async fn outbox_list<S: IntentStore + ?Sized>(
    store: &S,
    params: &OutboxListParams,
) -> Result<OutboxList, ViewError> {
    let limit = limit_of(params.limit)?;
    let filter = IntentFilter {
        statuses: parse_statuses(params.status.as_deref().unwrap_or(""))?,
        channel: params.channel.clone(),
        after: None,
        // One more than shown tells whether more exist.
        limit: limit + 1,
    };
    let mut intents = store.list_intents(&filter).await?;
    let more = intents.len() > limit as usize;
    intents.truncate(limit as usize);
    Ok(OutboxList {
        intents: intents.iter().map(IntentSummary::of).collect(),
        more,
    })
}

async fn load_intent<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
) -> Result<DurableSendIntent, ViewError> {
    let parsed = IntentId::parse(id).map_err(|e| ViewError::BadRequest(e.to_string()))?;
    store.load_intent(&parsed).await?.ok_or_else(|| {
        ViewError::NotFound(format!(
            "no send intent {id}: `clawgate outbox list` shows the intents (sent and cancelled \
             ones are removed after `retention.outbox_days`)"
        ))
    })
}

/// `GET /v1/outbox/{id}`: the whole stored intent.
pub async fn outbox_show<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
) -> Result<DurableSendIntent, ViewError> {
    load_intent(store, id).await
}

/// Why an operator action does not apply to a status.
fn not_applicable(action: &str, id: &str, status: IntentStatus) -> ViewError {
    let why = match status {
        IntentStatus::Pending => "it is pending: the gateway sends it when it is due",
        IntentStatus::Sending | IntentStatus::Committing => {
            "it is being sent right now: wait for the outcome and look again"
        }
        IntentStatus::Sent => "it was sent already",
        IntentStatus::Cancelled => "it was cancelled, which is final",
        IntentStatus::Failed | IntentStatus::UnknownAfterSend => "its status forbids it",
    };
    ViewError::Conflict(format!(
        "cannot {action} send intent {id} ({status}): {why}"
    ))
}

/// Failed or unknown-outcome intent → `pending`, due now, with a fresh attempt budget and
/// time-to-live (the operator decided it should go out after all).
///
/// For `unknown_after_send` this is the operator's explicit choice: the units without a
/// receipt are sent again, which duplicates them on a platform without reconciliation if they
/// had landed.
pub async fn outbox_retry<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
    now: UnixMillis,
) -> Result<OutboxAction, ViewError> {
    let mut intent = load_intent(store, id).await?;
    let previous = intent.status;
    if !matches!(
        previous,
        IntentStatus::Failed | IntentStatus::UnknownAfterSend
    ) || !previous.can_transition_to(IntentStatus::Pending)
    {
        return Err(not_applicable("retry", id, previous));
    }
    // An expired intent would expire again at once: give it its time-to-live anew.
    let ttl = intent
        .expires_at
        .map(|at| at.saturating_sub(intent.created_at).max(0));
    intent.expires_at = ttl.map(|ttl| now.saturating_add(ttl));
    intent.status = IntentStatus::Pending;
    intent.attempt = 0;
    intent.next_attempt_at = Some(now);
    intent.updated_at = now;
    store.save_intent(&intent, previous, None).await?;
    let warning = (previous == IntentStatus::UnknownAfterSend).then(|| {
        "the earlier outcome was unknown: units without a receipt are sent again, which \
         duplicates them on a platform without reconciliation if they had landed"
            .to_owned()
    });
    Ok(OutboxAction {
        intent: IntentSummary::of(&intent),
        previous_status: previous,
        warning,
    })
}

/// Pending, failed or unknown-outcome intent → `cancelled` (final), reason
/// `operator_cancelled`.
pub async fn outbox_cancel<S: IntentStore + ?Sized>(
    store: &S,
    id: &str,
    now: UnixMillis,
) -> Result<OutboxAction, ViewError> {
    let mut intent = load_intent(store, id).await?;
    let previous = intent.status;
    if !matches!(
        previous,
        IntentStatus::Pending | IntentStatus::Failed | IntentStatus::UnknownAfterSend
    ) || !previous.can_transition_to(IntentStatus::Cancelled)
    {
        return Err(not_applicable("cancel", id, previous));
    }
    intent.status = IntentStatus::Cancelled;
    intent.next_attempt_at = None;
    intent.failure = Some(DeliveryFailure {
        kind: DeliveryFailureKind::Cancelled,
        message: "cancelled by an operator".into(),
        reason: Some(FailureReason::OperatorCancelled),
        retry_after_ms: None,
        platform_code: None,
        at: now,
    });
    intent.updated_at = now;
    store.save_intent(&intent, previous, None).await?;
    let warning = (previous == IntentStatus::UnknownAfterSend)
        .then(|| "the outcome was unknown: the platform may show the message anyway".to_owned());
    Ok(OutboxAction {
        intent: IntentSummary::of(&intent),
        previous_status: previous,
        warning,
    })
}

// ---------------------------------------------------------------------------------------------
// Inbox

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

// ---------------------------------------------------------------------------------------------
// Leases

/// `GET /v1/leases` query, `clawgate leases list` options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeasesListParams {
    /// Comma-separated states (`open,closing`); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// At most this many leases (default 50, at most 1000), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/leases`: agent process leases, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseList {
    pub leases: Vec<LeaseSummary>,
    pub more: bool,
}

/// One agent process lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSummary {
    pub lease_id: LeaseId,
    pub state: LeaseState,
    pub session_key: SessionKey,
    /// The wrapper process (unknown until it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_group_id: Option<u32>,
    pub started_at: UnixMillis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<UnixMillis>,
}

impl LeaseSummary {
    pub fn of(lease: &AcpxProcessLease) -> LeaseSummary {
        LeaseSummary {
            lease_id: lease.lease_id.clone(),
            state: lease.state,
            session_key: lease.session_key.clone(),
            root_pid: lease.root_pid,
            process_group_id: lease.process_group_id,
            started_at: lease.started_at,
            ended_at: lease.ended_at,
        }
    }
}

const ALL_LEASE_STATES: [LeaseState; 4] = [
    LeaseState::Open,
    LeaseState::Closing,
    LeaseState::Closed,
    LeaseState::Lost,
];

/// Parses `open,closing`.
pub fn parse_lease_states(text: &str) -> Result<Vec<LeaseState>, ViewError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            ALL_LEASE_STATES
                .into_iter()
                .find(|state| state.as_str() == s)
                .ok_or_else(|| {
                    ViewError::BadRequest(format!(
                        "unknown lease state {s:?}: use one of open, closing, closed, lost"
                    ))
                })
        })
        .collect()
}

pub async fn leases_list<S: LeaseStore + ?Sized>(
    store: &S,
    params: &LeasesListParams,
) -> Result<LeaseList, ViewError> {
    let limit = limit_of(params.limit)? as usize;
    let mut states = parse_lease_states(params.state.as_deref().unwrap_or(""))?;
    if states.is_empty() {
        states = ALL_LEASE_STATES.to_vec();
    }
    let mut leases = store.list_leases(None, &states).await?;
    let more = leases.len() > limit;
    leases.truncate(limit);
    Ok(LeaseList {
        leases: leases.iter().map(LeaseSummary::of).collect(),
        more,
    })
}

/// `POST /v1/leases/reap`: what reaping did with each lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReapSummary {
    pub outcomes: Vec<ReapOutcome>,
    /// Finished leases removed by retention.
    pub pruned: u64,
}

/// One lease's reaping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReapOutcome {
    pub lease_id: LeaseId,
    pub result: ReapResult,
    /// Which processes were signalled, or why nothing was.
    pub detail: String,
}

/// What reaping did with one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReapResult {
    /// Verified as this instance's and ended; the lease is `closed`.
    Closed,
    /// The process was already gone; the lease is `lost`. Nothing was signalled.
    Lost,
    /// Ownership could not be verified: nothing was signalled, the lease is unchanged.
    Refused,
    /// The lease had finished already.
    AlreadyFinished,
}

impl ReapOutcome {
    fn of(lease_id: LeaseId, outcome: &CloseOutcome) -> ReapOutcome {
        let (result, detail) = match outcome {
            CloseOutcome::Closed(t) => (
                ReapResult::Closed,
                format!(
                    "TERM {:?}, KILL {:?}{}",
                    t.termed,
                    t.killed,
                    if t.survivors.is_empty() {
                        String::new()
                    } else {
                        format!(", survivors {:?}", t.survivors)
                    }
                ),
            ),
            CloseOutcome::Lost(why) => (ReapResult::Lost, why.clone()),
            CloseOutcome::Refused(why) => (ReapResult::Refused, why.clone()),
            CloseOutcome::AlreadyFinished(state) => {
                (ReapResult::AlreadyFinished, state.as_str().to_owned())
            }
        };
        ReapOutcome {
            lease_id,
            result,
            detail,
        }
    }
}

/// Ends the agent processes of this instance's unfinished leases that no live session of
/// `controller` owns — only ever processes verified as this instance's.
pub async fn leases_reap<S>(
    controller: &LifecycleController<S>,
    now: UnixMillis,
) -> Result<ReapSummary, ViewError>
where
    S: LeaseStore + SessionStore + InstanceStore + 'static,
{
    let report = controller.reap_startup_orphans(now).await?;
    Ok(ReapSummary {
        outcomes: report
            .outcomes
            .iter()
            .map(|(id, outcome)| ReapOutcome::of(id.clone(), outcome))
            .collect(),
        pruned: report.pruned,
    })
}

// ---------------------------------------------------------------------------------------------
// Sessions: the session tools, with the operator as requester.

/// The operator as a session-tools requester: visibility `all`, every agent allowed, not
/// sandboxed. `from` lets it act as a session (a watch needs an agent-qualified watcher).
pub fn operator_requester(from: Option<SessionKey>) -> Requester {
    let session_key = from.unwrap_or_else(|| {
        SessionKey::parse(OPERATOR_SESSION_KEY).expect("the operator key is a valid session key")
    });
    Requester {
        session_key,
        visibility: SessionVisibility::All,
        a2a_policy: AgentToAgentPolicy {
            enabled: true,
            allow: vec!["*".into()],
        },
        sandboxed: false,
    }
}

/// The session tools' own wire types, which the control API serves as they are.
pub use clawgate_awareness::{
    SendStatus, SessionListEntry, SessionStatusResult, SessionsHistoryResult, SessionsListParams,
    SessionsListResult, SessionsSendResult, StateChanges,
};

// The tools' parameters name their session; the control API takes it from the path, so its
// query and body types below are the parameters without the key.

/// `GET /v1/sessions/{key}/history` query (`sessions_history` without the key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionsHistoryParams {
    /// The newest this many retained events (capped by the gateway, 200 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/sessions/{key}` query (`session_status` without the key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatusParams {
    /// With a version: the typed events after it (`stateChanges`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes_since: Option<u64>,
}

/// `POST /v1/sessions/{key}/send` body (`sessions_send` without the key, with the sender).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionsSendBody {
    pub message: String,
    /// After the send, the sender watches the receiving session (needs an agent-qualified
    /// `from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<bool>,
    /// The session sending it (default: `operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<SessionKey>,
}

pub fn parse_session_key(text: &str) -> Result<SessionKey, ViewError> {
    SessionKey::parse(text).map_err(|e| ViewError::BadRequest(e.to_string()))
}

pub async fn sessions_list<S: AwarenessStore + 'static>(
    tools: &SessionTools<S>,
    params: &SessionsListParams,
) -> Result<SessionsListResult, ViewError> {
    Ok(tools
        .sessions_list(&operator_requester(None), params)
        .await?)
}

pub async fn sessions_history<S: AwarenessStore + 'static>(
    tools: &SessionTools<S>,
    key: SessionKey,
    params: &SessionsHistoryParams,
) -> Result<SessionsHistoryResult, ViewError> {
    Ok(tools
        .sessions_history(
            &operator_requester(None),
            &aw::SessionsHistoryParams {
                session_key: key,
                limit: params.limit,
            },
        )
        .await?)
}

pub async fn session_status<S: AwarenessStore + 'static>(
    tools: &SessionTools<S>,
    key: SessionKey,
    params: &SessionStatusParams,
) -> Result<SessionStatusResult, ViewError> {
    Ok(tools
        .session_status(
            &operator_requester(None),
            &aw::SessionStatusParams {
                session_key: key,
                changes_since: params.changes_since.map(StateVersion),
            },
        )
        .await?)
}

/// Who sends: the operator when `from` is absent; a session (`from`) sends under the
/// configured visibility and agent-to-agent policy, like any session-tool call of that session.
pub fn sender_requester(from: Option<SessionKey>, policy: &SessionsSection) -> Requester {
    match from {
        None => operator_requester(None),
        Some(session_key) => Requester {
            session_key,
            visibility: policy.visibility,
            a2a_policy: policy.a2a.clone(),
            sandboxed: false,
        },
    }
}

pub async fn sessions_send<S: AwarenessStore + 'static>(
    tools: &SessionTools<S>,
    policy: &SessionsSection,
    key: SessionKey,
    body: &SessionsSendBody,
) -> Result<SessionsSendResult, ViewError> {
    if body.message.trim().is_empty() {
        return Err(ViewError::BadRequest("the message is empty".into()));
    }
    Ok(tools
        .sessions_send(
            &sender_requester(body.from.clone(), policy),
            &aw::SessionsSendParams {
                session_key: key,
                message: body.message.clone(),
                watch: body.watch,
            },
        )
        .await?)
}

/// The delivery of a stopped gateway: there is nobody to deliver to.
#[derive(Debug)]
pub struct NoDelivery;

#[async_trait::async_trait]
impl aw::SessionDelivery for NoDelivery {
    async fn deliver(
        &self,
        _from: &SessionKey,
        _to: &SessionKey,
        _message: &str,
    ) -> Result<SessionKey, Box<dyn std::error::Error + Send + Sync>> {
        Err(NEEDS_GATEWAY_TO_SEND.into())
    }
}

pub const NEEDS_GATEWAY_TO_SEND: &str = "sending into a session needs a running gateway (it \
     delivers through the session's conversation): start one with `clawgate up`";

/// The session tools over a store, for a stopped gateway (reads only; sends are refused).
pub fn offline_tools(store: Arc<SqliteStore>) -> SessionTools<SqliteStore> {
    let awareness = Arc::new(aw::Awareness::builder(store).build());
    SessionTools::new(awareness, Arc::new(NoDelivery))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;
    use clawgate_store::testing::sample_intent;

    fn store() -> SqliteStore {
        SqliteStore::open_in_memory(SqliteOptions::default()).unwrap()
    }

    #[test]
    fn preview_is_one_line_and_bounded() {
        assert_eq!(preview("  hello\n\tworld  "), "hello world");
        let long = "x".repeat(200);
        let cut = preview(&long);
        assert_eq!(cut.chars().count(), PREVIEW_CHARS);
        assert!(cut.ends_with('…'));
        let exact = "é".repeat(PREVIEW_CHARS);
        assert_eq!(
            preview(&exact),
            exact,
            "multi-byte text at the limit is kept whole"
        );
    }

    #[test]
    fn statuses_parse_with_a_helpful_error() {
        assert_eq!(
            parse_statuses("failed, unknown_after_send").unwrap(),
            [IntentStatus::Failed, IntentStatus::UnknownAfterSend]
        );
        assert_eq!(parse_statuses("").unwrap(), []);
        let err = parse_statuses("failed,lost").unwrap_err().to_string();
        assert!(
            err.contains("\"lost\"") && err.contains("unknown_after_send"),
            "{err}"
        );
        assert_eq!(
            parse_lease_states("open,closing").unwrap(),
            [LeaseState::Open, LeaseState::Closing]
        );
        assert!(parse_lease_states("gone").is_err());
    }

    #[test]
    fn intent_summary_carries_the_failure_and_a_preview() {
        let mut intent = sample_intent(1, 1_000);
        intent.status = IntentStatus::Failed;
        intent.failure = Some(DeliveryFailure {
            kind: DeliveryFailureKind::Auth,
            message: "token rejected".into(),
            reason: Some(FailureReason::AwaitingConfiguration),
            retry_after_ms: None,
            platform_code: Some("401".into()),
            at: 2_000,
        });
        let summary = IntentSummary::of(&intent);
        assert_eq!(summary.status, IntentStatus::Failed);
        assert_eq!(summary.target, "room-1");
        assert_eq!(summary.failure_kind, Some(DeliveryFailureKind::Auth));
        assert_eq!(
            summary.failure_reason,
            Some(FailureReason::AwaitingConfiguration)
        );
        assert_eq!(summary.preview, "reply 1");
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["failureReason"], "awaiting_configuration");
        assert_eq!(json["idempotencyKey"], "key-1");
        assert!(
            json.get("nextAttemptAt").is_none(),
            "absent, not null: {json}"
        );
    }

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

    /// One row per (start status, action): whether the operator may do it.
    #[tokio::test]
    async fn operator_actions_follow_the_transition_table() {
        use IntentStatus::*;
        let cases: &[(IntentStatus, &str, bool)] = &[
            (Failed, "retry", true),
            (UnknownAfterSend, "retry", true),
            (Pending, "retry", false),
            (Sending, "retry", false),
            (Sent, "retry", false),
            (Cancelled, "retry", false),
            (Pending, "cancel", true),
            (Failed, "cancel", true),
            (UnknownAfterSend, "cancel", true),
            (Sending, "cancel", false),
            (Committing, "cancel", false),
            (Sent, "cancel", false),
        ];
        let store = store();
        for (n, (start, action, allowed)) in cases.iter().enumerate() {
            let intent = sample_intent(n as u64 + 1, 1_000);
            store.insert_intent(&intent, None).await.unwrap();
            // Walk the intent to its start status through legal moves.
            let path: &[IntentStatus] = match start {
                Pending => &[],
                Sending => &[Sending],
                Committing => &[Sending, Committing],
                UnknownAfterSend => &[Sending, UnknownAfterSend],
                Sent => &[Sending, Committing, Sent],
                Failed => &[Failed],
                Cancelled => &[Cancelled],
            };
            let mut current = intent.clone();
            for next in path {
                let before = current.status;
                current.status = *next;
                store.save_intent(&current, before, None).await.unwrap();
            }
            let id = intent.id.as_str();
            let result = match *action {
                "retry" => outbox_retry(&store, id, 5_000).await,
                _ => outbox_cancel(&store, id, 5_000).await,
            };
            let case = format!("{action} from {start}");
            match (result, allowed) {
                (Ok(done), true) => {
                    let expected = if *action == "retry" {
                        Pending
                    } else {
                        Cancelled
                    };
                    assert_eq!(done.intent.status, expected, "{case}");
                    assert_eq!(done.previous_status, *start, "{case}");
                    assert_eq!(done.warning.is_some(), *start == UnknownAfterSend, "{case}");
                    let stored = store.load_intent(&intent.id).await.unwrap().unwrap();
                    assert_eq!(stored.status, expected, "{case}: stored");
                    if expected == Pending {
                        assert_eq!(stored.next_attempt_at, Some(5_000), "{case}: due now");
                        assert_eq!(stored.attempt, 0, "{case}: fresh budget");
                    } else {
                        let reason = stored.failure.and_then(|f| f.reason);
                        assert_eq!(reason, Some(FailureReason::OperatorCancelled), "{case}");
                    }
                }
                (Err(ViewError::Conflict(message)), false) => {
                    assert!(message.contains(start.as_str()), "{case}: {message}");
                }
                (other, _) => panic!("{case}: unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn retry_gives_an_expired_intent_its_time_to_live_again() {
        let store = store();
        let mut intent = sample_intent(1, 1_000);
        intent.expires_at = Some(61_000);
        store.insert_intent(&intent, None).await.unwrap();
        intent.status = IntentStatus::Failed;
        store
            .save_intent(&intent, IntentStatus::Pending, None)
            .await
            .unwrap();
        let done = outbox_retry(&store, intent.id.as_str(), 100_000)
            .await
            .unwrap();
        assert_eq!(done.intent.expires_at, Some(160_000));
    }

    #[tokio::test]
    async fn unknown_intents_are_404_and_bad_ids_400() {
        let store = store();
        let missing = outbox_show(&store, "no-such-intent").await.unwrap_err();
        assert_eq!(missing.http_status(), 404, "{missing}");
        let bad = outbox_show(&store, "spaces are not ids").await.unwrap_err();
        assert_eq!(bad.http_status(), 400, "{bad}");
    }

    #[tokio::test]
    async fn listings_say_when_more_exist() {
        let store = store();
        for n in 1..=3 {
            store
                .insert_intent(&sample_intent(n, 1_000 + n as i64), None)
                .await
                .unwrap();
        }
        let params = |limit| OutboxListParams {
            limit: Some(limit),
            ..OutboxListParams::default()
        };
        let two = outbox_list(&store, &params(2)).await.unwrap();
        assert_eq!(two.intents.len(), 2);
        assert!(two.more);
        let all = outbox_list(&store, &params(3)).await.unwrap();
        assert!(!all.more);
        assert!(outbox_list(&store, &params(0)).await.is_err());
        let failed = OutboxListParams {
            status: Some("failed".into()),
            ..OutboxListParams::default()
        };
        assert!(
            outbox_list(&store, &failed)
                .await
                .unwrap()
                .intents
                .is_empty()
        );
    }

    #[test]
    fn a_session_sends_under_the_configured_visibility() {
        let row = clawgate_store::SessionRow {
            session_key: SessionKey::parse("agent:other:qa:room").unwrap(),
            agent_id: "other".into(),
            owner_session_key: None,
            spawned_by: None,
            parent_session_key: None,
            label: None,
            acp_owner: None,
            lease_id: None,
            created_at: 0,
            updated_at: 0,
            reset_at: None,
            deleted_at: None,
        };
        let from = Some(SessionKey::parse("agent:main:qa:dm-1").unwrap());
        let tree = crate::config::SessionsSection::default();
        assert!(
            !sender_requester(from.clone(), &tree).can_see(&row),
            "tree: another agent's session is out of reach"
        );
        let all = crate::config::SessionsSection {
            visibility: SessionVisibility::All,
            a2a: AgentToAgentPolicy {
                enabled: true,
                allow: vec!["oth*".into()],
            },
        };
        assert!(
            sender_requester(from, &all).can_see(&row),
            "all + a2a allow"
        );
        assert!(
            sender_requester(None, &tree).can_see(&row),
            "the operator sees every session whatever the policy"
        );
    }

    #[test]
    fn the_operator_sees_every_session() {
        let requester = operator_requester(None);
        let row = |key: &str, agent: &str| clawgate_store::SessionRow {
            session_key: SessionKey::parse(key).unwrap(),
            agent_id: agent.into(),
            owner_session_key: None,
            spawned_by: None,
            parent_session_key: None,
            label: None,
            acp_owner: None,
            lease_id: None,
            created_at: 0,
            updated_at: 0,
            reset_at: None,
            deleted_at: None,
        };
        assert!(requester.can_see(&row("agent:main:qa:room", "main")));
        assert!(requester.can_see(&row("agent:other:x", "other")));
        assert!(requester.can_see(&row("legacy", "main")));
    }
}
