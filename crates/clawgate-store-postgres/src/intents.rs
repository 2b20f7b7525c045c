//! Send intents: rows keep the whole intent as versioned JSON beside the columns recovery and
//! listings query; the claim columns are the per-intent idempotency lock, and across gateways
//! a claim's deadline (`claim_until`) is its only liveness: an expired claim is free.

use async_trait::async_trait;
use clawgate_store::{
    Claim, ClaimToken, InsertIntentOutcome, IntentCursor, IntentFilter, IntentStore, StoreError,
    StoreResult,
};
use clawgate_types::{
    DurableSendIntent, IntentId, IntentStatus, MessageReceipt, UnixMillis, to_json,
};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::PostgresStore;
use crate::errors::{DbError, DbResult};

use clawgate_store::codec::{self, ClaimWrite, INTENT_FORMAT};

const SELECT_INTENT: &str = "SELECT id, format_version, payload FROM send_intents";

/// The statuses recovery may still work on (the `send_intents_open` index's predicate).
const OPEN: &str = "status IN ('pending', 'sending', 'committing', 'unknown_after_send')";

/// Open intents due at `$1` that no live holder has claimed.
macro_rules! due_and_free {
    () => {
        "status IN ('pending', 'sending', 'committing', 'unknown_after_send')
         AND (next_attempt_at <= $1
              -- An unknown outcome without a scheduled reconciliation is parked for an
              -- operator: never picked up (and so never replayed) again.
              OR (next_attempt_at IS NULL AND status <> 'unknown_after_send'))
         AND (claimed_by IS NULL OR claim_until <= $1)"
    };
}

type Param<'a> = &'a (dyn ToSql + Sync);

/// The columns an update writes beside the payload.
#[derive(Debug, Clone)]
struct Columns {
    id: String,
    status: IntentStatus,
    attempt: i64,
    next_attempt_at: Option<UnixMillis>,
    expires_at: Option<UnixMillis>,
    updated_at: UnixMillis,
}

impl Columns {
    fn of(intent: &DurableSendIntent) -> Columns {
        Columns {
            id: intent.id.as_str().to_owned(),
            status: intent.status,
            attempt: i64::from(intent.attempt),
            next_attempt_at: intent.next_attempt_at,
            expires_at: intent.expires_at,
            updated_at: intent.updated_at,
        }
    }

    fn keeps_claim(&self) -> bool {
        codec::keeps_claim(self.status, self.next_attempt_at)
    }
}

fn claim_write(intent: &Columns, claim: Option<&Claim>) -> ClaimWrite {
    codec::claim_write(intent.keeps_claim(), claim)
}

/// The UPDATE of every column of an intent, and its guard when `guarded`: the stored status is
/// still the expected one and nobody else holds a live claim; taking a pending intent the writer
/// does not hold must start a new attempt on the copy it read (a stale copy no longer matches).
/// Parameters: `$1` id … `$8` payload, then `$9` claim token, `$10` claim deadline (with
/// [`ClaimWrite::Take`], or when guarded), `$11` expected status and `$12` now (when guarded).
fn update_sql(write: ClaimWrite, guarded: bool) -> String {
    let mut sql = String::from(
        "UPDATE send_intents SET status = $2, attempt = $3, next_attempt_at = $4,
             expires_at = $5, updated_at = $6, format_version = $7, payload = $8",
    );
    match write {
        ClaimWrite::Keep => {}
        ClaimWrite::Release => sql.push_str(", claimed_by = NULL, claim_until = NULL"),
        ClaimWrite::Take => sql.push_str(", claimed_by = $9, claim_until = $10"),
    }
    sql.push_str(" WHERE id = $1");
    if guarded {
        if write != ClaimWrite::Take {
            // Every parameter must appear for the server to know its type.
            sql.push_str(" AND ($10::BIGINT IS NULL OR TRUE)");
        }
        sql.push_str(
            " AND status = $11
              AND (claimed_by IS NULL OR claimed_by = $9::TEXT OR claim_until <= $12)",
        );
        if write == ClaimWrite::Take {
            sql.push_str(" AND ($11 <> 'pending' OR claimed_by = $9 OR attempt < $3)");
        }
    }
    sql
}

fn encode(intent: &DurableSendIntent) -> StoreResult<String> {
    codec::encode_intent(intent)
}

fn decode_row(row: &Row) -> DbResult<DurableSendIntent> {
    let id: String = row.try_get(0)?;
    let format: i64 = row.try_get(1)?;
    let payload: &str = row.try_get(2)?;
    decode(id, format, payload)
}

fn decode(id: String, format: i64, payload: &str) -> DbResult<DurableSendIntent> {
    Ok(codec::decode_intent(id, format, payload)?)
}

fn decode_all(rows: &[Row]) -> DbResult<Vec<DurableSendIntent>> {
    rows.iter().map(decode_row).collect()
}

fn not_found(id: &str) -> DbError {
    codec::intent_not_found(id).into()
}

fn parse_status(id: &str, text: &str) -> DbResult<IntentStatus> {
    Ok(codec::parse_status(id, text)?)
}

async fn load<C: GenericClient>(
    conn: &C,
    id: &str,
    lock: bool,
) -> DbResult<Option<DurableSendIntent>> {
    let sql = if lock {
        format!("{SELECT_INTENT} WHERE id = $1 FOR UPDATE")
    } else {
        format!("{SELECT_INTENT} WHERE id = $1")
    };
    let stmt = conn.prepare_cached(&sql).await?;
    conn.query_opt(&stmt, &[&id])
        .await?
        .as_ref()
        .map(decode_row)
        .transpose()
}

/// Writes every column of an existing intent; returns how many rows changed (0 when the guard
/// did not hold).
async fn update_intent<C: GenericClient>(
    conn: &C,
    intent: &Columns,
    payload: &str,
    write: ClaimWrite,
    guard: Option<(IntentStatus, Option<&Claim>)>,
) -> DbResult<u64> {
    let (expected, claim) = guard.map_or((None, None), |(status, claim)| (Some(status), claim));
    let token = claim.map(|c| c.token.as_str());
    let until = claim.map(Claim::until);
    let now = claim.map_or(intent.updated_at, |c| c.now);
    let expected = expected.map(IntentStatus::as_str);
    let status = intent.status.as_str();
    let mut params: Vec<Param<'_>> = vec![
        &intent.id,
        &status,
        &intent.attempt,
        &intent.next_attempt_at,
        &intent.expires_at,
        &intent.updated_at,
        &INTENT_FORMAT,
        &payload,
    ];
    let guarded = guard.is_some();
    if write == ClaimWrite::Take || guarded {
        params.push(&token);
        params.push(&until);
    }
    if guarded {
        params.push(&expected);
        params.push(&now);
    }
    let stmt = conn.prepare_cached(&update_sql(write, guarded)).await?;
    Ok(conn.execute(&stmt, &params).await?)
}

async fn save<C: GenericClient>(
    conn: &C,
    intent: &Columns,
    payload: &str,
    expected: IntentStatus,
    claim: Option<&Claim>,
) -> DbResult<()> {
    let id = intent.id.as_str();
    codec::check_transition(id, expected, intent.status)?;
    // One guarded UPDATE does the compare-and-set and the write; only when it changes nothing
    // is the row read again (locked, so the answer holds), to say why.
    let write = claim_write(intent, claim);
    if update_intent(conn, intent, payload, write, Some((expected, claim))).await? == 1 {
        return Ok(());
    }
    let stmt = conn
        .prepare_cached(
            "SELECT status, claimed_by, claim_until, attempt FROM send_intents
             WHERE id = $1 FOR UPDATE",
        )
        .await?;
    let row = conn
        .query_opt(&stmt, &[&id])
        .await?
        .ok_or_else(|| not_found(id))?;
    let status: String = row.try_get(0)?;
    let claimed_by: Option<String> = row.try_get(1)?;
    let claim_until: Option<i64> = row.try_get(2)?;
    let stored = codec::StoredGuard {
        status: parse_status(id, &status)?,
        claimed_by,
        claim_until,
        attempt: row.try_get(3)?,
    };
    if let Some(refused) = codec::refused_save(
        id,
        expected,
        claim,
        write,
        intent.attempt,
        intent.updated_at,
        stored,
    ) {
        return Err(refused.into());
    }
    // The guard held after all (the row changed between the two statements): write unguarded
    // under the row lock just taken.
    update_intent(conn, intent, payload, write, None).await?;
    Ok(())
}

/// The first write of every send. A conflict on the id (another key) is an error; one on the
/// idempotency key is a duplicate.
const INSERT_INTENT: &str = "INSERT INTO send_intents (id, idempotency_key, channel, account_id,
         status, attempt, next_attempt_at, expires_at, created_at, updated_at,
         claimed_by, claim_until, format_version, payload)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
     ON CONFLICT (idempotency_key) DO NOTHING";

#[async_trait]
impl IntentStore for PostgresStore {
    async fn insert_intent(
        &self,
        intent: &DurableSendIntent,
        claim: Option<&Claim>,
    ) -> StoreResult<InsertIntentOutcome> {
        let payload = encode(intent)?;
        let columns = Columns::of(intent);
        let token = claim.map(|c| c.token.as_str());
        let until = claim.map(Claim::until);
        let key = intent.idempotency_key.as_str();
        run!(self, |conn| {
            let (payload, columns) = (&payload, &columns);

            let stmt = conn.prepare_cached(INSERT_INTENT).await?;
            let inserted = conn
                .execute(
                    &stmt,
                    &[
                        &columns.id,
                        &key,
                        &intent.channel,
                        &intent.account_id,
                        &columns.status.as_str(),
                        &columns.attempt,
                        &columns.next_attempt_at,
                        &columns.expires_at,
                        &intent.created_at,
                        &columns.updated_at,
                        &token,
                        &until,
                        &INTENT_FORMAT,
                        payload,
                    ],
                )
                .await
                .map_err(|e| match e.code() {
                    // The id is taken under another key: a caller bug, never a duplicate.
                    Some(code) if *code == SqlState::UNIQUE_VIOLATION => {
                        DbError::Store(StoreError::InvalidInput(format!(
                            "send intent id {} already exists with another idempotency key",
                            columns.id
                        )))
                    }
                    _ => DbError::Pg(e),
                })?;
            if inserted == 1 {
                return Ok(InsertIntentOutcome::Inserted);
            }
            // A new statement, a new snapshot: it sees the row that won the key.
            let stmt = conn
                .prepare_cached(&format!("{SELECT_INTENT} WHERE idempotency_key = $1"))
                .await?;
            let row = conn.query_opt(&stmt, &[&key]).await?;
            match row {
                Some(row) => Ok(InsertIntentOutcome::Duplicate(Box::new(decode_row(&row)?))),
                // The row that held the key was pruned in between.
                None => Err(DbError::Store(StoreError::NotFound {
                    what: "send intent",
                    id: key.to_owned(),
                })),
            }
        })
    }

    async fn load_intent(&self, id: &IntentId) -> StoreResult<Option<DurableSendIntent>> {
        let id = id.as_str();
        run!(self, |conn| { load(conn, id, false).await })
    }

    async fn find_intent_by_key(&self, key: &str) -> StoreResult<Option<DurableSendIntent>> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(&format!("{SELECT_INTENT} WHERE idempotency_key = $1"))
                .await?;
            conn.query_opt(&stmt, &[&key])
                .await?
                .as_ref()
                .map(decode_row)
                .transpose()
        })
    }

    async fn find_intents_by_key_prefix(
        &self,
        prefix: &str,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>> {
        // A range on the key's unique index (byte order: the column collates as "C"); `LIKE`
        // would read `%` and `_` in a key as wildcards.
        let mut upper = prefix.to_owned();
        upper.push(char::MAX);
        let limit = i64::from(limit);
        run!(self, |conn| {
            let upper = &upper;

            let stmt = conn
                .prepare_cached(&format!(
                    "{SELECT_INTENT} WHERE idempotency_key >= $1 AND idempotency_key < $2
                         ORDER BY idempotency_key LIMIT $3"
                ))
                .await?;
            decode_all(&conn.query(&stmt, &[&prefix, upper, &limit]).await?)
        })
    }

    async fn save_intent(
        &self,
        intent: &DurableSendIntent,
        expected: IntentStatus,
        claim: Option<&Claim>,
    ) -> StoreResult<()> {
        let payload = encode(intent)?;
        let columns = Columns::of(intent);
        // Usually one guarded UPDATE; the transaction matters only when it fails and the row is
        // read again to say why.
        transaction!(self, |tx| {
            let (payload, columns) = (&payload, &columns);
            (save(tx, columns, payload, expected, claim)).await
        })
    }

    async fn record_partial_receipt(
        &self,
        id: &IntentId,
        parts: &MessageReceipt,
        now: UnixMillis,
    ) -> StoreResult<DurableSendIntent> {
        let id = id.as_str();
        transaction!(self, |tx| {
            let mut intent = load(tx, id, true).await?.ok_or_else(|| not_found(id))?;
            if intent.status != IntentStatus::Sending {
                return Err(StoreError::IntentStatusConflict {
                    id: id.to_owned(),
                    expected: IntentStatus::Sending,
                    actual: intent.status,
                }
                .into());
            }
            match &mut intent.partial_receipt {
                Some(existing) => existing.merge(parts.clone()),
                None => intent.partial_receipt = Some(parts.clone()),
            }
            intent.updated_at = now;
            let payload = encode(&intent)?;
            update_intent(tx, &Columns::of(&intent), &payload, ClaimWrite::Keep, None).await?;
            Ok(intent)
        })
    }

    async fn commit_receipt(
        &self,
        id: &IntentId,
        receipt: &MessageReceipt,
        now: UnixMillis,
    ) -> StoreResult<DurableSendIntent> {
        // The payload is edited by the server's JSON functions: one statement, no read first.
        let receipt = to_json(receipt).map_err(|source| StoreError::Decode {
            what: "receipt",
            id: id.to_string(),
            source,
        })?;
        let id = id.as_str();
        run!(self, |conn| {
            let receipt = &receipt;

            let stmt = conn
                .prepare_cached(
                    "UPDATE send_intents
                         SET status = 'sent', next_attempt_at = NULL, updated_at = $2,
                             claimed_by = NULL, claim_until = NULL,
                             payload = ((payload::jsonb - 'partialReceipt' - 'failure'
                                         - 'nextAttemptAt')
                                        || jsonb_build_object('status', 'sent'::TEXT,
                                               'receipt', $3::TEXT::jsonb,
                                               'updatedAt', $2::BIGINT))::TEXT
                         WHERE id = $1 AND format_version <= $4
                           AND status IN ('sending', 'committing', 'unknown_after_send')
                         RETURNING id, format_version, payload",
                )
                .await?;
            if let Some(row) = conn
                .query_opt(&stmt, &[&id, &now, receipt, &INTENT_FORMAT])
                .await?
            {
                return decode_row(&row);
            }
            // Not committed: say why (unknown id, newer payload, or an illegal move).
            let stmt = conn
                .prepare_cached("SELECT status, format_version FROM send_intents WHERE id = $1")
                .await?;
            let row = conn
                .query_opt(&stmt, &[&id])
                .await?
                .ok_or_else(|| not_found(id))?;
            let status: String = row.try_get(0)?;
            let format: i64 = row.try_get(1)?;
            if format > INTENT_FORMAT {
                return Err(StoreError::NewerPayloadFormat {
                    what: "send intent",
                    id: id.to_owned(),
                    found: format,
                    supported: INTENT_FORMAT,
                }
                .into());
            }
            let from = parse_status(id, &status)?;
            let source = from.transition_to(IntentStatus::Sent).err().unwrap_or(
                clawgate_types::IllegalTransition {
                    from,
                    to: IntentStatus::Sent,
                },
            );
            Err(StoreError::IllegalTransition {
                id: id.to_owned(),
                source,
            }
            .into())
        })
    }

    async fn claim_due_intents(
        &self,
        claim: &Claim,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>> {
        let token = claim.token.as_str();
        let (now, until, limit) = (claim.now, claim.until(), i64::from(limit));
        // One statement: the due rows are locked as they are picked, and rows another gateway is
        // claiming right now are skipped rather than waited for (and re-checked, had they been
        // taken), so two gateways never claim the same intent.
        let mut claimed = run!(self, |conn| {
            let stmt = conn
                .prepare_cached(concat!(
                    "UPDATE send_intents SET claimed_by = $2, claim_until = $3
                             WHERE id IN (SELECT id FROM send_intents WHERE ",
                    due_and_free!(),
                    " ORDER BY created_at, id LIMIT $4 FOR UPDATE SKIP LOCKED)
                             RETURNING id, format_version, payload, created_at"
                ))
                .await?;
            let rows = conn.query(&stmt, &[&now, &token, &until, &limit]).await?;
            rows.iter()
                .map(|r| Ok((r.try_get::<_, i64>(3)?, decode_row(r)?)))
                .collect::<DbResult<Vec<_>>>()
        })?;
        // RETURNING follows no order: oldest first, as promised.
        claimed.sort_by(|(a_at, a), (b_at, b)| (a_at, a.id.as_str()).cmp(&(b_at, b.id.as_str())));
        Ok(claimed.into_iter().map(|(_, intent)| intent).collect())
    }

    async fn due_intents(
        &self,
        now: UnixMillis,
        after: Option<&IntentCursor>,
        limit: u32,
    ) -> StoreResult<Vec<DurableSendIntent>> {
        let limit = i64::from(limit);
        run!(self, |conn| {
            let rows = match after {
                None => {
                    let stmt = conn
                        .prepare_cached(concat!(
                            "SELECT id, format_version, payload FROM send_intents WHERE ",
                            due_and_free!(),
                            " ORDER BY created_at, id LIMIT $2"
                        ))
                        .await?;
                    conn.query(&stmt, &[&now, &limit]).await?
                }
                Some(cursor) => {
                    let stmt = conn
                        .prepare_cached(concat!(
                            "SELECT id, format_version, payload FROM send_intents WHERE ",
                            due_and_free!(),
                            " AND (created_at, id) > ($3, $4)
                                 ORDER BY created_at, id LIMIT $2"
                        ))
                        .await?;
                    conn.query(&stmt, &[&now, &limit, &cursor.created_at, &cursor.id])
                        .await?
                }
            };
            decode_all(&rows)
        })
    }

    async fn claim_intent(
        &self,
        id: &IntentId,
        claim: &Claim,
    ) -> StoreResult<Option<DurableSendIntent>> {
        let id = id.as_str();
        let token = claim.token.as_str();
        let (now, until) = (claim.now, claim.until());
        run!(self, |conn| {
            let stmt = conn
                    .prepare_cached(
                        "UPDATE send_intents SET claimed_by = $2, claim_until = $3
                         WHERE id = $1 AND (claimed_by IS NULL OR claim_until <= $4 OR claimed_by = $2)
                         RETURNING id, format_version, payload",
                    )
                    .await?;
            if let Some(row) = conn.query_opt(&stmt, &[&id, &token, &until, &now]).await? {
                return Ok(Some(decode_row(&row)?));
            }
            let stmt = conn
                .prepare_cached("SELECT 1 FROM send_intents WHERE id = $1")
                .await?;
            match conn.query_opt(&stmt, &[&id]).await? {
                Some(_) => Ok(None),
                None => Err(not_found(id)),
            }
        })
    }

    async fn release_intent_claim(&self, id: &IntentId, token: &ClaimToken) -> StoreResult<()> {
        let (id, token) = (id.as_str(), token.as_str());
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "UPDATE send_intents SET claimed_by = NULL, claim_until = NULL
                         WHERE id = $1 AND claimed_by = $2",
                )
                .await?;
            conn.execute(&stmt, &[&id, &token]).await?;
            Ok(())
        })
    }

    async fn claim_holders(&self) -> StoreResult<Vec<(ClaimToken, u64)>> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "SELECT claimed_by, COUNT(*) FROM send_intents
                         WHERE claimed_by IS NOT NULL GROUP BY claimed_by ORDER BY claimed_by",
                )
                .await?;
            conn.query(&stmt, &[])
                .await?
                .iter()
                .map(|r| {
                    Ok((
                        ClaimToken(r.try_get(0)?),
                        crate::u64_of(r.try_get::<_, i64>(1)?),
                    ))
                })
                .collect()
        })
    }

    async fn release_claims_held_by(&self, token: &ClaimToken) -> StoreResult<u64> {
        let token = token.as_str();
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "UPDATE send_intents SET claimed_by = NULL, claim_until = NULL
                         WHERE claimed_by = $1",
                )
                .await?;
            Ok(conn.execute(&stmt, &[&token]).await?)
        })
    }

    async fn list_intents(&self, filter: &IntentFilter) -> StoreResult<Vec<DurableSendIntent>> {
        let statuses: Vec<&str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        let after = filter.after.as_ref();
        let limit = i64::from(filter.limit);
        run!(self, |conn| {
            let statuses = &statuses;

            let mut sql = format!("{SELECT_INTENT} WHERE TRUE");
            let mut params: Vec<Param<'_>> = Vec::new();
            if !statuses.is_empty() {
                params.push(statuses);
                sql.push_str(&format!(" AND status = ANY(${})", params.len()));
                if statuses
                    .iter()
                    .all(|s| IntentStatus::parse(s).is_some_and(IntentStatus::is_recoverable))
                {
                    // Implied by the filter; spelled out so the open index can serve it.
                    sql.push_str(&format!(" AND {OPEN}"));
                }
            }
            if let Some(channel) = &filter.channel {
                params.push(channel);
                sql.push_str(&format!(" AND channel = ${}", params.len()));
            }
            if let Some(after) = after {
                params.push(&after.created_at);
                params.push(&after.id);
                sql.push_str(&format!(
                    " AND (created_at, id) > (${}, ${})",
                    params.len() - 1,
                    params.len()
                ));
            }
            params.push(&limit);
            sql.push_str(&format!(" ORDER BY created_at, id LIMIT ${}", params.len()));
            let stmt = conn.prepare_cached(&sql).await?;
            decode_all(&conn.query(&stmt, &params).await?)
        })
    }

    async fn count_intents_by_status(&self) -> StoreResult<Vec<(IntentStatus, u64)>> {
        let mut counts = run!(self, |conn| {
            let stmt = conn
                .prepare_cached("SELECT status, COUNT(*) FROM send_intents GROUP BY status")
                .await?;
            conn.query(&stmt, &[])
                .await?
                .iter()
                .map(|r| {
                    let status: String = r.try_get(0)?;
                    Ok((
                        parse_status("(count)", &status)?,
                        crate::u64_of(r.try_get::<_, i64>(1)?),
                    ))
                })
                .collect::<DbResult<Vec<_>>>()
        })?;
        counts.sort_by_key(|(s, _)| *s);
        Ok(counts)
    }

    async fn prune_finished_intents(
        &self,
        updated_before: UnixMillis,
        limit: u32,
    ) -> StoreResult<u64> {
        let limit = i64::from(limit);
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "DELETE FROM send_intents WHERE id IN (
                             SELECT id FROM send_intents
                             WHERE created_at < $1 AND updated_at < $1
                               AND status IN ('sent', 'cancelled')
                             ORDER BY created_at, id LIMIT $2)",
                )
                .await?;
            Ok(conn.execute(&stmt, &[&updated_before, &limit]).await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{ClaimWrite, update_sql};

    /// Every update statement names each parameter it is given (the server must type them all).
    #[test]
    fn update_statements_use_every_parameter() {
        for write in [ClaimWrite::Keep, ClaimWrite::Release, ClaimWrite::Take] {
            for guarded in [false, true] {
                let sql = update_sql(write, guarded);
                let count = match (write, guarded) {
                    (_, true) => 12,
                    (ClaimWrite::Take, false) => 10,
                    _ => 8,
                };
                for n in 1..=count {
                    assert!(
                        sql.contains(&format!("${n}")),
                        "{write:?} {guarded}: ${n} in {sql}"
                    );
                }
                assert!(!sql.contains(&format!("${}", count + 1)), "{sql}");
            }
        }
    }
}
