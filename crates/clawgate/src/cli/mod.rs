//! The operator CLI: `status`, `outbox`, `inbox`, `sessions`, `leases`, `migrate` (`qa` is the
//! QA channel's own, [`crate::qa`]'s).
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

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use clawgate_store::StoreError;
use clawgate_types::clock::{Clock as _, SystemClock};

use crate::config::Config;
use crate::state::StateError;
use crate::views::ViewError;

mod backend;
mod inbox;
mod leases;
mod migrate;
mod outbox;
mod output;
mod sessions;
mod status;

pub(crate) use crate::store::applied_version;
pub(crate) use backend::{Backend, lock_for_change, segment};
pub use inbox::InboxCommand;
pub use leases::LeasesCommand;
pub use outbox::OutboxCommand;
pub(crate) use output::{
    Render, compact, emit, more_note, opt, opt_time, pretty, print, terminal_safe, wire,
};
pub use output::{Table, fmt_time};
pub use sessions::SessionsCommand;

/// How often following commands poll.
pub(crate) const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

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
    #[error(transparent)]
    OpenStore(Box<crate::store::OpenError>),
    #[error("cannot print the answer: {0}")]
    Output(#[from] std::io::Error),
}

impl From<StoreError> for CliError {
    fn from(error: StoreError) -> Self {
        CliError::Store(Box::new(error))
    }
}

impl From<crate::store::OpenError> for CliError {
    fn from(error: crate::store::OpenError) -> Self {
        match error {
            crate::store::OpenError::Store(error) => CliError::Store(Box::new(error)),
            other => CliError::OpenStore(Box::new(other)),
        }
    }
}

pub(crate) type CliResult<T> = Result<T, CliError>;

/// Runs one operator command against `config.state_dir`.
pub async fn run(config: &Config, command: Command, json: bool) -> CliResult<()> {
    if let Command::Migrate { create } = command {
        return migrate::migrate(config, create, json).await;
    }
    let backend = Backend::connect(config).await?;
    match command {
        // Answered above: it needs no backend (and may create the directory).
        Command::Migrate { .. } => Ok(()),
        Command::Status => status::status(&backend, json).await,
        Command::Outbox { command } => outbox::outbox(&backend, command, json).await,
        Command::Inbox { command } => inbox::inbox(&backend, command, json).await,
        Command::Leases { command } => leases::leases(&backend, config, command, json).await,
        Command::Sessions { command } => sessions::sessions(&backend, command, json).await,
    }
}

fn now() -> i64 {
    SystemClock.now_ms()
}
