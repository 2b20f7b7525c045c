//! The operator CLI: `status`, `outbox`, `inbox`, `sessions`, `leases`, `migrate`, `qa`.
//!
//! Every command works in two modes and says which on stderr:
//! * a gateway runs on the state directory (it holds the lock and published `gateway.json`):
//!   the command goes through its control API, so it sees what the gateway sees and changes
//!   happen where the gateway's loops pick them up;
//! * no gateway runs: the command opens the state database itself and calls the same
//!   [`crate::views`] functions. Changes take the directory's lock for their duration, so a
//!   gateway cannot start half-way through one.
//!
//! `--json` prints exactly the wire JSON (the control API's shapes, `docs/schema/`) to stdout;
//! otherwise a table. Following commands (`sessions watch`, `qa tail`) print one line (one JSON
//! object with `--json`) per change until Ctrl-C.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Subcommand;
use clawgate_acpx::{ControllerConfig, LifecycleController, system_table};
use clawgate_awareness::SessionTools;
use clawgate_store::sqlite::{MigrationStatus, STATE_DB_FILE};
use clawgate_store::{LeaseStore as _, SqliteOptions, SqliteStore, StoreError, Synchronous};
use clawgate_types::clock::{Clock as _, SystemClock};
use clawgate_types::{DurableSendIntent, IntentStatus, LeaseState, SessionStateEvent};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::{Config, SyncMode};
use crate::state::{StateDir, StateError, StateLock};
use crate::views::{self, ViewError};

/// How often following commands poll.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

/// The operator commands (`clawgate up` lives in `main.rs`).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The state directory at a glance: intents by status, inbound, leases, sessions.
    Status,
    /// Send intents (the durable outbox): list, show, retry, cancel.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Inbound event records: unfinished ones, attempts, dead letters.
    Inbox {
        #[command(subcommand)]
        command: InboxCommand,
    },
    /// Sessions through the session tools, as an operator who sees all of them.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Agent process leases: list, reap orphans.
    Leases {
        #[command(subcommand)]
        command: LeasesCommand,
    },
    /// Create or upgrade the state database (the gateway also does this when it starts).
    Migrate {
        /// Create the state directory if it does not exist.
        #[arg(long)]
        create: bool,
    },
    /// Talk to the QA channel from a terminal (needs a running gateway).
    Qa {
        #[command(subcommand)]
        command: QaCommand,
    },
}

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
}

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

#[derive(Debug, Subcommand)]
pub enum QaCommand {
    /// Write into a QA conversation as a person; the agent answers as usual.
    Send {
        #[arg(long)]
        conversation: String,
        text: String,
        /// Author id on the platform (default: operator).
        #[arg(long)]
        author: Option<String>,
        /// Channel name (default: the first configured channel).
        #[arg(long)]
        channel: Option<String>,
    },
    /// Print a conversation's messages, then new and edited ones as they change (Ctrl-C ends).
    Tail {
        #[arg(long)]
        conversation: String,
        #[arg(long)]
        channel: Option<String>,
    },
}

/// What an operator command can fail with; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(
        "state directory {0} does not exist: start a gateway there (`clawgate up`), create it \
         with `clawgate migrate --create`, or pass --state-dir"
    )]
    NoStateDir(PathBuf),
    #[error("no state database in {0} yet: `clawgate up` or `clawgate migrate` creates it")]
    NoDatabase(PathBuf),
    #[error(
        "state database {path} is at schema version {found}, this build needs {needed}: run \
         `clawgate migrate` first"
    )]
    NeedsMigration {
        path: PathBuf,
        found: i64,
        needed: i64,
    },
    #[error(
        "the state directory {path} is locked (pid {pid}) but no gateway.json is published: a \
         gateway is starting or stopping, or another clawgate command holds it; retry in a moment"
    )]
    LockedWithoutGateway { path: PathBuf, pid: String },
    #[error("a gateway started on {0} meanwhile: run the command again (it then goes through it)")]
    GatewayStarted(PathBuf),
    #[error("{0} needs a running gateway: start one with `clawgate up`")]
    NeedsGateway(&'static str),
    #[error(
        "cannot reach the running gateway at {url}: {source}; is it still up? (`clawgate status`)"
    )]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The gateway's own answer (`{"error": ...}`), passed on as it is.
    #[error("{message} (HTTP {status})")]
    Api { status: u16, message: String },
    #[error("cannot find this program's own path (the lease controller needs it): {0}")]
    OwnPath(std::io::Error),
    #[error(transparent)]
    View(#[from] ViewError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("state database: {0}")]
    Store(Box<StoreError>),
    #[error("cannot print the answer: {0}")]
    Output(#[from] std::io::Error),
}

impl From<StoreError> for CliError {
    fn from(error: StoreError) -> Self {
        CliError::Store(Box::new(error))
    }
}

type CliResult<T> = Result<T, CliError>;

/// Runs one operator command against `config.state_dir`.
pub async fn run(config: &Config, command: Command, json: bool) -> CliResult<()> {
    if let Command::Migrate { create } = command {
        return migrate(config, create, json);
    }
    let backend = Backend::locate(config)?;
    match &backend {
        Backend::Running { pid, url, .. } => eprintln!("(via running gateway pid {pid} at {url})"),
        Backend::Stopped(local) => eprintln!(
            "(state directory {}, gateway not running)",
            local.state.path().display()
        ),
    }
    match command {
        // Answered above: it needs no backend (and may create the directory).
        Command::Migrate { .. } => Ok(()),
        Command::Status => {
            let view = match &backend {
                Backend::Running { api, .. } => api.get("/v1/status", &()).await?,
                Backend::Stopped(local) => {
                    views::status(&local.store, local.state.path(), None).await?
                }
            };
            emit(&view, json)
        }
        Command::Outbox { command } => outbox(&backend, command, json).await,
        Command::Inbox { command } => match command {
            InboxCommand::List { status, limit } => {
                let status = status
                    .map(|s| serde_json::from_value(serde_json::Value::String(s)))
                    .transpose()
                    .map_err(|e| ViewError::BadRequest(format!("--status: {e}")))?;
                let params = views::InboxListParams { status, limit };
                let view = match &backend {
                    Backend::Running { api, .. } => api.get("/v1/inbox", &params).await?,
                    Backend::Stopped(local) => views::inbox_list(&*local.store, &params).await?,
                };
                emit(&view, json)
            }
        },
        Command::Leases { command } => leases(&backend, config, command, json).await,
        Command::Sessions { command } => sessions(&backend, command, json).await,
        Command::Qa { command } => qa(&backend, command, json).await,
    }
}

// ---------------------------------------------------------------------------------------------
// Modes

/// Where the command's answers come from.
enum Backend {
    Running {
        api: ControlClient,
        pid: u32,
        url: String,
    },
    Stopped(Box<Local>),
}

/// A stopped gateway's state, opened by the CLI.
struct Local {
    state: StateDir,
    store: Arc<SqliteStore>,
    tools: SessionTools<SqliteStore>,
}

impl Local {
    fn lock_for_change(&self) -> CliResult<StateLock> {
        lock_for_change(&self.state)
    }
}

/// Holds the directory's gateway lock while a change runs on a stopped gateway's state: a
/// gateway starting meanwhile would otherwise recover intents (or reap leases, or migrate)
/// while the operator changes them.
fn lock_for_change(state: &StateDir) -> CliResult<StateLock> {
    state.lock_exclusive().map_err(|e| match e {
        StateError::Busy { path, .. } => CliError::GatewayStarted(path),
        other => CliError::State(other),
    })
}

impl Backend {
    fn locate(config: &Config) -> CliResult<Backend> {
        let state = StateDir::existing(&config.state_dir)
            .ok_or_else(|| CliError::NoStateDir(config.state_dir.clone()))?;
        if state.is_locked() {
            let Some(info) = state.read_runtime() else {
                let pid =
                    std::fs::read_to_string(state.path().join("gateway.lock")).unwrap_or_default();
                return Err(CliError::LockedWithoutGateway {
                    path: state.path().to_path_buf(),
                    pid: pid.trim().to_owned(),
                });
            };
            return Ok(Backend::Running {
                api: ControlClient {
                    http: reqwest::Client::new(),
                    base: info.url.clone(),
                    token: info.control_token,
                },
                pid: info.pid,
                url: info.url,
            });
        }
        let db = state.path().join(STATE_DB_FILE);
        if !db.exists() {
            return Err(CliError::NoDatabase(state.path().to_path_buf()));
        }
        // Opening the store would migrate silently; an operator command should not.
        let statuses = clawgate_store::sqlite::migration_status(&db, &SqliteOptions::default())?;
        if statuses.iter().any(|m| m.applied_at.is_none()) {
            return Err(CliError::NeedsMigration {
                path: db,
                found: applied_version(&statuses),
                needed: clawgate_store::sqlite::SCHEMA_VERSION,
            });
        }
        let store = Arc::new(SqliteStore::open_state_dir(
            state.path(),
            store_options(config),
        )?);
        let tools = views::offline_tools(store.clone());
        Ok(Backend::Stopped(Box::new(Local {
            state,
            store,
            tools,
        })))
    }

    /// The control API, for commands only a running gateway can serve.
    fn running(&self, what: &'static str) -> CliResult<&ControlClient> {
        match self {
            Backend::Running { api, .. } => Ok(api),
            Backend::Stopped(_) => Err(CliError::NeedsGateway(what)),
        }
    }
}

fn store_options(config: &Config) -> SqliteOptions {
    SqliteOptions {
        synchronous: match config.durability.sync {
            SyncMode::Full => Synchronous::Full,
            SyncMode::Normal => Synchronous::Normal,
        },
        ..SqliteOptions::default()
    }
}

fn applied_version(statuses: &[MigrationStatus]) -> i64 {
    statuses
        .iter()
        .filter(|m| m.applied_at.is_some())
        .map(|m| m.version)
        .max()
        .unwrap_or(0)
}

/// The running gateway's control API.
struct ControlClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl ControlClient {
    async fn get<T: DeserializeOwned>(&self, path: &str, query: &impl Serialize) -> CliResult<T> {
        let request = self.http.get(format!("{}{path}", self.base)).query(query);
        self.send(request).await
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> CliResult<T> {
        let request = self.http.post(format!("{}{path}", self.base)).json(body);
        self.send(request).await
    }

    async fn send<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> CliResult<T> {
        let unreachable = |source| CliError::Unreachable {
            url: self.base.clone(),
            source,
        };
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status();
        if status.is_success() {
            return response.json().await.map_err(unreachable);
        }
        let message = match response.json::<views::ErrorBody>().await {
            Ok(body) => body.error,
            Err(_) => "the gateway gave no reason".to_owned(),
        };
        Err(CliError::Api {
            status: status.as_u16(),
            message,
        })
    }
}

/// One path segment, percent-encoded (session keys may hold `/`, `?`, `#`, `%`…).
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Commands

fn now() -> i64 {
    SystemClock.now_ms()
}

async fn outbox(backend: &Backend, command: OutboxCommand, json: bool) -> CliResult<()> {
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

async fn leases(
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

async fn sessions(backend: &Backend, command: SessionsCommand, json: bool) -> CliResult<()> {
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
        "#{} {} {} [{actor}] {}\n",
        event.sequence,
        event.created_at.map_or_else(|| "-".to_owned(), fmt_time),
        wire(&event.kind),
        event.summary
    )
}

async fn qa(backend: &Backend, command: QaCommand, json: bool) -> CliResult<()> {
    match command {
        QaCommand::Send {
            conversation,
            text,
            author,
            channel,
        } => {
            let api = backend.running("qa send")?;
            let body = views::QaSendBody {
                conversation: conversation.clone(),
                text,
                author,
                channel,
            };
            let sent: views::QaMessage = api.post("/v1/qa/send", &body).await?;
            if json {
                return emit(&sent, true);
            }
            print(&format!(
                "sent {} to conversation {conversation}; `clawgate qa tail --conversation \
                 {conversation}` shows the answer\n",
                sent.id
            ))
        }
        QaCommand::Tail {
            conversation,
            channel,
        } => {
            let api = backend.running("qa tail")?;
            let params = views::QaMessagesParams {
                conversation,
                channel,
            };
            let stop = tokio::signal::ctrl_c();
            tokio::pin!(stop);
            let mut shown: HashMap<String, views::QaMessage> = HashMap::new();
            loop {
                let mut listed: views::QaConversation = api.get("/v1/qa/messages", &params).await?;
                listed.messages.sort_by_key(|m| m.seq);
                for message in listed.messages {
                    if shown.get(&message.id) != Some(&message) {
                        print(&qa_line(&message, json))?;
                        shown.insert(message.id.clone(), message);
                    }
                }
                tokio::select! {
                    _ = &mut stop => return Ok(()),
                    _ = tokio::time::sleep(FOLLOW_INTERVAL) => {}
                }
            }
        }
    }
}

fn qa_line(message: &views::QaMessage, json: bool) -> String {
    if json {
        return format!("{}\n", compact(message));
    }
    let author = match (&message.author_id, message.from_agent) {
        (_, true) => "agent".to_owned(),
        (Some(id), false) => id.clone(),
        (None, false) => "?".to_owned(),
    };
    let mut marks = Vec::new();
    if message.from_agent {
        marks.push(wire(&message.state));
    }
    if message.edits > 0 {
        marks.push(format!("edit {}", message.edits));
    }
    let marks = if marks.is_empty() {
        String::new()
    } else {
        format!(" ({})", marks.join(", "))
    };
    format!("[{}] {author}{marks}: {}\n", message.id, message.text)
}

/// What `migrate --json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MigrateReport {
    state_database: String,
    from_version: i64,
    to_version: i64,
    applied: Vec<String>,
}

fn migrate(config: &Config, create: bool, json: bool) -> CliResult<()> {
    let dir = &config.state_dir;
    if !dir.is_dir() {
        if !create {
            return Err(CliError::NoStateDir(dir.clone()));
        }
        StateDir::create(dir)?;
        eprintln!("created the state directory {}", dir.display());
    }
    let state = StateDir::existing(dir).ok_or_else(|| CliError::NoStateDir(dir.clone()))?;
    if state.is_locked() {
        eprintln!(
            "(state directory {}, held by a running gateway: it migrated the database when it \
             started)",
            state.path().display()
        );
    } else {
        eprintln!(
            "(state directory {}, gateway not running)",
            state.path().display()
        );
    }
    let db = state.path().join(STATE_DB_FILE);
    let options = store_options(config);
    let before = clawgate_store::sqlite::migration_status(&db, &options)?;
    let from_version = applied_version(&before);
    let pending: Vec<&MigrationStatus> = before.iter().filter(|m| m.applied_at.is_none()).collect();
    // A running gateway migrated when it started; a stopped one is locked while migrating.
    let _lock = if state.is_locked() || pending.is_empty() {
        None
    } else {
        Some(lock_for_change(&state)?)
    };
    eprintln!("state database {}", db.display());
    let after = if pending.is_empty() {
        before.clone()
    } else {
        for m in &pending {
            eprintln!("  applying migration {:04} {}…", m.version, m.name);
        }
        clawgate_store::sqlite::migrate_file(&db, &options)?
    };
    let report = MigrateReport {
        state_database: db.display().to_string(),
        from_version,
        to_version: applied_version(&after),
        applied: pending
            .iter()
            .map(|m| format!("{:04} {}", m.version, m.name))
            .collect(),
    };
    if json {
        return print(&format!("{}\n", pretty(&report)));
    }
    if report.applied.is_empty() {
        print(&format!(
            "up to date: schema version {} (this build writes {})\n",
            report.to_version,
            clawgate_store::sqlite::SCHEMA_VERSION
        ))
    } else {
        print(&format!(
            "migrated: schema version {} -> {}\n",
            report.from_version, report.to_version
        ))
    }
}

// ---------------------------------------------------------------------------------------------
// Output

/// Writes to stdout; a closed pipe (`| head`) ends quietly instead of panicking.
fn print(text: &str) -> CliResult<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => Ok(other?),
    }
}

fn pretty(value: &impl Serialize) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn compact(value: &impl Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The wire spelling of a unit enum value (`unknown_after_send`).
fn wire(value: &impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

/// A view printed as its wire JSON or as a table.
trait Render: Serialize {
    fn table(&self) -> String;
}

fn emit(view: &impl Render, json: bool) -> CliResult<()> {
    if json {
        print(&format!("{}\n", pretty(view)))
    } else {
        print(&view.table())
    }
}

fn opt_time(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_owned(), fmt_time)
}

fn opt<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn more_note(more: bool) -> &'static str {
    if more {
        "… more match: raise --limit (at most 1000) or narrow the filter\n"
    } else {
        ""
    }
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
                i.attempt.to_string(),
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

impl Render for views::LeaseList {
    fn table(&self) -> String {
        if self.leases.is_empty() {
            return "no leases match\n".to_owned();
        }
        let mut t = Table::new(&[
            "LEASE", "STATE", "SESSION", "PID", "PGID", "STARTED", "ENDED",
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
            ]);
        }
        t.render() + more_note(self.more)
    }
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

impl Render for views::QaMessage {
    fn table(&self) -> String {
        qa_line(self, false)
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

/// An aligned text table: columns padded to their widest cell, two spaces apart.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose first row is `header`.
    pub fn new(header: &[&str]) -> Table {
        let mut table = Table::default();
        table.row(header.iter().copied());
        table
    }

    /// A table without a header (key / value pairs).
    pub fn plain() -> Table {
        Table::default()
    }

    /// Adds a row; line breaks and other control characters in cells become spaces, so a row
    /// stays one line.
    pub fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let cells = cells
            .into_iter()
            .map(|c| {
                c.as_ref()
                    .chars()
                    .map(|ch| if ch.is_control() { ' ' } else { ch })
                    .collect()
            })
            .collect();
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (n, cell) in row.iter().enumerate() {
                widths[n] = widths[n].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::new();
            for (n, cell) in row.iter().enumerate() {
                if n > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                let pad = widths[n] - cell.chars().count();
                line.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of milliseconds since the epoch.
pub fn fmt_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm, proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_keeps_rows_on_one_line() {
        let mut t = Table::new(&["ID", "STATUS", "TEXT"]);
        t.row(["a", "failed", "hello\nworld"]);
        t.row(["long-id", "unknown_after_send", ""]);
        assert_eq!(
            t.render(),
            "ID       STATUS              TEXT\n\
             a        failed              hello world\n\
             long-id  unknown_after_send\n"
        );
    }

    #[test]
    fn table_counts_characters_not_bytes() {
        let mut t = Table::plain();
        t.row(["héllo", "x"]);
        t.row(["ab", "y"]);
        assert_eq!(t.render(), "héllo  x\nab     y\n");
        assert_eq!(Table::plain().render(), "");
    }

    #[test]
    fn times_are_utc_civil_dates() {
        let cases = [
            (0, "1970-01-01 00:00:00"),
            (951_782_400_000, "2000-02-29 00:00:00"),
            (1_700_000_000_999, "2023-11-14 22:13:20"),
            (-1_000, "1969-12-31 23:59:59"),
        ];
        for (ms, text) in cases {
            assert_eq!(fmt_time(ms), text, "{ms}");
        }
    }

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(segment("agent:main:qa:room-1"), "agent:main:qa:room-1");
        assert_eq!(segment("a/b?c#d%e"), "a%2Fb%3Fc%23d%25e");
        assert_eq!(segment("é"), "%C3%A9");
    }

    #[test]
    fn qa_lines_mark_agent_state_and_edits() {
        let message = views::QaMessage {
            id: "m-2".into(),
            seq: 2,
            author_id: None,
            from_agent: true,
            text: "hi".into(),
            edits: 3,
            state: views::QaMessageState::Streaming,
        };
        assert_eq!(
            qa_line(&message, false),
            "[m-2] agent (streaming, edit 3): hi\n"
        );
        let json: serde_json::Value =
            serde_json::from_str(qa_line(&message, true).trim()).expect("one JSON object");
        assert_eq!(json["state"], "streaming");
    }
}
