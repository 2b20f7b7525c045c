//! `clawgate inbox`: the inbound event records.

use clap::Subcommand;

use crate::views::{self, ViewError};

use super::{Backend, CliResult, Render, Table, emit, fmt_time, more_note, opt, wire};

#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Inbound event records, newest first.
    List {
        #[arg(long, value_parser = ["received", "completed", "dead_lettered"])]
        status: Option<String>,
        /// At most this many (default 50, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
    },
}

pub(super) async fn inbox(backend: &Backend, command: InboxCommand, json: bool) -> CliResult<()> {
    match command {
        InboxCommand::List { status, limit } => {
            let status = status
                .map(|s| serde_json::from_value(serde_json::Value::String(s)))
                .transpose()
                .map_err(|e| ViewError::BadRequest(format!("--status: {e}")))?;
            let params = views::InboxListParams { status, limit };
            let view = match backend {
                Backend::Running { api, .. } => api.get("/v1/inbox", &params).await?,
                Backend::Stopped(local) => views::inbox_list(&*local.store, &params).await?,
            };
            emit(&view, json)
        }
    }
}

impl Render for views::InboxList {
    fn table(&self) -> String {
        if self.records.is_empty() {
            return "no inbound records match\n".to_owned();
        }
        let mut t = Table::new(&[
            "CHANNEL",
            "EVENT",
            "STATUS",
            "ATTEMPTS",
            "CONVERSATION",
            "RECEIVED",
            "LAST ERROR",
            "TEXT",
        ]);
        for r in &self.records {
            t.row([
                r.channel.clone(),
                r.event_id.clone(),
                wire(&r.status),
                r.attempts.to_string(),
                opt(r.conversation.as_deref()),
                fmt_time(r.received_at),
                r.last_error
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), views::preview),
                r.preview.clone(),
            ]);
        }
        t.render() + more_note(self.more)
    }
}
