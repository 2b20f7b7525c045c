//! `clawgate outbox`: list, show, retry and cancel send intents.

use clap::Subcommand;
use clawgate_types::DurableSendIntent;

use crate::views;

use super::{
    Backend, CliResult, Render, Table, emit, fmt_time, more_note, now, opt_time, pretty, print,
    segment, wire,
};

#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Send intents, oldest first, with their last failure.
    List {
        /// Only these statuses (repeat or comma-separate): pending, sending, committing,
        /// unknown_after_send, sent, failed, cancelled.
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        #[arg(long)]
        channel: Option<String>,
        /// At most this many (default 50, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// One whole send intent (JSON).
    Show { id: String },
    /// Send a failed or unknown_after_send intent again: it becomes pending, due now, with a
    /// fresh attempt budget and time-to-live.
    ///
    /// Retrying an unknown_after_send intent is your explicit choice that it did not arrive:
    /// its units without a receipt are sent again, which DUPLICATES them on a platform without
    /// reconciliation (idempotency keys) if they had landed. Check the conversation first.
    Retry { id: String },
    /// Cancel a pending, failed or unknown_after_send intent (final; it is never sent).
    Cancel { id: String },
}

pub(super) async fn outbox(backend: &Backend, command: OutboxCommand, json: bool) -> CliResult<()> {
    match command {
        OutboxCommand::List {
            status,
            channel,
            limit,
        } => {
            let params = views::OutboxListParams {
                status: (!status.is_empty()).then(|| status.join(",")),
                channel,
                limit,
            };
            let view = match backend {
                Backend::Running { api, .. } => api.get("/v1/outbox", &params).await?,
                Backend::Stopped(local) => views::outbox_list(&*local.store, &params).await?,
            };
            emit(&view, json)
        }
        OutboxCommand::Show { id } => {
            let intent: DurableSendIntent = match backend {
                Backend::Running { api, .. } => {
                    api.get(&format!("/v1/outbox/{}", segment(&id)), &())
                        .await?
                }
                Backend::Stopped(local) => views::outbox_show(&*local.store, &id).await?,
            };
            // The whole intent is the answer in both forms.
            print(&format!("{}\n", pretty(&intent)))
        }
        OutboxCommand::Retry { id } => outbox_change(backend, &id, true, json).await,
        OutboxCommand::Cancel { id } => outbox_change(backend, &id, false, json).await,
    }
}

async fn outbox_change(backend: &Backend, id: &str, retry: bool, json: bool) -> CliResult<()> {
    let verb = if retry { "retry" } else { "cancel" };
    let done: views::OutboxAction = match backend {
        Backend::Running { api, .. } => {
            let path = format!("/v1/outbox/{}/{verb}", segment(id));
            api.post(&path, &()).await?
        }
        Backend::Stopped(local) => {
            let _lock = local.lock_for_change()?;
            if retry {
                views::outbox_retry(&*local.store, id, now()).await?
            } else {
                views::outbox_cancel(&*local.store, id, now()).await?
            }
        }
    };
    if let Some(warning) = &done.warning {
        eprintln!("warning: {warning}");
    }
    if json {
        return emit(&done, true);
    }
    let mut text = format!(
        "send intent {}: {} -> {}\n",
        done.intent.id, done.previous_status, done.intent.status
    );
    if retry {
        text.push_str(match backend {
            Backend::Running { .. } => "the running gateway sends it within a few seconds\n",
            Backend::Stopped(_) => "it is sent when the gateway starts (`clawgate up`)\n",
        });
    }
    print(&text)
}

impl Render for views::OutboxList {
    fn table(&self) -> String {
        if self.intents.is_empty() {
            return "no send intents match\n".to_owned();
        }
        let mut t = Table::new(&[
            "ID", "STATUS", "ATTEMPT", "CHANNEL", "TARGET", "UPDATED", "NEXT", "FAILURE", "TEXT",
        ]);
        for i in &self.intents {
            let failure = match (i.failure_kind, i.failure_reason) {
                (None, _) => "-".to_owned(),
                (Some(kind), None) => wire(&kind),
                (Some(kind), Some(reason)) => format!("{}/{}", wire(&kind), wire(&reason)),
            };
            let status = if i.awaits_final {
                format!("{} (streaming, no final yet)", i.status)
            } else {
                i.status.to_string()
            };
            t.row([
                i.id.to_string(),
                status,
                match i.reconciliations {
                    0 => i.attempt.to_string(),
                    asked => format!("{} (asked {asked}x)", i.attempt),
                },
                i.channel.clone(),
                i.target.clone(),
                fmt_time(i.updated_at),
                opt_time(i.next_attempt_at),
                failure,
                i.preview.clone(),
            ]);
        }
        t.render() + more_note(self.more)
    }
}

impl Render for views::OutboxAction {
    fn table(&self) -> String {
        format!(
            "send intent {}: {} -> {}\n",
            self.intent.id, self.previous_status, self.intent.status
        )
    }
}
