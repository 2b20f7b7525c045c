//! `clawgate leases`, `/v1/leases`: the agent process leases, and reaping the orphaned ones.

use clawgate_acpx::{CloseOutcome, LifecycleController};
use clawgate_store::LeaseStore;
use clawgate_types::{
    AcpxProcessLease, LeaseId, LeaseState, LeaseSurvivor, SessionKey, UnixMillis,
};
use serde::{Deserialize, Serialize};

use super::{ViewError, limit_of};

/// `GET /v1/leases` query, `clawgate leases list` options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeasesListParams {
    /// Comma-separated states (`open,closing`); all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// At most this many leases (default 50, at most 1000), oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/leases`: agent process leases, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseList {
    pub leases: Vec<LeaseSummary>,
    pub more: bool,
}

/// One agent process lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeaseSummary {
    pub lease_id: LeaseId,
    pub state: LeaseState,
    pub session_key: SessionKey,
    /// The wrapper process (unknown until it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_group_id: Option<u32>,
    /// Evidence that a live process is still this lease's (a pid alone may have been reused):
    /// the root's start time (clock ticks since boot)…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_start_time: Option<u64>,
    /// …in this boot…
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// …running this command line (its hash).
    #[serde(default)]
    pub command_hash: String,
    pub started_at: UnixMillis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<UnixMillis>,
    /// Owned processes that outlived KILL: the lease stays `closing` until they are gone
    /// (the gateway looks again every few seconds, and at start).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<LeaseSurvivor>,
    /// The agent's last stderr lines before its start or a turn failed (secrets masked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
}

impl LeaseSummary {
    pub fn of(lease: &AcpxProcessLease) -> LeaseSummary {
        LeaseSummary {
            lease_id: lease.lease_id.clone(),
            state: lease.state,
            session_key: lease.session_key.clone(),
            root_pid: lease.root_pid,
            process_group_id: lease.process_group_id,
            root_start_time: lease.root_start_time,
            boot_id: lease.boot_id.clone(),
            command_hash: lease.command_hash.clone(),
            started_at: lease.started_at,
            ended_at: lease.ended_at,
            stderr_tail: lease.stderr_tail.clone(),
            survivors: lease.survivors.clone(),
        }
    }
}

const ALL_LEASE_STATES: [LeaseState; 4] = [
    LeaseState::Open,
    LeaseState::Closing,
    LeaseState::Closed,
    LeaseState::Lost,
];

/// Parses `open,closing`.
pub fn parse_lease_states(text: &str) -> Result<Vec<LeaseState>, ViewError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            ALL_LEASE_STATES
                .into_iter()
                .find(|state| state.as_str() == s)
                .ok_or_else(|| {
                    ViewError::BadRequest(format!(
                        "unknown lease state {s:?}: use one of open, closing, closed, lost"
                    ))
                })
        })
        .collect()
}

pub async fn leases_list<S: LeaseStore + ?Sized>(
    store: &S,
    params: &LeasesListParams,
) -> Result<LeaseList, ViewError> {
    let limit = limit_of(params.limit)? as usize;
    let mut states = parse_lease_states(params.state.as_deref().unwrap_or(""))?;
    if states.is_empty() {
        states = ALL_LEASE_STATES.to_vec();
    }
    let mut leases = store.list_leases(None, &states).await?;
    let more = leases.len() > limit;
    leases.truncate(limit);
    Ok(LeaseList {
        leases: leases.iter().map(LeaseSummary::of).collect(),
        more,
    })
}

/// `POST /v1/leases/reap`: what reaping did with each lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReapSummary {
    pub outcomes: Vec<ReapOutcome>,
    /// Finished leases removed by retention.
    pub pruned: u64,
}

/// One lease's reaping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReapOutcome {
    pub lease_id: LeaseId,
    pub result: ReapResult,
    /// Which processes were signalled, or why nothing was.
    pub detail: String,
}

/// What reaping did with one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReapResult {
    /// Verified as this instance's and ended; the lease is `closed`.
    Closed,
    /// Verified and signalled, but processes outlived KILL (listed in the detail): the lease
    /// stays `closing` and is looked at again until they are gone.
    Survived,
    /// The process was already gone; the lease is `lost`. Nothing was signalled.
    Lost,
    /// Ownership could not be verified: nothing was signalled, the lease is unchanged.
    Refused,
    /// The lease had finished already.
    AlreadyFinished,
}

impl ReapOutcome {
    pub fn of(lease_id: LeaseId, outcome: &CloseOutcome) -> ReapOutcome {
        let (result, detail) = match outcome {
            CloseOutcome::Closed(t) => (ReapResult::Closed, termination_detail(t)),
            CloseOutcome::Survived(t) => (ReapResult::Survived, termination_detail(t)),
            CloseOutcome::Lost(why) => (ReapResult::Lost, why.clone()),
            CloseOutcome::Refused(why) => (ReapResult::Refused, why.clone()),
            CloseOutcome::AlreadyFinished(state) => {
                (ReapResult::AlreadyFinished, state.as_str().to_owned())
            }
        };
        ReapOutcome {
            lease_id,
            result,
            detail,
        }
    }
}

fn termination_detail(t: &clawgate_acpx::Termination) -> String {
    let mut detail = format!("TERM {:?}, KILL {:?}", t.termed, t.killed);
    if !t.survivors.is_empty() {
        let pids: Vec<u32> = t.survivors.iter().map(|s| s.pid).collect();
        detail.push_str(&format!(", survived KILL {pids:?}"));
    }
    detail
}

/// Ends the agent processes of this instance's unfinished leases that no live session of
/// `controller` owns — only ever processes verified as this instance's.
pub async fn leases_reap(
    controller: &LifecycleController,
    now: UnixMillis,
) -> Result<ReapSummary, ViewError> {
    let report = controller.reap_startup_orphans(now).await?;
    Ok(ReapSummary {
        outcomes: report
            .outcomes
            .iter()
            .map(|(id, outcome)| ReapOutcome::of(id.clone(), outcome))
            .collect(),
        pruned: report.pruned,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    #[test]
    fn lease_states_parse_with_a_helpful_error() {
        assert_eq!(
            parse_lease_states("open,closing").unwrap(),
            [LeaseState::Open, LeaseState::Closing]
        );
        assert!(parse_lease_states("gone").is_err());
    }
}
