//! `clawgate leases`: list the agent process leases, reap orphaned ones.

use std::time::Duration;

use clap::Subcommand;
use clawgate_acpx::{ControllerConfig, LifecycleController, system_table};
use clawgate_types::LeaseState;

use crate::config::Config;
use crate::views::{self, ViewError};

use super::{
    Backend, CliError, CliResult, Render, Table, emit, fmt_time, more_note, now, opt, opt_time,
    terminal_safe, wire,
};

#[derive(Debug, Subcommand)]
pub enum LeasesCommand {
    /// Agent process leases, oldest first.
    List {
        /// Only these states (repeat or comma-separate): open, closing, closed, lost.
        #[arg(long, value_delimiter = ',')]
        state: Vec<String>,
        #[arg(long)]
        limit: Option<u32>,
    },
    /// End the agent processes of unfinished leases no live session owns. Only processes
    /// verified as this instance's are signalled; anything else is refused and left alone.
    Reap,
}

pub(super) async fn leases(
    backend: &Backend,
    config: &Config,
    command: LeasesCommand,
    json: bool,
) -> CliResult<()> {
    match command {
        LeasesCommand::List { state, limit } => {
            let params = views::LeasesListParams {
                state: (!state.is_empty()).then(|| state.join(",")),
                limit,
            };
            let view = match backend {
                Backend::Running { api, .. } => api.get("/v1/leases", &params).await?,
                Backend::Stopped(local) => views::leases_list(&*local.store, &params).await?,
            };
            emit(&view, json)
        }
        LeasesCommand::Reap => {
            let view = match backend {
                Backend::Running { api, .. } => {
                    eprintln!("asking the running gateway to reap orphaned agent processes…");
                    api.post("/v1/leases/reap", &()).await?
                }
                Backend::Stopped(local) => {
                    let _lock = local.lock_for_change()?;
                    let exe = std::env::current_exe().map_err(CliError::OwnPath)?;
                    let mut controller = ControllerConfig::new(exe);
                    controller.wrapper_args = vec![crate::gateway::WRAPPER_SUBCOMMAND.to_owned()];
                    controller.retention =
                        Duration::from_secs(config.retention.lease_days * 24 * 3600);
                    let controller =
                        LifecycleController::new(local.store.clone(), system_table(), controller)
                            .await
                            .map_err(ViewError::from)?;
                    let unfinished = local
                        .store
                        .list_leases(
                            Some(controller.instance_id()),
                            &[LeaseState::Open, LeaseState::Closing],
                        )
                        .await?;
                    eprintln!(
                        "reaping {} unfinished lease(s) of this instance…",
                        unfinished.len()
                    );
                    views::leases_reap(&controller, now()).await?
                }
            };
            emit(&view, json)
        }
    }
}

impl Render for views::LeaseList {
    fn table(&self) -> String {
        if self.leases.is_empty() {
            return "no leases match\n".to_owned();
        }
        let mut t = Table::new(&[
            "LEASE",
            "STATE",
            "SESSION",
            "PID",
            "PGID",
            "STARTED",
            "ENDED",
            "SURVIVORS",
        ]);
        for l in &self.leases {
            t.row([
                l.lease_id.to_string(),
                l.state.as_str().to_owned(),
                l.session_key.to_string(),
                opt(l.root_pid),
                opt(l.process_group_id),
                fmt_time(l.started_at),
                opt_time(l.ended_at),
                survivors(&l.survivors),
            ]);
        }
        let mut out = t.render() + more_note(self.more);
        // Why an agent failed, under the table: the lines are long.
        for l in self.leases.iter().filter(|l| !l.stderr_tail.is_empty()) {
            out.push_str(&format!("\nagent stderr of lease {}:\n", l.lease_id));
            for line in &l.stderr_tail {
                out.push_str(&format!("  {}\n", terminal_safe(line)));
            }
        }
        out
    }
}

/// The pids that outlived KILL (`-` for none).
fn survivors(list: &[clawgate_types::LeaseSurvivor]) -> String {
    if list.is_empty() {
        return "-".to_owned();
    }
    list.iter()
        .map(|s| s.pid.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl Render for views::ReapSummary {
    fn table(&self) -> String {
        let mut out = if self.outcomes.is_empty() {
            "no unfinished leases to reap\n".to_owned()
        } else {
            let mut t = Table::new(&["LEASE", "RESULT", "DETAIL"]);
            for o in &self.outcomes {
                t.row([o.lease_id.to_string(), wire(&o.result), o.detail.clone()]);
            }
            t.render()
        };
        out.push_str(&format!(
            "{} finished lease(s) removed by retention\n",
            self.pruned
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use clawgate_acpx::{CloseOutcome, Termination};
    use clawgate_types::{AcpxProcessLease, GatewayInstanceId, LeaseId, LeaseSurvivor, SessionKey};

    use super::*;

    /// A lease whose processes outlived KILL shows as `closing` with their pids, in the table,
    /// the JSON of `/v1/leases`, and the reap result.
    #[test]
    fn survivors_are_shown_to_the_operator() {
        let survivor = LeaseSurvivor {
            pid: 4243,
            start_time: 77,
        };
        let lease = AcpxProcessLease {
            lease_id: LeaseId::parse("lease-held").expect("id"),
            gateway_instance_id: GatewayInstanceId::parse("gw-a").expect("instance"),
            session_key: SessionKey::parse("agent:main:qa:room-7").expect("key"),
            wrapper_root: "/opt/clawgate".into(),
            wrapper_path: "/opt/clawgate/clawgate".into(),
            root_pid: Some(4240),
            root_start_time: Some(70),
            boot_id: Some("boot".into()),
            process_group_id: Some(4241),
            command_hash: "sha256:0".into(),
            started_at: 1,
            state: LeaseState::Closing,
            ended_at: None,
            survivors: vec![survivor],
            stderr_tail: vec!["error: no API key".into()],
        };
        let list = views::LeaseList {
            leases: vec![views::LeaseSummary::of(&lease)],
            more: false,
        };
        let table = list.table();
        let row = table.lines().nth(1).expect("one row");
        assert!(
            row.contains("closing") && row.trim_end().ends_with("4243"),
            "{table}"
        );
        let json = serde_json::to_value(&list).expect("json");
        assert_eq!(
            json["leases"][0]["survivors"],
            serde_json::json!([{"pid": 4243, "startTime": 77}])
        );

        let reap = views::ReapSummary {
            outcomes: vec![views::ReapOutcome::of(
                lease.lease_id.clone(),
                &CloseOutcome::Survived(Termination {
                    termed: vec![4243, 4241, 4240],
                    killed: vec![4243, 4240],
                    survivors: vec![survivor],
                    kill_refused: None,
                }),
            )],
            pruned: 0,
        };
        assert_eq!(reap.outcomes[0].result, views::ReapResult::Survived);
        let text = reap.table();
        assert!(
            text.contains("survived") && text.contains("survived KILL [4243]"),
            "{text}"
        );
    }
}
