//! Channel account leases (one serving gateway per account) and the schema as operators see it.

use async_trait::async_trait;
use clawgate_store::{
    AccountClaim, AccountLease, AccountLeaseStore, MigrationStatus, SchemaStore, StoreError,
    StoreResult,
};
use clawgate_types::{GatewayInstanceId, UnixMillis};
use tokio_postgres::Row;

use crate::PostgresStore;
use crate::errors::DbResult;

fn lease(row: &Row) -> DbResult<AccountLease> {
    let account: String = row.try_get(0)?;
    let holder: String = row.try_get(1)?;
    let epoch: i64 = row.try_get(2)?;
    Ok(AccountLease {
        holder: GatewayInstanceId::parse(holder).map_err(|e| {
            StoreError::InvalidInput(format!(
                "stored holder of account {account} is invalid: {e}"
            ))
        })?,
        account,
        epoch: u64::try_from(epoch).unwrap_or(0),
        until: row.try_get(3)?,
    })
}

#[async_trait]
impl AccountLeaseStore for PostgresStore {
    async fn acquire_account(
        &self,
        account: &str,
        holder: &GatewayInstanceId,
        now: UnixMillis,
        ttl_ms: i64,
    ) -> StoreResult<AccountClaim> {
        let holder = holder.as_str();
        let until = now.saturating_add(ttl_ms);
        run!(self, |conn| {
            // One statement: the row lock of the upsert orders two gateways racing for it.
            let stmt = conn
                .prepare_cached(
                    "INSERT INTO account_leases AS l (account, holder, epoch, until)
                     VALUES ($1, $2, 1, $3)
                     ON CONFLICT (account) DO UPDATE SET
                         epoch = CASE WHEN l.holder = excluded.holder THEN l.epoch
                                      ELSE l.epoch + 1 END,
                         holder = excluded.holder,
                         until = excluded.until
                     WHERE l.holder = excluded.holder OR l.until <= $4
                     RETURNING account, holder, epoch, until",
                )
                .await?;
            match conn
                .query_opt(&stmt, &[&account, &holder, &until, &now])
                .await?
            {
                Some(row) => Ok(AccountClaim::Granted(lease(&row)?)),
                None => {
                    let stmt = conn
                        .prepare_cached(
                            "SELECT account, holder, epoch, until FROM account_leases
                             WHERE account = $1",
                        )
                        .await?;
                    let row = conn.query_one(&stmt, &[&account]).await?;
                    Ok(AccountClaim::HeldBy(lease(&row)?))
                }
            }
        })
    }

    async fn release_account(
        &self,
        account: &str,
        holder: &GatewayInstanceId,
        epoch: u64,
        now: UnixMillis,
    ) -> StoreResult<()> {
        let holder = holder.as_str();
        let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "UPDATE account_leases SET until = $4
                     WHERE account = $1 AND holder = $2 AND epoch = $3 AND until > $4",
                )
                .await?;
            conn.execute(&stmt, &[&account, &holder, &epoch, &now])
                .await?;
            Ok(())
        })
    }

    async fn account_leases(&self) -> StoreResult<Vec<AccountLease>> {
        run!(self, |conn| {
            let stmt = conn
                .prepare_cached(
                    "SELECT account, holder, epoch, until FROM account_leases ORDER BY account",
                )
                .await?;
            conn.query(&stmt, &[])
                .await?
                .iter()
                .map(lease)
                .collect::<DbResult<Vec<_>>>()
        })
    }
}

#[async_trait]
impl SchemaStore for PostgresStore {
    fn database(&self) -> String {
        format!(
            "{} (schema {})",
            PostgresStore::database(self),
            self.schema()
        )
    }

    fn supported_schema_version(&self) -> i64 {
        crate::SCHEMA_VERSION
    }

    async fn migration_status(&self) -> StoreResult<Vec<MigrationStatus>> {
        run!(self, |conn| { crate::migrate::status(conn).await })
    }
}
