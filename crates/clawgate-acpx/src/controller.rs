//! The ACPX lifecycle controller: owns process leases and the cleanup policy.
//!
//! * `ensure_session`: lease written (`open`, no pid) **before** the wrapper starts; the lease
//!   id goes on the session row; the wrapper's report fills in root pid, start time, boot id
//!   and process group; then ACP `initialize` + `session/new`.
//!   A live session whose wrapper exited or whose ACP connection closed is not handed back:
//!   its lease is resolved and a fresh process starts under a new lease.
//! * `checkout`: a session for one turn under the agent's `max_live`. At the cap, the least
//!   recently used idle session goes: its process ends, or (`reuse_processes`, an agent with
//!   `session/close`) is handed over — the agent closes the old ACP session, the same lease is
//!   re-keyed to the new session (one session per process at a time), and the new session's
//!   ACP session is loaded or begun on the same connection. A session row keeps the id of the
//!   last lease that served it; a close of a session whose lease serves another one now
//!   signals nothing.
//! * `prompt`: a turn the agent's death cut short fails with [`AcpxError::AgentExited`], after
//!   the lease was resolved and the session dropped, so the caller can retry it once.
//! * `cancel_turn`: `session/cancel` only — wrapper and adapter stay.
//! * `close_session`: load the row and its lease, verify the live tree, then children first,
//!   TERM, grace, re-verify, KILL; `closed`, or `lost` when the process was already gone. A
//!   process that outlives KILL keeps the lease `closing` with it listed as a survivor;
//!   `recheck_survivors` (the maintenance loop), the startup reaper or another close closes it
//!   once the survivors are gone.
//! * `reap_startup_orphans`: this instance's open/closing leases only; descendants come from
//!   the process table; then bounded retention of closed/lost leases.
//!
//! Every refusal is logged (tracing, keyed by lease id) with its reason.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, OnceLock, mpsc as std_mpsc};
use std::time::Duration;

use clawgate_store::Store;
use clawgate_store::{SessionRow, StoreError};
use clawgate_types::clock::{Clock as _, SystemClock};
use clawgate_types::{
    AcpBackend, AcpSessionOwner, AcpxProcessLease, GatewayInstanceId, LeaseId, LeaseState,
    LeaseSurvivor, SessionKey, UnixMillis,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::Mutex;
use tracing::Instrument;

use crate::acp::{AcpClient, AcpError, TurnOutcome};
use crate::environment::AgentEnv;
use crate::evidence::{INSTANCE_FLAG, LEASE_FLAG, PARENT_PID_ENV, command_hash};
use crate::pool::{AgentLimits, InUse, PoolFigures, Pools, Ticket, Usage};
use crate::stderr::StderrTail;
use crate::table::ProcessTable;
use crate::terminate::{Termination, Timing, terminate_orphans, terminate_tree};
use crate::verify::{
    CannotTell, NotOurs, OwnedTree, Verdict, marked_processes, orphaned_members, take_marked,
    verify_owned_tree,
};

/// The wrapper's report line prefix on stderr.
pub const WRAPPER_REPORT_PREFIX: &str = "clawgate-acpx-wrapper ready ";
const GRACE_FLAG: &str = "--clawgate-grace-ms";
/// How long a wrapper whose ACP connection closed is given to finish exiting.
const EXIT_SETTLE: Duration = Duration::from_secs(1);
/// How often, and how far apart, a process found mid-exit is verified again before its lease
/// is left for later (2 s in all).
const EXIT_RECHECKS: u32 = 40;
const EXIT_RECHECK_EVERY: Duration = Duration::from_millis(50);
/// How long an agent is given to close an idle session whose process is handed over.
const HAND_OVER_CLOSE: Duration = Duration::from_secs(1);

/// Controller errors; each says what failed and for which session or lease.
#[derive(Debug, thiserror::Error)]
pub enum AcpxError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("generated lease id rejected: {0}")]
    LeaseId(#[from] clawgate_types::ParseIdError),
    #[error("session {0} has no row in the session registry: ensure it first")]
    UnknownSession(SessionKey),
    #[error("session {0} has no live ACP runtime in this gateway process: ensure it first")]
    NotRunning(SessionKey),
    #[error("wrapper {path} could not be started for lease {lease_id}: {source}")]
    Spawn {
        path: PathBuf,
        lease_id: LeaseId,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "wrapper for lease {lease_id} did not report its process group within {waited_ms} ms \
         ({detail}); check that {path} is a clawgate-acpx-wrapper binary"
    )]
    NoReport {
        lease_id: LeaseId,
        path: PathBuf,
        waited_ms: u64,
        detail: String,
    },
    #[error("cannot record the identity of wrapper pid {pid} for lease {lease_id}: {detail}")]
    Identity {
        lease_id: LeaseId,
        pid: u32,
        detail: String,
    },
    /// The agent's process tree is gone (its wrapper exited, or the ACP connection closed)
    /// while `step` ran. Its lease has been resolved (`lost` when provably gone, `closed`
    /// after a verified termination) and the session dropped from the live set: the next
    /// `ensure_session` starts a fresh process under a new lease, so the turn may be retried
    /// once. What the agent streamed before it died is not part of any reply.
    #[error(
        "the agent process of session {session} (lease {lease_id}) exited during {step}; its \
         lease is resolved and the next ensure_session starts a fresh one: retry the turn"
    )]
    AgentExited {
        session: SessionKey,
        lease_id: LeaseId,
        step: &'static str,
    },
    /// A lease of this instance is served by a live wrapper whose parent, the process that
    /// started it, is alive and is not this process: another gateway runs with this instance
    /// id (its state directory, or its database, was copied while it ran). Nothing was
    /// signalled and no lease was changed.
    #[error(
        "another gateway (pid {gateway_pid}) runs with this gateway instance id \
         {instance}: it started the live agent of lease {lease_id} (wrapper pid {wrapper_pid}) \
         and is still its parent, so this state directory is a copy of a running gateway's \
         (copied while it ran, e.g. for a backup). Nothing was signalled and no lease was \
         changed. Run only one of them: stop the gateway with pid {gateway_pid} first if this \
         copy is to replace it, or keep this copy as a backup and leave it stopped (a copy \
         carries the original's instance id and leases; back up with the gateway stopped, or \
         with SQLite's online backup)"
    )]
    AnotherGateway {
        gateway_pid: u32,
        instance: GatewayInstanceId,
        lease_id: LeaseId,
        wrapper_pid: u32,
    },
    /// An idle session's process could not be handed to another session (its agent did not
    /// close the old ACP session, or the new one could not begin): the process is closed and
    /// a new one starts for the waiting turn.
    #[error(
        "the agent process of lease {lease_id} could not be handed from session {from} to \
         session {to}: {why}"
    )]
    HandOver {
        lease_id: LeaseId,
        from: SessionKey,
        to: SessionKey,
        why: String,
    },
    /// The agent refused because it is not logged in (ACP `auth_required`, or its words for
    /// a missing key). Retrying cannot help until an operator logs it in.
    #[error(
        "agent {agent} is not logged in ({step} refused: {message}); it advertises the \
         authentication methods {methods:?}: log it in (docs/agents.md says how for each agent) \
         or pass its key with [[agents]] env_passthrough"
    )]
    AgentAuth {
        agent: String,
        step: &'static str,
        message: String,
        methods: Vec<String>,
    },
    #[error("ACP with the agent of session {session}: {source}")]
    Acp {
        session: SessionKey,
        #[source]
        source: AcpError,
    },
}

impl AcpxError {
    /// True when the agent's process died under the call: retrying on a fresh process (one
    /// more `ensure_session`) is the remedy.
    pub fn agent_exited(&self) -> bool {
        matches!(self, AcpxError::AgentExited { .. })
    }

    /// True when the agent is not logged in ([`AcpxError::AgentAuth`]).
    pub fn is_auth(&self) -> bool {
        matches!(self, AcpxError::AgentAuth { .. })
    }
}

/// How long an agent may take to accept a key from its environment.
const AUTHENTICATE_WAIT: Duration = Duration::from_secs(30);

/// When the agent advertises an `env_var` authentication method whose variables it was given,
/// `authenticate` with the first such method (an agent such as codex-acp reads the key only
/// then). Browser and terminal logins are never started. A refusal is logged; the session's
/// start then says whether the agent is logged in.
async fn authenticate_from_env(client: &AcpClient, env: &AgentEnv) {
    let Some(method) = client
        .auth_methods()
        .iter()
        .find(|m| !m.env_vars.is_empty() && m.env_vars.iter().all(|v| env.contains(v)))
    else {
        return;
    };
    match tokio::time::timeout(AUTHENTICATE_WAIT, client.authenticate(&method.id)).await {
        Ok(Ok(())) => {
            tracing::info!(method = %method.id, "authenticated with a key from the agent's environment")
        }
        Ok(Err(error)) => tracing::warn!(method = %method.id, %error, "authenticate refused"),
        Err(_) => tracing::warn!(method = %method.id, "authenticate was not answered in time"),
    }
}

/// `error` as [`AcpxError::AgentAuth`] when the agent said it is not logged in (logged at
/// WARN with the methods it offers, for the operator); otherwise unchanged.
fn auth_or(error: AcpxError, agent: &str, client: &AcpClient) -> AcpxError {
    let AcpxError::Acp { source, .. } = &error else {
        return error;
    };
    if !source.is_auth_required() {
        return error;
    }
    let (step, message) = match source {
        AcpError::Protocol { step, source } => (*step, source.message.clone()),
        AcpError::Disconnected { step } => (*step, String::new()),
    };
    let methods: Vec<String> = client
        .auth_methods()
        .iter()
        .map(ToString::to_string)
        .collect();
    tracing::warn!(agent, step, %message, auth_methods = ?methods,
        "the agent is not logged in: its turns are not retried until an operator logs it in");
    AcpxError::AgentAuth {
        agent: agent.to_owned(),
        step,
        message,
        methods,
    }
}

/// Where the wrapper lives and how long things may take.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Absolute path of the `clawgate-acpx-wrapper` binary (or of a multi-call binary that
    /// runs the wrapper when given `wrapper_args`).
    pub wrapper_path: PathBuf,
    /// Arguments placed before the wrapper's own flags (e.g. a multi-call subcommand).
    pub wrapper_args: Vec<String>,
    /// The directory the wrapper path must be under (live `/proc/PID/exe` is checked against it).
    pub wrapper_root: PathBuf,
    /// Grace the wrapper itself gives its group between TERM and KILL on parent death.
    pub wrapper_grace: Duration,
    /// TERM → KILL timing of the controller's own terminations.
    pub timing: Timing,
    /// How long closed and lost leases are kept.
    pub retention: Duration,
    /// How long to wait for the wrapper's report line.
    pub report_timeout: Duration,
}

impl ControllerConfig {
    /// Defaults for a wrapper binary at `wrapper_path` (its directory is the wrapper root).
    pub fn new(wrapper_path: PathBuf) -> ControllerConfig {
        let wrapper_root = wrapper_path
            .parent()
            .map_or_else(|| PathBuf::from("/"), PathBuf::from);
        ControllerConfig {
            wrapper_path,
            wrapper_args: Vec::new(),
            wrapper_root,
            wrapper_grace: Duration::from_secs(2),
            timing: Timing::default(),
            retention: Duration::from_secs(7 * 24 * 3600),
            report_timeout: Duration::from_secs(10),
        }
    }
}

/// What `ensure_session` needs to start (or find) a session's runtime.
#[derive(Debug, Clone)]
pub struct EnsureInput {
    pub session_key: SessionKey,
    pub agent_id: String,
    pub owner_session_key: SessionKey,
    pub spawned_by: Option<SessionKey>,
    /// The adapter command line (argv), e.g. `["gemini", "--acp"]`.
    pub adapter: Vec<String>,
    /// The adapter's whole environment (the wrapper adds only its lease marks): nothing of
    /// the gateway's own environment reaches an agent unless it is listed here.
    pub env: AgentEnv,
    pub cwd: PathBuf,
    pub now: UnixMillis,
}

/// A live ACP session served by a leased process tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpRuntimeHandle {
    pub session_key: SessionKey,
    pub lease_id: LeaseId,
    pub acp_session_id: String,
    pub root_pid: u32,
    pub process_group_id: u32,
    /// How the ACP session began on this process.
    pub start: SessionStart,
}

/// A live session held for a turn (from [`LifecycleController::checkout`]): idle again when
/// dropped.
#[derive(Debug)]
pub struct SessionUse {
    handle: AcpRuntimeHandle,
    _in_use: InUse,
}

impl SessionUse {
    fn new(handle: AcpRuntimeHandle, usage: Arc<Usage>, pools: Arc<Pools>) -> SessionUse {
        SessionUse {
            handle,
            _in_use: InUse::new(usage, pools),
        }
    }

    /// The session's runtime.
    pub fn handle(&self) -> &AcpRuntimeHandle {
        &self.handle
    }
}

/// How a session's ACP session began when its process started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionStart {
    /// The session's first process: `session/new`.
    New,
    /// An earlier process served it (closed for idleness, or the gateway restarted): the agent
    /// resumed that ACP session with `session/load`.
    Loaded,
    /// An earlier process served it, and its ACP session could not be resumed (`why`): a fresh
    /// one began, without the agent's memory of the conversation.
    Fresh { previous: String, why: String },
}

/// What a close or a reap did with one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseOutcome {
    /// Verified and ended; the lease is `closed`.
    Closed(Termination),
    /// Owned processes outlived KILL (`Termination::survivors`): the lease stays `closing` with
    /// them recorded, and a later look ([`LifecycleController::recheck_survivors`], the startup
    /// reaper, another close) closes it once they are gone.
    Survived(Termination),
    /// The process was already gone; the lease is `lost`. No signal was sent.
    Lost(String),
    /// Nothing was signalled and the lease was left as it was (reason logged).
    Refused(String),
    /// The lease had already finished.
    AlreadyFinished(LeaseState),
}

/// Result of a startup reap.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReapReport {
    pub outcomes: Vec<(LeaseId, CloseOutcome)>,
    /// Closed/lost leases removed by retention.
    pub pruned: u64,
}

#[derive(Debug)]
struct LiveSession {
    handle: AcpRuntimeHandle,
    agent_id: String,
    /// The adapter command line the process runs (a hand-over needs the same one).
    adapter: Vec<String>,
    /// The environment it was started with (a hand-over needs the same one).
    env: AgentEnv,
    usage: Arc<Usage>,
    client: Arc<AcpClient>,
    child: Option<std::process::Child>,
    stderr: StderrTail,
}

impl LiveSession {
    /// Why this session cannot serve another turn, if it cannot: the wrapper (our own child,
    /// so `try_wait` is exact) has exited, or the ACP connection has closed.
    fn gone(&mut self) -> Option<String> {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            return Some(format!("its wrapper exited ({status})"));
        }
        if self.client.is_closed() {
            return Some("its ACP connection closed".to_owned());
        }
        None
    }

    /// Whether this process may be handed to a session of `adapter`: the same command line,
    /// and an agent that frees a session on `session/close` (else every hand-over would leave
    /// one more session in the agent's memory).
    fn can_host(&self, input: &EnsureInput) -> bool {
        self.adapter == input.adapter
            && self.env == input.env
            && self
                .client
                .capabilities()
                .session_capabilities
                .close
                .is_some()
    }
}

/// The lifecycle controller of one gateway instance.
#[derive(Debug)]
pub struct LifecycleController {
    store: Arc<dyn Store>,
    table: Arc<dyn ProcessTable>,
    instance: GatewayInstanceId,
    config: ControllerConfig,
    live: Mutex<HashMap<SessionKey, LiveSession>>,
    pools: Arc<Pools>,
}

impl LifecycleController {
    /// Loads (or creates, once per state directory) the gateway instance id.
    pub async fn new(
        store: Arc<dyn Store>,
        table: Arc<dyn ProcessTable>,
        config: ControllerConfig,
    ) -> Result<LifecycleController, AcpxError> {
        let instance = store.gateway_instance_id().await?;
        Ok(LifecycleController {
            store,
            table,
            instance,
            config,
            live: Mutex::new(HashMap::new()),
            pools: Arc::new(Pools::default()),
        })
    }

    pub fn instance_id(&self) -> &GatewayInstanceId {
        &self.instance
    }

    /// The wrapper argv for a lease (what `/proc/PID/cmdline` will show, and what is hashed).
    pub fn wrapper_argv(&self, lease_id: &LeaseId, adapter: &[String]) -> Vec<String> {
        let mut argv = vec![self.config.wrapper_path.display().to_string()];
        argv.extend(self.config.wrapper_args.iter().cloned());
        argv.extend([
            LEASE_FLAG.to_owned(),
            lease_id.to_string(),
            INSTANCE_FLAG.to_owned(),
            self.instance.to_string(),
            GRACE_FLAG.to_owned(),
            self.config.wrapper_grace.as_millis().to_string(),
            "--".to_owned(),
        ]);
        argv.extend(adapter.iter().cloned());
        argv
    }

    /// Returns the live runtime of a session, starting wrapper + adapter + ACP session if none.
    pub async fn ensure_session(&self, input: EnsureInput) -> Result<AcpRuntimeHandle, AcpxError> {
        let mut live = self.live.lock().await;
        if let Some(session) = live.get_mut(&input.session_key) {
            match session.gone() {
                None => return Ok(session.handle.clone()),
                Some(why) => {
                    if let Some(dead) = live.remove(&input.session_key) {
                        self.retire(dead, &why, input.now).await;
                    }
                }
            }
        }
        let lease_id = LeaseId::parse(clawgate_store::ids::new_id())?;
        let span = tracing::info_span!("acpx_lease", lease_id = %lease_id,
            session = %input.session_key);
        let (session, handle) = self.start(&input, lease_id).instrument(span).await?;
        live.insert(input.session_key.clone(), session);
        Ok(handle)
    }

    async fn start(
        &self,
        input: &EnsureInput,
        lease_id: LeaseId,
    ) -> Result<(LiveSession, AcpRuntimeHandle), AcpxError> {
        let argv = self.wrapper_argv(&lease_id, &input.adapter);
        let lease = AcpxProcessLease {
            lease_id: lease_id.clone(),
            gateway_instance_id: self.instance.clone(),
            session_key: input.session_key.clone(),
            wrapper_root: self.config.wrapper_root.display().to_string(),
            wrapper_path: self.config.wrapper_path.display().to_string(),
            root_pid: None,
            root_start_time: None,
            boot_id: None,
            process_group_id: None,
            command_hash: command_hash(&argv),
            started_at: input.now,
            state: LeaseState::Open,
            ended_at: None,
            survivors: Vec::new(),
            stderr_tail: Vec::new(),
        };
        // Lease first: a crash after this line leaves an open lease the reaper resolves.
        self.store.insert_lease(&lease).await?;
        match self.record_session_and_spawn(input, &lease_id, &argv).await {
            Ok((child, previous)) => self.started(input, lease, child, previous).await,
            Err(error) => {
                // No process was started: the lease is provably without one.
                tracing::warn!(%error, "start failed before the wrapper ran; lease lost");
                self.lose_lease(&lease, input.now).await;
                Err(error)
            }
        }
    }

    /// The session row names the new lease, then the wrapper starts.
    async fn record_session_and_spawn(
        &self,
        input: &EnsureInput,
        lease_id: &LeaseId,
        argv: &[String],
    ) -> Result<(std::process::Child, Option<String>), AcpxError> {
        let previous = self.record_session(input, lease_id).await?;
        let child = spawn_wrapper(argv, &input.env)
            .await
            .map_err(|source| AcpxError::Spawn {
                path: self.config.wrapper_path.clone(),
                lease_id: lease_id.clone(),
                source,
            })?;
        Ok((child, previous))
    }

    /// Writes the session row (created on first use) naming `lease_id` as the lease of the
    /// process serving it; returns the ACP session id an earlier process left on it.
    async fn record_session(
        &self,
        input: &EnsureInput,
        lease_id: &LeaseId,
    ) -> Result<Option<String>, AcpxError> {
        let mut row = self
            .store
            .load_session(&input.session_key)
            .await?
            .unwrap_or_else(|| SessionRow {
                session_key: input.session_key.clone(),
                agent_id: input.agent_id.clone(),
                owner_session_key: Some(input.owner_session_key.clone()),
                spawned_by: input.spawned_by.clone(),
                parent_session_key: input.spawned_by.clone(),
                label: None,
                acp_owner: None,
                lease_id: None,
                acp_session_id: None,
                created_at: input.now,
                updated_at: input.now,
                reset_at: None,
                deleted_at: None,
            });
        row.acp_owner = Some(AcpSessionOwner {
            session_key: input.session_key.clone(),
            spawned_by: input.spawned_by.clone(),
            parent_session_key: input.spawned_by.clone(),
            owner_session_key: input.owner_session_key.clone(),
            agent_id: input.agent_id.clone(),
            backend: AcpBackend::Acpx,
            gateway_instance_id: self.instance.clone(),
            created_at: input.now,
        });
        row.lease_id = Some(lease_id.clone());
        row.updated_at = input.now;
        self.store.upsert_session(&row).await?;
        Ok(row.acp_session_id)
    }

    /// Marks the lease of a start whose process is provably gone — never started, or our own
    /// child, waited for — `lost` (best effort: the next start's reaping resolves it too).
    async fn lose_lease(&self, lease: &AcpxProcessLease, now: UnixMillis) {
        if let Ok(Some(mut stored)) = self.store.load_lease(&lease.lease_id).await
            && stored.state == LeaseState::Open
        {
            stored.state = LeaseState::Lost;
            stored.ended_at = Some(now);
            let _ = self.store.save_lease(&stored, LeaseState::Open).await;
        }
    }

    /// Identifies the started wrapper, records its identity on the lease and opens the ACP
    /// session; on any failure the wrapper is ended and the lease resolved.
    async fn started(
        &self,
        input: &EnsureInput,
        mut lease: AcpxProcessLease,
        mut child: std::process::Child,
        previous: Option<String>,
    ) -> Result<(LiveSession, AcpRuntimeHandle), AcpxError> {
        let lease_id = lease.lease_id.clone();
        let pid = child.id();
        let io = take_stdio(&mut child);
        let tail = StderrTail::new(&input.env);
        let started = async {
            let (stdin, stdout, stderr) = io.map_err(|e| AcpxError::Spawn {
                path: self.config.wrapper_path.clone(),
                lease_id: lease_id.clone(),
                source: e,
            })?;
            let pgid = self.read_report(stderr, &lease_id, pid, &tail).await?;
            // Our own unreaped child: its pid cannot be recycled while we read its identity.
            let start_time = self
                .table
                .open(pid)
                .ok()
                .flatten()
                .and_then(|h| h.stat().ok().flatten())
                .map(|s| s.start_time)
                .ok_or_else(|| AcpxError::Identity {
                    lease_id: lease_id.clone(),
                    pid,
                    detail: "its /proc stat is unreadable".into(),
                })?;
            let boot_id = self.table.boot_id().map_err(|e| AcpxError::Identity {
                lease_id: lease_id.clone(),
                pid,
                detail: e.to_string(),
            })?;
            lease.root_pid = Some(pid);
            lease.root_start_time = Some(start_time);
            lease.boot_id = Some(boot_id);
            lease.process_group_id = Some(pgid);
            self.store.save_lease(&lease, LeaseState::Open).await?;
            tracing::info!(root_pid = pid, pgid, "wrapper started and lease recorded");
            let client =
                AcpClient::connect(stdin, stdout)
                    .await
                    .map_err(|source| AcpxError::Acp {
                        session: input.session_key.clone(),
                        source,
                    })?;
            authenticate_from_env(&client, &input.env).await;
            let (acp_session_id, start) = self
                .begin_acp_session(&client, input, previous)
                .await
                .map_err(|error| auth_or(error, &input.agent_id, &client))?;
            Ok::<_, AcpxError>((pgid, client, acp_session_id, start))
        }
        .await;
        match started {
            Ok((pgid, client, acp_session_id, start)) => {
                let handle = AcpRuntimeHandle {
                    session_key: input.session_key.clone(),
                    lease_id,
                    acp_session_id,
                    root_pid: pid,
                    process_group_id: pgid,
                    start,
                };
                Ok((
                    LiveSession {
                        handle: handle.clone(),
                        agent_id: input.agent_id.clone(),
                        adapter: input.adapter.clone(),
                        env: input.env.clone(),
                        usage: Usage::new(),
                        client: Arc::new(client),
                        child: Some(child),
                        stderr: tail,
                    },
                    handle,
                ))
            }
            Err(error) => {
                let outcome = self.abandon_start(&lease_id, child, input.now).await;
                // After the tree ended: what the agent wrote as it failed is all in by now.
                self.keep_stderr(&lease_id, &tail).await;
                tracing::warn!(%error, agent = %input.agent_id, ?outcome,
                    stderr = %tail.joined(),
                    "agent start failed: its whole process tree was ended");
                Err(error)
            }
        }
    }

    /// Ends everything a start that did not become a live session left running, through the
    /// same verified path as a close: the wrapper, the adapter and every descendant or
    /// marked member of its group (an `npx`-style `sh -c` launcher's `node`, an adapter's
    /// native binary), TERM then KILL. The lease ends `closed` (or `closing` with survivors
    /// named), never `lost` with processes alive. A wrapper that never reported its group is
    /// our own unreaped child: TERM makes it drain its group before it exits.
    async fn abandon_start(
        &self,
        lease_id: &LeaseId,
        mut child: std::process::Child,
        now: UnixMillis,
    ) -> CloseOutcome {
        let recorded = match self.store.load_lease(lease_id).await {
            Ok(Some(lease)) => lease,
            Ok(None) | Err(_) => {
                let outcome = self.end_own_child(&mut child).await;
                reap_child_later(child);
                return outcome;
            }
        };
        let verified = if recorded.root_pid.is_some() {
            match self.end_lease(recorded.clone(), now).await {
                Ok(CloseOutcome::Refused(why)) => {
                    tracing::warn!(%why, "the failed start's tree did not verify: ending our own \
                        child instead");
                    None
                }
                Ok(outcome) => Some(outcome),
                Err(error) => {
                    tracing::warn!(%error, "the failed start's lease could not be resolved");
                    None
                }
            }
        } else {
            None
        };
        let outcome = match verified {
            // Gone by the time it was looked at, nothing of its group left: the start ended
            // with nothing alive, which is what a close does.
            Some(CloseOutcome::Lost(_)) => {
                self.resolve_abandoned(lease_id, LeaseState::Lost, LeaseState::Closed, now)
                    .await;
                CloseOutcome::Closed(Termination::default())
            }
            Some(outcome) => outcome,
            None => {
                let outcome = self.end_own_child(&mut child).await;
                let state = match outcome {
                    CloseOutcome::Closed(_) => LeaseState::Closed,
                    _ => LeaseState::Lost,
                };
                self.resolve_abandoned(lease_id, LeaseState::Open, state, now)
                    .await;
                outcome
            }
        };
        reap_child_later(child);
        outcome
    }

    /// TERM to our own unreaped wrapper (its pid cannot be recycled while unreaped): it drains
    /// its group (TERM, its grace, KILL) and exits. KILL only if it has not exited by then.
    async fn end_own_child(&self, child: &mut std::process::Child) -> CloseOutcome {
        if let Ok(Some(_)) = child.try_wait() {
            return CloseOutcome::Closed(Termination::default());
        }
        let pid = child.id();
        #[cfg(unix)]
        let termed = rustix::process::Pid::from_raw(pid.cast_signed()).is_some_and(|p| {
            rustix::process::kill_process(p, rustix::process::Signal::TERM).is_ok()
        });
        #[cfg(not(unix))]
        let termed = false;
        let deadline =
            std::time::Instant::now() + self.config.wrapper_grace + self.config.timing.kill_wait;
        while termed && std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return CloseOutcome::Closed(Termination {
                    termed: vec![pid],
                    ..Termination::default()
                });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = child.kill();
        CloseOutcome::Lost(format!(
            "the wrapper (pid {pid}) did not end on TERM and was killed: its group could not \
             be drained"
        ))
    }

    /// Records the agent's last stderr lines on its lease, for the operator (best effort: a
    /// lease whose state changed meanwhile is tried once more).
    async fn keep_stderr(&self, lease_id: &LeaseId, tail: &StderrTail) {
        let lines = tail.lines();
        if lines.is_empty() {
            return;
        }
        for _ in 0..2 {
            let Ok(Some(mut lease)) = self.store.load_lease(lease_id).await else {
                return;
            };
            if lease.stderr_tail == lines {
                return;
            }
            lease.stderr_tail = lines.clone();
            let expected = lease.state;
            if self.store.save_lease(&lease, expected).await.is_ok() {
                return;
            }
        }
    }

    /// Moves the lease of an abandoned start from `from` to `to` (best effort: a lease in
    /// another state is left as it is, and the next reap looks at it).
    async fn resolve_abandoned(
        &self,
        lease_id: &LeaseId,
        from: LeaseState,
        to: LeaseState,
        now: UnixMillis,
    ) {
        let Ok(Some(mut lease)) = self.store.load_lease(lease_id).await else {
            return;
        };
        if lease.state != from {
            return;
        }
        lease.state = to;
        lease.ended_at = Some(now);
        if let Err(error) = self.store.save_lease(&lease, from).await {
            tracing::warn!(%error, "the abandoned start's lease could not be resolved");
        }
    }

    /// The ACP session of a process that just started: the session's earlier one resumed
    /// with `session/load` when there was one and the agent can, else `session/new`. The id is
    /// kept on the session row for the next process.
    async fn begin_acp_session(
        &self,
        client: &AcpClient,
        input: &EnsureInput,
        previous: Option<String>,
    ) -> Result<(String, SessionStart), AcpxError> {
        let acp = |source| AcpxError::Acp {
            session: input.session_key.clone(),
            source,
        };
        let (id, start) = match previous {
            None => (
                client.new_session(&input.cwd).await.map_err(acp)?,
                SessionStart::New,
            ),
            Some(previous) => match client.load_session(&previous, &input.cwd).await {
                Ok(Some(_history)) => (previous, SessionStart::Loaded),
                outcome => {
                    let why = match outcome {
                        Err(error) => format!("session/load failed: {error}"),
                        _ => "the agent does not advertise loadSession".to_owned(),
                    };
                    let id = client.new_session(&input.cwd).await.map_err(acp)?;
                    (id, SessionStart::Fresh { previous, why })
                }
            },
        };
        tracing::info!(acp_session = %id, ?start, "ACP session begun");
        if let Some(mut row) = self.store.load_session(&input.session_key).await?
            && row.acp_session_id.as_deref() != Some(id.as_str())
        {
            row.acp_session_id = Some(id.clone());
            row.updated_at = SystemClock.now_ms();
            self.store.upsert_session(&row).await?;
        }
        Ok((id, start))
    }

    /// Sets the limits of `agent`'s sessions (the cap on live processes, the idle close).
    pub fn set_limits(&self, agent: &str, limits: AgentLimits) {
        self.pools.set_limits(agent, limits);
    }

    /// A live session of `input.session_key` for one turn, starting its process if none runs
    /// (as [`LifecycleController::ensure_session`]) under the agent's [`AgentLimits`]: at the
    /// cap the least recently used idle session of the agent is closed to make room; when every
    /// one is in use, the turn waits its turn (first come, first served). The session is in use
    /// until the returned [`SessionUse`] is dropped.
    pub async fn checkout(&self, input: EnsureInput) -> Result<SessionUse, AcpxError> {
        let agent = input.agent_id.clone();
        let mut ticket = Ticket {
            pools: &self.pools,
            agent: &agent,
            ticket: None,
        };
        loop {
            let changed = self.pools.changed.notified();
            tokio::pin!(changed);
            // Registered before the state is looked at: a change after the look wakes it.
            changed.as_mut().enable();
            let limits = self.pools.limits(&agent);
            let mut evict: Option<(SessionKey, LiveSession, &'static str)> = None;
            let mut hand_over: Option<(SessionKey, LiveSession)> = None;
            let mut yielded = false;
            let mut starting = None;
            {
                let mut live = self.live.lock().await;
                if self.pools.is_starting(&input.session_key) {
                    // Another turn of this session is starting its process: use that one.
                    drop(live);
                    changed.await;
                    continue;
                }
                if let Some(session) = live.get_mut(&input.session_key) {
                    match session.gone() {
                        None if session.usage.in_use()
                            || self.pools.is_first(&agent, ticket.ticket) =>
                        {
                            let session_use = SessionUse::new(
                                session.handle.clone(),
                                session.usage.clone(),
                                self.pools.clone(),
                            );
                            return Ok(session_use);
                        }
                        None if limits.reuse_processes && session.can_host(&input) => {
                            // Idle while turns of other conversations wait for a slot: left
                            // for the first of them, which takes its process over; this turn
                            // queues behind.
                            yielded = true;
                        }
                        None => {
                            // Idle while turns of other conversations wait for a slot: the
                            // slot goes to the first of them, this turn queues behind.
                            if let Some(own) = self.take(&mut live, &input.session_key) {
                                evict = Some((
                                    input.session_key.clone(),
                                    own,
                                    "its slot went to a waiting turn",
                                ));
                            }
                        }
                        Some(why) => {
                            if let Some(dead) = live.remove(&input.session_key) {
                                self.retire(dead, &why, input.now).await;
                            }
                        }
                    }
                }
                if evict.is_none() && !yielded && self.pools.is_first(&agent, ticket.ticket) {
                    // Sessions being closed or started have processes too: they count.
                    let running = live.values().filter(|s| s.agent_id == agent).count()
                        + self.pools.closing_count(&agent)
                        + self.pools.starting_count(&agent);
                    if limits.max_live.is_none_or(|max| running < max) {
                        self.pools.leave(&agent, ticket.ticket.take());
                        starting = Some(self.pools.begin_start(&input.session_key, &agent));
                    } else {
                        // At the cap: the least recently used idle session makes room.
                        let idlest = live
                            .iter()
                            .filter(|(_, s)| s.agent_id == agent && !s.usage.in_use())
                            .min_by_key(|(_, s)| s.usage.idle_since())
                            .map(|(key, _)| key.clone());
                        let reusable = |key: &SessionKey| {
                            limits.reuse_processes
                                && live.get(key).is_some_and(|s| s.can_host(&input))
                        };
                        match idlest {
                            Some(key) if reusable(&key) => {
                                // Its process serves this turn's session next: no process
                                // ends, none starts.
                                if let Some(session) = live.remove(&key) {
                                    self.pools.leave(&agent, ticket.ticket.take());
                                    starting =
                                        Some(self.pools.begin_start(&input.session_key, &agent));
                                    hand_over = Some((key, session));
                                }
                            }
                            Some(key) => {
                                if let Some(session) = self.take(&mut live, &key) {
                                    evict = Some((
                                        key,
                                        session,
                                        "the least recently used idle session made room under \
                                         max_live",
                                    ));
                                }
                            }
                            None => {}
                        }
                    }
                }
            }
            if let Some(starting) = starting {
                // The slot is held by `starting`; the process starts (or is handed over)
                // without the live set's lock, so the starts of different conversations (a
                // fork, an exec, the ACP handshake, a session/load) run side by side.
                let (session, handle) = match hand_over {
                    Some((from, session)) => {
                        self.pools
                            .evictions
                            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let span = tracing::info_span!("acpx_lease",
                            lease_id = %session.handle.lease_id, session = %input.session_key);
                        match self
                            .hand_over(&input, &from, session)
                            .instrument(span)
                            .await
                        {
                            Ok(taken) => {
                                self.pools
                                    .handovers
                                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                taken
                            }
                            Err((session, error)) => {
                                tracing::warn!(%error,
                                    "idle process not handed over: it is closed, and the turn \
                                     looks for a slot again");
                                // Counted as closing before the start's count goes: the
                                // process is still there until it is closed. The turn stays
                                // first in line: turns that came while the process closes
                                // wait behind it.
                                self.pools.closing(&agent);
                                ticket.ticket = Some(self.pools.enqueue_first(&agent));
                                drop(starting);
                                let why = "its process could not be handed over";
                                if let Err(error) = self
                                    .close_removed(&from, Some(session), why, input.now)
                                    .await
                                {
                                    tracing::warn!(session = %from, %error,
                                        "process not closed cleanly after a failed hand-over");
                                }
                                continue;
                            }
                        }
                    }
                    None => {
                        let lease_id = LeaseId::parse(clawgate_store::ids::new_id())?;
                        let span = tracing::info_span!("acpx_lease", lease_id = %lease_id,
                            session = %input.session_key);
                        self.start(&input, lease_id).instrument(span).await?
                    }
                };
                let session_use =
                    SessionUse::new(handle, session.usage.clone(), self.pools.clone());
                self.live
                    .lock()
                    .await
                    .insert(input.session_key.clone(), session);
                drop(starting);
                return Ok(session_use);
            }
            if let Some((key, session, why)) = evict {
                self.pools
                    .evictions
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if let Err(error) = self
                    .close_removed(&key, Some(session), why, input.now)
                    .await
                {
                    tracing::warn!(session = %key, %error, "evicted session not closed cleanly");
                }
                if key == input.session_key && ticket.ticket.is_none() {
                    ticket.ticket = Some(self.pools.enqueue(&agent));
                }
                continue;
            }
            if ticket.ticket.is_none() {
                ticket.ticket = Some(self.pools.enqueue(&agent));
                tracing::info!(session = %input.session_key, agent = %agent,
                    "every agent session is in use at max_live: the turn waits for a slot");
                continue;
            }
            changed.await;
        }
    }

    /// Hands the process of `from`'s idle session (already out of the live set) to `input`'s
    /// session: the agent closes the old ACP session, the lease names the new session (same
    /// process, same evidence), the new session's row names the lease, and the new session's
    /// ACP session is loaded (or begun) on the same connection. On failure the live session
    /// is given back, for the caller to close.
    async fn hand_over(
        &self,
        input: &EnsureInput,
        from: &SessionKey,
        mut session: LiveSession,
    ) -> Result<(LiveSession, AcpRuntimeHandle), (LiveSession, AcpxError)> {
        let lease_id = session.handle.lease_id.clone();
        let failed = |why: String| AcpxError::HandOver {
            lease_id: lease_id.clone(),
            from: from.clone(),
            to: input.session_key.clone(),
            why,
        };
        if let Some(why) = session.gone() {
            return Err((session, failed(why)));
        }
        // The old session must be gone from the agent before another begins on it.
        let close = session.client.close_session(&session.handle.acp_session_id);
        let refused = match tokio::time::timeout(HAND_OVER_CLOSE, close).await {
            Ok(Ok(true)) => None,
            Ok(Ok(false)) => Some("the agent does not advertise session/close".to_owned()),
            Ok(Err(error)) => Some(format!("session/close failed: {error}")),
            Err(_) => Some(format!(
                "session/close was not answered within {} ms",
                HAND_OVER_CLOSE.as_millis()
            )),
        };
        if let Some(why) = refused {
            return Err((session, failed(why)));
        }
        let moved = async {
            let mut lease = self
                .store
                .load_lease(&lease_id)
                .await?
                .ok_or_else(|| failed("its lease is not in the store".to_owned()))?;
            lease.session_key = input.session_key.clone();
            self.store.save_lease(&lease, LeaseState::Open).await?;
            let previous = self.record_session(input, &lease_id).await?;
            self.begin_acp_session(&session.client, input, previous)
                .await
        }
        .await;
        match moved {
            Ok((acp_session_id, start)) => {
                let handle = AcpRuntimeHandle {
                    session_key: input.session_key.clone(),
                    lease_id,
                    acp_session_id,
                    root_pid: session.handle.root_pid,
                    process_group_id: session.handle.process_group_id,
                    start,
                };
                tracing::info!(from = %from, "idle agent process handed over");
                session.handle = handle.clone();
                session.usage = Usage::new();
                Ok((session, handle))
            }
            Err(error) => Err((session, error)),
        }
    }

    /// Closes the sessions idle longer than their agent's `idle_close` (verified, lease
    /// `closed`); returns how many. Their next turn starts a process again.
    pub async fn close_idle(&self, now: UnixMillis) -> usize {
        let idle: Vec<(SessionKey, LiveSession)> = {
            let mut live = self.live.lock().await;
            let due: Vec<SessionKey> = live
                .iter()
                .filter(|(_, s)| {
                    !s.usage.in_use()
                        && self
                            .pools
                            .limits(&s.agent_id)
                            .idle_close
                            .is_some_and(|after| s.usage.idle_since().elapsed() >= after)
                })
                .map(|(key, _)| key.clone())
                .collect();
            due.into_iter()
                .filter_map(|key| self.take(&mut live, &key).map(|s| (key, s)))
                .collect()
        };
        let closed = idle.len();
        for (key, session) in idle {
            self.pools
                .idle_closes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Err(error) = self.close_removed(&key, Some(session), "idle", now).await {
                tracing::warn!(session = %key, %error, "idle session not closed cleanly");
            }
        }
        closed
    }

    /// Live sessions, turns in them and waiting for them, and the closes so far.
    pub async fn figures(&self) -> PoolFigures {
        let live = self.live.lock().await;
        PoolFigures {
            live: live.len() + self.pools.closing_total() + self.pools.starting_total(),
            in_use: live.values().filter(|s| s.usage.in_use()).count(),
            queued: self.pools.queued(),
            idle_closes: self
                .pools
                .idle_closes
                .load(std::sync::atomic::Ordering::SeqCst),
            evictions: self
                .pools
                .evictions
                .load(std::sync::atomic::Ordering::SeqCst),
            handovers: self
                .pools
                .handovers
                .load(std::sync::atomic::Ordering::SeqCst),
        }
    }

    async fn read_report(
        &self,
        stderr: ChildStderr,
        lease_id: &LeaseId,
        pid: u32,
        tail: &StderrTail,
    ) -> Result<u32, AcpxError> {
        let mut lines = BufReader::new(stderr).lines();
        let waited_ms = self.config.report_timeout.as_millis() as u64;
        let no_report = |detail: String| AcpxError::NoReport {
            lease_id: lease_id.clone(),
            path: self.config.wrapper_path.clone(),
            waited_ms,
            detail,
        };
        let found = tokio::time::timeout(self.config.report_timeout, async {
            loop {
                match lines.next_line().await {
                    Ok(Some(line)) => {
                        if let Some(json) = line.strip_prefix(WRAPPER_REPORT_PREFIX) {
                            return parse_report(json, pid);
                        }
                        let line = tail.push(&line);
                        tracing::info!(target: "acpx_stderr", "{line}");
                    }
                    Ok(None) => return Err("stderr closed: the wrapper exited".to_owned()),
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
        .await
        .map_err(|_| no_report("timed out".into()))?
        .map_err(no_report)?;
        // Keep draining the adapter's stderr into the log, under this lease's span.
        let span = tracing::Span::current();
        let tail = tail.clone();
        tokio::spawn(
            async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    let line = tail.push(&line);
                    tracing::info!(target: "acpx_stderr", "{line}");
                }
            }
            .instrument(span),
        );
        Ok(found)
    }

    async fn client(
        &self,
        key: &SessionKey,
    ) -> Result<(Arc<AcpClient>, String, String, StderrTail), AcpxError> {
        let live = self.live.lock().await;
        let session = live
            .get(key)
            .ok_or_else(|| AcpxError::NotRunning(key.clone()))?;
        Ok((
            session.client.clone(),
            session.handle.acp_session_id.clone(),
            session.agent_id.clone(),
            session.stderr.clone(),
        ))
    }

    /// The sessions with a live runtime in this process (what a clean shutdown closes).
    pub async fn live_sessions(&self) -> Vec<SessionKey> {
        self.live.lock().await.keys().cloned().collect()
    }

    /// Runs one prompt turn, streaming text chunks to `on_chunk`.
    pub async fn prompt(
        &self,
        handle: &AcpRuntimeHandle,
        text: &str,
        on_chunk: impl FnMut(&str) + Send,
    ) -> Result<TurnOutcome, AcpxError> {
        let (client, session_id, agent, tail) = self.client(&handle.session_key).await?;
        let result = client.prompt(&session_id, text, on_chunk).await;
        if let Err(error) = &result {
            tracing::warn!(lease_id = %handle.lease_id, %error, stderr = %tail.joined(),
                "the agent's turn failed");
            self.keep_stderr(&handle.lease_id, &tail).await;
        }
        match result {
            Ok(outcome) => Ok(outcome),
            Err(source) if source.is_disconnected() || client.is_closed() => {
                drop(client);
                self.retire_exited(handle, "session/prompt").await;
                Err(AcpxError::AgentExited {
                    session: handle.session_key.clone(),
                    lease_id: handle.lease_id.clone(),
                    step: "session/prompt",
                })
            }
            Err(source) => Err(auth_or(
                AcpxError::Acp {
                    session: handle.session_key.clone(),
                    source,
                },
                &agent,
                &client,
            )),
        }
    }

    /// Drops the live session of `handle` after its agent died under `step` — only if it is
    /// still the one of that lease (a concurrent caller may have replaced it already).
    async fn retire_exited(&self, handle: &AcpRuntimeHandle, step: &str) {
        let mut live = self.live.lock().await;
        if live
            .get(&handle.session_key)
            .is_some_and(|s| s.handle.lease_id == handle.lease_id)
            && let Some(dead) = live.remove(&handle.session_key)
        {
            let why = format!("the ACP connection closed during {step}");
            self.retire(dead, &why, SystemClock.now_ms()).await;
        }
    }

    /// Resolves the lease of a session whose agent is gone, through the same verification as
    /// a close: `lost` when the tree is provably gone, `closed` after a verified termination of
    /// what is left, refused (and left for the next start's reaping) otherwise. Never fails:
    /// the caller moves on to a fresh process either way.
    async fn retire(&self, mut session: LiveSession, why: &str, now: UnixMillis) {
        let lease_id = session.handle.lease_id.clone();
        let span = tracing::info_span!("acpx_lease", lease_id = %lease_id,
            session = %session.handle.session_key);
        async move {
            tracing::warn!(
                why,
                "agent process gone: resolving its lease, dropping the session"
            );
            // The wrapper holds the pipe of its stdout until it exits, so a closed connection
            // means it is exiting: let it finish (bounded), so that verification finds it gone
            // instead of half-exited and unreadable.
            if session.client.is_closed()
                && let Some(child) = session.child.as_mut()
            {
                let deadline = std::time::Instant::now() + EXIT_SETTLE;
                while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            session.client.shutdown();
            let resolved = match self.store.load_lease(&lease_id).await {
                Ok(Some(lease)) => self.end_lease(lease, now).await,
                Ok(None) => Ok(CloseOutcome::Refused(format!(
                    "lease {lease_id} is not in the store"
                ))),
                Err(error) => Err(error.into()),
            };
            match resolved {
                Ok(outcome) => tracing::info!(?outcome, "lease of the exited agent resolved"),
                Err(error) => tracing::warn!(%error,
                    "lease of the exited agent not resolved; the next start's reaping will"),
            }
            if let Some(child) = session.child {
                reap_child_later(child);
            }
            self.pools.changed.notify_waiters();
        }
        .instrument(span)
        .await
    }

    /// Aborts the active turn only: the session, wrapper and adapter stay.
    pub async fn cancel_turn(&self, handle: &AcpRuntimeHandle) -> Result<(), AcpxError> {
        let (client, session_id, _, _) = self.client(&handle.session_key).await?;
        tracing::info!(lease_id = %handle.lease_id, "cancel turn (processes stay)");
        client.cancel(&session_id).map_err(|source| AcpxError::Acp {
            session: handle.session_key.clone(),
            source,
        })
    }

    /// Closes a session: loads its row and lease, verifies the live tree, ends it.
    pub async fn close_session(
        &self,
        key: &SessionKey,
        reason: &str,
        now: UnixMillis,
    ) -> Result<CloseOutcome, AcpxError> {
        if self.store.load_session(key).await?.is_none() {
            return Err(AcpxError::UnknownSession(key.clone()));
        }
        let live = {
            let mut live = self.live.lock().await;
            self.take(&mut live, key)
        };
        self.close_removed(key, live, reason, now).await
    }

    /// Closes `key`'s session (as [`LifecycleController::close_session`]) and forgets its ACP
    /// session id, so the next start begins a fresh ACP session (`session/new`) instead of
    /// loading the old one.
    pub async fn reset_session(
        &self,
        key: &SessionKey,
        reason: &str,
        now: UnixMillis,
    ) -> Result<CloseOutcome, AcpxError> {
        let outcome = self.close_session(key, reason, now).await?;
        if let Some(mut row) = self.store.load_session(key).await?
            && row.acp_session_id.is_some()
        {
            row.acp_session_id = None;
            row.updated_at = now;
            self.store.upsert_session(&row).await?;
        }
        Ok(outcome)
    }

    /// Takes `key`'s session out of the live set to close it: until
    /// [`LifecycleController::close_removed`] has ended it, it counts against its agent's
    /// `max_live` (its process is still there).
    fn take(
        &self,
        live: &mut HashMap<SessionKey, LiveSession>,
        key: &SessionKey,
    ) -> Option<LiveSession> {
        let session = live.remove(key)?;
        self.pools.closing(&session.agent_id);
        Some(session)
    }

    /// Closes a session already taken out of the live set (`live`, when it had a runtime
    /// here): its lease is the live session's, else the row's.
    async fn close_removed(
        &self,
        key: &SessionKey,
        live: Option<LiveSession>,
        reason: &str,
        now: UnixMillis,
    ) -> Result<CloseOutcome, AcpxError> {
        let agent = live.as_ref().map(|s| s.agent_id.clone());
        let closed = self.close_lease_of(key, live, reason, now).await;
        // A slot came free (or may have).
        match agent {
            Some(agent) => self.pools.closed(&agent),
            None => self.pools.changed.notify_waiters(),
        }
        closed
    }

    async fn close_lease_of(
        &self,
        key: &SessionKey,
        live: Option<LiveSession>,
        reason: &str,
        now: UnixMillis,
    ) -> Result<CloseOutcome, AcpxError> {
        let row_lease = match &live {
            Some(session) => Some(session.handle.lease_id.clone()),
            None => self
                .store
                .load_session(key)
                .await?
                .and_then(|row| row.lease_id),
        };
        let Some(lease_id) = row_lease else {
            let why = "legacy session record without a lease id: no live evidence can be \
                       matched, so nothing is signalled (fail closed)";
            tracing::warn!(session = %key, reason, "close refused: {why}");
            return Ok(CloseOutcome::Refused(why.into()));
        };
        let span = tracing::info_span!("acpx_lease", lease_id = %lease_id, session = %key);
        async move {
            if let Some(session) = &live {
                // Polite first: the agent frees the session when it supports session/close.
                let close = session.client.close_session(&session.handle.acp_session_id);
                match tokio::time::timeout(Duration::from_secs(1), close).await {
                    Ok(Err(error)) => tracing::debug!(%error, "session/close failed"),
                    Err(_) => tracing::debug!("session/close timed out"),
                    Ok(Ok(_)) => {}
                }
            }
            let Some(lease) = self.store.load_lease(&lease_id).await? else {
                let why = format!("lease {lease_id} of the session row is not in the store");
                tracing::warn!(reason, "close refused: {why}");
                return Ok(CloseOutcome::Refused(why));
            };
            if live.is_none() && lease.session_key != *key && !lease.state.is_finished() {
                let why = format!(
                    "lease {lease_id} serves session {} now (its process was handed over when \
                     this session went idle): nothing of this session runs, so nothing is \
                     signalled",
                    lease.session_key
                );
                tracing::info!(reason, "close left alone: {why}");
                return Ok(CloseOutcome::Refused(why));
            }
            let outcome = self.end_lease(lease, now).await?;
            if let Some(session) = live {
                session.client.shutdown();
                if let Some(child) = session.child {
                    reap_child_later(child);
                }
            }
            tracing::info!(reason, ?outcome, "session closed");
            Ok(outcome)
        }
        .instrument(span)
        .await
    }

    /// Verify, then end or mark one lease. Shared by close and the startup reaper.
    async fn end_lease(
        &self,
        mut lease: AcpxProcessLease,
        now: UnixMillis,
    ) -> Result<CloseOutcome, AcpxError> {
        if lease.state.is_finished() {
            return Ok(CloseOutcome::AlreadyFinished(lease.state));
        }
        let mut verdict = verify_owned_tree(self.table.as_ref(), &lease, &self.instance);
        // A wrapper caught mid-exit (a gateway killed a moment ago takes its wrappers with
        // it) is asked again until it is gone, within a bound: left `open`, its lease would
        // wait for the next start.
        for _ in 0..EXIT_RECHECKS {
            if !matches!(verdict, Verdict::CannotTell(CannotTell::Exiting { .. })) {
                break;
            }
            tokio::time::sleep(EXIT_RECHECK_EVERY).await;
            verdict = verify_owned_tree(self.table.as_ref(), &lease, &self.instance);
        }
        match verdict {
            Verdict::Owned(tree) => {
                if let Some(gateway_pid) = self.other_gateway(&tree) {
                    let why = format!(
                        "its wrapper (pid {}) is the child of another live gateway (pid \
                         {gateway_pid}) with this instance id: a copied state directory",
                        tree.root.stat.pid
                    );
                    tracing::warn!(lease_id = %lease.lease_id, gateway_pid,
                        "refused to signal: {why}; not ours, not signalled");
                    return Ok(CloseOutcome::Refused(why));
                }
                let expected = lease.state;
                if expected == LeaseState::Open {
                    lease.state = LeaseState::Closing;
                    self.store.save_lease(&lease, LeaseState::Open).await?;
                }
                let mut report = terminate_tree(
                    self.table.as_ref(),
                    &lease,
                    &self.instance,
                    tree,
                    self.config.timing,
                )
                .await;
                // A process the tree started while it was being ended (an agent's shell in a
                // session of its own, forked after the listing) outlives the root, reparented
                // away from it: it still carries the lease's mark, and is ended too.
                if report.survivors.is_empty() && report.kill_refused.is_none() {
                    self.sweep_marked(&lease, &mut report).await;
                }
                // Survivors of an earlier pass the fresh tree no longer reaches still count.
                for earlier in self.still_alive(&lease) {
                    if !report.survivors.contains(&earlier) {
                        report.survivors.push(earlier);
                    }
                }
                self.settle(lease, report, now).await
            }
            Verdict::CannotTell(reason) => {
                tracing::warn!(lease_id = %lease.lease_id, %reason,
                    "refused to signal: cannot verify ownership");
                Ok(CloseOutcome::Refused(reason.to_string()))
            }
            Verdict::NotOurs(reason)
                if !lease.survivors.is_empty()
                    && !matches!(reason, NotOurs::ForeignLease { .. }) =>
            {
                // The root was KILLed by an earlier pass (and is gone or someone else's now):
                // only the recorded survivors are left to wait for. Their KILL is pending
                // already, so they are only looked at (by pid and start time), not signalled.
                tracing::info!(%reason, survivors = ?lease.survivors,
                    "root no longer verifies; looking at the recorded survivors");
                let report = Termination {
                    survivors: self.still_alive(&lease),
                    ..Termination::default()
                };
                self.settle(lease, report, now).await
            }
            Verdict::NotOurs(reason) if reason.process_gone() => {
                // The root is gone, but its group may not be: an adapter's children outlive a
                // wrapper that was killed before it could drain them.
                if let Some(outcome) = self.end_orphans(&mut lease, now).await? {
                    return Ok(outcome);
                }
                let expected = lease.state;
                lease.state = LeaseState::Lost;
                lease.ended_at = Some(now);
                self.store.save_lease(&lease, expected).await?;
                if matches!(reason, NotOurs::PidReused { .. }) {
                    // A live stranger holds the lease's pid now: what an operator should see
                    // (at the default level) is that it was left alone.
                    tracing::warn!(lease_id = %lease.lease_id, %reason,
                        "refused to signal: not ours, not signalled (the lease's process is gone \
                         and its pid reused); lease marked lost");
                } else {
                    tracing::info!(%reason, "no signal: process already gone; lease marked lost");
                }
                Ok(CloseOutcome::Lost(reason.to_string()))
            }
            Verdict::NotOurs(reason) => {
                tracing::warn!(lease_id = %lease.lease_id, %reason,
                    "refused to signal: live process is not this lease's; not ours, not signalled");
                Ok(CloseOutcome::Refused(reason.to_string()))
            }
        }
    }

    /// The pid of another live gateway that started this verified tree's wrapper and is still
    /// its parent, if there is one: the wrapper's environment names the process that started
    /// it, and its parent is that process, alive, older than the wrapper, and not this one.
    /// (A wrapper whose gateway died is reparented, so its parent no longer matches.) Anything
    /// unreadable is no evidence: `None`.
    fn other_gateway(&self, tree: &OwnedTree) -> Option<u32> {
        let root = &tree.root.stat;
        let parent = root.ppid;
        if parent <= 1 || parent == std::process::id() {
            return None;
        }
        let started_by = tree.root.handle.environ_var(PARENT_PID_ENV).ok()??;
        if started_by?.parse::<u32>().ok()? != parent {
            return None;
        }
        let stat = self.table.open(parent).ok()??.stat().ok()??;
        (!stat.zombie && stat.start_time <= root.start_time).then_some(parent)
    }

    /// [`AcpxError::AnotherGateway`] when one of `leases` is served by a live wrapper of
    /// another gateway with this instance id. Reads only: nothing is signalled or written.
    fn another_gateway(&self, leases: &[AcpxProcessLease]) -> Option<AcpxError> {
        for lease in leases.iter().filter(|l| !l.state.is_finished()) {
            if let Verdict::Owned(tree) =
                verify_owned_tree(self.table.as_ref(), lease, &self.instance)
                && let Some(gateway_pid) = self.other_gateway(&tree)
            {
                return Some(AcpxError::AnotherGateway {
                    gateway_pid,
                    instance: self.instance.clone(),
                    lease_id: lease.lease_id.clone(),
                    wrapper_pid: tree.root.stat.pid,
                });
            }
        }
        None
    }

    /// Ends the live processes of `lease` whose root is gone (see
    /// [`crate::verify::orphaned_members`]) and settles the lease (`closed`, or `closing` with
    /// survivors); `None` when there are none (or the table cannot be listed: the caller then
    /// resolves the lease by its root alone).
    async fn end_orphans(
        &self,
        lease: &mut AcpxProcessLease,
        now: UnixMillis,
    ) -> Result<Option<CloseOutcome>, AcpxError> {
        let orphans = match orphaned_members(self.table.as_ref(), lease, &self.instance) {
            Ok(orphans) if !orphans.is_empty() => orphans,
            Ok(_) => return Ok(None),
            Err(error) => {
                tracing::warn!(lease_id = %lease.lease_id, %error,
                    "the lease's process group could not be looked at");
                return Ok(None);
            }
        };
        Ok(Some(
            self.end_orphan_list(lease.clone(), orphans, now).await?,
        ))
    }

    /// After a termination that ended the root: ends what still carries the lease's mark
    /// (see [`LifecycleController::end_lease`]), adding to `report`.
    async fn sweep_marked(&self, lease: &AcpxProcessLease, report: &mut Termination) {
        let orphans = match orphaned_members(self.table.as_ref(), lease, &self.instance) {
            Ok(orphans) if !orphans.is_empty() => orphans,
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(lease_id = %lease.lease_id, %error,
                    "processes carrying the lease's mark could not be looked for");
                return;
            }
        };
        let pids: Vec<u32> = orphans.iter().map(|p| p.stat.pid).collect();
        tracing::info!(lease_id = %lease.lease_id, ?pids,
            "processes the tree started while it was ended: ending them too");
        let swept = terminate_orphans(lease, orphans, self.config.timing).await;
        report.termed.extend(swept.termed);
        report.killed.extend(swept.killed);
        report.survivors.extend(swept.survivors);
    }

    async fn end_orphan_list(
        &self,
        mut lease: AcpxProcessLease,
        orphans: Vec<crate::verify::OwnedProcess>,
        now: UnixMillis,
    ) -> Result<CloseOutcome, AcpxError> {
        let pids: Vec<u32> = orphans.iter().map(|p| p.stat.pid).collect();
        tracing::warn!(lease_id = %lease.lease_id, ?pids,
            "the lease's wrapper is gone but processes it started live on: ending them");
        if lease.state != LeaseState::Closing {
            let expected = lease.state;
            lease.state = LeaseState::Closing;
            lease.ended_at = None;
            self.store.save_lease(&lease, expected).await?;
        }
        let report = terminate_orphans(&lease, orphans, self.config.timing).await;
        self.settle(lease, report, now).await
    }

    /// Leases of this instance already marked `lost` whose processes live on, carrying the
    /// lease's mark (a start that failed before this was checked, a wrapper killed by hand):
    /// each such tree is ended and its lease closed. One pass over the process table serves
    /// every lease.
    pub async fn reap_lost_groups(
        &self,
        now: UnixMillis,
    ) -> Result<Vec<(LeaseId, CloseOutcome)>, AcpxError> {
        let Ok(boot) = self.table.boot_id() else {
            return Ok(Vec::new());
        };
        let lost: Vec<AcpxProcessLease> = self
            .store
            .list_leases(Some(&self.instance), &[LeaseState::Lost])
            .await?
            .into_iter()
            .filter(|l| l.boot_id.as_deref() == Some(boot.as_str()) && l.root_start_time.is_some())
            .collect();
        let Some(since) = lost.iter().filter_map(|l| l.root_start_time).min() else {
            return Ok(Vec::new());
        };
        let listed = match self.table.list() {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%error, "process table unreadable: lost leases not looked at");
                return Ok(Vec::new());
            }
        };
        let mut marked = marked_processes(self.table.as_ref(), &listed, since);
        let mut outcomes = Vec::new();
        for lease in lost {
            let Some(root_start) = lease.root_start_time else {
                continue;
            };
            let orphans = take_marked(&mut marked, &listed, &lease, root_start);
            if orphans.is_empty() {
                continue;
            }
            let lease_id = lease.lease_id.clone();
            let span = tracing::info_span!("acpx_reap", lease_id = %lease_id);
            let outcome = self
                .end_orphan_list(lease, orphans, now)
                .instrument(span)
                .await?;
            outcomes.push((lease_id, outcome));
        }
        Ok(outcomes)
    }

    /// Records the end of a termination of a `closing` lease: `closed` when nothing owned
    /// survived, otherwise still `closing` with the survivors listed for the next look.
    async fn settle(
        &self,
        mut lease: AcpxProcessLease,
        report: Termination,
        now: UnixMillis,
    ) -> Result<CloseOutcome, AcpxError> {
        lease.survivors = report.survivors.clone();
        if lease.survivors.is_empty() {
            lease.state = LeaseState::Closed;
            lease.ended_at = Some(now);
            self.store.save_lease(&lease, LeaseState::Closing).await?;
            return Ok(CloseOutcome::Closed(report));
        }
        tracing::error!(survivors = ?lease.survivors,
            "owned processes outlived KILL: the lease stays closing and is looked at again");
        self.store.save_lease(&lease, LeaseState::Closing).await?;
        Ok(CloseOutcome::Survived(report))
    }

    /// The lease's recorded survivors that still exist: same boot, same pid, same start time,
    /// not a zombie. What cannot be read counts as alive (gone needs evidence).
    fn still_alive(&self, lease: &AcpxProcessLease) -> Vec<LeaseSurvivor> {
        if lease.survivors.is_empty() {
            return Vec::new();
        }
        if let (Ok(current), Some(recorded)) = (self.table.boot_id(), lease.boot_id.as_deref())
            && current != recorded
        {
            return Vec::new();
        }
        lease
            .survivors
            .iter()
            .copied()
            .filter(|survivor| match self.table.open(survivor.pid) {
                Ok(None) => false,
                Err(_) => true,
                Ok(Some(handle)) => match handle.stat() {
                    Ok(Some(stat)) => !stat.zombie && stat.start_time == survivor.start_time,
                    Ok(None) => false,
                    Err(_) => true,
                },
            })
            .collect()
    }

    /// Looks again at this instance's leases left `closing` with survivors (the maintenance
    /// loop calls it): each is closed once its survivors are gone. A lease that cannot be
    /// settled now is logged and left for the next call.
    pub async fn recheck_survivors(
        &self,
        now: UnixMillis,
    ) -> Result<Vec<(LeaseId, CloseOutcome)>, AcpxError> {
        let leases = self
            .store
            .list_leases(Some(&self.instance), &[LeaseState::Closing])
            .await?;
        let mut outcomes = Vec::new();
        for lease in leases.into_iter().filter(|l| !l.survivors.is_empty()) {
            let lease_id = lease.lease_id.clone();
            let span = tracing::info_span!("acpx_recheck", lease_id = %lease_id);
            match self.end_lease(lease, now).instrument(span).await {
                Ok(outcome) => outcomes.push((lease_id, outcome)),
                Err(error) => tracing::warn!(lease_id = %lease_id, %error,
                    "survivors not rechecked; the next pass tries again"),
            }
        }
        Ok(outcomes)
    }

    /// Startup reaping: this instance's open and closing leases (never a scan for look-alike
    /// command lines), each verified and ended or marked; then retention of finished leases.
    pub async fn reap_startup_orphans(&self, now: UnixMillis) -> Result<ReapReport, AcpxError> {
        let leases = self
            .store
            .list_leases(
                Some(&self.instance),
                &[LeaseState::Open, LeaseState::Closing],
            )
            .await?;
        let running: Vec<LeaseId> = self
            .live
            .lock()
            .await
            .values()
            .map(|s| s.handle.lease_id.clone())
            .collect();
        // Before anything is signalled or written: leases served by another live gateway (a
        // copy of this state runs beside it) make this reap, and this start, refuse.
        let unserved: Vec<AcpxProcessLease> = leases
            .iter()
            .filter(|l| !running.contains(&l.lease_id))
            .cloned()
            .collect();
        if let Some(refusal) = self.another_gateway(&unserved) {
            return Err(refusal);
        }
        let mut report = ReapReport::default();
        for lease in leases {
            if running.contains(&lease.lease_id) {
                continue;
            }
            let lease_id = lease.lease_id.clone();
            let span = tracing::info_span!("acpx_reap", lease_id = %lease_id);
            let outcome = self.end_lease(lease, now).instrument(span).await?;
            report.outcomes.push((lease_id, outcome));
        }
        report.outcomes.extend(self.reap_lost_groups(now).await?);
        report.pruned = self.prune_finished(now).await?;
        Ok(report)
    }

    /// Bounded retention: forgets closed/lost leases that ended more than `retention` ago.
    pub async fn prune_finished(&self, now: UnixMillis) -> Result<u64, AcpxError> {
        // Saturating: a retention too long to count in milliseconds keeps everything (a
        // wrapped conversion would put the cutoff in the future and forget every lease).
        let retention = i64::try_from(self.config.retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = now.saturating_sub(retention);
        Ok(self.store.prune_finished_leases(cutoff).await?)
    }
}

fn parse_report(json: &str, wrapper_pid: u32) -> Result<u32, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("bad report {json:?}: {e}"))?;
    let root = value.get("rootPid").and_then(serde_json::Value::as_u64);
    let group = value
        .get("processGroupId")
        .and_then(serde_json::Value::as_u64)
        .and_then(|g| u32::try_from(g).ok());
    match (root, group) {
        (Some(root), Some(group)) if root == u64::from(wrapper_pid) => Ok(group),
        _ => Err(format!(
            "report {json:?} does not name wrapper pid {wrapper_pid}"
        )),
    }
}

type Stdio3 = (ChildStdin, ChildStdout, ChildStderr);

fn take_stdio(child: &mut std::process::Child) -> std::io::Result<Stdio3> {
    let missing = || std::io::Error::other("child stdio was not piped");
    let stdin = ChildStdin::from_std(child.stdin.take().ok_or_else(missing)?)?;
    let stdout = ChildStdout::from_std(child.stdout.take().ok_or_else(missing)?)?;
    let stderr = ChildStderr::from_std(child.stderr.take().ok_or_else(missing)?)?;
    Ok((stdin, stdout, stderr))
}

/// Reaps the wrapper we started once it exits, so no zombie lingers, without blocking. A task
/// polls: a blocking `wait` would hold one of the runtime's blocking threads per closing
/// wrapper (a burst of idle closes, a burst of threads) and hold up the runtime's shutdown
/// for a wrapper slow to end.
fn reap_child_later(mut child: std::process::Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    let pid = child.id();
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(10);
        loop {
            match child.try_wait() {
                Ok(None) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Ok(Some(_)) => {
                    tracing::debug!(pid, "wrapper reaped");
                    return;
                }
                Err(error) => {
                    tracing::warn!(pid, %error, "the wrapper could not be reaped");
                    return;
                }
            }
        }
    });
}

type SpawnJob = (
    Vec<String>,
    AgentEnv,
    tokio::sync::oneshot::Sender<std::io::Result<std::process::Child>>,
);

/// Wrappers are started from one dedicated thread that lives as long as the process:
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the wrapper ends, so forking from a
/// short-lived runtime thread would kill healthy sessions.
async fn spawn_wrapper(argv: &[String], env: &AgentEnv) -> std::io::Result<std::process::Child> {
    static SPAWNER: OnceLock<std::sync::Mutex<std_mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = std_mpsc::channel::<SpawnJob>();
        std::thread::Builder::new()
            .name("clawgate-acpx-spawner".into())
            .spawn(move || {
                for (argv, env, reply) in rx {
                    let _ = reply.send(spawn_now(&argv, &env));
                }
            })
            .map(|_| ())
            .unwrap_or_else(|error| tracing::error!(%error, "cannot start the spawner thread"));
        std::sync::Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
    sender
        .lock()
        .unwrap_or_else(|poison| poison.into_inner())
        .send((argv.to_vec(), env.clone(), reply_tx))
        .map_err(|_| std::io::Error::other("the wrapper spawner thread is gone"))?;
    reply_rx
        .await
        .map_err(|_| std::io::Error::other("the wrapper spawner thread dropped the request"))?
}

/// The wrapper starts from an empty environment plus `env`: the agent below it inherits
/// exactly that (and the wrapper's lease marks), never the gateway's tokens.
fn spawn_now(argv: &[String], env: &AgentEnv) -> std::io::Result<std::process::Child> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty wrapper command"))?;
    std::process::Command::new(program)
        .args(args)
        .env_clear()
        .envs(env.iter())
        .env(PARENT_PID_ENV, std::process::id().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}
