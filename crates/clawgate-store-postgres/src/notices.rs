//! Atomic notice transitions on watch cursors: each is one transaction holding the cursor's row
//! lock, so gateways sharing the database never lose or double a notice.

use async_trait::async_trait;
use clawgate_store::{
    AppendWithNotices, ConsumedNotice, NewSessionEvent, NoticeCursorStore, StoreResult, WatchCursor,
};
use clawgate_types::{SessionKey, StateVersion, UnixMillis};
use deadpool_postgres::GenericClient;

use crate::errors::DbResult;
use crate::signals::{CURSOR_COLUMNS, append, check_summary, decode_cursor, load_cursor};
use crate::{PostgresStore, i64_of, u64_of};

use clawgate_store::codec::{self, notifying_kinds};

async fn open_notices<C: GenericClient>(
    conn: &C,
    target: &str,
    sequence: i64,
    actor: Option<&str>,
    now: UnixMillis,
) -> DbResult<Vec<WatchCursor>> {
    // Only cursors without a pending notice change: a pending notice keeps its frozen watermark
    // and text, and the remainder is found from the log when it is consumed. A cursor locked by
    // a consume in progress is waited for and its row re-checked, so the notice opens exactly
    // when the consume left none pending.
    let stmt = conn
        .prepare_cached(&format!(
            "UPDATE session_watch_cursors
             SET notified_version = $2, material_version = GREATEST(material_version, $2),
                 updated_at = $4
             WHERE target_key = $1 AND notified_version IS NULL AND acked_version < $2
               AND watcher_key IS DISTINCT FROM $3
             RETURNING {CURSOR_COLUMNS}"
        ))
        .await?;
    let rows = conn
        .query(&stmt, &[&target, &sequence, &actor, &now])
        .await?;
    let mut opened = rows
        .iter()
        .map(decode_cursor)
        .collect::<DbResult<Vec<_>>>()?;
    opened.sort_by(|a, b| a.watcher_key.cmp(&b.watcher_key));
    Ok(opened)
}

async fn consume<C: GenericClient>(
    conn: &C,
    watcher: &str,
    target: &str,
    seen: StateVersion,
    now: UnixMillis,
) -> DbResult<ConsumedNotice> {
    // The row lock makes the check of `acked_version` and the move one step: of two gateways
    // consuming the same notice, the second waits, then reads the moved cursor and acks nothing.
    let (mut cursor, frozen) =
        match codec::notice_to_ack(load_cursor(conn, watcher, target, true).await?, seen) {
            codec::NoticeToAck::Pending { cursor, frozen } => (cursor, frozen),
            codec::NoticeToAck::Nothing(unchanged) => return Ok(unchanged),
        };
    let stmt = conn
        .prepare_cached(
            "SELECT (SELECT MAX(sequence) FROM session_state_events
                     WHERE session_key = $1 AND sequence > $2 AND kind = ANY($4)
                       AND (actor_id IS NULL OR actor_id <> $3)),
                    (SELECT head FROM session_heads WHERE session_key = $1),
                    (SELECT pruned_through FROM session_heads WHERE session_key = $1)",
        )
        .await?;
    let kinds = notifying_kinds();
    let row = conn
        .query_one(&stmt, &[&target, &i64_of(frozen.0), &watcher, &kinds])
        .await?;
    let after = codec::AfterWatermark {
        newest_material: row.try_get::<_, Option<i64>>(0)?.map(u64_of),
        head: u64_of(row.try_get::<_, Option<i64>>(1)?.unwrap_or(0)),
        pruned_through: u64_of(row.try_get::<_, Option<i64>>(2)?.unwrap_or(0)),
    };
    let consumed = codec::ack_notice(&mut cursor, frozen, after, now);
    let stmt = conn
        .prepare_cached(
            "UPDATE session_watch_cursors SET acked_version = $3, notified_version = $4,
                 material_version = $5, updated_at = $6
             WHERE watcher_key = $1 AND target_key = $2",
        )
        .await?;
    conn.execute(
        &stmt,
        &[
            &watcher,
            &target,
            &i64_of(cursor.acked_version.0),
            &cursor.notified_version.map(|v| i64_of(v.0)),
            &i64_of(cursor.material_version.0),
            &now,
        ],
    )
    .await?;
    Ok(consumed)
}

#[async_trait]
impl NoticeCursorStore for PostgresStore {
    async fn append_event_opening_notices(
        &self,
        event: &NewSessionEvent,
    ) -> StoreResult<AppendWithNotices> {
        check_summary(event)?;
        transaction!(self, |tx| {
            let appended = append(tx, event).await?;
            let opened = if appended.duplicate || !event.kind.notifies() {
                Vec::new()
            } else {
                open_notices(
                    tx,
                    &event.session_key.storage_key(),
                    i64_of(appended.event.sequence),
                    event.actor_id.as_deref(),
                    event.created_at,
                )
                .await?
            };
            Ok(AppendWithNotices { appended, opened })
        })
    }

    async fn consume_notice(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
        seen: StateVersion,
        now: UnixMillis,
    ) -> StoreResult<ConsumedNotice> {
        let (w, t) = (watcher.storage_key(), target.storage_key());
        let (w, t) = (w.as_ref(), t.as_ref());
        transaction!(self, |tx| { consume(tx, w, t, seen, now).await })
    }

    async fn consume_deletion_notice(
        &self,
        watcher: &SessionKey,
        target: &SessionKey,
    ) -> StoreResult<bool> {
        let (w, t) = (watcher.storage_key(), target.storage_key());
        let (w, t) = (w.as_ref(), t.as_ref());
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "DELETE FROM session_watch_cursors
                     WHERE watcher_key = $1 AND target_key = $2 AND target_deleted_by IS NOT NULL",
                )
                .await?;
            Ok(conn.execute(&stmt, &[&w, &t]).await? > 0)
        })
    }
}
