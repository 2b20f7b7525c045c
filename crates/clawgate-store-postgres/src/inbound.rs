//! Inbound records (dedupe across restarts and gateways, attempts, dead letters) and polling
//! watermarks.

use async_trait::async_trait;
use clawgate_store::codec;
use clawgate_store::{
    InboundKey, InboundRecord, InboundStatus, InboundStore, RecordInboundOutcome, StoreError,
    StoreResult, WatermarkKey, WatermarkStore,
};
use clawgate_types::UnixMillis;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::errors::DbResult;
use crate::{PostgresStore, u32_of};

const COLUMNS: &str = "channel, account_id, event_id, status, attempts, payload, last_error, \
                       received_at, updated_at";

fn decode(row: &Row) -> DbResult<InboundRecord> {
    Ok(codec::InboundRow {
        channel: row.try_get(0)?,
        account_id: row.try_get(1)?,
        event_id: row.try_get(2)?,
        status: row.try_get(3)?,
        attempts: row.try_get(4)?,
        payload: row.try_get(5)?,
        last_error: row.try_get(6)?,
        received_at: row.try_get(7)?,
        updated_at: row.try_get(8)?,
    }
    .decode()?)
}

async fn load<C: GenericClient>(conn: &C, key: &InboundKey) -> DbResult<Option<InboundRecord>> {
    let stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM inbound_records
             WHERE channel = $1 AND account_id = $2 AND event_id = $3"
        ))
        .await?;
    conn.query_opt(&stmt, &[&key.channel, &key.account_id, &key.event_id])
        .await?
        .as_ref()
        .map(decode)
        .transpose()
}

fn not_found(key: &InboundKey) -> StoreError {
    StoreError::NotFound {
        what: "inbound record",
        id: format!("{}/{}/{}", key.channel, key.account_id, key.event_id),
    }
}

#[async_trait]
impl InboundStore for PostgresStore {
    async fn record_inbound(
        &self,
        key: &InboundKey,
        payload: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<RecordInboundOutcome> {
        let text = payload.to_string();
        run!(self, |conn| {
            let text = &text;

            // One statement: a new record, or another attempt counted on an unfinished one
            // (before it runs: a turn that kills the process still counts). `xmax = 0` tells
            // a fresh row from an updated one.
            let stmt = conn
                .prepare_cached(&format!(
                    "INSERT INTO inbound_records AS r (channel, account_id, event_id, status,
                             attempts, payload, last_error, received_at, updated_at)
                         VALUES ($1, $2, $3, 'received', 1, $4, NULL, $5, $5)
                         ON CONFLICT (channel, account_id, event_id) DO UPDATE
                         SET attempts = r.attempts + 1, updated_at = EXCLUDED.updated_at
                         WHERE r.status = 'received'
                         RETURNING {COLUMNS}, (xmax = 0) AS inserted"
                ))
                .await?;
            let row = conn
                .query_opt(
                    &stmt,
                    &[&key.channel, &key.account_id, &key.event_id, text, &now],
                )
                .await?;
            match row {
                Some(row) if row.try_get::<_, bool>(9)? => {
                    Ok(RecordInboundOutcome::New(decode(&row)?))
                }
                Some(row) => Ok(RecordInboundOutcome::Duplicate(decode(&row)?)),
                // Finished: returned unchanged.
                None => Ok(RecordInboundOutcome::Duplicate(
                    load(conn, key).await?.ok_or_else(|| not_found(key))?,
                )),
            }
        })
    }

    async fn accept_inbound(
        &self,
        key: &InboundKey,
        payload: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<bool> {
        let text = payload.to_string();
        run!(self, |conn| {
            let text = &text;

            let stmt = conn
                .prepare_cached(
                    "INSERT INTO inbound_records (channel, account_id, event_id, status,
                             attempts, payload, last_error, received_at, updated_at)
                         VALUES ($1, $2, $3, 'received', 0, $4, NULL, $5, $5)
                         ON CONFLICT DO NOTHING",
                )
                .await?;
            let inserted = conn
                .execute(
                    &stmt,
                    &[&key.channel, &key.account_id, &key.event_id, text, &now],
                )
                .await?;
            Ok(inserted == 1)
        })
    }

    async fn load_inbound(&self, key: &InboundKey) -> StoreResult<Option<InboundRecord>> {
        run!(self, |conn| { load(conn, key).await })
    }

    async fn finish_inbound(
        &self,
        key: &InboundKey,
        status: InboundStatus,
        error: Option<&str>,
        now: UnixMillis,
    ) -> StoreResult<u32> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "UPDATE inbound_records
                         SET status = $4, last_error = COALESCE(last_error, $5), updated_at = $6
                         WHERE channel = $1 AND account_id = $2 AND event_id = $3
                         RETURNING attempts",
                )
                .await?;
            let row = conn
                .query_opt(
                    &stmt,
                    &[
                        &key.channel,
                        &key.account_id,
                        &key.event_id,
                        &status.as_str(),
                        &error,
                        &now,
                    ],
                )
                .await?
                .ok_or_else(|| not_found(key))?;
            Ok(u32_of(row.try_get(0)?))
        })
    }

    async fn interrupt_inbound(
        &self,
        key: &InboundKey,
        error: &str,
        now: UnixMillis,
    ) -> StoreResult<u32> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "UPDATE inbound_records
                         SET attempts = GREATEST(attempts - 1, 0),
                             last_error = COALESCE(last_error, $4), updated_at = $5
                         WHERE channel = $1 AND account_id = $2 AND event_id = $3
                           AND status = 'received'
                         RETURNING attempts",
                )
                .await?;
            let row = conn
                .query_opt(
                    &stmt,
                    &[&key.channel, &key.account_id, &key.event_id, &error, &now],
                )
                .await?;
            match row {
                Some(row) => Ok(u32_of(row.try_get(0)?)),
                // Finished meanwhile (or never recorded): nothing to give back.
                None => Ok(load(conn, key)
                    .await?
                    .ok_or_else(|| not_found(key))?
                    .attempts),
            }
        })
    }

    async fn list_unfinished_inbound(&self, limit: u32) -> StoreResult<Vec<InboundRecord>> {
        let limit = i64::from(limit);
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM inbound_records WHERE status = 'received'
                         ORDER BY received_at, event_id LIMIT $1"
                ))
                .await?;
            conn.query(&stmt, &[&limit])
                .await?
                .iter()
                .map(decode)
                .collect()
        })
    }

    async fn list_inbound(
        &self,
        status: Option<InboundStatus>,
        limit: u32,
    ) -> StoreResult<Vec<InboundRecord>> {
        let limit = i64::from(limit);
        let status = status.map(InboundStatus::as_str);
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM inbound_records
                         WHERE ($1::TEXT IS NULL OR status = $1)
                         ORDER BY received_at DESC LIMIT $2"
                ))
                .await?;
            conn.query(&stmt, &[&status, &limit])
                .await?
                .iter()
                .map(decode)
                .collect()
        })
    }

    async fn prune_completed_inbound(
        &self,
        completed_before: UnixMillis,
        limit: u32,
    ) -> StoreResult<u64> {
        let limit = i64::from(limit);
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "DELETE FROM inbound_records WHERE ctid IN (
                             SELECT ctid FROM inbound_records
                             WHERE status = 'completed' AND received_at < $1 AND updated_at < $1
                             ORDER BY received_at LIMIT $2)",
                )
                .await?;
            Ok(conn.execute(&stmt, &[&completed_before, &limit]).await?)
        })
    }
}

#[async_trait]
impl WatermarkStore for PostgresStore {
    async fn load_watermark(
        &self,
        key: &WatermarkKey,
    ) -> StoreResult<Option<(i64, Option<String>)>> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "SELECT watermark, checkpoint FROM polling_watermarks
                         WHERE channel = $1 AND account_id = $2 AND source = $3",
                )
                .await?;
            conn.query_opt(&stmt, &[&key.channel, &key.account_id, &key.source])
                .await?
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .transpose()
        })
    }

    async fn advance_watermark(
        &self,
        key: &WatermarkKey,
        value: i64,
        checkpoint: Option<&str>,
        now: UnixMillis,
    ) -> StoreResult<i64> {
        run!(self, |conn| {
            // The checkpoint moves with the watermark only: one valid at a lower position
            // than the stored one would resume past events not finished there.
            let stmt = conn
                .prepare_cached(
                    "INSERT INTO polling_watermarks AS w
                             (channel, account_id, source, watermark, checkpoint, updated_at)
                         VALUES ($1, $2, $3, $4, $5, $6)
                         ON CONFLICT (channel, account_id, source) DO UPDATE
                         SET checkpoint = CASE WHEN EXCLUDED.watermark > w.watermark
                                               THEN EXCLUDED.checkpoint ELSE w.checkpoint END,
                             watermark = GREATEST(w.watermark, EXCLUDED.watermark),
                             updated_at = EXCLUDED.updated_at
                         RETURNING watermark",
                )
                .await?;
            let row = conn
                .query_one(
                    &stmt,
                    &[
                        &key.channel,
                        &key.account_id,
                        &key.source,
                        &value,
                        &checkpoint,
                        &now,
                    ],
                )
                .await?;
            Ok(row.try_get(0)?)
        })
    }
}
