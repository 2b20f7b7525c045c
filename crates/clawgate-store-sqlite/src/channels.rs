//! Channel state: books of keyed records and named values, scoped to one channel account.

use async_trait::async_trait;
use clawgate_store::{
    AppendedRecord, ChannelRecord, ChannelScope, ChannelStateStore, ChannelValue, StoreError,
    StoreResult, ValueExpectation, ValueSwap,
};
use clawgate_types::UnixMillis;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::SqliteStore;
use crate::errors::DbResult;

fn json(what: &str, text: &str) -> DbResult<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| {
        StoreError::InvalidInput(format!("the stored channel {what} is not JSON: {e}")).into()
    })
}

fn raw_record(row: &Row<'_>) -> rusqlite::Result<(i64, String, String, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn record((seq, key, value, recorded_at): (i64, String, String, i64)) -> DbResult<ChannelRecord> {
    Ok(ChannelRecord {
        seq,
        value: json("record", &value)?,
        key,
        recorded_at,
    })
}

fn find(
    conn: &Connection,
    scope: &ChannelScope,
    book: &str,
    key: &str,
) -> DbResult<Option<ChannelRecord>> {
    conn.prepare_cached(
        "SELECT seq, key, value, recorded_at FROM channel_records
         WHERE kind = ?1 AND account = ?2 AND book = ?3 AND key = ?4",
    )?
    .query_row(params![scope.kind, scope.account, book, key], raw_record)
    .optional()?
    .map(record)
    .transpose()
}

fn load_value(
    conn: &Connection,
    scope: &ChannelScope,
    name: &str,
) -> DbResult<Option<ChannelValue>> {
    let raw: Option<(String, i64, i64)> = conn
        .prepare_cached(
            "SELECT value, version, updated_at FROM channel_values
             WHERE kind = ?1 AND account = ?2 AND name = ?3",
        )?
        .query_row(params![scope.kind, scope.account, name], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    raw.map(|(value, version, updated_at)| {
        Ok(ChannelValue {
            value: json("value", &value)?,
            version,
            updated_at,
        })
    })
    .transpose()
}

#[async_trait]
impl ChannelStateStore for SqliteStore {
    async fn append_channel_record(
        &self,
        scope: &ChannelScope,
        book: &str,
        key: &str,
        value: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<AppendedRecord> {
        let (scope, book, key, text) = (
            scope.clone(),
            book.to_owned(),
            key.to_owned(),
            value.to_string(),
        );
        let value = value.clone();
        self.write(move |conn| {
            if let Some(record) = find(conn, &scope, &book, &key)? {
                return Ok(AppendedRecord { record, new: false });
            }
            let seq: i64 = conn
                .prepare_cached(
                    "INSERT INTO channel_books (kind, account, book, last_seq) VALUES (?1, ?2, ?3, 1)
                     ON CONFLICT (kind, account, book) DO UPDATE SET last_seq = last_seq + 1
                     RETURNING last_seq",
                )?
                .query_row(params![scope.kind, scope.account, book], |r| r.get(0))?;
            conn.prepare_cached(
                "INSERT INTO channel_records (kind, account, book, seq, key, value, recorded_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![scope.kind, scope.account, book, seq, key, text, now])?;
            Ok(AppendedRecord {
                record: ChannelRecord {
                    seq,
                    key,
                    value,
                    recorded_at: now,
                },
                new: true,
            })
        })
        .await
    }

    async fn find_channel_record(
        &self,
        scope: &ChannelScope,
        book: &str,
        key: &str,
    ) -> StoreResult<Option<ChannelRecord>> {
        let (scope, book, key) = (scope.clone(), book.to_owned(), key.to_owned());
        self.read(move |conn| find(conn, &scope, &book, &key)).await
    }

    async fn channel_records_since(
        &self,
        scope: &ChannelScope,
        book: &str,
        after: i64,
        limit: u32,
    ) -> StoreResult<Vec<ChannelRecord>> {
        let (scope, book) = (scope.clone(), book.to_owned());
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT seq, key, value, recorded_at FROM channel_records
                 WHERE kind = ?1 AND account = ?2 AND book = ?3 AND seq > ?4
                 ORDER BY seq LIMIT ?5",
            )?;
            let rows = stmt.query_map(
                params![scope.kind, scope.account, book, after, limit],
                raw_record,
            )?;
            let mut out = Vec::new();
            for row in rows {
                out.push(record(row?)?);
            }
            Ok(out)
        })
        .await
    }

    async fn prune_channel_records(
        &self,
        scope: &ChannelScope,
        book: &str,
        older_than: UnixMillis,
        keep_newest: u64,
    ) -> StoreResult<u64> {
        let (scope, book) = (scope.clone(), book.to_owned());
        let keep = i64::try_from(keep_newest).unwrap_or(i64::MAX);
        self.write(move |conn| {
            let old = conn
                .prepare_cached(
                    "DELETE FROM channel_records
                     WHERE kind = ?1 AND account = ?2 AND book = ?3 AND recorded_at < ?4",
                )?
                .execute(params![scope.kind, scope.account, book, older_than])?;
            // Beyond the newest `keep`: everything at or below the seq `keep` places down.
            let surplus = conn
                .prepare_cached(
                    "DELETE FROM channel_records
                     WHERE kind = ?1 AND account = ?2 AND book = ?3 AND seq <= (
                         SELECT seq FROM channel_records
                         WHERE kind = ?1 AND account = ?2 AND book = ?3
                         ORDER BY seq DESC LIMIT 1 OFFSET ?4)",
                )?
                .execute(params![scope.kind, scope.account, book, keep])?;
            Ok((old + surplus) as u64)
        })
        .await
    }

    async fn load_channel_value(
        &self,
        scope: &ChannelScope,
        name: &str,
    ) -> StoreResult<Option<ChannelValue>> {
        let (scope, name) = (scope.clone(), name.to_owned());
        self.read(move |conn| load_value(conn, &scope, &name)).await
    }

    async fn swap_channel_value(
        &self,
        scope: &ChannelScope,
        name: &str,
        expected: ValueExpectation,
        value: &serde_json::Value,
        now: UnixMillis,
    ) -> StoreResult<ValueSwap> {
        let (scope, name, text) = (scope.clone(), name.to_owned(), value.to_string());
        let value = value.clone();
        self.write(move |conn| {
            let current = load_value(conn, &scope, &name)?;
            let holds = match (expected, &current) {
                (ValueExpectation::Any, _) => true,
                (ValueExpectation::Absent, stored) => stored.is_none(),
                (ValueExpectation::Version(v), Some(stored)) => stored.version == v,
                (ValueExpectation::Version(_), None) => false,
            };
            if !holds {
                return Ok(ValueSwap::Conflict(current));
            }
            let version = current.map_or(1, |c| c.version + 1);
            conn.prepare_cached(
                "INSERT INTO channel_values (kind, account, name, value, version, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (kind, account, name) DO UPDATE SET
                     value = excluded.value, version = excluded.version,
                     updated_at = excluded.updated_at",
            )?
            .execute(params![scope.kind, scope.account, name, text, version, now])?;
            Ok(ValueSwap::Written(ChannelValue {
                value,
                version,
                updated_at: now,
            }))
        })
        .await
    }

    async fn delete_channel_value(&self, scope: &ChannelScope, name: &str) -> StoreResult<bool> {
        let (scope, name) = (scope.clone(), name.to_owned());
        self.write(move |conn| {
            let n = conn
                .prepare_cached(
                    "DELETE FROM channel_values WHERE kind = ?1 AND account = ?2 AND name = ?3",
                )?
                .execute(params![scope.kind, scope.account, name])?;
            Ok(n > 0)
        })
        .await
    }
}
