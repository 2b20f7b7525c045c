//! The session registry, ACPX leases, channel account leases and the gateway instance id.

use async_trait::async_trait;
use clawgate_types::{
    AcpxProcessLease, GatewayInstanceId, LeaseId, LeaseState, SessionKey, UnixMillis,
};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Serialize, de::DeserializeOwned};

use super::SqliteStore;
use super::errors::DbResult;
use super::signals::{cursors, head, i64_of};
use clawgate_store::{AccountClaim, AccountLease, AccountLeaseStore};
use clawgate_store::{InstanceStore, LeaseStore, SessionStore};
use clawgate_store::{SessionRow, WatchCursor};
use clawgate_store::{StoreError, StoreResult};

use clawgate_store::codec::{self, ROW_FORMAT};

fn encode<T: Serialize>(what: &'static str, id: &str, value: &T) -> DbResult<String> {
    Ok(codec::encode(what, id, value)?)
}

fn decode<T: DeserializeOwned>(
    what: &'static str,
    id: String,
    format: i64,
    payload: &str,
) -> DbResult<T> {
    Ok(codec::decode(what, id, format, ROW_FORMAT, payload)?)
}

fn load_session(conn: &Connection, key: &str) -> DbResult<Option<SessionRow>> {
    let raw: Option<(i64, String)> = conn
        .prepare_cached("SELECT format_version, payload FROM sessions WHERE session_key = ?1")?
        .query_row([key], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    raw.map(|(format, payload)| Ok(codec::decode_session(key, format, &payload)?))
        .transpose()
}

fn write_session(conn: &Connection, row: &SessionRow) -> DbResult<()> {
    let key = row.session_key.storage_key();
    conn.prepare_cached(
        "INSERT INTO sessions (session_key, agent_id, deleted_at, format_version, payload)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (session_key) DO UPDATE SET agent_id = excluded.agent_id,
             deleted_at = excluded.deleted_at, format_version = excluded.format_version,
             payload = excluded.payload",
    )?
    .execute(params![
        key,
        row.agent_id,
        row.deleted_at,
        ROW_FORMAT,
        codec::encode_session(row)?
    ])?;
    Ok(())
}

fn required_session(conn: &Connection, key: &str) -> DbResult<SessionRow> {
    load_session(conn, key)?.ok_or_else(|| {
        StoreError::NotFound {
            what: "session",
            id: key.to_owned(),
        }
        .into()
    })
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn upsert_session(&self, row: &SessionRow) -> StoreResult<()> {
        let row = row.clone();
        self.write(move |conn| write_session(conn, &row)).await
    }

    async fn load_session(&self, key: &SessionKey) -> StoreResult<Option<SessionRow>> {
        let key = key.storage_key().into_owned();
        self.read(move |conn| load_session(conn, &key)).await
    }

    async fn list_sessions(&self) -> StoreResult<Vec<SessionRow>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT session_key, format_version, payload FROM sessions
                 WHERE deleted_at IS NULL ORDER BY session_key",
            )?;
            let rows =
                stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, String>(2)?)))?;
            let mut out = Vec::new();
            for row in rows {
                let (key, format, payload): (String, i64, String) = row?;
                out.push(codec::decode_session(&key, format, &payload)?);
            }
            Ok(out)
        })
        .await
    }

    async fn reset_session(&self, key: &SessionKey, now: UnixMillis) -> StoreResult<()> {
        let key = key.storage_key().into_owned();
        self.write(move |conn| {
            let mut row = required_session(conn, &key)?;
            row.reset_at = Some(now);
            row.updated_at = now;
            write_session(conn, &row)?;
            conn.prepare_cached("DELETE FROM session_watch_cursors WHERE watcher_key = ?1")?
                .execute([&key])?;
            Ok(())
        })
        .await
    }

    async fn delete_session(
        &self,
        key: &SessionKey,
        deleted_by: &str,
        now: UnixMillis,
    ) -> StoreResult<Vec<WatchCursor>> {
        let key = key.storage_key().into_owned();
        let deleted_by = deleted_by.to_owned();
        self.write(move |conn| {
            let mut row = required_session(conn, &key)?;
            row.deleted_at = Some(now);
            row.updated_at = now;
            write_session(conn, &row)?;
            // The deleter's own cursor goes with its watches: nobody is told of their own act.
            conn.prepare_cached(
                "DELETE FROM session_watch_cursors
                 WHERE watcher_key = ?1 OR (target_key = ?1 AND watcher_key = ?2)",
            )?
            .execute([&key, &deleted_by])?;
            let head = i64_of(head(conn, &key)?.state_version.0);
            let mut stmt = conn.prepare_cached(
                "UPDATE session_watch_cursors
                 SET target_deleted_by = ?2, notified_version = MAX(acked_version, ?3),
                     updated_at = ?4
                 WHERE target_key = ?1 AND target_deleted_by IS NULL",
            )?;
            stmt.execute(params![key, deleted_by, head, now])?;
            cursors(
                conn,
                "WHERE target_key = ?1 AND target_deleted_by IS NOT NULL",
                &[&key],
            )
        })
        .await
    }
}

fn load_lease(conn: &Connection, id: &str) -> DbResult<Option<AcpxProcessLease>> {
    let raw: Option<(i64, String)> = conn
        .prepare_cached("SELECT format_version, payload FROM acpx_leases WHERE lease_id = ?1")?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    raw.map(|(format, payload)| decode("lease", id.to_owned(), format, &payload))
        .transpose()
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn insert_lease(&self, lease: &AcpxProcessLease) -> StoreResult<()> {
        let lease = lease.clone();
        self.write(move |conn| {
            let id = lease.lease_id.as_str();
            conn.prepare_cached(
                "INSERT INTO acpx_leases (lease_id, gateway_instance_id, session_key, state,
                     started_at, ended_at, format_version, payload)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                id,
                lease.gateway_instance_id.as_str(),
                lease.session_key.as_str(),
                lease.state.as_str(),
                lease.started_at,
                lease.ended_at,
                ROW_FORMAT,
                encode("lease", id, &lease)?,
            ])?;
            Ok(())
        })
        .await
    }

    async fn load_lease(&self, id: &LeaseId) -> StoreResult<Option<AcpxProcessLease>> {
        let id = id.as_str().to_owned();
        self.read(move |conn| load_lease(conn, &id)).await
    }

    async fn save_lease(&self, lease: &AcpxProcessLease, expected: LeaseState) -> StoreResult<()> {
        let lease = lease.clone();
        self.write(move |conn| {
            let id = lease.lease_id.as_str();
            let stored = load_lease(conn, id)?
                .ok_or_else(|| StoreError::NotFound { what: "lease", id: id.to_owned() })?;
            if stored.state != expected {
                return Err(StoreError::LeaseStateConflict {
                    id: id.to_owned(),
                    expected,
                    actual: stored.state,
                }
                .into());
            }
            conn.prepare_cached(
                "UPDATE acpx_leases SET state = ?2, ended_at = ?3, format_version = ?4, payload = ?5,
                        session_key = ?6
                 WHERE lease_id = ?1",
            )?
            .execute(params![
                id,
                lease.state.as_str(),
                lease.ended_at,
                ROW_FORMAT,
                encode("lease", id, &lease)?,
                lease.session_key.as_str()
            ])?;
            Ok(())
        })
        .await
    }

    async fn list_leases(
        &self,
        instance: Option<&GatewayInstanceId>,
        states: &[LeaseState],
    ) -> StoreResult<Vec<AcpxProcessLease>> {
        let instance = instance.map(|i| i.as_str().to_owned());
        let states: Vec<&'static str> = states.iter().map(|s| s.as_str()).collect();
        self.read(move |conn| {
            let mut sql = String::from(
                "SELECT lease_id, format_version, payload FROM acpx_leases WHERE 1 = 1",
            );
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            if let Some(instance) = instance {
                sql.push_str(" AND gateway_instance_id = ?");
                args.push(instance.into());
            }
            if !states.is_empty() {
                sql.push_str(&format!(
                    " AND state IN ({})",
                    vec!["?"; states.len()].join(", ")
                ));
                args.extend(
                    states
                        .iter()
                        .map(|s| rusqlite::types::Value::from((*s).to_owned())),
                );
            }
            sql.push_str(" ORDER BY started_at, lease_id");
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| {
                Ok((r.get(0)?, r.get(1)?, r.get::<_, String>(2)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (id, format, payload) = row?;
                out.push(decode("lease", id, format, &payload)?);
            }
            Ok(out)
        })
        .await
    }

    async fn prune_finished_leases(&self, ended_before: UnixMillis) -> StoreResult<u64> {
        self.write(move |conn| {
            let n = conn
                .prepare_cached(
                    "DELETE FROM acpx_leases
                     WHERE state IN ('closed', 'lost') AND ended_at IS NOT NULL AND ended_at < ?1",
                )?
                .execute([ended_before])?;
            Ok(n as u64)
        })
        .await
    }
}

const INSTANCE_KEY: &str = "gateway_instance_id";

#[async_trait]
impl InstanceStore for SqliteStore {
    async fn gateway_instance_id(&self) -> StoreResult<GatewayInstanceId> {
        // In the writer: two processes starting at once agree on one id.
        self.write(|conn| {
            conn.prepare_cached(
                "INSERT INTO gateway_meta (key, value) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            )?
            .execute(params![INSTANCE_KEY, clawgate_store::ids::new_id()])?;
            let value: String = conn
                .prepare_cached("SELECT value FROM gateway_meta WHERE key = ?1")?
                .query_row([INSTANCE_KEY], |r| r.get(0))?;
            GatewayInstanceId::parse(value).map_err(|e| {
                StoreError::InvalidInput(format!("stored gateway instance id is invalid: {e}"))
                    .into()
            })
        })
        .await
    }
}

fn account_lease(row: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, i64, i64)> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

fn to_account_lease(
    (account, holder, epoch, until): (String, String, i64, i64),
) -> Result<AccountLease, StoreError> {
    Ok(AccountLease {
        holder: GatewayInstanceId::parse(holder).map_err(|e| {
            StoreError::InvalidInput(format!(
                "stored holder of account {account} is invalid: {e}"
            ))
        })?,
        account,
        epoch: u64::try_from(epoch).unwrap_or(0),
        until,
    })
}

#[async_trait]
impl AccountLeaseStore for SqliteStore {
    async fn acquire_account(
        &self,
        account: &str,
        holder: &GatewayInstanceId,
        now: UnixMillis,
        ttl_ms: i64,
    ) -> StoreResult<AccountClaim> {
        let account = account.to_owned();
        let holder = holder.as_str().to_owned();
        let until = now.saturating_add(ttl_ms);
        self.write(move |conn| {
            // Taken when free, expired or already ours; a change of hands raises the epoch.
            let taken = conn
                .prepare_cached(
                    "INSERT INTO account_leases (account, holder, epoch, until)
                     VALUES (?1, ?2, 1, ?3)
                     ON CONFLICT (account) DO UPDATE SET
                         epoch = CASE WHEN holder = excluded.holder THEN epoch ELSE epoch + 1 END,
                         holder = excluded.holder,
                         until = excluded.until
                     WHERE holder = excluded.holder OR until <= ?4
                     RETURNING account, holder, epoch, until",
                )?
                .query_row(params![account, holder, until, now], account_lease)
                .optional()?;
            let granted = taken.is_some();
            let row = match taken {
                Some(row) => row,
                None => conn
                    .prepare_cached(
                        "SELECT account, holder, epoch, until FROM account_leases
                         WHERE account = ?1",
                    )?
                    .query_row([&account], account_lease)?,
            };
            let lease = to_account_lease(row)?;
            Ok(if granted {
                AccountClaim::Granted(lease)
            } else {
                AccountClaim::HeldBy(lease)
            })
        })
        .await
    }

    async fn release_account(
        &self,
        account: &str,
        holder: &GatewayInstanceId,
        epoch: u64,
        now: UnixMillis,
    ) -> StoreResult<()> {
        let account = account.to_owned();
        let holder = holder.as_str().to_owned();
        let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
        self.write(move |conn| {
            conn.prepare_cached(
                "UPDATE account_leases SET until = ?4
                 WHERE account = ?1 AND holder = ?2 AND epoch = ?3 AND until > ?4",
            )?
            .execute(params![account, holder, epoch, now])?;
            Ok(())
        })
        .await
    }

    async fn account_leases(&self) -> StoreResult<Vec<AccountLease>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT account, holder, epoch, until FROM account_leases ORDER BY account",
            )?;
            let rows = stmt.query_map([], account_lease)?;
            let mut out = Vec::new();
            for row in rows {
                out.push(to_account_lease(row?)?);
            }
            Ok(out)
        })
        .await
    }
}
