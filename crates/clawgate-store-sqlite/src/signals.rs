//! The per-session signal log (events + heads + prune watermarks) and watch cursors.

use async_trait::async_trait;
use clawgate_types::{SessionKey, SessionStateEvent, StateVersion, UnixMillis};
use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::de::DeserializeOwned;

use super::SqliteStore;
use super::errors::DbResult;
use clawgate_store::{
    AppendedEvent, ChangesSince, NewSessionEvent, PruneReport, SessionHead, WatchCursor,
    WatchSource,
};
use clawgate_store::{SignalLogStore, WatchCursorStore};
use clawgate_store::{StoreError, StoreResult};

pub(super) use clawgate_store::codec::enum_text;

pub(super) fn enum_parse<T: DeserializeOwned>(what: &'static str, text: &str) -> DbResult<T> {
    Ok(clawgate_store::codec::enum_parse(what, text)?)
}

pub(super) fn parse_key(text: &str) -> DbResult<SessionKey> {
    Ok(clawgate_store::codec::parse_key(text)?)
}

pub(super) fn u64_of(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(super) fn i64_of(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

const SELECT_EVENT: &str = "SELECT sequence, kind, actor_type, actor_id, summary, outcome,
    child_session_key, created_at FROM session_state_events";

type RawEvent = (
    i64,
    String,
    String,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    i64,
);

fn event_row(r: &Row<'_>) -> rusqlite::Result<RawEvent> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
    ))
}

fn decode_event(
    (sequence, kind, actor, actor_id, summary, outcome, child, created_at): RawEvent,
) -> DbResult<SessionStateEvent> {
    Ok(SessionStateEvent {
        sequence: u64_of(sequence),
        kind: enum_parse("event kind", &kind)?,
        actor_type: enum_parse("actor type", &actor)?,
        actor_id,
        summary,
        outcome: outcome.map(|o| enum_parse("run outcome", &o)).transpose()?,
        child_session_key: child.map(|c| parse_key(&c)).transpose()?,
        created_at: Some(created_at),
    })
}

pub(super) fn head(conn: &Connection, key: &str) -> DbResult<SessionHead> {
    let row: Option<(i64, i64)> = conn
        .prepare_cached("SELECT head, pruned_through FROM session_heads WHERE session_key = ?1")?
        .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let (head, pruned) = row.unwrap_or((0, 0));
    Ok(SessionHead {
        state_version: StateVersion(u64_of(head)),
        pruned_through: u64_of(pruned),
    })
}

pub(super) fn append(conn: &Connection, event: &NewSessionEvent) -> DbResult<AppendedEvent> {
    let key = event.session_key.storage_key();
    if let Some(dedupe) = &event.dedupe_key {
        let existing = conn
            .prepare_cached(&format!(
                "{SELECT_EVENT} WHERE session_key = ?1 AND dedupe_key = ?2"
            ))?
            .query_row(params![key, dedupe], event_row)
            .optional()?;
        if let Some(existing) = existing {
            return Ok(AppendedEvent {
                event: decode_event(existing)?,
                duplicate: true,
            });
        }
    }
    let sequence: i64 = conn
        .prepare_cached(
            "INSERT INTO session_heads (session_key, head, pruned_through, updated_at)
             VALUES (?1, 1, 0, ?2)
             ON CONFLICT (session_key) DO UPDATE SET head = head + 1, updated_at = excluded.updated_at
             RETURNING head",
        )?
        .query_row(params![key, event.created_at], |r| r.get(0))?;
    conn.prepare_cached(
        "INSERT INTO session_state_events (session_key, sequence, kind, actor_type, actor_id,
             summary, outcome, child_session_key, dedupe_key, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )?
    .execute(params![
        key,
        sequence,
        enum_text(&event.kind),
        enum_text(&event.actor_type),
        event.actor_id,
        event.summary,
        event.outcome.as_ref().map(enum_text),
        event.child_session_key.as_ref().map(|k| k.storage_key()),
        event.dedupe_key,
        event.created_at,
    ])?;
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

/// Raises each affected session's prune watermark to the highest sequence about to be removed
/// by `predicate`, then removes those rows. Heads are never touched, so they stay monotonic.
fn prune_where(conn: &Connection, predicate: &str, arg: i64) -> DbResult<u64> {
    conn.execute(
        &format!(
            "UPDATE session_heads SET pruned_through = MAX(pruned_through, (
                 SELECT MAX(e.sequence) FROM session_state_events e
                 WHERE e.session_key = session_heads.session_key AND e.{predicate}))
             WHERE session_key IN (
                 SELECT DISTINCT session_key FROM session_state_events WHERE {predicate})"
        ),
        [arg],
    )?;
    let deleted = conn.execute(
        &format!("DELETE FROM session_state_events WHERE {predicate}"),
        [arg],
    )?;
    Ok(deleted as u64)
}

#[async_trait]
impl SignalLogStore for SqliteStore {
    async fn append_event(&self, event: &NewSessionEvent) -> StoreResult<AppendedEvent> {
        clawgate_store::codec::check_summary(event)?;
        let event = event.clone();
        self.write(move |conn| append(conn, &event)).await
    }

    async fn session_head(&self, key: &SessionKey) -> StoreResult<SessionHead> {
        let key = key.storage_key().into_owned();
        self.read(move |conn| head(conn, &key)).await
    }

    async fn events_since(
        &self,
        key: &SessionKey,
        since: StateVersion,
        limit: u32,
    ) -> StoreResult<ChangesSince> {
        let key = key.storage_key().into_owned();
        self.read(move |conn| {
            let head = head(conn, &key)?;
            let mut stmt = conn.prepare_cached(&format!(
                "{SELECT_EVENT} WHERE session_key = ?1 AND sequence > ?2 ORDER BY sequence LIMIT ?3"
            ))?;
            let rows = stmt.query_map(
                params![key, i64_of(since.0), i64::from(limit) + 1],
                event_row,
            )?;
            let mut events = Vec::new();
            for row in rows {
                events.push(decode_event(row?)?);
            }
            let truncated = events.len() > limit as usize;
            events.truncate(limit as usize);
            Ok(ChangesSince {
                state_version: head.state_version,
                events,
                truncated,
                history_gap: since.0 < head.pruned_through,
            })
        })
        .await
    }

    async fn prune_signal_log(
        &self,
        older_than: UnixMillis,
        max_rows: u64,
    ) -> StoreResult<PruneReport> {
        self.write(move |conn| {
            let mut events_deleted = prune_where(conn, "created_at < ?1", older_than)?;
            let boundary: Option<i64> = conn
                .query_row(
                    "SELECT id FROM session_state_events ORDER BY id DESC LIMIT 1 OFFSET ?1",
                    [i64_of(max_rows)],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(boundary) = boundary {
                events_deleted += prune_where(conn, "id <= ?1", boundary)?;
            }
            let cursors_deleted = conn.execute(
                "DELETE FROM session_watch_cursors WHERE updated_at < ?1",
                [older_than],
            )? as u64;
            Ok(PruneReport {
                events_deleted,
                cursors_deleted,
            })
        })
        .await
    }
}

const SELECT_CURSOR: &str = "SELECT watcher_key, target_key, acked_version, notified_version,
    material_version, source, created_at, updated_at, target_deleted_by FROM session_watch_cursors";

pub(super) type RawCursor = (
    String,
    String,
    i64,
    Option<i64>,
    i64,
    String,
    i64,
    i64,
    Option<String>,
);

pub(super) fn cursor_row(r: &Row<'_>) -> rusqlite::Result<RawCursor> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
    ))
}

pub(super) fn decode_cursor(
    (watcher, target, acked, notified, material, source, created_at, updated_at, deleted_by): RawCursor,
) -> DbResult<WatchCursor> {
    Ok(WatchCursor {
        watcher_key: parse_key(&watcher)?,
        target_key: parse_key(&target)?,
        acked_version: StateVersion(u64_of(acked)),
        notified_version: notified.map(|n| StateVersion(u64_of(n))),
        material_version: StateVersion(u64_of(material)),
        target_deleted_by: deleted_by,
        source: WatchSource::parse(&source).ok_or_else(|| {
            StoreError::InvalidInput(format!("watch cursor has unknown source {source:?}"))
        })?,
        created_at,
        updated_at,
    })
}

pub(super) fn cursors(
    conn: &Connection,
    filter: &str,
    args: &[&dyn rusqlite::ToSql],
) -> DbResult<Vec<WatchCursor>> {
    let mut stmt = conn.prepare_cached(&format!(
        "{SELECT_CURSOR} {filter} ORDER BY watcher_key, target_key"
    ))?;
    let rows = stmt.query_map(args, cursor_row)?;
    let mut out = Vec::new();
    for row in rows {
        out.push(decode_cursor(row?)?);
    }
    Ok(out)
}

pub(super) fn load_cursor(
    conn: &Connection,
    watcher: &str,
    target: &str,
) -> DbResult<Option<WatchCursor>> {
    let raw = conn
        .prepare_cached(&format!(
            "{SELECT_CURSOR} WHERE watcher_key = ?1 AND target_key = ?2"
        ))?
        .query_row([watcher, target], cursor_row)
        .optional()?;
    raw.map(decode_cursor).transpose()
}

use clawgate_store::codec::check_watcher;

#[async_trait]
impl WatchCursorStore for SqliteStore {
    async fn ensure_cursor(&self, cursor: &WatchCursor) -> StoreResult<WatchCursor> {
        check_watcher(cursor)?;
        let c = cursor.clone();
        self.write(move |conn| {
            conn.prepare_cached(
                "INSERT INTO session_watch_cursors (watcher_key, target_key, acked_version,
                     notified_version, material_version, source, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT (watcher_key, target_key) DO NOTHING",
            )?
            .execute(params![
                c.watcher_key.storage_key(),
                c.target_key.storage_key(),
                i64_of(c.acked_version.0),
                c.notified_version.map(|v| i64_of(v.0)),
                i64_of(c.material_version.0),
                c.source.as_str(),
                c.created_at,
                c.updated_at,
            ])?;
            load_cursor(
                conn,
                &c.watcher_key.storage_key(),
                &c.target_key.storage_key(),
            )?
            .ok_or_else(|| {
                StoreError::NotFound {
                    what: "watch cursor",
                    id: c.watcher_key.to_string(),
                }
                .into()
            })
        })
        .await
    }

    async fn save_cursor(&self, cursor: &WatchCursor) -> StoreResult<()> {
        let c = cursor.clone();
        self.write(move |conn| {
            let changed = conn
                .prepare_cached(
                    "UPDATE session_watch_cursors SET acked_version = ?3, notified_version = ?4,
                         material_version = ?5, updated_at = ?6
                     WHERE watcher_key = ?1 AND target_key = ?2",
                )?
                .execute(params![
                    c.watcher_key.storage_key(),
                    c.target_key.storage_key(),
                    i64_of(c.acked_version.0),
                    c.notified_version.map(|v| i64_of(v.0)),
                    i64_of(c.material_version.0),
                    c.updated_at,
                ])?;
            if changed == 0 {
                return Err(StoreError::NotFound {
                    what: "watch cursor",
                    id: format!("{} -> {}", c.watcher_key, c.target_key),
                }
                .into());
            }
            Ok(())
        })
        .await
    }

    async fn load_cursor(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
    ) -> StoreResult<Option<WatchCursor>> {
        let (w, t) = (
            watcher.storage_key().into_owned(),
            target.storage_key().into_owned(),
        );
        self.read(move |conn| load_cursor(conn, &w, &t)).await
    }

    async fn cursors_on_target(&self, target: &SessionKey) -> StoreResult<Vec<WatchCursor>> {
        let t = target.storage_key().into_owned();
        self.read(move |conn| cursors(conn, "WHERE target_key = ?1", &[&t]))
            .await
    }

    async fn cursors_of_watcher(&self, watcher: &SessionKey) -> StoreResult<Vec<WatchCursor>> {
        let w = watcher.storage_key().into_owned();
        self.read(move |conn| cursors(conn, "WHERE watcher_key = ?1", &[&w]))
            .await
    }

    async fn cursors_with_pending_notice(&self) -> StoreResult<Vec<WatchCursor>> {
        self.read(|conn| cursors(conn, "WHERE notified_version IS NOT NULL", &[]))
            .await
    }
}
