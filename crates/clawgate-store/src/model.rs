//! Records the ports exchange that are storage concepts rather than domain vocabulary.

use clawgate_types::{
    AcpSessionOwner, ActorType, DurableSendIntent, IntentStatus, LeaseId, RunOutcome, SessionKey,
    SessionStateEvent, SessionStateEventKind, StateVersion, UnixMillis,
};
use serde::{Deserialize, Serialize};

/// Who holds the per-intent idempotency lock (a gateway instance + process + worker).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken(pub String);

impl ClaimToken {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A claim request: who, and until when the lock holds if the holder dies.
#[derive(Debug, Clone)]
pub struct Claim {
    pub token: ClaimToken,
    pub now: UnixMillis,
    pub ttl_ms: i64,
}

impl Claim {
    pub fn until(&self) -> UnixMillis {
        self.now.saturating_add(self.ttl_ms)
    }
}

/// Result of recording a new intent.
#[derive(Debug, Clone, PartialEq)]
pub enum InsertIntentOutcome {
    Inserted,
    /// An intent with the same idempotency key exists; it is returned unchanged.
    Duplicate(Box<DurableSendIntent>),
}

/// Which intents an operator or recovery listing wants.
#[derive(Debug, Clone, Default)]
pub struct IntentFilter {
    /// Only these statuses (all when empty).
    pub statuses: Vec<IntentStatus>,
    pub channel: Option<String>,
    /// Keyset cursor: return intents strictly after this (created_at, id).
    pub after: Option<IntentCursor>,
    pub limit: u32,
}

/// Position in the (created_at, id) order intents are listed in (oldest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentCursor {
    pub created_at: UnixMillis,
    pub id: String,
}

impl IntentCursor {
    pub fn of(intent: &DurableSendIntent) -> IntentCursor {
        IntentCursor {
            created_at: intent.created_at,
            id: intent.id.as_str().to_owned(),
        }
    }
}

/// Key of an inbound platform event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InboundKey {
    pub channel: String,
    pub account_id: String,
    pub event_id: String,
}

/// Where an inbound event is in its processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboundStatus {
    /// Recorded, not finished (also after a failed attempt that will be retried).
    Received,
    /// Fully handled: a redelivery is a duplicate.
    Completed,
    /// Failed too many times; kept for operators, never retried automatically.
    DeadLettered,
}

impl InboundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            InboundStatus::Received => "received",
            InboundStatus::Completed => "completed",
            InboundStatus::DeadLettered => "dead_lettered",
        }
    }

    pub fn parse(text: &str) -> Option<InboundStatus> {
        [
            InboundStatus::Received,
            InboundStatus::Completed,
            InboundStatus::DeadLettered,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// A recorded inbound event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboundRecord {
    pub channel: String,
    pub account_id: String,
    pub event_id: String,
    pub status: InboundStatus,
    pub attempts: u32,
    /// The normalized message (or raw event) needed to process it again after a restart.
    pub payload: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub received_at: UnixMillis,
    pub updated_at: UnixMillis,
}

/// Result of recording an inbound event.
#[derive(Debug, Clone, PartialEq)]
pub enum RecordInboundOutcome {
    New(InboundRecord),
    /// Seen before (webhook redelivery, replayed poll): the stored record, unchanged.
    Duplicate(InboundRecord),
}

/// Key of a polling source's durable watermark.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WatermarkKey {
    pub channel: String,
    pub account_id: String,
    pub source: String,
}

/// An event to append to a session's signal log.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSessionEvent {
    pub session_key: SessionKey,
    pub kind: SessionStateEventKind,
    pub actor_type: ActorType,
    pub actor_id: Option<String>,
    pub summary: String,
    pub outcome: Option<RunOutcome>,
    pub child_session_key: Option<SessionKey>,
    /// A second append with the same key returns the first row instead of a new one.
    pub dedupe_key: Option<String>,
    pub created_at: UnixMillis,
}

/// Result of an append.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendedEvent {
    pub event: SessionStateEvent,
    /// True when the dedupe key matched an existing row (nothing was appended).
    pub duplicate: bool,
}

/// The delta `changesSince` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChangesSince {
    pub state_version: StateVersion,
    pub events: Vec<SessionStateEvent>,
    /// More events exist after the last one returned.
    pub truncated: bool,
    /// The requested version is older than the retained history: refresh the whole session.
    pub history_gap: bool,
}

/// The durable per-session head of the signal log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionHead {
    pub state_version: StateVersion,
    /// Highest sequence removed by pruning (0 = nothing pruned).
    pub pruned_through: u64,
}

/// What a retention pass removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PruneReport {
    pub events_deleted: u64,
    pub cursors_deleted: u64,
}

/// How a watch began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchSource {
    /// Implicit spawn edge: a parent watches the child it created.
    Spawn,
    /// `sessions_send watch: true`.
    Explicit,
}

impl WatchSource {
    pub fn as_str(self) -> &'static str {
        match self {
            WatchSource::Spawn => "spawn",
            WatchSource::Explicit => "explicit",
        }
    }

    pub fn parse(text: &str) -> Option<WatchSource> {
        [WatchSource::Spawn, WatchSource::Explicit]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// A watcher's durable position on one target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchCursor {
    pub watcher_key: SessionKey,
    pub target_key: SessionKey,
    /// Everything up to here has been seen (notice consumed).
    pub acked_version: StateVersion,
    /// Frozen watermark of the pending notice, if one is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notified_version: Option<StateVersion>,
    /// Highest notifying event observed on the target.
    pub material_version: StateVersion,
    /// Set when the target was deleted: who deleted it. The cursor then carries one pending
    /// deletion notice (`notified_version` set, so no change notice opens on it), and goes
    /// away when that notice is consumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_deleted_by: Option<String>,
    pub source: WatchSource,
    pub created_at: UnixMillis,
    pub updated_at: UnixMillis,
}

/// A session row of the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRow {
    pub session_key: SessionKey,
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_session_key: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_by: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_key: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// ACP ownership metadata, for ACP-backed sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acp_owner: Option<AcpSessionOwner>,
    /// The lease of the ACPX process tree serving this session, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<LeaseId>,
    /// The ACP session id the agent gave this session last (`session/new`), for `session/load`
    /// when a process starts for it again (after an idle close or a restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acp_session_id: Option<String>,
    pub created_at: UnixMillis,
    pub updated_at: UnixMillis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_at: Option<UnixMillis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<UnixMillis>,
}

/// Result of appending an event and opening the notices it causes, in one write.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendWithNotices {
    pub appended: AppendedEvent,
    /// Cursors that moved from "no notice" to "notice pending" because of this event.
    pub opened: Vec<WatchCursor>,
}

/// Result of consuming a pending notice.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumedNotice {
    /// The cursor after the operation (`None`: no cursor for the pair).
    pub cursor: Option<WatchCursor>,
    /// The pending notice was acknowledged (the cursor advanced to its frozen watermark).
    pub acked: bool,
    /// Material work of another actor arrived after the frozen watermark: exactly one new
    /// notice is now pending.
    pub reopened: bool,
}

/// A migration's state in one database (what `clawgate migrate` and `status` show).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationStatus {
    pub version: i64,
    pub name: String,
    /// When it was applied (ms since the epoch), `None` while pending.
    pub applied_at: Option<i64>,
}

/// Which gateway serves a channel account, until when, under which fencing epoch. With several
/// gateways on one database each account (a bot token allows one poller) has one holder at a
/// time; a holder that stops renewing loses it at `until`, and the next holder's epoch is higher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountLease {
    /// `<channel>/<account>`, as the gateway names it.
    pub account: String,
    pub holder: clawgate_types::GatewayInstanceId,
    /// Raised each time the account changes hands: a holder that sees a higher epoch than its
    /// own knows it was replaced.
    pub epoch: u64,
    pub until: clawgate_types::UnixMillis,
}

/// The answer to an attempt to take or renew an account.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountClaim {
    /// The caller holds it (taken now, or renewed).
    Granted(AccountLease),
    /// Another gateway holds it, live until `until`.
    HeldBy(AccountLease),
}

/// Whose channel state a call reads or writes: one channel kind and one of its accounts. Two
/// accounts of one kind never see each other's records or values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChannelScope {
    /// The channel kind (`zalo`, `matrix`…).
    pub kind: String,
    /// The account id of the `[[channels]]` entry (`default` when none is named).
    pub account: String,
}

impl ChannelScope {
    pub fn new(kind: impl Into<String>, account: impl Into<String>) -> ChannelScope {
        ChannelScope {
            kind: kind.into(),
            account: account.into(),
        }
    }
}

impl std::fmt::Display for ChannelScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.account)
    }
}

/// One record of a channel's book (a send journal, an echo book…).
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelRecord {
    /// Its position in the book: appends are numbered 1, 2, 3… in the order they commit, so
    /// a reader that has seen up to `seq` finds every later record after it.
    pub seq: i64,
    /// Unique in its book.
    pub key: String,
    pub value: serde_json::Value,
    pub recorded_at: UnixMillis,
}

/// What an append did.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendedRecord {
    pub record: ChannelRecord,
    /// False when the book already held a record with that key (it is returned unchanged).
    pub new: bool,
}

/// A named value of a channel (a cursor, a token, a reference) with its version: 1 when first
/// written, one more with every write.
#[derive(Debug, Clone, PartialEq)]
pub struct ChannelValue {
    pub value: serde_json::Value,
    pub version: i64,
    pub updated_at: UnixMillis,
}

/// What a write of a named value requires of the stored one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueExpectation {
    /// Nothing is stored under the name yet.
    Absent,
    /// The stored value has this version (another writer has not changed it since it was read).
    Version(i64),
    /// Anything: the write replaces whatever is there.
    Any,
}

/// What a write of a named value did.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueSwap {
    /// Written; the stored value now.
    Written(ChannelValue),
    /// The expectation did not hold; nothing written. The stored value (`None`: absent).
    Conflict(Option<ChannelValue>),
}
