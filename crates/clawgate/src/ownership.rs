//! One gateway per channel account. Gateways sharing one database take each account's lease
//! (`AccountLeaseStore`) before they serve its inbound source, renew it while they serve, and
//! stop serving the moment a renewal shows another holder. A gateway that dies stops renewing:
//! another one takes the account once the deadline passes (within `ttl` plus one retry
//! interval). Deadlines are compared with each gateway's own clock, so gateways' clocks must agree
//! to well within `ttl` (NTP does). Sends are not fenced: any gateway may deliver or recover a
//! reply (claims keep each intent with one worker), only polling is exclusive.

use std::sync::Arc;
use std::time::Duration;

use clawgate_store::{AccountClaim, AccountLease, Store};
use clawgate_types::GatewayInstanceId;
use clawgate_types::clock::Clock;
use tokio::sync::watch;
use tracing::{info, warn};

/// Why a tenure ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TenureEnd {
    /// The gateway is stopping: the caller stops serving, then gives the lease back
    /// ([`AccountOwnership::release`]).
    Stopped(AccountLease),
    /// Another gateway holds the account now (or the lease ran out before it could be renewed).
    Lost,
}

/// Takes and holds channel-account leases for one gateway instance.
pub struct AccountOwnership {
    store: Arc<dyn Store>,
    holder: GatewayInstanceId,
    ttl: Duration,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for AccountOwnership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountOwnership")
            .field("holder", &self.holder)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl AccountOwnership {
    pub fn new(
        store: Arc<dyn Store>,
        holder: GatewayInstanceId,
        ttl: Duration,
        clock: Arc<dyn Clock>,
    ) -> AccountOwnership {
        AccountOwnership {
            store,
            holder,
            ttl,
            clock,
        }
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.ttl.as_millis()).unwrap_or(i64::MAX)
    }

    /// How often a holder renews, and a waiting gateway asks again.
    fn interval(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(50))
    }

    /// Waits until `account` is this gateway's; `None` once `stop` fires.
    pub async fn acquire(
        &self,
        account: &str,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<AccountLease> {
        let mut reported: Option<GatewayInstanceId> = None;
        loop {
            if *stop.borrow() {
                return None;
            }
            match self
                .store
                .acquire_account(account, &self.holder, self.clock.now_ms(), self.ttl_ms())
                .await
            {
                Ok(AccountClaim::Granted(lease)) => {
                    info!(account, epoch = lease.epoch, "serving this channel account");
                    return Some(lease);
                }
                Ok(AccountClaim::HeldBy(lease)) => {
                    if reported.as_ref() != Some(&lease.holder) {
                        info!(
                            account,
                            holder = %lease.holder,
                            until = lease.until,
                            "another gateway serves this channel account; taking over if it stops renewing"
                        );
                        reported = Some(lease.holder);
                    }
                }
                Err(e) => {
                    warn!(account, error = %e, "the account lease could not be read; retrying")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval()) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Gives `lease` back, so another gateway takes the account without waiting for its
    /// deadline.
    pub async fn release(&self, lease: &AccountLease) {
        if let Err(e) = self
            .store
            .release_account(
                &lease.account,
                &self.holder,
                lease.epoch,
                self.clock.now_ms(),
            )
            .await
        {
            warn!(account = %lease.account, error = %e, "the account lease could not be given back; it expires by itself");
        }
    }

    /// Renews `lease` until `stop` fires or it is lost.
    pub async fn hold(
        &self,
        mut lease: AccountLease,
        stop: &mut watch::Receiver<bool>,
    ) -> TenureEnd {
        loop {
            if *stop.borrow() {
                return TenureEnd::Stopped(lease);
            }
            tokio::select! {
                _ = tokio::time::sleep(self.interval()) => {}
                _ = stop.changed() => continue,
            }
            let now = self.clock.now_ms();
            match self
                .store
                .acquire_account(&lease.account, &self.holder, now, self.ttl_ms())
                .await
            {
                Ok(AccountClaim::Granted(renewed)) if renewed.epoch == lease.epoch => {
                    lease = renewed
                }
                Ok(AccountClaim::Granted(renewed)) => {
                    // It ran out and came back to us: someone may have served it in between.
                    warn!(account = %lease.account, from = lease.epoch, to = renewed.epoch, "the account lease lapsed and was taken again");
                    lease = renewed;
                }
                Ok(AccountClaim::HeldBy(other)) => {
                    warn!(account = %lease.account, holder = %other.holder, "another gateway took this channel account; no longer serving it");
                    return TenureEnd::Lost;
                }
                Err(e) if now < lease.until => {
                    warn!(account = %lease.account, error = %e, "the account lease could not be renewed; retrying before it runs out");
                }
                Err(e) => {
                    warn!(account = %lease.account, error = %e, "the account lease ran out unrenewed; no longer serving it");
                    return TenureEnd::Lost;
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use clawgate_types::clock::SystemClock;

    fn gateway(store: &Arc<dyn Store>, name: &str) -> AccountOwnership {
        AccountOwnership::new(
            store.clone(),
            GatewayInstanceId::parse(name).unwrap(),
            Duration::from_millis(600),
            Arc::new(SystemClock),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_gateway_serves_an_account_and_another_takes_it_when_it_stops_renewing() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
        let (a, b) = (gateway(&store, "gw-a"), gateway(&store, "gw-b"));
        let (stop_a, mut a_stop) = watch::channel(false);
        let (_stop_b, mut b_stop) = watch::channel(false);
        let first = a.acquire("telegram/default", &mut a_stop).await.unwrap();

        // B waits while A renews: A holds it for several lease lengths.
        let a_holds = tokio::spawn(async move {
            let end = a.hold(first, &mut a_stop).await;
            (a, end)
        });
        let waiting = tokio::time::timeout(
            Duration::from_millis(2_000),
            b.acquire("telegram/default", &mut b_stop),
        )
        .await;
        assert!(
            waiting.is_err(),
            "B never takes an account A keeps renewing"
        );

        // A stops and gives it back: B takes it at once, under a higher epoch.
        stop_a.send(true).unwrap();
        let (a, end) = a_holds.await.unwrap();
        let TenureEnd::Stopped(last) = end else {
            panic!("a stopping gateway ends its tenure as stopped: {end:?}");
        };
        a.release(&last).await;
        let taken = tokio::time::timeout(
            Duration::from_millis(300),
            b.acquire("telegram/default", &mut b_stop),
        )
        .await
        .expect("a released account is taken without waiting for its deadline")
        .unwrap();
        assert!(taken.epoch > last.epoch);

        // B dies (stops renewing, gives nothing back): A takes over after the deadline, and
        // B's next renewal learns it lost the account.
        let (_stop_a2, mut a_stop2) = watch::channel(false);
        let retaken = tokio::time::timeout(
            Duration::from_millis(3_000),
            a.acquire("telegram/default", &mut a_stop2),
        )
        .await
        .expect("a dead holder's account is taken after its deadline")
        .unwrap();
        assert!(retaken.epoch > taken.epoch);
        let end = tokio::time::timeout(Duration::from_millis(3_000), b.hold(taken, &mut b_stop))
            .await
            .expect("the replaced holder notices at its next renewal");
        assert_eq!(end, TenureEnd::Lost);
    }
}
