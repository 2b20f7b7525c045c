//! Channel state: books of keyed records and named values, scoped to one channel account and
//! shared by every gateway on the database.

use async_trait::async_trait;
use clawgate_store::{
    AppendedRecord, ChannelRecord, ChannelScope, ChannelStateStore, ChannelValue, StoreError,
    StoreResult, ValueExpectation, ValueSwap,
};
use clawgate_types::UnixMillis;
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::PostgresStore;
use crate::errors::DbResult;

fn json(what: &str, text: &str) -> DbResult<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::InvalidInput(format!("the stored channel {what} is not JSON: {e}")).into()
    })
}

fn record(row: &Row) -> DbResult<ChannelRecord> {
    let value: String = row.try_get(2)?;
    Ok(ChannelRecord {
        seq: row.try_get(0)?,
        key: row.try_get(1)?,
        value: json("record", &value)?,
        recorded_at: row.try_get(3)?,
    })
}

fn value(row: &Row) -> DbResult<ChannelValue> {
    let text: String = row.try_get(0)?;
    Ok(ChannelValue {
        value: json("value", &text)?,
        version: row.try_get(1)?,
        updated_at: row.try_get(2)?,
    })
}

async fn find<C: GenericClient>(
    conn: &C,
    scope: &ChannelScope,
    book: &str,
    key: &str,
) -> DbResult<Option<ChannelRecord>> {
    let stmt = conn
        .prepare_cached(
            "SELECT seq, key, value, recorded_at FROM channel_records
             WHERE kind = $1 AND account = $2 AND book = $3 AND key = $4",
        )
        .await?;
    conn.query_opt(&stmt, &[&scope.kind, &scope.account, &book, &key])
        .await?
        .as_ref()
        .map(record)
        .transpose()
}

#[async_trait]
impl ChannelStateStore for PostgresStore {
    async fn append_channel_record(
        &self,
        scope: &ChannelScope,
        book: &str,
        key: &str,
        value: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<AppendedRecord> {
        let text = value.to_string();
        transaction!(self, |conn| {
            if let Some(record) = find(conn, scope, book, key).await? {
                return Ok(AppendedRecord { record, new: false });
            }
            // The book's row stays locked until this transaction ends: appends to one book
            // commit in the order of their numbers.
            let stmt = conn
                .prepare_cached(
                    "INSERT INTO channel_books AS b (kind, account, book, last_seq)
                     VALUES ($1, $2, $3, 1)
                     ON CONFLICT (kind, account, book) DO UPDATE SET last_seq = b.last_seq + 1
                     RETURNING last_seq",
                )
                .await?;
            let seq: i64 = conn
                .query_one(&stmt, &[&scope.kind, &scope.account, &book])
                .await?
                .try_get(0)?;
            let stmt = conn
                .prepare_cached(
                    "INSERT INTO channel_records (kind, account, book, seq, key, value, recorded_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (kind, account, book, key) DO NOTHING",
                )
                .await?;
            let inserted = conn
                .execute(
                    &stmt,
                    &[&scope.kind, &scope.account, &book, &seq, &key, &text, &now],
                )
                .await?;
            if inserted == 0 {
                // Another gateway appended the key after our look and committed before our
                // insert (it held the book's row): its record stands.
                let record = find(conn, scope, book, key).await?.ok_or_else(|| {
                    StoreError::InvalidInput(format!(
                        "channel record {key:?} of {scope} book {book:?} vanished mid-append"
                    ))
                })?;
                return Ok(AppendedRecord { record, new: false });
            }
            Ok(AppendedRecord {
                record: ChannelRecord {
                    seq,
                    key: key.to_owned(),
                    value: value.clone(),
                    recorded_at: now,
                },
                new: true,
            })
        })
    }

    async fn find_channel_record(
        &self,
        scope: &ChannelScope,
        book: &str,
        key: &str,
    ) -> StoreResult<Option<ChannelRecord>> {
        run!(self, |conn| { find(conn, scope, book, key).await })
    }

    async fn channel_records_since(
        &self,
        scope: &ChannelScope,
        book: &str,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<ChannelRecord>> {
        let limit = i64::from(limit);
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "SELECT seq, key, value, recorded_at FROM channel_records
                     WHERE kind = $1 AND account = $2 AND book = $3 AND seq > $4
                     ORDER BY seq LIMIT $5",
                )
                .await?;
            conn.query(&stmt, &[&scope.kind, &scope.account, &book, &after, &limit])
                .await?
                .iter()
                .map(record)
                .collect::<DbResult<Vec<_>>>()
        })
    }

    async fn prune_channel_records(
        &self,
        scope: &ChannelScope,
        book: &str,
        older_than: UnixMillis,
        keep_newest: u64,
    ) -> StoreResult<u64> {
        let keep = i64::try_from(keep_newest).unwrap_or(i64::MAX);
        transaction!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "DELETE FROM channel_records
                     WHERE kind = $1 AND account = $2 AND book = $3 AND recorded_at < $4",
                )
                .await?;
            let old = conn
                .execute(&stmt, &[&scope.kind, &scope.account, &book, &older_than])
                .await?;
            let stmt = conn
                .prepare_cached(
                    "DELETE FROM channel_records
                     WHERE kind = $1 AND account = $2 AND book = $3 AND seq <= (
                         SELECT seq FROM channel_records
                         WHERE kind = $1 AND account = $2 AND book = $3
                         ORDER BY seq DESC LIMIT 1 OFFSET $4)",
                )
                .await?;
            let surplus = conn
                .execute(&stmt, &[&scope.kind, &scope.account, &book, &keep])
                .await?;
            Ok(old + surplus)
        })
    }

    async fn load_channel_value(
        &self,
        scope: &ChannelScope,
        name: &str,
    ) -> StoreResult<Option<ChannelValue>> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "SELECT value, version, updated_at FROM channel_values
                     WHERE kind = $1 AND account = $2 AND name = $3",
                )
                .await?;
            conn.query_opt(&stmt, &[&scope.kind, &scope.account, &name])
                .await?
                .as_ref()
                .map(value)
                .transpose()
        })
    }

    async fn swap_channel_value(
        &self,
        scope: &ChannelScope,
        name: &str,
        expected: ValueExpectation,
        new: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<ValueSwap> {
        let text = new.to_string();
        transaction!(self, |conn| {
            // The row lock (or, when absent, the primary key of the insert) orders two writers.
            let stmt = conn
                .prepare_cached(
                    "SELECT value, version, updated_at FROM channel_values
                     WHERE kind = $1 AND account = $2 AND name = $3 FOR UPDATE",
                )
                .await?;
            let current = conn
                .query_opt(&stmt, &[&scope.kind, &scope.account, &name])
                .await?
                .as_ref()
                .map(value)
                .transpose()?;
            let holds = match (expected, &current) {
                (ValueExpectation::Any, _) => true,
                (ValueExpectation::Absent, stored) => stored.is_none(),
                (ValueExpectation::Version(v), Some(stored)) => stored.version == v,
                (ValueExpectation::Version(_), None) => false,
            };
            if !holds {
                return Ok(ValueSwap::Conflict(current));
            }
            let version = current.as_ref().map_or(1, |c| c.version + 1);
            let stmt = conn
                .prepare_cached(
                    "INSERT INTO channel_values AS v (kind, account, name, value, version, updated_at)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (kind, account, name) DO UPDATE SET
                         value = excluded.value, version = excluded.version,
                         updated_at = excluded.updated_at
                     WHERE v.version = $5 - 1",
                )
                .await?;
            let written = conn
                .execute(
                    &stmt,
                    &[&scope.kind, &scope.account, &name, &text, &version, &now],
                )
                .await?;
            if written == 0 {
                // Absent at our look, inserted by another writer before our insert.
                let stmt = conn
                    .prepare_cached(
                        "SELECT value, version, updated_at FROM channel_values
                         WHERE kind = $1 AND account = $2 AND name = $3",
                    )
                    .await?;
                let stored = conn
                    .query_opt(&stmt, &[&scope.kind, &scope.account, &name])
                    .await?
                    .as_ref()
                    .map(value)
                    .transpose()?;
                return Ok(if expected == ValueExpectation::Any {
                    // Nothing was required of it: write over it (the row is locked now).
                    let stmt = conn
                        .prepare_cached(
                            "UPDATE channel_values SET value = $4, version = version + 1,
                                 updated_at = $5
                             WHERE kind = $1 AND account = $2 AND name = $3
                             RETURNING value, version, updated_at",
                        )
                        .await?;
                    let row = conn
                        .query_one(&stmt, &[&scope.kind, &scope.account, &name, &text, &now])
                        .await?;
                    ValueSwap::Written(value(&row)?)
                } else {
                    ValueSwap::Conflict(stored)
                });
            }
            Ok(ValueSwap::Written(ChannelValue {
                value: new.clone(),
                version,
                updated_at: now,
            }))
        })
    }

    async fn delete_channel_value(&self, scope: &ChannelScope, name: &str) -> StoreResult<bool> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "DELETE FROM channel_values WHERE kind = $1 AND account = $2 AND name = $3",
                )
                .await?;
            Ok(conn
                .execute(&stmt, &[&scope.kind, &scope.account, &name])
                .await?
                > 0)
        })
    }
}
