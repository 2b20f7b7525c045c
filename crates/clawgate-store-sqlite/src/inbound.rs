//! Inbound records (dedupe across restarts, attempts, dead letters) and polling watermarks.

use async_trait::async_trait;
use clawgate_types::UnixMillis;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::SqliteStore;
use super::errors::DbResult;
use clawgate_store::codec::InboundRow;
use clawgate_store::{
    InboundKey, InboundRecord, InboundStatus, RecordInboundOutcome, WatermarkKey,
};
use clawgate_store::{InboundStore, WatermarkStore};
use clawgate_store::{StoreError, StoreResult};

/// Completed records last updated before `?1`, oldest first, at most `?2`. A record updated
/// before `?1` was received before it too: the bound on `received_at` keeps the walk of the
/// status index to the records that can qualify.
pub(super) const COMPLETED_BEFORE: &str = "SELECT rowid FROM inbound_records
     WHERE status = 'completed' AND received_at < ?1 AND updated_at < ?1
     ORDER BY received_at LIMIT ?2";

const SELECT_INBOUND: &str = "SELECT channel, account_id, event_id, status, attempts, payload,
    last_error, received_at, updated_at FROM inbound_records";

fn raw_row(r: &Row<'_>) -> rusqlite::Result<InboundRow> {
    Ok(InboundRow {
        channel: r.get(0)?,
        account_id: r.get(1)?,
        event_id: r.get(2)?,
        status: r.get(3)?,
        attempts: r.get(4)?,
        payload: r.get(5)?,
        last_error: r.get(6)?,
        received_at: r.get(7)?,
        updated_at: r.get(8)?,
    })
}

fn decode(raw: InboundRow) -> DbResult<InboundRecord> {
    Ok(raw.decode()?)
}

fn load(conn: &Connection, key: &InboundKey) -> DbResult<Option<InboundRecord>> {
    let raw = conn
        .prepare_cached(&format!(
            "{SELECT_INBOUND} WHERE channel = ?1 AND account_id = ?2 AND event_id = ?3"
        ))?
        .query_row(params![key.channel, key.account_id, key.event_id], raw_row)
        .optional()?;
    raw.map(decode).transpose()
}

fn not_found(key: &InboundKey) -> StoreError {
    StoreError::NotFound {
        what: "inbound record",
        id: format!("{}/{}/{}", key.channel, key.account_id, key.event_id),
    }
}

fn list(
    conn: &Connection,
    sql: &str,
    args: &[&dyn rusqlite::ToSql],
) -> DbResult<Vec<InboundRecord>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map(args, raw_row)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(decode(row?)?);
    }
    Ok(out)
}

#[async_trait]
impl InboundStore for SqliteStore {
    async fn record_inbound(
        &self,
        key: &InboundKey,
        payload: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<RecordInboundOutcome> {
        let key = key.clone();
        let value = payload.clone();
        let payload = payload.to_string();
        let written = key.clone();
        let outcome = self
            .write(move |conn| {
                let inserted = conn
                .prepare_cached(
                    "INSERT INTO inbound_records (channel, account_id, event_id, status, attempts,
                         payload, last_error, received_at, updated_at)
                     VALUES (?1, ?2, ?3, 'received', 1, ?4, NULL, ?5, ?5)
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![
                    key.channel,
                    key.account_id,
                    key.event_id,
                    payload,
                    now
                ])?;
                if inserted == 1 {
                    return Ok(None);
                }
                // Seen before and unfinished: another attempt starts now, counted before it
                // runs (a turn that kills the process still counts).
                conn.prepare_cached(
                    "UPDATE inbound_records SET attempts = attempts + 1, updated_at = ?4
                     WHERE channel = ?1 AND account_id = ?2 AND event_id = ?3
                       AND status = 'received'",
                )?
                .execute(params![
                    key.channel,
                    key.account_id,
                    key.event_id,
                    now
                ])?;
                // The stored record, as it is now.
                Ok(Some(load(conn, &key)?.ok_or_else(|| not_found(&key))?))
            })
            .await?;
        Ok(match outcome {
            Some(existing) => RecordInboundOutcome::Duplicate(existing),
            // New: the record is exactly what was written (no read back on the writer).
            None => RecordInboundOutcome::New(InboundRecord {
                channel: written.channel,
                account_id: written.account_id,
                event_id: written.event_id,
                status: InboundStatus::Received,
                attempts: 1,
                payload: value,
                last_error: None,
                received_at: now,
                updated_at: now,
            }),
        })
    }

    async fn load_inbound(&self, key: &InboundKey) -> StoreResult<Option<InboundRecord>> {
        let key = key.clone();
        self.read(move |conn| load(conn, &key)).await
    }

    async fn accept_inbound(
        &self,
        key: &InboundKey,
        payload: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<bool> {
        let key = key.clone();
        let payload = payload.to_string();
        self.write(move |conn| {
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO inbound_records (channel, account_id, event_id, status, attempts,
                         payload, last_error, received_at, updated_at)
                     VALUES (?1, ?2, ?3, 'received', 0, ?4, NULL, ?5, ?5)
                     ON CONFLICT DO NOTHING",
                )?
                .execute(params![
                    key.channel,
                    key.account_id,
                    key.event_id,
                    payload,
                    now
                ])?;
            Ok(inserted == 1)
        })
        .await
    }

    async fn finish_inbound(
        &self,
        key: &InboundKey,
        status: InboundStatus,
        error: Option<&str>,
        now: UnixMillis,
    ) -> StoreResult<u32> {
        let key = key.clone();
        let error = error.map(str::to_owned);
        self.write(move |conn| {
            let attempts: Option<i64> = conn
                .prepare_cached(
                    "UPDATE inbound_records
                     SET status = ?4,
                         last_error = COALESCE(last_error, ?5), updated_at = ?6
                     WHERE channel = ?1 AND account_id = ?2 AND event_id = ?3
                     RETURNING attempts",
                )?
                .query_row(
                    params![
                        key.channel,
                        key.account_id,
                        key.event_id,
                        status.as_str(),
                        error,
                        now
                    ],
                    |r| r.get(0),
                )
                .optional()?;
            let attempts = attempts.ok_or_else(|| not_found(&key))?;
            Ok(u32::try_from(attempts).unwrap_or(u32::MAX))
        })
        .await
    }

    async fn interrupt_inbound(
        &self,
        key: &InboundKey,
        error: &str,
        now: UnixMillis,
    ) -> StoreResult<u32> {
        let key = key.clone();
        let error = error.to_owned();
        self.write(move |conn| {
            let attempts: Option<i64> = conn
                .prepare_cached(
                    "UPDATE inbound_records
                     SET attempts = MAX(attempts - 1, 0),
                         last_error = COALESCE(last_error, ?4), updated_at = ?5
                     WHERE channel = ?1 AND account_id = ?2 AND event_id = ?3
                       AND status = 'received'
                     RETURNING attempts",
                )?
                .query_row(
                    params![key.channel, key.account_id, key.event_id, error, now],
                    |r| r.get(0),
                )
                .optional()?;
            match attempts {
                Some(attempts) => Ok(u32::try_from(attempts).unwrap_or(u32::MAX)),
                // Finished meanwhile (or never recorded): nothing to give back.
                None => Ok(load(conn, &key)?.ok_or_else(|| not_found(&key))?.attempts),
            }
        })
        .await
    }

    async fn list_unfinished_inbound(&self, limit: u32) -> StoreResult<Vec<InboundRecord>> {
        self.read(move |conn| {
            list(
                conn,
                &format!("{SELECT_INBOUND} WHERE status = 'received' ORDER BY received_at, event_id LIMIT ?1"),
                &[&limit],
            )
        })
        .await
    }

    async fn list_inbound(
        &self,
        status: Option<InboundStatus>,
        limit: u32,
    ) -> StoreResult<Vec<InboundRecord>> {
        self.read(move |conn| match status {
            Some(status) => list(
                conn,
                &format!("{SELECT_INBOUND} WHERE status = ?1 ORDER BY received_at DESC LIMIT ?2"),
                &[&status.as_str(), &limit],
            ),
            None => list(
                conn,
                &format!("{SELECT_INBOUND} ORDER BY received_at DESC LIMIT ?1"),
                &[&limit],
            ),
        })
        .await
    }

    async fn prune_completed_inbound(
        &self,
        completed_before: UnixMillis,
        limit: u32,
    ) -> StoreResult<u64> {
        self.delete_oldest("inbound_records", COMPLETED_BEFORE, completed_before, limit)
            .await
    }
}

#[async_trait]
impl WatermarkStore for SqliteStore {
    async fn load_watermark(
        &self,
        key: &WatermarkKey,
    ) -> StoreResult<Option<(i64, Option<String>)>> {
        let key = key.clone();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT watermark, checkpoint FROM polling_watermarks
                     WHERE channel = ?1 AND account_id = ?2 AND source = ?3",
                )?
                .query_row(params![key.channel, key.account_id, key.source], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?)
        })
        .await
    }

    async fn advance_watermark(
        &self,
        key: &WatermarkKey,
        value: i64,
        checkpoint: Option<&str>,
        now: UnixMillis,
    ) -> StoreResult<i64> {
        let key = key.clone();
        let checkpoint = checkpoint.map(str::to_owned);
        self.write(move |conn| {
            // The checkpoint moves with the watermark only: one valid at a lower position than
            // the stored one would resume past events not finished there.
            Ok(conn
                .prepare_cached(
                    "INSERT INTO polling_watermarks
                         (channel, account_id, source, watermark, checkpoint, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (channel, account_id, source) DO UPDATE
                     SET checkpoint = CASE WHEN excluded.watermark > watermark
                                           THEN excluded.checkpoint ELSE checkpoint END,
                         watermark = MAX(watermark, excluded.watermark),
                         updated_at = excluded.updated_at
                     RETURNING watermark",
                )?
                .query_row(
                    params![
                        key.channel,
                        key.account_id,
                        key.source,
                        value,
                        checkpoint,
                        now
                    ],
                    |r| r.get(0),
                )?)
        })
        .await
    }
}
