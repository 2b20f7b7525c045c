//! The per-session signal log (events + heads + prune watermarks) and watch cursors.

use async_trait::async_trait;
use clawgate_store::{
    AppendedEvent, ChangesSince, NewSessionEvent, PruneReport, SessionHead, SignalLogStore,
    StoreError, StoreResult, WatchCursor, WatchCursorStore, WatchSource,
};
use clawgate_types::{SessionKey, SessionStateEvent, StateVersion, UnixMillis};
use deadpool_postgres::GenericClient;
use serde::de::DeserializeOwned;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;

use crate::errors::{DbError, DbResult};
use crate::{PostgresStore, i64_of, u64_of};

use clawgate_store::codec::check_watcher;
pub(crate) use clawgate_store::codec::{check_summary, enum_text};

fn enum_parse<T: DeserializeOwned>(what: &'static str, text: &str) -> DbResult<T> {
    Ok(clawgate_store::codec::enum_parse(what, text)?)
}

fn parse_key(text: &str) -> DbResult<SessionKey> {
    Ok(clawgate_store::codec::parse_key(text)?)
}

const EVENT_COLUMNS: &str =
    "sequence, kind, actor_type, actor_id, summary, outcome, child_session_key, created_at";

/// An event from the row's columns starting at `at`.
fn decode_event(row: &Row, at: usize) -> DbResult<SessionStateEvent> {
    let kind: &str = row.try_get(at + 1)?;
    let actor: &str = row.try_get(at + 2)?;
    let outcome: Option<&str> = row.try_get(at + 5)?;
    let child: Option<&str> = row.try_get(at + 6)?;
    Ok(SessionStateEvent {
        sequence: u64_of(row.try_get(at)?),
        kind: enum_parse("event kind", kind)?,
        actor_type: enum_parse("actor type", actor)?,
        actor_id: row.try_get(at + 3)?,
        summary: row.try_get(at + 4)?,
        outcome: outcome.map(|o| enum_parse("run outcome", o)).transpose()?,
        child_session_key: child.map(parse_key).transpose()?,
        created_at: Some(row.try_get(at + 7)?),
    })
}

pub(crate) async fn head<C: GenericClient>(conn: &C, key: &str) -> DbResult<SessionHead> {
    let stmt = conn
        .prepare_cached("SELECT head, pruned_through FROM session_heads WHERE session_key = $1")
        .await?;
    let (head, pruned) = match conn.query_opt(&stmt, &[&key]).await? {
        Some(row) => (row.try_get(0)?, row.try_get(1)?),
        None => (0, 0),
    };
    Ok(SessionHead {
        state_version: StateVersion(u64_of(head)),
        pruned_through: u64_of(pruned),
    })
}

/// Appends inside a transaction. The head row's lock (taken by the upsert that advances it)
/// hands one session's sequences out one at a time, across gateways. Two gateways appending
/// the same dedupe key at once: the loser's insert breaks the unique index, and its transaction
/// is run again, finding the winner's row.
pub(crate) async fn append<C: GenericClient>(
    conn: &C,
    event: &NewSessionEvent,
) -> DbResult<AppendedEvent> {
    let key = event.session_key.storage_key();
    let key = key.as_ref();
    if let Some(dedupe) = &event.dedupe_key {
        let stmt = conn
            .prepare_cached(&format!(
                "SELECT {EVENT_COLUMNS} FROM session_state_events
                 WHERE session_key = $1 AND dedupe_key = $2"
            ))
            .await?;
        if let Some(row) = conn.query_opt(&stmt, &[&key, dedupe]).await? {
            return Ok(AppendedEvent {
                event: decode_event(&row, 0)?,
                duplicate: true,
            });
        }
    }
    let kind = enum_text(&event.kind);
    let actor = enum_text(&event.actor_type);
    let outcome = event.outcome.as_ref().map(enum_text);
    let child = event.child_session_key.as_ref().map(|k| k.storage_key());
    let child = child.as_deref();
    // Head and event in one statement: one round trip for the hot write.
    let stmt = conn
        .prepare_cached(
            "WITH head AS (
                 INSERT INTO session_heads AS h (session_key, head, pruned_through, updated_at)
                 VALUES ($1, 1, 0, $10)
                 ON CONFLICT (session_key) DO UPDATE
                 SET head = h.head + 1, updated_at = EXCLUDED.updated_at
                 RETURNING head)
             INSERT INTO session_state_events (session_key, sequence, kind, actor_type, actor_id,
                 summary, outcome, child_session_key, dedupe_key, created_at)
             SELECT $1, head.head, $2, $3, $4, $5, $6, $7, $8, $9 FROM head
             RETURNING sequence",
        )
        .await?;
    let row = conn
        .query_one(
            &stmt,
            &[
                &key,
                &kind,
                &actor,
                &event.actor_id,
                &event.summary,
                &outcome,
                &child,
                &event.dedupe_key,
                &event.created_at,
                &event.created_at,
            ],
        )
        .await
        .map_err(|e| match e.code() {
            Some(code) if *code == SqlState::UNIQUE_VIOLATION && event.dedupe_key.is_some() => {
                DbError::Retry(e)
            }
            _ => DbError::Pg(e),
        })?;
    let sequence: i64 = row.try_get(0)?;
    Ok(AppendedEvent {
        event: SessionStateEvent {
            sequence: u64_of(sequence),
            kind: event.kind,
            actor_type: event.actor_type,
            actor_id: event.actor_id.clone(),
            summary: event.summary.clone(),
            outcome: event.outcome,
            child_session_key: event.child_session_key.clone(),
            created_at: Some(event.created_at),
        },
        duplicate: false,
    })
}

/// Removes the events `predicate` picks (its one parameter is `$1`) and raises each affected
/// session's prune watermark to the highest sequence removed, in one statement. Heads are never
/// touched, so they stay monotonic.
async fn prune_where<C: GenericClient>(conn: &C, predicate: &str, arg: i64) -> DbResult<u64> {
    let stmt = conn
        .prepare_cached(&format!(
            "WITH gone AS (
                 DELETE FROM session_state_events WHERE {predicate}
                 RETURNING session_key, sequence),
             per_session AS (
                 SELECT session_key, MAX(sequence) AS through, COUNT(*) AS removed
                 FROM gone GROUP BY session_key),
             raised AS (
                 UPDATE session_heads h SET pruned_through = GREATEST(h.pruned_through, p.through)
                 FROM per_session p WHERE h.session_key = p.session_key)
             SELECT COALESCE(SUM(removed), 0)::BIGINT FROM per_session"
        ))
        .await?;
    let row = conn.query_one(&stmt, &[&arg]).await?;
    Ok(u64_of(row.try_get(0)?))
}

#[async_trait]
impl SignalLogStore for PostgresStore {
    async fn append_event(&self, event: &NewSessionEvent) -> StoreResult<AppendedEvent> {
        check_summary(event)?;
        if event.dedupe_key.is_none() {
            // One statement, its own transaction.
            return run!(self, |conn| { append(conn, event).await });
        }
        transaction!(self, |tx| { append(tx, event).await })
    }

    async fn session_head(&self, key: &SessionKey) -> StoreResult<SessionHead> {
        let key = key.storage_key();
        let key = key.as_ref();
        run!(self, |conn| { head(conn, key).await })
    }

    async fn events_since(
        &self,
        key: &SessionKey,
        since: StateVersion,
        limit: u32,
    ) -> StoreResult<ChangesSince> {
        let key = key.storage_key();
        let key = key.as_ref();
        let since_at = i64_of(since.0);
        let fetch = i64::from(limit) + 1;
        // One statement, one snapshot: the head and the events agree.
        let (head, mut events) = run!(self, |conn| {
            let stmt = conn
                .prepare_cached(&format!(
                    "SELECT h.head, h.pruned_through, e.* FROM (SELECT 1) AS one
                             LEFT JOIN session_heads h ON h.session_key = $1
                             LEFT JOIN LATERAL (
                                 SELECT {EVENT_COLUMNS} FROM session_state_events
                                 WHERE session_key = $1 AND sequence > $2
                                 ORDER BY sequence LIMIT $3) e ON TRUE
                             ORDER BY e.sequence"
                ))
                .await?;
            let rows = conn.query(&stmt, &[&key, &since_at, &fetch]).await?;
            let mut head = SessionHead {
                state_version: StateVersion(0),
                pruned_through: 0,
            };
            let mut events = Vec::with_capacity(rows.len());
            for row in &rows {
                let h: Option<i64> = row.try_get(0)?;
                let pruned: Option<i64> = row.try_get(1)?;
                head = SessionHead {
                    state_version: StateVersion(u64_of(h.unwrap_or(0))),
                    pruned_through: u64_of(pruned.unwrap_or(0)),
                };
                if row.try_get::<_, Option<i64>>(2)?.is_some() {
                    events.push(decode_event(row, 2)?);
                }
            }
            Ok((head, events))
        })?;
        let truncated = events.len() > limit as usize;
        events.truncate(limit as usize);
        Ok(ChangesSince {
            state_version: head.state_version,
            events,
            truncated,
            history_gap: since.0 < head.pruned_through,
        })
    }

    async fn prune_signal_log(
        &self,
        older_than: UnixMillis,
        max_rows: u64,
    ) -> StoreResult<PruneReport> {
        let max_rows = i64_of(max_rows);
        transaction!(self, |tx| {
            let mut events_deleted = prune_where(tx, "created_at < $1", older_than).await?;
            // The newest `max_rows` rows stay (after the age pass, as its own statement).
            events_deleted += prune_where(
                tx,
                "id <= (SELECT id FROM session_state_events ORDER BY id DESC
                            LIMIT 1 OFFSET $1)",
                max_rows,
            )
            .await?;
            let stmt = tx
                .prepare_cached("DELETE FROM session_watch_cursors WHERE updated_at < $1")
                .await?;
            let cursors_deleted = tx.execute(&stmt, &[&older_than]).await?;
            Ok(PruneReport {
                events_deleted,
                cursors_deleted,
            })
        })
    }
}

pub(crate) const CURSOR_COLUMNS: &str = "watcher_key, target_key, acked_version, notified_version, \
                                         material_version, source, created_at, updated_at, \
                                         target_deleted_by";

pub(crate) fn decode_cursor(row: &Row) -> DbResult<WatchCursor> {
    let watcher: &str = row.try_get(0)?;
    let target: &str = row.try_get(1)?;
    let notified: Option<i64> = row.try_get(3)?;
    let source: &str = row.try_get(5)?;
    Ok(WatchCursor {
        watcher_key: parse_key(watcher)?,
        target_key: parse_key(target)?,
        acked_version: StateVersion(u64_of(row.try_get(2)?)),
        notified_version: notified.map(|n| StateVersion(u64_of(n))),
        material_version: StateVersion(u64_of(row.try_get(4)?)),
        target_deleted_by: row.try_get(8)?,
        source: WatchSource::parse(source).ok_or_else(|| {
            StoreError::InvalidInput(format!("watch cursor has unknown source {source:?}"))
        })?,
        created_at: row.try_get(6)?,
        updated_at: row.try_get(7)?,
    })
}

/// One cursor; `lock` takes its row lock for the rest of the transaction.
pub(crate) async fn load_cursor<C: GenericClient>(
    conn: &C,
    watcher: &str,
    target: &str,
    lock: bool,
) -> DbResult<Option<WatchCursor>> {
    let sql = format!(
        "SELECT {CURSOR_COLUMNS} FROM session_watch_cursors
         WHERE watcher_key = $1 AND target_key = $2{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let stmt = conn.prepare_cached(&sql).await?;
    conn.query_opt(&stmt, &[&watcher, &target])
        .await?
        .as_ref()
        .map(decode_cursor)
        .transpose()
}

pub(crate) async fn cursors<C: GenericClient>(
    conn: &C,
    filter: &str,
    arg: Option<&str>,
) -> DbResult<Vec<WatchCursor>> {
    let stmt = conn
        .prepare_cached(&format!(
            "SELECT {CURSOR_COLUMNS} FROM session_watch_cursors {filter}
             ORDER BY watcher_key, target_key"
        ))
        .await?;
    let rows = match arg {
        Some(arg) => conn.query(&stmt, &[&arg]).await?,
        None => conn.query(&stmt, &[]).await?,
    };
    rows.iter().map(decode_cursor).collect()
}

#[async_trait]
impl WatchCursorStore for PostgresStore {
    async fn ensure_cursor(&self, cursor: &WatchCursor) -> StoreResult<WatchCursor> {
        check_watcher(cursor)?;
        let c = cursor;
        let (watcher, target) = (c.watcher_key.storage_key(), c.target_key.storage_key());
        let (watcher, target) = (watcher.as_ref(), target.as_ref());
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(&format!(
                    "INSERT INTO session_watch_cursors ({CURSOR_COLUMNS})
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                         ON CONFLICT (watcher_key, target_key) DO NOTHING"
                ))
                .await?;
            let inserted = conn
                .execute(
                    &stmt,
                    &[
                        &watcher,
                        &target,
                        &i64_of(c.acked_version.0),
                        &c.notified_version.map(|v| i64_of(v.0)),
                        &i64_of(c.material_version.0),
                        &c.source.as_str(),
                        &c.created_at,
                        &c.updated_at,
                        &c.target_deleted_by,
                    ],
                )
                .await?;
            if inserted == 1 {
                return Ok(c.clone());
            }
            load_cursor(conn, watcher, target, false)
                .await?
                .ok_or_else(|| {
                    StoreError::NotFound {
                        what: "watch cursor",
                        id: c.watcher_key.to_string(),
                    }
                    .into()
                })
        })
    }

    async fn save_cursor(&self, cursor: &WatchCursor) -> StoreResult<()> {
        let c = cursor;
        let (watcher, target) = (c.watcher_key.storage_key(), c.target_key.storage_key());
        let (watcher, target) = (watcher.as_ref(), target.as_ref());
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "UPDATE session_watch_cursors SET acked_version = $3,
                             notified_version = $4, material_version = $5, updated_at = $6
                         WHERE watcher_key = $1 AND target_key = $2",
                )
                .await?;
            let changed = conn
                .execute(
                    &stmt,
                    &[
                        &watcher,
                        &target,
                        &i64_of(c.acked_version.0),
                        &c.notified_version.map(|v| i64_of(v.0)),
                        &i64_of(c.material_version.0),
                        &c.updated_at,
                    ],
                )
                .await?;
            if changed == 0 {
                return Err(StoreError::NotFound {
                    what: "watch cursor",
                    id: format!("{} -> {}", c.watcher_key, c.target_key),
                }
                .into());
            }
            Ok(())
        })
    }

    async fn load_cursor(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
    ) -> StoreResult<Option<WatchCursor>> {
        let (w, t) = (watcher.storage_key(), target.storage_key());
        let (w, t) = (w.as_ref(), t.as_ref());
        run!(self, |conn| { load_cursor(conn, w, t, false).await })
    }

    async fn cursors_on_target(&self, target: &SessionKey) -> StoreResult<Vec<WatchCursor>> {
        let t = target.storage_key();
        let t = t.as_ref();
        run!(self, |conn| {
            cursors(conn, "WHERE target_key = $1", Some(t)).await
        })
    }

    async fn cursors_of_watcher(&self, watcher: &SessionKey) -> StoreResult<Vec<WatchCursor>> {
        let w = watcher.storage_key();
        let w = w.as_ref();
        run!(self, |conn| {
            cursors(conn, "WHERE watcher_key = $1", Some(w)).await
        })
    }

    async fn cursors_with_pending_notice(&self) -> StoreResult<Vec<WatchCursor>> {
        run!(self, |conn| {
            cursors(conn, "WHERE notified_version IS NOT NULL", None).await
        })
    }
}
