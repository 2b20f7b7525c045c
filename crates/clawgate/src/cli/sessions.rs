//! `clawgate sessions`: the session tools as an operator, and following a session's signal log.

use clap::Subcommand;
use clawgate_types::SessionStateEvent;

use crate::views;

use super::{
    Backend, CliResult, FOLLOW_INTERVAL, Render, Table, compact, emit, fmt_time, opt, opt_time,
    print, segment, terminal_safe, wire,
};

#[derive(Debug, Subcommand)]
pub enum SessionsCommand {
    /// Every session of the registry with its state version.
    List {
        #[arg(long)]
        limit: Option<u32>,
    },
    /// A session's state version; with --changes-since N the events after version N.
    Status {
        key: String,
        #[arg(long)]
        changes_since: Option<u64>,
    },
    /// The newest retained state changes of a session.
    History {
        key: String,
        #[arg(long)]
        limit: Option<u32>,
    },
    /// Follow a session's signal log: print each new event until Ctrl-C.
    Watch {
        key: String,
        /// Start after this version (default: the current one, so only new events show).
        #[arg(long)]
        since: Option<u64>,
    },
    /// Send a message into a session: it arrives in the session's conversation, authored by
    /// `session:<from>` (needs a running gateway).
    Send {
        key: String,
        message: String,
        /// Watch the receiving session afterwards (needs an agent-qualified --from).
        #[arg(long)]
        watch: bool,
        /// The sending session (default: operator).
        #[arg(long)]
        from: Option<String>,
    },
    /// Cancel the session's running turn (ACP session/cancel): its reply says it was stopped,
    /// the session and its agent process stay (needs a running gateway).
    Cancel { key: String },
    /// Close the session's agent session: the next message begins a fresh one (needs a
    /// running gateway).
    Close { key: String },
}

pub(super) async fn sessions(
    backend: &Backend,
    command: SessionsCommand,
    json: bool,
) -> CliResult<()> {
    match command {
        SessionsCommand::List { limit } => {
            let params = views::SessionsListParams { limit };
            let view = match backend {
                Backend::Running { api, .. } => api.get("/v1/sessions", &params).await?,
                Backend::Stopped(local) => views::sessions_list(&local.tools, &params).await?,
            };
            emit(&view, json)
        }
        SessionsCommand::Status { key, changes_since } => {
            let view = session_status(backend, &key, changes_since).await?;
            emit(&view, json)
        }
        SessionsCommand::History { key, limit } => {
            let params = views::SessionsHistoryParams { limit };
            let view = match backend {
                Backend::Running { api, .. } => {
                    let path = format!("/v1/sessions/{}/history", segment(&key));
                    api.get(&path, &params).await?
                }
                Backend::Stopped(local) => {
                    let key = views::parse_session_key(&key)?;
                    views::sessions_history(&local.tools, key, &params).await?
                }
            };
            emit(&view, json)
        }
        SessionsCommand::Watch { key, since } => watch(backend, &key, since, json).await,
        SessionsCommand::Send {
            key,
            message,
            watch,
            from,
        } => {
            let api = backend.running("sessions send")?;
            let body = views::SessionsSendBody {
                message,
                watch: watch.then_some(true),
                from: from.as_deref().map(views::parse_session_key).transpose()?,
            };
            let path = format!("/v1/sessions/{}/send", segment(&key));
            let view: views::SessionsSendResult = api.post(&path, &body).await?;
            emit(&view, json)
        }
        SessionsCommand::Cancel { key } => session_action(backend, &key, "cancel", json).await,
        SessionsCommand::Close { key } => session_action(backend, &key, "close", json).await,
    }
}

/// `sessions cancel` / `sessions close`: through the running gateway, which holds the turns.
async fn session_action(
    backend: &Backend,
    key: &str,
    action: &'static str,
    json: bool,
) -> CliResult<()> {
    let api = backend.running(if action == "cancel" {
        "sessions cancel"
    } else {
        "sessions close"
    })?;
    let path = format!("/v1/sessions/{}/{action}", segment(key));
    let view: views::SessionAction = api.post(&path, &()).await?;
    emit(&view, json)
}

impl Render for views::SessionAction {
    fn table(&self) -> String {
        match (self.action.as_str(), self.turn_was_running) {
            ("cancel", true) => format!("{}: the running turn was cancelled\n", self.session),
            ("cancel", false) => format!("{}: no turn was running\n", self.session),
            (_, true) => format!(
                "{}: the running turn was cancelled and the agent session closed; the next \
                 message begins a fresh one\n",
                self.session
            ),
            _ => format!(
                "{}: the agent session was closed; the next message begins a fresh one\n",
                self.session
            ),
        }
    }
}

async fn session_status(
    backend: &Backend,
    key: &str,
    changes_since: Option<u64>,
) -> CliResult<views::SessionStatusResult> {
    let params = views::SessionStatusParams { changes_since };
    Ok(match backend {
        Backend::Running { api, .. } => {
            api.get(&format!("/v1/sessions/{}", segment(key)), &params)
                .await?
        }
        Backend::Stopped(local) => {
            let key = views::parse_session_key(key)?;
            views::session_status(&local.tools, key, &params).await?
        }
    })
}

/// Polls `session_status` with `changesSince` and prints each new event until Ctrl-C.
async fn watch(backend: &Backend, key: &str, since: Option<u64>, json: bool) -> CliResult<()> {
    let mut since = match since {
        Some(since) => since,
        None => session_status(backend, key, None).await?.state_version.0,
    };
    eprintln!("watching {key} after version {since} (Ctrl-C ends)");
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    loop {
        let status = session_status(backend, key, Some(since)).await?;
        let mut more = false;
        if let Some(changes) = status.state_changes {
            if changes.history_gap {
                eprintln!("note: events after version {since} were removed by retention");
            }
            for event in &changes.events {
                print(&event_line(event, json))?;
                since = since.max(event.sequence);
            }
            more = changes.truncated;
        }
        if !more {
            since = since.max(status.state_version.0);
            tokio::select! {
                _ = &mut stop => return Ok(()),
                _ = tokio::time::sleep(FOLLOW_INTERVAL) => {}
            }
        }
    }
}

fn event_line(event: &SessionStateEvent, json: bool) -> String {
    if json {
        return format!("{}\n", compact(event));
    }
    let actor = match &event.actor_id {
        Some(id) => format!("{} {id}", wire(&event.actor_type)),
        None => wire(&event.actor_type),
    };
    format!(
        "#{} {} {} [{}] {}\n",
        event.sequence,
        event.created_at.map_or_else(|| "-".to_owned(), fmt_time),
        wire(&event.kind),
        terminal_safe(&actor),
        terminal_safe(&event.summary)
    )
}

impl Render for views::SessionsListResult {
    fn table(&self) -> String {
        if self.sessions.is_empty() {
            return "no sessions\n".to_owned();
        }
        let mut t = Table::new(&["KEY", "AGENT", "VERSION", "LABEL", "UPDATED"]);
        for s in &self.sessions {
            t.row([
                s.key.to_string(),
                s.agent_id.clone(),
                s.state_version.map_or(0, |v| v.0).to_string(),
                opt(s.label.as_deref()),
                fmt_time(s.updated_at),
            ]);
        }
        t.render()
    }
}

impl Render for views::SessionStatusResult {
    fn table(&self) -> String {
        let mut t = Table::plain();
        t.row(["session", self.session_key.as_str()]);
        t.row(["agent", &self.agent_id]);
        t.row(["state version".to_owned(), self.state_version.0.to_string()]);
        let mut out = t.render();
        if let Some(changes) = &self.state_changes {
            out.push_str(&events_table(&changes.events));
            if changes.truncated {
                out.push_str("… more events follow: ask again from the last one\n");
            }
            if changes.history_gap {
                out.push_str("note: older events were removed by retention\n");
            }
        }
        out
    }
}

impl Render for views::SessionsHistoryResult {
    fn table(&self) -> String {
        let mut out = format!(
            "session {} at state version {}\n",
            self.session_key, self.state_version.0
        );
        out.push_str(&events_table(&self.events));
        if self.truncated {
            out.push_str("… older events exist: raise --limit\n");
        }
        if self.history_gap {
            out.push_str("note: older events were removed by retention\n");
        }
        out
    }
}

impl Render for views::SessionsSendResult {
    fn table(&self) -> String {
        let watched = match self.watched {
            Some(true) => "; watching it",
            Some(false) => "; not watching it (a watcher needs an agent-qualified --from)",
            None => "",
        };
        format!("{} to {}{watched}\n", self.status, self.session_key)
    }
}

fn events_table(events: &[SessionStateEvent]) -> String {
    if events.is_empty() {
        return "no events\n".to_owned();
    }
    let mut t = Table::new(&["SEQ", "AT", "KIND", "ACTOR", "SUMMARY"]);
    for e in events {
        let actor = match &e.actor_id {
            Some(id) => format!("{} {id}", wire(&e.actor_type)),
            None => wire(&e.actor_type),
        };
        t.row([
            e.sequence.to_string(),
            opt_time(e.created_at),
            wire(&e.kind),
            actor,
            e.summary.clone(),
        ]);
    }
    t.render()
}
