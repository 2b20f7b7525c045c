//! The session registry, ACPX leases and the gateway instance id.

use async_trait::async_trait;
use clawgate_store::{
    InstanceStore, LeaseStore, SessionRow, SessionStore, StoreError, StoreResult,
};
use clawgate_types::{
    AcpxProcessLease, GatewayInstanceId, LeaseId, LeaseState, SessionKey, UnixMillis,
};
use deadpool_postgres::GenericClient;
use serde::de::DeserializeOwned;
use tokio_postgres::types::ToSql;

use crate::PostgresStore;
use crate::errors::DbResult;

use crate::signals::cursors;
use clawgate_store::WatchCursor;
use clawgate_store::codec::{self, ROW_FORMAT, encode};

fn decode<T: DeserializeOwned>(
    what: &'static str,
    id: String,
    format: i64,
    payload: &str,
) -> DbResult<T> {
    Ok(clawgate_store::codec::decode(
        what, id, format, ROW_FORMAT, payload,
    )?)
}

async fn load_session<C: GenericClient>(
    conn: &C,
    key: &str,
    lock: bool,
) -> DbResult<Option<SessionRow>> {
    let sql = format!(
        "SELECT format_version, payload FROM sessions WHERE session_key = $1{}",
        if lock { " FOR UPDATE" } else { "" }
    );
    let stmt = conn.prepare_cached(&sql).await?;
    match conn.query_opt(&stmt, &[&key]).await? {
        Some(row) => Ok(Some(codec::decode_session(
            key,
            row.try_get(0)?,
            row.try_get(1)?,
        )?)),
        None => Ok(None),
    }
}

async fn write_session<C: GenericClient>(conn: &C, row: &SessionRow) -> DbResult<()> {
    let key = row.session_key.storage_key();
    let key = key.as_ref();
    let payload = codec::encode_session(row)?;
    let stmt = conn
        .prepare_cached(
            "INSERT INTO sessions (session_key, agent_id, deleted_at, format_version, payload)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_key) DO UPDATE SET agent_id = EXCLUDED.agent_id,
                 deleted_at = EXCLUDED.deleted_at, format_version = EXCLUDED.format_version,
                 payload = EXCLUDED.payload",
        )
        .await?;
    conn.execute(
        &stmt,
        &[&key, &row.agent_id, &row.deleted_at, &ROW_FORMAT, &payload],
    )
    .await?;
    Ok(())
}

/// Marks the row (reset or deleted, by `mark`) and deletes the cursors `cursors` names (`$1`
/// the key, `$2` `arg`), in one transaction with the session row locked.
async fn mark_session<C: GenericClient>(
    conn: &C,
    key: &str,
    now: UnixMillis,
    mark: fn(&mut SessionRow, UnixMillis),
    cursors: &str,
    arg: &str,
) -> DbResult<()> {
    let mut row = load_session(conn, key, true)
        .await?
        .ok_or_else(|| StoreError::NotFound {
            what: "session",
            id: key.to_owned(),
        })?;
    mark(&mut row, now);
    row.updated_at = now;
    write_session(conn, &row).await?;
    let stmt = conn
        .prepare_cached(&format!(
            "DELETE FROM session_watch_cursors WHERE {cursors}"
        ))
        .await?;
    if cursors.contains("$2") {
        conn.execute(&stmt, &[&key, &arg]).await?;
    } else {
        conn.execute(&stmt, &[&key]).await?;
    }
    Ok(())
}

#[async_trait]
impl SessionStore for PostgresStore {
    async fn upsert_session(&self, row: &SessionRow) -> StoreResult<()> {
        run!(self, |conn| { write_session(conn, row).await })
    }

    async fn load_session(&self, key: &SessionKey) -> StoreResult<Option<SessionRow>> {
        let key = key.storage_key();
        let key = key.as_ref();
        run!(self, |conn| { load_session(conn, key, false).await })
    }

    async fn list_sessions(&self) -> StoreResult<Vec<SessionRow>> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "SELECT session_key, format_version, payload FROM sessions
                         WHERE deleted_at IS NULL ORDER BY session_key",
                )
                .await?;
            conn.query(&stmt, &[])
                .await?
                .iter()
                .map(|r| {
                    Ok(codec::decode_session(
                        r.try_get(0)?,
                        r.try_get(1)?,
                        r.try_get(2)?,
                    )?)
                })
                .collect()
        })
    }

    async fn reset_session(&self, key: &SessionKey, now: UnixMillis) -> StoreResult<()> {
        let key = key.storage_key();
        let key = key.as_ref();
        transaction!(self, |tx| {
            (mark_session(
                tx,
                key,
                now,
                |row, now| row.reset_at = Some(now),
                "watcher_key = $1",
                "",
            ))
            .await
        })
    }

    async fn delete_session(
        &self,
        key: &SessionKey,
        deleted_by: &str,
        now: UnixMillis,
    ) -> StoreResult<Vec<WatchCursor>> {
        let key = key.storage_key();
        let key = key.as_ref();
        transaction!(self, |tx| {
            // The deleter's own cursor goes with its watches: nobody is told of their own act.
            (mark_session(
                tx,
                key,
                now,
                |row, now| row.deleted_at = Some(now),
                "watcher_key = $1 OR (target_key = $1 AND watcher_key = $2)",
                deleted_by,
            ))
            .await?;
            let stmt = tx
                .prepare_cached(
                    "UPDATE session_watch_cursors
                     SET target_deleted_by = $2,
                         notified_version = GREATEST(acked_version,
                             COALESCE((SELECT head FROM session_heads WHERE session_key = $1), 0)),
                         updated_at = $3
                     WHERE target_key = $1 AND target_deleted_by IS NULL",
                )
                .await?;
            tx.execute(&stmt, &[&key, &deleted_by, &now]).await?;
            cursors(
                tx,
                "WHERE target_key = $1 AND target_deleted_by IS NOT NULL",
                Some(key),
            )
            .await
        })
    }
}

async fn load_lease<C: GenericClient>(conn: &C, id: &str) -> DbResult<Option<AcpxProcessLease>> {
    let stmt = conn
        .prepare_cached("SELECT format_version, payload FROM acpx_leases WHERE lease_id = $1")
        .await?;
    match conn.query_opt(&stmt, &[&id]).await? {
        Some(row) => Ok(Some(decode(
            "lease",
            id.to_owned(),
            row.try_get(0)?,
            row.try_get(1)?,
        )?)),
        None => Ok(None),
    }
}

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn insert_lease(&self, lease: &AcpxProcessLease) -> StoreResult<()> {
        let id = lease.lease_id.as_str();
        let payload = encode("lease", id, lease)?;
        run!(self, |conn| {
            let payload = &payload;

            let stmt = conn
                .prepare_cached(
                    "INSERT INTO acpx_leases (lease_id, gateway_instance_id, session_key,
                             state, started_at, ended_at, format_version, payload)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .await?;
            conn.execute(
                &stmt,
                &[
                    &id,
                    &lease.gateway_instance_id.as_str(),
                    &lease.session_key.as_str(),
                    &lease.state.as_str(),
                    &lease.started_at,
                    &lease.ended_at,
                    &ROW_FORMAT,
                    payload,
                ],
            )
            .await?;
            Ok(())
        })
    }

    async fn load_lease(&self, id: &LeaseId) -> StoreResult<Option<AcpxProcessLease>> {
        let id = id.as_str();
        run!(self, |conn| { load_lease(conn, id).await })
    }

    async fn save_lease(&self, lease: &AcpxProcessLease, expected: LeaseState) -> StoreResult<()> {
        let id = lease.lease_id.as_str();
        let payload = encode("lease", id, lease)?;
        run!(self, |conn| {
            let payload = &payload;

            // A compare-and-set in one statement; only a miss reads the row to say why.
            let stmt = conn
                .prepare_cached(
                    "UPDATE acpx_leases SET state = $2, ended_at = $3, format_version = $4,
                             payload = $5, session_key = $7
                         WHERE lease_id = $1 AND state = $6",
                )
                .await?;
            let changed = conn
                .execute(
                    &stmt,
                    &[
                        &id,
                        &lease.state.as_str(),
                        &lease.ended_at,
                        &ROW_FORMAT,
                        payload,
                        &expected.as_str(),
                        &lease.session_key.as_str(),
                    ],
                )
                .await?;
            if changed == 1 {
                return Ok(());
            }
            let stored = load_lease(conn, id)
                .await?
                .ok_or_else(|| StoreError::NotFound {
                    what: "lease",
                    id: id.to_owned(),
                })?;
            Err(StoreError::LeaseStateConflict {
                id: id.to_owned(),
                expected,
                actual: stored.state,
            }
            .into())
        })
    }

    async fn list_leases(
        &self,
        instance: Option<&GatewayInstanceId>,
        states: &[LeaseState],
    ) -> StoreResult<Vec<AcpxProcessLease>> {
        let instance = instance.map(GatewayInstanceId::as_str);
        let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        run!(self, |conn| {
            let states = &states;

            let any_state = states.is_empty();
            let params: [&(dyn ToSql + Sync); 3] = [&instance, &any_state, states];
            let stmt = conn
                .prepare_cached(
                    "SELECT lease_id, format_version, payload FROM acpx_leases
                         WHERE ($1::TEXT IS NULL OR gateway_instance_id = $1)
                           AND ($2 OR state = ANY($3))
                         ORDER BY started_at, lease_id",
                )
                .await?;
            conn.query(&stmt, &params)
                .await?
                .iter()
                .map(|r| decode("lease", r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))
                .collect()
        })
    }

    async fn prune_finished_leases(&self, ended_before: UnixMillis) -> StoreResult<u64> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "DELETE FROM acpx_leases
                         WHERE state IN ('closed', 'lost') AND ended_at IS NOT NULL
                           AND ended_at < $1",
                )
                .await?;
            Ok(conn.execute(&stmt, &[&ended_before]).await?)
        })
    }
}

#[async_trait]
impl InstanceStore for PostgresStore {
    /// The configured instance: with one shared database each gateway has its own, which the
    /// caller keeps locally.
    async fn gateway_instance_id(&self) -> StoreResult<GatewayInstanceId> {
        Ok(self.inner.instance.clone())
    }
}
