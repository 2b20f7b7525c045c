//! Send intents: rows keep the whole intent as versioned JSON beside the columns recovery and
//! listings query; the claim columns are the per-intent idempotency lock.

use async_trait::async_trait;
use clawgate_types::{
    DurableSendIntent, IntentId, IntentStatus, MessageReceipt, UnixMillis, to_json,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteStore;
use super::errors::{DbError, DbResult};
use super::writer::Ack;
use clawgate_store::IntentStore;
use clawgate_store::{Claim, ClaimToken, InsertIntentOutcome, IntentCursor, IntentFilter};
use clawgate_store::{StoreError, StoreResult};

use clawgate_store::codec::{self, ClaimWrite, INTENT_FORMAT};

const SELECT_INTENT: &str = "SELECT id, format_version, payload FROM send_intents";

/// The predicates of the partial indexes over send intents, exactly as the migrations declare
/// them: SQLite uses a partial index only for a query that repeats its predicate. They are ORs of
/// equalities, not `IN` lists: SQLite evaluates them on every write to the table and builds a
/// temporary B-tree for each evaluation of an `IN` list.
macro_rules! open_predicate {
    () => {
        "(status = 'pending' OR status = 'sending' OR status = 'committing' OR status = 'unknown_after_send')"
    };
}
const OPEN_PREDICATE: &str = open_predicate!();

/// Open intents due at `?1` that no live holder has claimed.
macro_rules! due_and_free {
    () => {
        concat!(
            open_predicate!(),
            "
             AND (next_attempt_at <= ?1
                  -- An unknown outcome without a scheduled reconciliation is parked for an
                  -- operator: never picked up (and so never replayed) again.
                  OR (next_attempt_at IS NULL AND status != 'unknown_after_send'))
             AND (claimed_by IS NULL OR claim_until <= ?1)"
        )
    };
}

/// Finished intents (the statuses [`IntentStatus::is_terminal`] names) last updated before `?1`,
/// oldest first, at most `?2`. A row updated before `?1` was created before it too: the bound on
/// `created_at` keeps the walk of the creation index short when there is little to remove.
const FINISHED_BEFORE: &str = "SELECT rowid FROM send_intents
     WHERE created_at < ?1 AND updated_at < ?1 AND (status = 'sent' OR status = 'cancelled')
     ORDER BY created_at, id LIMIT ?2";

const ATTENTION_PREDICATE: &str =
    "(status = 'unknown_after_send' OR status = 'failed' OR status = 'cancelled')";
const ATTENTION_STATUSES: [IntentStatus; 3] = [
    IntentStatus::UnknownAfterSend,
    IntentStatus::Failed,
    IntentStatus::Cancelled,
];

/// An intent row update: every column of the intent, what it does to the claim columns, then
/// its guard.
macro_rules! intent_update {
    ($claim:literal, $guard:expr) => {
        concat!(
            "UPDATE send_intents SET status = ?2, attempt = ?3, next_attempt_at = ?4,
                 expires_at = ?5, updated_at = ?6, format_version = ?7, payload = ?8",
            $claim,
            "\n WHERE id = ?1",
            $guard
        )
    };
}

/// The compare-and-set of a save: the stored status is still the expected one (`?9`) and nobody
/// else (`?10` is the writer's claim token) holds a live claim at `?12`.
macro_rules! compare_and_set {
    () => {
        " AND status = ?9 AND (claimed_by IS NULL OR claimed_by = ?10 OR claim_until <= ?12)"
    };
}

/// The first write of every send.
const INSERT_INTENT: &str = "INSERT INTO send_intents (id, idempotency_key, channel, account_id,
         status, attempt, next_attempt_at, expires_at, created_at, updated_at,
         claimed_by, claim_until, format_version, payload)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
     ON CONFLICT (idempotency_key) DO NOTHING";

/// Taking a pending intent the writer does not hold starts a new attempt on the copy it read
/// (`?3`, the attempt written, is past the stored one): a copy read before another worker took
/// the intent, worked on it and let it go again (pending, rescheduled) no longer matches.
macro_rules! fresh_take {
    () => {
        " AND (?9 != 'pending' OR claimed_by = ?10 OR attempt < ?3)"
    };
}

/// The columns an update writes beside the payload: what a save needs, so the intent itself
/// is neither cloned for the writer thread nor dropped there.
#[derive(Debug, Clone)]
struct Columns {
    id: String,
    status: IntentStatus,
    attempt: u32,
    next_attempt_at: Option<UnixMillis>,
    expires_at: Option<UnixMillis>,
    updated_at: UnixMillis,
}

/// What an insert writes besides [`Columns`]: the columns that never change.
#[derive(Debug, Clone)]
struct NewRow {
    columns: Columns,
    idempotency_key: String,
    channel: String,
    account_id: Option<String>,
    created_at: UnixMillis,
}

impl NewRow {
    fn of(intent: &DurableSendIntent) -> NewRow {
        NewRow {
            columns: Columns::of(intent),
            idempotency_key: intent.idempotency_key.clone(),
            channel: intent.channel.clone(),
            account_id: intent.account_id.clone(),
            created_at: intent.created_at,
        }
    }
}

impl Columns {
    fn of(intent: &DurableSendIntent) -> Columns {
        Columns {
            id: intent.id.as_str().to_owned(),
            status: intent.status,
            attempt: intent.attempt,
            next_attempt_at: intent.next_attempt_at,
            expires_at: intent.expires_at,
            updated_at: intent.updated_at,
        }
    }

    fn keeps_claim(&self) -> bool {
        codec::keeps_claim(self.status, self.next_attempt_at)
    }
}

/// The update statement for a claim write, guarded by [`compare_and_set!`] or not.
fn update_sql(write: ClaimWrite, guarded: bool) -> &'static str {
    match (write, guarded) {
        (ClaimWrite::Keep, true) => intent_update!("", compare_and_set!()),
        (ClaimWrite::Release, true) => intent_update!(
            ", claimed_by = NULL, claim_until = NULL",
            compare_and_set!()
        ),
        (ClaimWrite::Take, true) => intent_update!(
            ", claimed_by = ?10, claim_until = ?11",
            concat!(compare_and_set!(), fresh_take!())
        ),
        (ClaimWrite::Keep, false) => intent_update!("", ""),
        (ClaimWrite::Release, false) => {
            intent_update!(", claimed_by = NULL, claim_until = NULL", "")
        }
        (ClaimWrite::Take, false) => intent_update!(", claimed_by = ?10, claim_until = ?11", ""),
    }
}

/// Writes every column of an existing intent; returns how many rows changed (0 when the guard
/// did not hold).
fn update_intent(
    conn: &Connection,
    intent: &Columns,
    payload: &str,
    claim_write: ClaimWrite,
    guard: Option<(IntentStatus, Option<&Claim>)>,
) -> DbResult<usize> {
    let sql = update_sql(claim_write, guard.is_some());
    let (expected, claim) = guard.map_or((None, None), |(status, claim)| (Some(status), claim));
    let now = claim.map_or(intent.updated_at, |c| c.now);
    let values: [&dyn rusqlite::ToSql; 12] = [
        &intent.id,
        &intent.status.as_str(),
        &intent.attempt,
        &intent.next_attempt_at,
        &intent.expires_at,
        &intent.updated_at,
        &INTENT_FORMAT,
        &payload,
        &expected.map(IntentStatus::as_str),
        &claim.map(|c| c.token.as_str()),
        &claim.map(Claim::until),
        &now,
    ];
    let mut stmt = conn.prepare_cached(sql)?;
    // Numbered parameters: a statement binds up to the highest number it uses.
    let used = stmt.parameter_count().min(values.len());
    Ok(stmt.execute(&values[..used])?)
}

/// The listing query for a filter, with its arguments.
fn list_query(filter: &IntentFilter) -> (String, Vec<rusqlite::types::Value>) {
    let mut sql = format!("{SELECT_INTENT} WHERE 1 = 1");
    let mut args: Vec<rusqlite::types::Value> = Vec::new();
    if !filter.statuses.is_empty() {
        let marks = vec!["?"; filter.statuses.len()].join(", ");
        sql.push_str(&format!(" AND status IN ({marks})"));
        args.extend(filter.statuses.iter().map(|s| s.as_str().to_owned().into()));
        // Implied by the filter; spelled out so the narrower partial index can serve it.
        if filter
            .statuses
            .iter()
            .all(|s| ATTENTION_STATUSES.contains(s))
        {
            sql.push_str(&format!(" AND {ATTENTION_PREDICATE}"));
        } else if filter.statuses.iter().all(|s| s.is_recoverable()) {
            sql.push_str(&format!(" AND {OPEN_PREDICATE}"));
        }
    }
    if let Some(channel) = &filter.channel {
        sql.push_str(" AND channel = ?");
        args.push(channel.clone().into());
    }
    if let Some(after) = &filter.after {
        sql.push_str(" AND (created_at > ? OR (created_at = ? AND id > ?))");
        args.push(after.created_at.into());
        args.push(after.created_at.into());
        args.push(after.id.clone().into());
    }
    sql.push_str(" ORDER BY created_at, id LIMIT ?");
    args.push(i64::from(filter.limit).into());
    (sql, args)
}

fn encode(intent: &DurableSendIntent) -> DbResult<String> {
    Ok(codec::encode_intent(intent)?)
}

fn decode_row(row: &Row<'_>) -> rusqlite::Result<(String, i64, String)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
}

fn decode((id, format, payload): (String, i64, String)) -> DbResult<DurableSendIntent> {
    Ok(codec::decode_intent(id, format, &payload)?)
}

fn load(conn: &Connection, id: &str) -> DbResult<Option<DurableSendIntent>> {
    let raw = conn
        .prepare_cached(&format!("{SELECT_INTENT} WHERE id = ?1"))?
        .query_row([id], decode_row)
        .optional()?;
    raw.map(decode).transpose()
}

fn load_required(conn: &Connection, id: &str) -> DbResult<DurableSendIntent> {
    load(conn, id)?.ok_or_else(|| codec::intent_not_found(id).into())
}

fn current_claim(conn: &Connection, id: &str) -> DbResult<Option<(Option<String>, Option<i64>)>> {
    Ok(conn
        .prepare_cached("SELECT claimed_by, claim_until FROM send_intents WHERE id = ?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?)
}

fn parse_status(id: &str, text: &str) -> DbResult<IntentStatus> {
    Ok(codec::parse_status(id, text)?)
}

fn claim_write(intent: &Columns, claim: Option<&Claim>) -> ClaimWrite {
    codec::claim_write(intent.keeps_claim(), claim)
}

fn save(
    conn: &Connection,
    intent: &Columns,
    payload: &str,
    expected: IntentStatus,
    claim: Option<&Claim>,
) -> DbResult<()> {
    let id = intent.id.as_str();
    codec::check_transition(id, expected, intent.status)?;
    // One guarded UPDATE does the compare-and-set (status, claim) and the write; only when it
    // changes nothing is the row read again, to say why.
    let write = claim_write(intent, claim);
    if update_intent(conn, intent, payload, write, Some((expected, claim)))? == 1 {
        return Ok(());
    }
    let (status, claimed_by, claim_until, stored_attempt): (
        String,
        Option<String>,
        Option<i64>,
        u32,
    ) = conn
        .prepare_cached(
            "SELECT status, claimed_by, claim_until, attempt FROM send_intents WHERE id = ?1",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?
        .ok_or_else(|| codec::intent_not_found(id))?;
    let stored = codec::StoredGuard {
        status: parse_status(id, &status)?,
        claimed_by,
        claim_until,
        attempt: i64::from(stored_attempt),
    };
    let attempt = i64::from(intent.attempt);
    if let Some(refused) = codec::refused_save(
        id,
        expected,
        claim,
        write,
        attempt,
        intent.updated_at,
        stored,
    ) {
        return Err(refused.into());
    }
    update_intent(conn, intent, payload, write, None)?;
    Ok(())
}

fn claim_one(conn: &Connection, id: &str, claim: &Claim) -> DbResult<bool> {
    let changed = conn
        .prepare_cached(
            "UPDATE send_intents SET claimed_by = ?2, claim_until = ?3
             WHERE id = ?1 AND (claimed_by IS NULL OR claim_until <= ?4 OR claimed_by = ?2)",
        )?
        .execute(params![id, claim.token.as_str(), claim.until(), claim.now])?;
    Ok(changed == 1)
}

impl SqliteStore {
    /// Inserts an intent (or finds the one holding its idempotency key), answered when `ack` says.
    async fn insert_intent_acked(
        &self,
        intent: &DurableSendIntent,
        claim: Option<&Claim>,
        ack: Ack,
    ) -> StoreResult<InsertIntentOutcome> {
        // Encode on the caller's task: the writer thread is the bottleneck, keep it for SQL.
        let payload = encode(intent).map_err(|e| self.map_error(e))?;
        let row = NewRow::of(intent);
        let claim = claim.cloned();
        self.write_statement_acked(ack, move |conn| {
            let columns = &row.columns;
            let inserted = conn
                .prepare_cached(INSERT_INTENT)?
                .execute(params![
                    columns.id,
                    row.idempotency_key,
                    row.channel,
                    row.account_id,
                    columns.status.as_str(),
                    columns.attempt,
                    columns.next_attempt_at,
                    columns.expires_at,
                    row.created_at,
                    columns.updated_at,
                    claim.as_ref().map(|c| c.token.as_str()),
                    claim.as_ref().map(Claim::until),
                    INTENT_FORMAT,
                    payload,
                ])
                .map_err(|e| match e.sqlite_error_code() {
                    // The id is taken under another key: a caller bug, never a duplicate.
                    Some(rusqlite::ErrorCode::ConstraintViolation) => {
                        DbError::Store(StoreError::InvalidInput(format!(
                            "send intent id {} already exists with another idempotency key",
                            columns.id
                        )))
                    }
                    _ => DbError::Sqlite(e),
                })?;
            if inserted == 1 {
                return Ok(InsertIntentOutcome::Inserted);
            }
            let raw = conn
                .prepare_cached(&format!("{SELECT_INTENT} WHERE idempotency_key = ?1"))?
                .query_row([&row.idempotency_key], decode_row)
                .optional()?;
            let raw = raw.ok_or_else(|| StoreError::NotFound {
                what: "send intent",
                id: row.idempotency_key.clone(),
            })?;
            Ok(InsertIntentOutcome::Duplicate(Box::new(decode(raw)?)))
        })
        .await
    }
}

#[async_trait]
impl IntentStore for SqliteStore {
    async fn insert_intent(
        &self,
        intent: &DurableSendIntent,
        claim: Option<&Claim>,
    ) -> StoreResult<InsertIntentOutcome> {
        self.insert_intent_acked(intent, claim, Ack::Durable).await
    }

    async fn insert_intent_ordered(
        &self,
        intent: &DurableSendIntent,
        claim: Option<&Claim>,
    ) -> StoreResult<InsertIntentOutcome> {
        self.insert_intent_acked(intent, claim, Ack::Committed)
            .await
    }

    async fn load_intent(&self, id: &IntentId) -> StoreResult<Option<DurableSendIntent>> {
        let id = id.as_str().to_owned();
        self.read(move |conn| load(conn, &id)).await
    }

    async fn find_intent_by_key(&self, key: &str) -> StoreResult<Option<DurableSendIntent>> {
        let key = key.to_owned();
        self.read(move |conn| {
            let raw = conn
                .prepare_cached(&format!("{SELECT_INTENT} WHERE idempotency_key = ?1"))?
                .query_row([&key], decode_row)
                .optional()?;
            raw.map(decode).transpose()
        })
        .await
    }

    async fn find_intents_by_key_prefix(
        &self,
        prefix: &str,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>> {
        let prefix = prefix.to_owned();
        self.read(move |conn| {
            // A range on the key's unique index (`LIKE` would not use it, and would read `%`
            // and `_` in a key as wildcards).
            let mut upper = prefix.clone();
            upper.push(char::MAX);
            let rows = conn
                .prepare_cached(&format!(
                    "{SELECT_INTENT} WHERE idempotency_key >= ?1 AND idempotency_key < ?2 \
                     ORDER BY idempotency_key LIMIT ?3"
                ))?
                .query_map(rusqlite::params![prefix, upper, limit], decode_row)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(decode).collect()
        })
        .await
    }

    async fn save_intent(
        &self,
        intent: &DurableSendIntent,
        expected: IntentStatus,
        claim: Option<&Claim>,
    ) -> StoreResult<()> {
        let payload = encode(intent).map_err(|e| self.map_error(e))?;
        let intent = Columns::of(intent);
        let claim = claim.cloned();
        self.write_statement(move |conn| save(conn, &intent, &payload, expected, claim.as_ref()))
            .await
    }

    async fn record_partial_receipt(
        &self,
        id: &IntentId,
        parts: &MessageReceipt,
        now: UnixMillis,
    ) -> StoreResult<DurableSendIntent> {
        let id = id.as_str().to_owned();
        let parts = parts.clone();
        self.write_statement(move |conn| {
            let mut intent = load_required(conn, &id)?;
            if intent.status != IntentStatus::Sending {
                return Err(StoreError::IntentStatusConflict {
                    id,
                    expected: IntentStatus::Sending,
                    actual: intent.status,
                }
                .into());
            }
            match &mut intent.partial_receipt {
                Some(existing) => existing.merge(parts),
                None => intent.partial_receipt = Some(parts),
            }
            intent.updated_at = now;
            let payload = encode(&intent)?;
            update_intent(
                conn,
                &Columns::of(&intent),
                &payload,
                ClaimWrite::Keep,
                None,
            )?;
            Ok(intent)
        })
        .await
    }

    async fn commit_receipt(
        &self,
        id: &IntentId,
        receipt: &MessageReceipt,
        now: UnixMillis,
    ) -> StoreResult<DurableSendIntent> {
        // The receipt is encoded here and the payload edited by SQLite's JSON functions: the
        // writer thread never decodes or re-encodes the intent (it is the shared bottleneck).
        let receipt = to_json(receipt).map_err(|source| StoreError::Decode {
            what: "receipt",
            id: id.to_string(),
            source,
        })?;
        let key = id.as_str().to_owned();
        let raw = self
            .write_statement(move |conn| {
                let committed = conn
                    .prepare_cached(
                        "UPDATE send_intents
                         SET status = 'sent', next_attempt_at = NULL, updated_at = ?2,
                             claimed_by = NULL, claim_until = NULL,
                             payload = json_set(
                                 json_remove(payload, '$.partialReceipt', '$.failure', '$.nextAttemptAt'),
                                 '$.status', 'sent', '$.receipt', json(?3), '$.updatedAt', ?2)
                         WHERE id = ?1 AND format_version <= ?4
                           AND status IN ('sending', 'committing', 'unknown_after_send')
                         RETURNING id, format_version, payload",
                    )?
                    .query_row(params![key, now, receipt, INTENT_FORMAT], decode_row)
                    .optional()?;
                if let Some(raw) = committed {
                    return Ok(raw);
                }
                // Not committed: say why (unknown id, newer payload, or an illegal move).
                let found: Option<(String, i64)> = conn
                    .prepare_cached("SELECT status, format_version FROM send_intents WHERE id = ?1")?
                    .query_row([&key], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                let Some((status, format)) = found else {
                    return Err(StoreError::NotFound { what: "send intent", id: key }.into());
                };
                if format > INTENT_FORMAT {
                    return Err(StoreError::NewerPayloadFormat {
                        what: "send intent",
                        id: key,
                        found: format,
                        supported: INTENT_FORMAT,
                    }
                    .into());
                }
                let from = parse_status(&key, &status)?;
                let source = from
                    .transition_to(IntentStatus::Sent)
                    .err()
                    .unwrap_or(clawgate_types::IllegalTransition { from, to: IntentStatus::Sent });
                Err(StoreError::IllegalTransition { id: key, source }.into())
            })
            .await?;
        decode(raw).map_err(|e| self.map_error(e))
    }

    async fn claim_due_intents(
        &self,
        claim: &Claim,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>> {
        let claim = claim.clone();
        self.write(move |conn| {
            let ids: Vec<String> = {
                let mut stmt = conn.prepare_cached(concat!(
                    "SELECT id FROM send_intents WHERE ",
                    due_and_free!(),
                    " ORDER BY created_at, id LIMIT ?2"
                ))?;
                let rows = stmt.query_map(params![claim.now, limit], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            let mut claimed = Vec::with_capacity(ids.len());
            for id in ids {
                if claim_one(conn, &id, &claim)? {
                    // Raw rows: decoding happens on the caller's task, off the writer thread.
                    let raw = conn
                        .prepare_cached(&format!("{SELECT_INTENT} WHERE id = ?1"))?
                        .query_row([&id], decode_row)?;
                    claimed.push(raw);
                }
            }
            Ok(claimed)
        })
        .await?
        .into_iter()
        .map(|raw| decode(raw).map_err(|e| self.map_error(e)))
        .collect()
    }

    async fn due_intents(
        &self,
        now: UnixMillis,
        after: Option<&IntentCursor>,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>> {
        let after = after.cloned();
        // A read: the writer thread, which every send shares, does none of this work.
        self.read(move |conn| {
            let raws: Vec<(String, i64, String)> = match &after {
                None => conn
                    .prepare_cached(concat!(
                        "SELECT id, format_version, payload FROM send_intents WHERE ",
                        due_and_free!(),
                        " ORDER BY created_at, id LIMIT ?2"
                    ))?
                    .query_map(params![now, limit], decode_row)?
                    .collect::<rusqlite::Result<_>>()?,
                Some(cursor) => conn
                    .prepare_cached(concat!(
                        "SELECT id, format_version, payload FROM send_intents WHERE ",
                        due_and_free!(),
                        " AND (created_at > ?3 OR (created_at = ?3 AND id > ?4))
                         ORDER BY created_at, id LIMIT ?2"
                    ))?
                    .query_map(
                        params![now, limit, cursor.created_at, cursor.id],
                        decode_row,
                    )?
                    .collect::<rusqlite::Result<_>>()?,
            };
            raws.into_iter().map(decode).collect()
        })
        .await
    }

    async fn claim_intent(
        &self,
        id: &IntentId,
        claim: &Claim,
    ) -> StoreResult<Option<DurableSendIntent>> {
        let id = id.as_str().to_owned();
        let claim = claim.clone();
        self.write(move |conn| {
            if current_claim(conn, &id)?.is_none() {
                return Err(StoreError::NotFound {
                    what: "send intent",
                    id,
                }
                .into());
            }
            if claim_one(conn, &id, &claim)? {
                Ok(Some(load_required(conn, &id)?))
            } else {
                Ok(None)
            }
        })
        .await
    }

    async fn release_intent_claim(&self, id: &IntentId, token: &ClaimToken) -> StoreResult<()> {
        let id = id.as_str().to_owned();
        let token = token.clone();
        self.write_statement(move |conn| {
            conn.prepare_cached(
                "UPDATE send_intents SET claimed_by = NULL, claim_until = NULL
                 WHERE id = ?1 AND claimed_by = ?2",
            )?
            .execute(params![id, token.as_str()])?;
            Ok(())
        })
        .await
    }

    async fn claim_holders(&self) -> StoreResult<Vec<(ClaimToken, u64)>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT claimed_by, COUNT(*) FROM send_intents
                 WHERE claimed_by IS NOT NULL GROUP BY claimed_by ORDER BY claimed_by",
            )?;
            let rows = stmt.query_map([], |r| Ok((ClaimToken(r.get(0)?), r.get::<_, i64>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (token, count) = row?;
                out.push((token, u64::try_from(count).unwrap_or(0)));
            }
            Ok(out)
        })
        .await
    }

    async fn release_claims_held_by(&self, token: &ClaimToken) -> StoreResult<u64> {
        let token = token.clone();
        self.write_statement(move |conn| {
            let n = conn
                .prepare_cached(
                    "UPDATE send_intents SET claimed_by = NULL, claim_until = NULL WHERE claimed_by = ?1",
                )?
                .execute([token.as_str()])?;
            Ok(n as u64)
        })
        .await
    }

    async fn list_intents(&self, filter: &IntentFilter) -> StoreResult<Vec<DurableSendIntent>> {
        let filter = filter.clone();
        self.read(move |conn| {
            let (sql, args) = list_query(&filter);
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args), decode_row)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(decode(row?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn prune_finished_intents(
        &self,
        updated_before: UnixMillis,
        limit: u32,
    ) -> StoreResult<u64> {
        self.delete_oldest("send_intents", FINISHED_BEFORE, updated_before, limit)
            .await
    }

    async fn count_intents_by_status(&self) -> StoreResult<Vec<(IntentStatus, u64)>> {
        self.read(|conn| {
            let mut stmt =
                conn.prepare_cached("SELECT status, COUNT(*) FROM send_intents GROUP BY status")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (status, count) = row?;
                let status = parse_status("(count)", &status)?;
                out.push((status, u64::try_from(count).unwrap_or(0)));
            }
            out.sort_by_key(|(s, _)| *s);
            Ok(out)
        })
        .await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use clawgate_types::{ALL_INTENT_STATUSES, IntentStatus};

    use super::{
        ATTENTION_PREDICATE, ClaimWrite, FINISHED_BEFORE, INSERT_INTENT, OPEN_PREDICATE,
        list_query, update_sql,
    };
    use crate::MIGRATIONS;
    use crate::inbound::COMPLETED_BEFORE;
    use clawgate_store::IntentFilter;

    /// The partial indexes are usable only by queries that repeat their predicates verbatim.
    #[test]
    fn queries_repeat_the_partial_index_predicates_verbatim() {
        let schema: String = MIGRATIONS.iter().map(|m| m.sql).collect();
        for predicate in [OPEN_PREDICATE, ATTENTION_PREDICATE] {
            assert!(schema.contains(predicate), "no index declares {predicate}");
        }
    }

    /// The writes every send makes build no temporary B-tree: SQLite builds one for each
    /// evaluation of an `IN (...)` list in a partial index's predicate, on every write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writes_of_a_send_build_no_temporary_btree() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open_store(dir.path());
        let writes = [ClaimWrite::Keep, ClaimWrite::Release, ClaimWrite::Take];
        let updates = writes
            .into_iter()
            .flat_map(|w| [update_sql(w, true), update_sql(w, false)]);
        for sql in std::iter::once(INSERT_INTENT).chain(updates) {
            let opcodes = store
                .read(move |conn| {
                    let mut stmt = conn.prepare(&format!("EXPLAIN {sql}"))?;
                    let unbound = vec![rusqlite::types::Value::Null; stmt.parameter_count()];
                    let rows = stmt.query_map(rusqlite::params_from_iter(unbound), |r| {
                        r.get::<_, String>(1)
                    })?;
                    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
                })
                .await
                .unwrap();
            assert!(
                opcodes.iter().any(|op| op == "Insert"),
                "{sql}: {opcodes:?}"
            );
            assert!(
                !opcodes.iter().any(|op| op == "OpenEphemeral"),
                "{sql} builds a temporary B-tree: {opcodes:?}"
            );
        }
    }

    /// Each listing is served by an index; only several attention statuses (few rows) are merged
    /// by a sort.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listings_use_their_index() {
        use IntentStatus::*;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open_store(dir.path());
        let cases: [(&[IntentStatus], &str, bool); 5] = [
            (&[], "send_intents_created", false),
            (&[Sent], "send_intents_created", false),
            (&[Failed], "send_intents_attention", false),
            (&[UnknownAfterSend, Failed], "send_intents_attention", true),
            (&[Pending, Sending, Committing], "send_intents_open", false),
        ];
        for (statuses, index, sorts) in cases {
            let (sql, args) = list_query(&IntentFilter {
                statuses: statuses.to_vec(),
                limit: 10,
                ..IntentFilter::default()
            });
            let plan = store
                .read(move |conn| {
                    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                    let rows = stmt
                        .query_map(rusqlite::params_from_iter(args), |r| r.get::<_, String>(3))?;
                    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("; "))
                })
                .await
                .unwrap();
            assert!(plan.contains(index), "{statuses:?}: {plan}");
            assert_eq!(plan.contains("TEMP B-TREE"), sorts, "{statuses:?}: {plan}");
        }
    }

    /// Retention removes exactly the statuses nothing leaves (finished intents, completed
    /// inbound records), and finds them by walking an index from its oldest end: no scan of the
    /// table, no sort.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pruning_walks_an_index_from_the_oldest_end() {
        for status in ALL_INTENT_STATUSES {
            let named = FINISHED_BEFORE.contains(&format!("'{}'", status.as_str()));
            assert_eq!(named, status.is_terminal(), "{status}");
        }
        let dir = tempfile::tempdir().unwrap();
        let store = crate::testing::open_store(dir.path());
        let cases = [
            (FINISHED_BEFORE, "send_intents_created"),
            (COMPLETED_BEFORE, "inbound_records_status"),
        ];
        for (query, index) in cases {
            let plan = store
                .read(move |conn| {
                    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {query}"))?;
                    let rows =
                        stmt.query_map(rusqlite::params![0, 1], |r| r.get::<_, String>(3))?;
                    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?.join("; "))
                })
                .await
                .unwrap();
            assert!(plan.contains(index), "{plan}");
            assert!(!plan.contains("TEMP B-TREE"), "{plan}");
        }
    }

    /// `commit_receipt`'s SQL names the statuses a commit may leave; they must be exactly the
    /// ones the transition table allows into `sent`.
    #[test]
    fn commit_sql_matches_the_transition_table() {
        let allowed: Vec<&str> = ALL_INTENT_STATUSES
            .into_iter()
            .filter(|s| s.can_transition_to(IntentStatus::Sent))
            .map(IntentStatus::as_str)
            .collect();
        assert_eq!(allowed, vec!["sending", "committing", "unknown_after_send"]);
    }
}
