//! Atomic notice transitions on watch cursors, and the change feed that tells one process about
//! another process's commits (`PRAGMA data_version` polled on a dedicated connection).

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_types::{SessionKey, StateVersion, UnixMillis};
use rusqlite::{Connection, OpenFlags, params};
use tokio::sync::watch;

use super::SqliteStore;
use super::errors::DbResult;
use super::signals::{RawCursor, append, cursor_row, decode_cursor, head, i64_of, load_cursor};
use clawgate_store::{AppendWithNotices, ConsumedNotice, NewSessionEvent, WatchCursor};
use clawgate_store::{ChangeFeed, NoticeCursorStore};
use clawgate_store::{StoreError, StoreResult};

use clawgate_store::codec::{self, notifying_kinds};

fn open_notices(
    conn: &Connection,
    target: &str,
    sequence: i64,
    actor: Option<&str>,
    now: UnixMillis,
) -> DbResult<Vec<WatchCursor>> {
    // Only cursors without a pending notice change: a pending notice keeps its frozen watermark
    // and text, and the remainder is found from the log when it is consumed. This keeps an
    // event on a target with many pending watchers to an index scan, not a rewrite of each row.
    let mut stmt = conn.prepare_cached(
        "UPDATE session_watch_cursors
         SET notified_version = ?2, material_version = MAX(material_version, ?2), updated_at = ?4
         WHERE target_key = ?1 AND notified_version IS NULL AND acked_version < ?2
           AND watcher_key IS NOT ?3
         RETURNING watcher_key, target_key, acked_version, notified_version, material_version,
             source, created_at, updated_at, target_deleted_by",
    )?;
    let rows = stmt.query_map(params![target, sequence, actor, now], cursor_row)?;
    let raw: Vec<RawCursor> = rows.collect::<rusqlite::Result<_>>()?;
    let mut opened = raw
        .into_iter()
        .map(decode_cursor)
        .collect::<DbResult<Vec<_>>>()?;
    opened.sort_by(|a, b| a.watcher_key.cmp(&b.watcher_key));
    Ok(opened)
}

fn consume(
    conn: &Connection,
    watcher: &str,
    target: &str,
    seen: StateVersion,
    now: UnixMillis,
) -> DbResult<ConsumedNotice> {
    let (mut cursor, frozen) = match codec::notice_to_ack(load_cursor(conn, watcher, target)?, seen)
    {
        codec::NoticeToAck::Pending { cursor, frozen } => (cursor, frozen),
        codec::NoticeToAck::Nothing(unchanged) => return Ok(unchanged),
    };
    let kinds = notifying_kinds();
    let placeholders = (0..kinds.len())
        .map(|i| format!("?{}", i + 4))
        .collect::<Vec<_>>()
        .join(", ");
    let mut args: Vec<rusqlite::types::Value> = vec![
        target.to_owned().into(),
        i64_of(frozen.0).into(),
        watcher.to_owned().into(),
    ];
    args.extend(kinds.into_iter().map(rusqlite::types::Value::from));
    let newest_material: Option<i64> = conn
        .prepare_cached(&format!(
            "SELECT MAX(sequence) FROM session_state_events
             WHERE session_key = ?1 AND sequence > ?2 AND kind IN ({placeholders})
               AND (actor_id IS NULL OR actor_id != ?3)"
        ))?
        .query_row(rusqlite::params_from_iter(args), |r| r.get(0))?;
    let head = head(conn, target)?;
    let after = codec::AfterWatermark {
        newest_material: newest_material.map(|seq| u64::try_from(seq).unwrap_or(0)),
        head: head.state_version.0,
        pruned_through: head.pruned_through,
    };
    let consumed = codec::ack_notice(&mut cursor, frozen, after, now);
    conn.prepare_cached(
        "UPDATE session_watch_cursors SET acked_version = ?3, notified_version = ?4,
             material_version = ?5, updated_at = ?6
         WHERE watcher_key = ?1 AND target_key = ?2",
    )?
    .execute(params![
        watcher,
        target,
        i64_of(cursor.acked_version.0),
        cursor.notified_version.map(|v| i64_of(v.0)),
        i64_of(cursor.material_version.0),
        now,
    ])?;
    Ok(consumed)
}

#[async_trait]
impl NoticeCursorStore for SqliteStore {
    async fn append_event_opening_notices(
        &self,
        event: &NewSessionEvent,
    ) -> StoreResult<AppendWithNotices> {
        clawgate_store::codec::check_summary(event)?;
        let event = event.clone();
        self.write(move |conn| {
            let appended = append(conn, &event)?;
            let opened = if appended.duplicate || !event.kind.notifies() {
                Vec::new()
            } else {
                open_notices(
                    conn,
                    &event.session_key.storage_key(),
                    i64_of(appended.event.sequence),
                    event.actor_id.as_deref(),
                    event.created_at,
                )?
            };
            Ok(AppendWithNotices { appended, opened })
        })
        .await
    }

    async fn consume_notice(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
        seen: StateVersion,
        now: UnixMillis,
    ) -> StoreResult<ConsumedNotice> {
        let (w, t) = (
            watcher.storage_key().into_owned(),
            target.storage_key().into_owned(),
        );
        // In the writer: the check of the log and the cursor update are one transaction, so an
        // event appended by another process lands either before (and reopens) or after (and
        // opens a fresh notice) — never in between.
        self.write(move |conn| consume(conn, &w, &t, seen, now))
            .await
    }

    async fn consume_deletion_notice(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
    ) -> StoreResult<bool> {
        let (w, t) = (
            watcher.storage_key().into_owned(),
            target.storage_key().into_owned(),
        );
        self.write(move |conn| {
            let deleted = conn
                .prepare_cached(
                    "DELETE FROM session_watch_cursors
                     WHERE watcher_key = ?1 AND target_key = ?2 AND target_deleted_by IS NOT NULL",
                )?
                .execute([&w, &t])?;
            Ok(deleted > 0)
        })
        .await
    }
}

/// Polls `PRAGMA data_version` on its own read-only connection: the value changes when any
/// *other* connection commits (the update hook would only see this connection's writes).
fn read_data_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0))
}

/// `last` is the version read before the feed was handed out: a commit made after
/// `external_changes` returned is announced even if this thread starts late.
fn poll_data_version(
    conn: Connection,
    path: PathBuf,
    interval: Duration,
    tx: watch::Sender<u64>,
    mut last: Option<i64>,
) {
    loop {
        std::thread::sleep(interval);
        if tx.is_closed() {
            return;
        }
        match read_data_version(&conn) {
            Ok(version) if Some(version) != last => {
                last = Some(version);
                tx.send_modify(|generation| *generation = generation.wrapping_add(1));
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "change feed could not read data_version");
            }
        }
    }
}

impl ChangeFeed for SqliteStore {
    fn external_changes(&self, interval: Duration) -> StoreResult<watch::Receiver<u64>> {
        let (tx, rx) = watch::channel(0u64);
        let ctx = &self.inner.ctx;
        if matches!(self.inner.readers, super::Readers::Writer) {
            // In memory: no other connection can exist; the dropped sender ends the feed.
            return Ok(rx);
        }
        let conn = Connection::open_with_flags(
            &ctx.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| ctx.map_sqlite(e, super::errors::Phase::Open))?;
        conn.busy_timeout(Duration::from_millis(ctx.busy_timeout_ms))
            .map_err(|e| ctx.map_sqlite(e, super::errors::Phase::Open))?;
        // The baseline is read here, not on the polling thread, which may start after the
        // caller's next commit.
        let last = read_data_version(&conn).ok();
        let path = ctx.path.clone();
        std::thread::Builder::new()
            .name("clawgate-change-feed".into())
            .spawn(move || {
                let interval = interval.max(Duration::from_millis(1));
                poll_data_version(conn, path, interval, tx, last);
            })
            .map_err(|e| StoreError::Backend(Box::new(e)))?;
        Ok(rx)
    }
}
