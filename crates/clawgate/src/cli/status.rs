//! `clawgate status`: the state directory at a glance.

use clawgate_types::IntentStatus;

use crate::views;

use super::{Backend, CliResult, Render, Table, emit, fmt_time};

/// `clawgate status`.
pub(super) async fn status(backend: &Backend, json: bool) -> CliResult<()> {
    let view = match backend {
        Backend::Running { api, .. } => api.get("/v1/status", &()).await?,
        Backend::Stopped(local) => views::status(&*local.store, local.state.path(), None).await?,
    };
    emit(&view, json)
}

impl Render for views::StatusView {
    fn table(&self) -> String {
        let mut t = Table::plain();
        t.row(["state directory", &self.state_dir]);
        let gateway = match &self.gateway {
            Some(g) => format!(
                "running: pid {}, {} since {}, turns {} in flight / {} done / {} failed",
                g.pid,
                g.url,
                fmt_time(g.started_at),
                g.turns_in_flight,
                g.turns_completed,
                g.turns_failed
            ),
            None if self.running => "running".to_owned(),
            None => "not running".to_owned(),
        };
        t.row(["gateway", &gateway]);
        if let Some(g) = &self.gateway {
            t.row([
                "agents".to_owned(),
                format!(
                    "{} sessions live ({} in use), {} turns queued, {} idle closes, {} evicted \
                     for a waiting turn ({} of them handed their process over)",
                    g.agent_sessions_live,
                    g.agent_sessions_in_use,
                    g.turns_queued,
                    g.idle_closes,
                    g.evictions,
                    g.handovers
                ),
            ]);
            t.row([
                "agent turns".to_owned(),
                format!(
                    "{} refused (agent not logged in), {} past their deadline, {} cancelled",
                    g.agent_auth_failures, g.turn_deadlines, g.turns_cancelled
                ),
            ]);
        }
        t.row([
            "schema".to_owned(),
            format!(
                "version {} (this build writes {})",
                self.schema_version, self.supported_schema_version
            ),
        ]);
        let intents: Vec<String> = self
            .intents
            .iter()
            .map(|(status, n)| match status {
                IntentStatus::Pending if self.replies_streaming > 0 => format!(
                    "{status} {n} ({} streaming, no final yet)",
                    self.replies_streaming
                ),
                _ => format!("{status} {n}"),
            })
            .collect();
        t.row(["intents".to_owned(), intents.join(", ")]);
        t.row([
            "inbound".to_owned(),
            format!(
                "{} unfinished, {} dead-lettered",
                self.inbound_unfinished, self.inbound_dead_lettered
            ),
        ]);
        t.row(["open leases".to_owned(), self.open_leases.to_string()]);
        t.row(["sessions".to_owned(), self.sessions.to_string()]);
        t.render()
    }
}
