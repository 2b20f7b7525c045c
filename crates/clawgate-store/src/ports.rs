//! The storage ports: shaped for the engines' use cases, not generic CRUD.
//!
//! Every method is one atomic unit on the backend: a caller never sees half of an operation.
//! Timestamps come from the caller's clock (the store keeps no clock of its own), so tests can
//! drive time.

use async_trait::async_trait;
use clawgate_types::{
    AcpxProcessLease, DurableSendIntent, GatewayInstanceId, IntentId, IntentStatus, LeaseId,
    LeaseState, MessageReceipt, SessionKey, StateVersion, UnixMillis,
};

use crate::StoreResult;
use crate::model::{
    AccountClaim, AccountLease, AppendWithNotices, AppendedEvent, AppendedRecord, ChangesSince,
    ChannelRecord, ChannelScope, ChannelValue, Claim, ClaimToken, ConsumedNotice, InboundKey,
    InboundRecord, InboundStatus, InsertIntentOutcome, IntentCursor, IntentFilter, MigrationStatus,
    NewSessionEvent, PruneReport, RecordInboundOutcome, SessionHead, SessionRow, ValueExpectation,
    ValueSwap, WatchCursor, WatermarkKey,
};

/// Durable send intents, their receipts and the per-intent idempotency lock.
#[async_trait]
pub trait IntentStore: Send + Sync {
    /// Records a new intent (status `pending`, or `sending` when the caller starts its first
    /// attempt in the same write), optionally already claimed by the caller.
    /// An existing intent with the same idempotency key is returned instead (nothing written).
    async fn insert_intent(
        &self,
        intent: &DurableSendIntent,
        claim: Option<&Claim>,
    ) -> StoreResult<InsertIntentOutcome>;

    /// [`insert_intent`](Self::insert_intent), answered once the insert is ordered before every
    /// later write of this store but possibly before it is durable. It is durable no later than
    /// the next write this store reports durable, and if it cannot be made durable, neither can
    /// any later write. For a caller whose next write must be durable anyway (starting the first
    /// attempt): it saves one wait for the disk, and a crash before that next write is durable
    /// leaves the intent either as inserted or not recorded at all.
    ///
    /// The default waits for durability, which keeps the promise for any store.
    async fn insert_intent_ordered(
        &self,
        intent: &DurableSendIntent,
        claim: Option<&Claim>,
    ) -> StoreResult<InsertIntentOutcome> {
        self.insert_intent(intent, claim).await
    }

    async fn load_intent(&self, id: &IntentId) -> StoreResult<Option<DurableSendIntent>>;

    async fn find_intent_by_key(
        &self,
        idempotency_key: &str,
    ) -> StoreResult<Option<DurableSendIntent>>;

    /// Every intent whose idempotency key starts with `prefix` (at most `limit`), in key order,
    /// in one read: the generations of one reply (`<channel>:reply:<event>:<n>`).
    async fn find_intents_by_key_prefix(
        &self,
        prefix: &str,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>>;

    /// Stores `intent` (its new status, attempt, batch, failure, schedule…) if the stored status
    /// is still `expected` and the move `expected -> intent.status` is legal, and no other holder
    /// has a live claim on it at `claim.now`. The claim is kept while the holder still works on
    /// the intent (`sending`, `committing`, or `pending` with no `next_attempt_at`) — with a
    /// claim, such a save takes or refreshes it, so a worker's first guarded write is also its
    /// lock —; any other status (terminal, `failed`, parked, or rescheduled for later) releases
    /// it.
    async fn save_intent(
        &self,
        intent: &DurableSendIntent,
        expected: IntentStatus,
        claim: Option<&Claim>,
    ) -> StoreResult<()>;

    /// Adds the receipt parts of units that landed to the intent's partial receipt (status must
    /// be `sending`). Those units are never sent again.
    async fn record_partial_receipt(
        &self,
        id: &IntentId,
        parts: &MessageReceipt,
        now: UnixMillis,
    ) -> StoreResult<DurableSendIntent>;

    /// Records the final receipt and marks the intent `sent` in one write (from `sending` — the
    /// platform just answered —, `committing` or `unknown_after_send`), releasing any claim.
    /// Returns the committed intent.
    async fn commit_receipt(
        &self,
        id: &IntentId,
        receipt: &MessageReceipt,
        now: UnixMillis,
    ) -> StoreResult<DurableSendIntent>;

    /// Claims up to `limit` recoverable intents that are due at `claim.now` and not claimed by a
    /// live holder, oldest first. Two callers never receive the same intent while a claim holds.
    /// An `unknown_after_send` intent without `next_attempt_at` is parked and never returned.
    async fn claim_due_intents(
        &self,
        claim: &Claim,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>>;

    /// The intents [`IntentStore::claim_due_intents`] would claim, strictly after `after` in the
    /// same order, without claiming them: a read, which leaves the writer to the writes. A worker
    /// takes each one by its first guarded write ([`IntentStore::save_intent`] with its claim, or
    /// [`IntentStore::claim_intent`]), and a worker that loses that race leaves the intent alone.
    async fn due_intents(
        &self,
        now: UnixMillis,
        after: Option<&IntentCursor>,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>>;

    /// Claims one intent by id; `Ok(None)` when another holder's claim is still live.
    async fn claim_intent(
        &self,
        id: &IntentId,
        claim: &Claim,
    ) -> StoreResult<Option<DurableSendIntent>>;

    /// Gives a claim back (no-op when `token` does not hold it).
    async fn release_intent_claim(&self, id: &IntentId, token: &ClaimToken) -> StoreResult<()>;

    /// Every live or expired claim holder with how many intents it holds (to find claims of
    /// processes that died, which would otherwise block recovery until their claims expire).
    async fn claim_holders(&self) -> StoreResult<Vec<(ClaimToken, u64)>>;

    /// Releases every claim `token` holds; returns how many.
    async fn release_claims_held_by(&self, token: &ClaimToken) -> StoreResult<u64>;

    /// Pages through intents oldest first (keyset pagination; streams any number of rows).
    async fn list_intents(&self, filter: &IntentFilter) -> StoreResult<Vec<DurableSendIntent>>;

    /// How many intents are in each status (statuses with none are omitted).
    async fn count_intents_by_status(&self) -> StoreResult<Vec<(IntentStatus, u64)>>;

    /// Deletes up to `limit` finished intents (`sent`, `cancelled`: statuses nothing leaves) last
    /// updated before `updated_before`, oldest first; returns how many. Open intents and those
    /// waiting for an operator (`failed`, `unknown_after_send`) are never removed. A removed
    /// intent's idempotency key may be used again, so the retention window is also the outbound
    /// dedupe window.
    async fn prune_finished_intents(
        &self,
        updated_before: UnixMillis,
        limit: u32,
    ) -> StoreResult<u64>;
}

/// Inbound event records: dedupe across restarts, attempts and dead letters.
#[async_trait]
pub trait InboundStore: Send + Sync {
    /// Records an inbound event the first time it is seen (later deliveries are duplicates)
    /// and, while it is unfinished (`received`), counts the processing attempt that starts now:
    /// attempts are counted durably before dispatch, so a turn that kills the process every
    /// time still reaches the dead-letter limit. A finished record is returned unchanged.
    async fn record_inbound(
        &self,
        key: &InboundKey,
        payload: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<RecordInboundOutcome>;

    /// Records a pushed event as accepted (`received`, no attempt counted) the first time it
    /// is seen, so it is durable before it waits behind its conversation's earlier turns;
    /// [`Self::record_inbound`] then counts its first attempt. An existing record is left as
    /// it is. `true` when the record is new.
    async fn accept_inbound(
        &self,
        key: &InboundKey,
        payload: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<bool>;

    async fn load_inbound(&self, key: &InboundKey) -> StoreResult<Option<InboundRecord>>;

    /// Ends one processing attempt (counted when it started, by [`Self::record_inbound`]):
    /// moves the record to `status` (`received` when another attempt will follow) and keeps the
    /// first error message for operators. Returns the attempts counted so far.
    async fn finish_inbound(
        &self,
        key: &InboundKey,
        status: InboundStatus,
        error: Option<&str>,
        now: UnixMillis,
    ) -> StoreResult<u32>;

    /// Ends an attempt that was interrupted, not failed (the gateway stopped under it): the
    /// record stays `received` and the attempt counted at its start is given back, so clean
    /// restarts never use up an event's attempts. Keeps the first error message. Returns the
    /// attempts counted now.
    async fn interrupt_inbound(
        &self,
        key: &InboundKey,
        error: &str,
        now: UnixMillis,
    ) -> StoreResult<u32>;

    /// Records still `received` (to be processed again after a restart), oldest first.
    async fn list_unfinished_inbound(&self, limit: u32) -> StoreResult<Vec<InboundRecord>>;

    /// Records in one status, newest first (operator listings).
    async fn list_inbound(
        &self,
        status: Option<InboundStatus>,
        limit: u32,
    ) -> StoreResult<Vec<InboundRecord>>;

    /// Forgets up to `limit` completed records last updated before `completed_before` (the
    /// dedupe window), oldest first; returns how many.
    async fn prune_completed_inbound(
        &self,
        completed_before: UnixMillis,
        limit: u32,
    ) -> StoreResult<u64>;
}

/// Durable "safe completed" watermarks of polling sources.
#[async_trait]
pub trait WatermarkStore: Send + Sync {
    /// The watermark and the checkpoint stored with it (`None` when it never advanced).
    async fn load_watermark(
        &self,
        key: &WatermarkKey,
    ) -> StoreResult<Option<(i64, Option<String>)>>;

    /// Moves the watermark forward to `value`, with the source's resume `checkpoint` valid
    /// there; never backwards (a lower `value` changes nothing, its checkpoint included).
    /// Returns the stored value.
    async fn advance_watermark(
        &self,
        key: &WatermarkKey,
        value: i64,
        checkpoint: Option<&str>,
        now: UnixMillis,
    ) -> StoreResult<i64>;
}

/// The per-session signal log with its durable heads and prune watermarks.
#[async_trait]
pub trait SignalLogStore: Send + Sync {
    /// Appends an event and advances the session head in one write; a matching dedupe key
    /// returns the existing row instead.
    async fn append_event(&self, event: &NewSessionEvent) -> StoreResult<AppendedEvent>;

    async fn session_head(&self, key: &SessionKey) -> StoreResult<SessionHead>;

    /// Up to `limit` events after `since`, oldest first, with `truncated` and an exact
    /// `historyGap` (from the prune watermark). Moves no cursor.
    async fn events_since(
        &self,
        key: &SessionKey,
        since: StateVersion,
        limit: u32,
    ) -> StoreResult<ChangesSince>;

    /// Applies retention: removes events older than `older_than` and the oldest rows beyond
    /// `max_rows`, raising prune watermarks (heads never move back), and expires watch cursors
    /// not updated since `older_than`.
    async fn prune_signal_log(
        &self,
        older_than: UnixMillis,
        max_rows: u64,
    ) -> StoreResult<PruneReport>;
}

/// Watch cursors of watcher sessions on target sessions.
#[async_trait]
pub trait WatchCursorStore: Send + Sync {
    /// Creates the cursor unless one exists for the pair (then returns the existing one).
    async fn ensure_cursor(&self, cursor: &WatchCursor) -> StoreResult<WatchCursor>;

    /// Overwrites a cursor's positions.
    async fn save_cursor(&self, cursor: &WatchCursor) -> StoreResult<()>;

    async fn load_cursor(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
    ) -> StoreResult<Option<WatchCursor>>;

    async fn cursors_on_target(&self, target: &SessionKey) -> StoreResult<Vec<WatchCursor>>;

    async fn cursors_of_watcher(&self, watcher: &SessionKey) -> StoreResult<Vec<WatchCursor>>;

    /// Every cursor with a pending notice (rebuilt into the notice queue after a restart).
    async fn cursors_with_pending_notice(&self) -> StoreResult<Vec<WatchCursor>>;
}

/// The session registry.
#[async_trait]
pub trait SessionStore: Send + Sync {
    /// Creates or updates a session row.
    async fn upsert_session(&self, row: &SessionRow) -> StoreResult<()>;

    async fn load_session(&self, key: &SessionKey) -> StoreResult<Option<SessionRow>>;

    /// Rows not deleted, by key.
    async fn list_sessions(&self) -> StoreResult<Vec<SessionRow>>;

    /// Marks a reset and removes the cursors the session holds as a watcher, in one write.
    async fn reset_session(&self, key: &SessionKey, now: UnixMillis) -> StoreResult<()>;

    /// In one write: marks the row deleted, removes the cursors it holds as a watcher, and
    /// turns every cursor on it into a pending deletion notice (`target_deleted_by` =
    /// `deleted_by`, `notified_version` frozen at the head) — except the deleter's own cursor
    /// (a watcher whose key is `deleted_by`), which is removed: nobody is told of their own
    /// deletion. A cursor already carrying a deletion notice keeps it. Returns the cursors
    /// that carry a deletion notice now, by watcher.
    async fn delete_session(
        &self,
        key: &SessionKey,
        deleted_by: &str,
        now: UnixMillis,
    ) -> StoreResult<Vec<WatchCursor>>;
}

/// ACPX process leases.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Records a lease (written before the wrapper starts).
    async fn insert_lease(&self, lease: &AcpxProcessLease) -> StoreResult<()>;

    async fn load_lease(&self, id: &LeaseId) -> StoreResult<Option<AcpxProcessLease>>;

    /// Stores the lease if its stored state is still `expected`.
    async fn save_lease(&self, lease: &AcpxProcessLease, expected: LeaseState) -> StoreResult<()>;

    /// Leases of one gateway instance in the given states, oldest first.
    async fn list_leases(
        &self,
        instance: Option<&GatewayInstanceId>,
        states: &[LeaseState],
    ) -> StoreResult<Vec<AcpxProcessLease>>;

    /// Deletes closed and lost leases that ended before `ended_before`.
    async fn prune_finished_leases(&self, ended_before: UnixMillis) -> StoreResult<u64>;
}

/// Identity of the gateway installation that owns this state.
#[async_trait]
pub trait InstanceStore: Send + Sync {
    /// The instance id of this state directory, generated and persisted on first use.
    async fn gateway_instance_id(&self) -> StoreResult<GatewayInstanceId>;
}

/// Which gateway serves each channel account when several share one database.
#[async_trait]
pub trait AccountLeaseStore: Send + Sync {
    /// In one write: takes `account` for `holder` until `now + ttl_ms` when it is free, expired
    /// (`until <= now`), or already `holder`'s (a renewal keeps the epoch; a change of hands
    /// raises it); else answers who holds it.
    async fn acquire_account(
        &self,
        account: &str,
        holder: &GatewayInstanceId,
        now: UnixMillis,
        ttl_ms: i64,
    ) -> StoreResult<AccountClaim>;

    /// Gives `account` back (its `until` becomes `now`) if `holder` still holds it at `epoch`,
    /// so another gateway takes it without waiting for the deadline.
    async fn release_account(
        &self,
        account: &str,
        holder: &GatewayInstanceId,
        epoch: u64,
        now: UnixMillis,
    ) -> StoreResult<()>;

    /// Every account lease, live or expired, by account.
    async fn account_leases(&self) -> StoreResult<Vec<AccountLease>>;
}

/// What channel crates keep between runs — send journals, echo books, sync cursors, rotating
/// tokens, conversation references — scoped to one channel account, so two accounts of a kind
/// never collide and every gateway sharing the database sees the same evidence. Two shapes:
/// books of keyed records (append once, find, read in order, prune) and named values written
/// with compare-and-set. A write reported `Ok` is durable, like every other port's.
#[async_trait]
pub trait ChannelStateStore: Send + Sync {
    /// Appends a record under `key` to `book`. A key the book already holds changes nothing:
    /// the stored record is returned with `new: false` (so an append repeated after a crash,
    /// or made by two gateways at once, is recorded once).
    async fn append_channel_record(
        &self,
        scope: &ChannelScope,
        book: &str,
        key: &str,
        value: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<AppendedRecord>;

    /// The record under `key` in `book`.
    async fn find_channel_record(
        &self,
        scope: &ChannelScope,
        book: &str,
        key: &str,
    ) -> StoreResult<Option<ChannelRecord>>;

    /// Up to `limit` records of `book` with `seq > after`, in `seq` order.
    async fn channel_records_since(
        &self,
        scope: &ChannelScope,
        book: &str,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<ChannelRecord>>;

    /// Removes the records of `book` recorded before `older_than` and, of the rest, all but
    /// the newest `keep_newest`; returns how many. The sequence never restarts.
    async fn prune_channel_records(
        &self,
        scope: &ChannelScope,
        book: &str,
        older_than: UnixMillis,
        keep_newest: u64,
    ) -> StoreResult<u64>;

    /// The value stored under `name`.
    async fn load_channel_value(
        &self,
        scope: &ChannelScope,
        name: &str,
    ) -> StoreResult<Option<ChannelValue>>;

    /// Writes `value` under `name` if the stored one meets `expected` (in one write, so of two
    /// writers expecting the same version exactly one succeeds).
    async fn swap_channel_value(
        &self,
        scope: &ChannelScope,
        name: &str,
        expected: ValueExpectation,
        value: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<ValueSwap>;

    /// Removes the value under `name`; true when there was one.
    async fn delete_channel_value(&self, scope: &ChannelScope, name: &str) -> StoreResult<bool>;
}

/// The database behind the ports, as operators see it.
#[async_trait]
pub trait SchemaStore: Send + Sync {
    /// The database, as errors and `status` name it: a file's path, or a server's
    /// `host:port/dbname` (never a password).
    fn database(&self) -> String;

    /// The newest schema version this build of the backend writes.
    fn supported_schema_version(&self) -> i64;

    /// Every migration this build knows with its applied time in this database, plus any newer
    /// ones a newer build applied.
    async fn migration_status(&self) -> StoreResult<Vec<MigrationStatus>>;
}

/// Everything the engines need, in one object: what every backend implements. Engines hold it
/// as `Arc<dyn Store>` (or, upcast, the one port they use), so the backend is chosen at run
/// time in one place. `Debug` describes the backend and its database (never a password).
pub trait Store:
    std::fmt::Debug
    + IntentStore
    + InboundStore
    + WatermarkStore
    + SignalLogStore
    + WatchCursorStore
    + SessionStore
    + LeaseStore
    + InstanceStore
    + NoticeCursorStore
    + ChangeFeed
    + SchemaStore
    + AccountLeaseStore
    + ChannelStateStore
    + 'static
{
}

impl<T> Store for T where
    T: std::fmt::Debug
        + IntentStore
        + InboundStore
        + WatermarkStore
        + SignalLogStore
        + WatchCursorStore
        + SessionStore
        + LeaseStore
        + InstanceStore
        + NoticeCursorStore
        + ChangeFeed
        + SchemaStore
        + AccountLeaseStore
        + ChannelStateStore
        + 'static
{
}

/// Notice transitions on watch cursors, each one atomic on the backend, so several gateway
/// processes sharing one database never lose or double a notice.
#[async_trait]
pub trait NoticeCursorStore: Send + Sync {
    /// Appends `event` (as [`SignalLogStore::append_event`]) and, in the same write, when the
    /// event's kind notifies and it is not a duplicate, opens a notice on every cursor on the
    /// event's session that has none pending, lags the new sequence, and whose watcher is not the
    /// event's actor: `notified_version` and `material_version` freeze at the new sequence.
    /// Cursors that already have a notice pending are left alone (their notice stays
    /// byte-identical; the remainder is found when it is consumed).
    async fn append_event_opening_notices(
        &self,
        event: &NewSessionEvent,
    ) -> StoreResult<AppendWithNotices>;

    /// Consumes the pending notice of `watcher` on `target` if its `acked_version` is still
    /// `seen` (what the consumed notice text said): `acked_version` moves to the frozen
    /// watermark. If a notifying event by another actor lies after the watermark — or history
    /// after it was pruned, so nobody can tell — exactly one new notice opens at the newest.
    ///
    /// A cursor carrying a deletion notice is left as it is (`acked: false`): only
    /// [`Self::consume_deletion_notice`] consumes that one, so an ack of a change notice shown
    /// before the deletion never swallows it.
    async fn consume_notice(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
        seen: StateVersion,
        now: UnixMillis,
    ) -> StoreResult<ConsumedNotice>;

    /// Consumes the deletion notice of `watcher` on `target`: the cursor goes away, so that
    /// target never notifies the watcher again. False when there was none (consumed
    /// elsewhere, or the target was not deleted).
    async fn consume_deletion_notice(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
    ) -> StoreResult<bool>;
}

/// Announces commits made to the same database through other connections — other gateway
/// processes (and this process's own writer: consumers must be idempotent). What must be
/// announced is every commit of signal events and watch cursors (notices depend on nothing
/// else); a backend may announce more (SQLite announces every commit, PostgreSQL only those).
pub trait ChangeFeed: Send + Sync {
    /// A receiver whose value changes after such a commit, checked every `interval`. Many
    /// commits between checks are announced once. The sender is dropped (the receiver's
    /// `changed()` fails) when the backend has no other connections to observe (in memory);
    /// the feed stops once every receiver is dropped.
    fn external_changes(
        &self,
        interval: std::time::Duration,
    ) -> StoreResult<tokio::sync::watch::Receiver<u64>>;
}
