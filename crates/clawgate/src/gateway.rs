//! The running gateway: one state directory, its channels, agents and loops.
//!
//! Start order matters for exactly-once replies after a crash:
//! 1. the state directory is locked (one gateway per directory) and the store opened;
//! 2. agent processes left by an earlier run are reaped from *this instance's* leases;
//! 3. the receive loops poll from the durable watermark, so an update accepted but unfinished
//!    before the crash is processed again — and its reply key finds the reply an earlier
//!    attempt delivered or recorded (a recorded final is finished by the turn itself, a preview
//!    without a final removed first);
//! 4. beside them, paced send recovery passes drain every other due intent (claims keep each
//!    intent with one worker, so a turn and a pass never both send it).
//!
//! One turn: inbound event → receive context (dedupe, echo gate, durable inbound record) →
//! session registry + signal log → agent prompt through the leased ACP runtime → live preview
//! edits → durable final (finalized in place) → receipt → the update is finished (watermark).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clawgate_acpx::{AgentLimits, ControllerConfig, LifecycleController, system_table};
use clawgate_awareness::{Awareness, AwarenessConfig, RetentionPolicy};
use clawgate_channel_sdk::{ChannelRegistry, ChannelSetup, ChannelState, LegacyFiles, SetupError};
use clawgate_messages::{Messenger, ReceiveOptions, Receiver, SourceRunner, SourceStores};
use clawgate_store::{ChannelScope, Store, WatermarkKey};

use crate::ownership::{AccountOwnership, TenureEnd};
use clawgate_turns::{AgentCommand, Counters, TurnHandler, Turns};
use clawgate_types::UnixMillis;
use clawgate_types::clock::SystemClock;
use tokio::sync::watch;
use tracing::{info, warn};

pub use crate::channels::Channel;
use crate::config::{Config, ConfigError};
use crate::state::{StateDir, StateLock};

/// Now, in the clock every durable record uses.
pub(crate) fn now_ms() -> UnixMillis {
    use clawgate_types::clock::Clock as _;
    SystemClock.now_ms()
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("state database: {0}")]
    Store(#[from] clawgate_store::StoreError),
    #[error(transparent)]
    OpenStore(#[from] crate::store::OpenError),
    #[error("agent runtime: {0}")]
    Acpx(#[from] clawgate_acpx::AcpxError),
    /// Another live gateway runs with this state's instance id (a copied state directory):
    /// [`clawgate_acpx::AcpxError::AnotherGateway`] names its pid and what to do.
    #[error(transparent)]
    AnotherGateway(clawgate_acpx::AcpxError),
    #[error("cannot find this program's own path (needed to start agents under the wrapper): {0}")]
    OwnPath(std::io::Error),
    #[error("cannot create the agents' working directory under the state directory: {0}")]
    WorkingDir(std::io::Error),
    #[error("cannot read random bytes from /dev/urandom (for a token): {0}")]
    Random(std::io::Error),
    #[error("channel configuration: {0}")]
    Channel(SetupError),
    #[error(
        "will not listen on {0}: it is not a loopback address, and the control API (with the \
         operator's token) and the chat page are served on 127.0.0.1 or ::1 only; pass \
         --listen 127.0.0.1:<port> (0 for any free port)"
    )]
    NotLoopback(std::net::SocketAddr),
    #[error(
        "cannot listen on {addr}: {source}; set [gateway] listen in the configuration or pass \
         --listen 127.0.0.1:0 for a free port"
    )]
    Listen {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The program that serves as wrapper and bundled agent (this binary, multi-call).
pub const WRAPPER_SUBCOMMAND: &str = "acpx-wrapper";
pub const DEMO_AGENT_SUBCOMMAND: &str = "demo-agent";

/// A started gateway.
pub struct Gateway {
    pub config: Config,
    pub state: StateDir,
    pub store: Arc<dyn Store>,
    pub messenger: Messenger,
    pub awareness: Arc<Awareness>,
    pub acpx: Arc<LifecycleController>,
    pub channels: Vec<Arc<Channel>>,
    pub counters: Arc<Counters>,
    /// Runs the agent turns of every channel.
    pub turns: Arc<Turns>,
    pub started_at: UnixMillis,
    /// Agent argv per agent id (resolved once: the bundled agent is this binary).
    clock: Arc<SystemClock>,
    stop: watch::Sender<bool>,
    _lock: StateLock,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("state", &self.state.path())
            .finish_non_exhaustive()
    }
}

/// 32 random bytes from the OS, hex.
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Gateway {
    /// [`Gateway::start_with`] the channel kinds of this build ([`crate::channels::registry`]).
    pub async fn start(config: Config) -> Result<Arc<Gateway>, GatewayError> {
        let exe = std::env::current_exe().map_err(GatewayError::OwnPath)?;
        let registry = crate::channels::registry(&config.state_dir);
        Gateway::start_with(config, &registry, exe).await
    }

    /// Locks the state directory, opens the store, reaps earlier agent processes, builds the
    /// channels through the factories of `registry`. `program` is the `clawgate` binary: it
    /// serves as the agents' wrapper and bundled demo agent. Nothing is polled yet:
    /// [`Gateway::run`] does that after recovery.
    pub async fn start_with(
        config: Config,
        registry: &ChannelRegistry,
        program: PathBuf,
    ) -> Result<Arc<Gateway>, GatewayError> {
        let state = StateDir::create(&config.state_dir)?;
        state
            .refuse_read_only(config.state.backend)
            .map_err(crate::store::OpenError::Store)?;
        for change in state.make_private()? {
            warn!("{change}");
            println!("warning: {change}");
        }
        let lock = state.lock_exclusive()?;
        let store = crate::store::open(
            &config,
            state.path(),
            crate::store::Migrations::Apply,
            crate::crash_points::commit_hook(),
        )
        .await?;

        let exe = program;
        let mut controller = ControllerConfig::new(exe.clone());
        controller.wrapper_args = vec![WRAPPER_SUBCOMMAND.to_owned()];
        controller.retention =
            Duration::from_secs(config.retention.lease_days.saturating_mul(86_400));
        let acpx =
            Arc::new(LifecycleController::new(store.clone(), system_table(), controller).await?);
        let report = acpx
            .reap_startup_orphans(now_ms())
            .await
            .map_err(|error| match error {
                clawgate_acpx::AcpxError::AnotherGateway { .. } => {
                    GatewayError::AnotherGateway(error)
                }
                other => GatewayError::Acpx(other),
            })?;
        for (lease, outcome) in &report.outcomes {
            info!(%lease, ?outcome, "agent processes of an earlier run resolved");
        }
        if !report.outcomes.is_empty() {
            use clawgate_acpx::CloseOutcome as Outcome;
            let count =
                |of: fn(&Outcome) -> bool| report.outcomes.iter().filter(|(_, o)| of(o)).count();
            let reaped = count(|o| matches!(o, Outcome::Closed(_)));
            let survived = count(|o| matches!(o, Outcome::Survived(_)));
            let gone = count(|o| matches!(o, Outcome::Lost(_) | Outcome::AlreadyFinished(_)));
            let refused = count(|o| matches!(o, Outcome::Refused(_)));
            let mut line = format!(
                "agent leases of an earlier run: {reaped} reaped (processes ended), {gone} already gone"
            );
            if survived > 0 {
                line.push_str(&format!(
                    ", {survived} still closing (processes outlived KILL; `clawgate leases list` \
                     names them, and they are looked at again)"
                ));
            }
            if refused > 0 {
                line.push_str(&format!(
                    ", {refused} left alone (not verifiably ours; the log says why)"
                ));
            }
            println!("{line}");
        }

        let awareness = Arc::new(
            Awareness::builder(store.clone())
                .config(AwarenessConfig {
                    retention: RetentionPolicy {
                        max_age: Duration::from_secs(
                            config.retention.signal_log_days.saturating_mul(86_400),
                        ),
                        max_rows: config.retention.signal_log_max_rows,
                    },
                    ..AwarenessConfig::default()
                })
                .build(),
        );
        if let Err(e) = awareness.rebuild_notices().await {
            warn!(error = %e, "pending notices could not be rebuilt");
        }
        // On a shared database other gateways record events too: their notices for watchers
        // served here arrive through the store's change feed. (A SQLite state has one gateway.)
        if config.state.backend == crate::config::StateBackend::Postgres
            && let Err(e) = awareness.follow_external_changes()
        {
            warn!(error = %e, "other gateways' changes cannot be followed; notices they open wait for the next start");
        }

        let mut agents = HashMap::new();
        for agent in &config.agents {
            let argv = if agent.command.is_empty() {
                vec![exe.display().to_string(), DEMO_AGENT_SUBCOMMAND.to_owned()]
            } else {
                agent.command.clone()
            };
            let cwd = match &agent.cwd {
                Some(dir) => dir.clone(),
                None => state
                    .agent_dir(&agent.id)
                    .map_err(GatewayError::WorkingDir)?,
            };
            agents.insert(
                agent.id.clone(),
                AgentCommand::new(argv, cwd)
                    .with_env(agent_env(agent))
                    .with_busy_notice_after(Duration::from_secs(agent.busy_notice_secs))
                    .with_turn_limits(
                        Duration::from_secs(agent.turn_timeout_secs),
                        Duration::from_secs(agent.progress_notice_secs),
                        Duration::from_secs(agent.cancel_grace_secs),
                    ),
            );
            acpx.set_limits(
                &agent.id,
                AgentLimits {
                    max_live: Some(agent.max_live_or_default()),
                    idle_close: (agent.idle_close_secs > 0)
                        .then(|| Duration::from_secs(agent.idle_close_secs)),
                    reuse_processes: agent.reuse_processes,
                },
            );
        }

        let clock = Arc::new(SystemClock);
        // Files an earlier release kept in the state directory, read by every channel; a file
        // several accounts of a kind shared is set aside only after all of them imported it.
        let legacy = LegacyFiles::shared_in_dir(state.path());
        let mut channels = Vec::new();
        for (n, section) in config.channels.iter().enumerate() {
            let name = if section.account == "default" {
                section.kind.clone()
            } else {
                format!("{}-{}", section.kind, section.account)
            };
            let factory = registry.get(&section.kind).ok_or_else(|| {
                GatewayError::Channel(SetupError::new(
                    format!("channels[{n}].kind"),
                    format!(
                        "no channel kind {:?} in this build (known: {}); a kind's channel \
                         crate is compiled in by clawgate's cargo feature `channel-<kind>`",
                        section.kind,
                        registry.kinds().join(", ")
                    ),
                ))
            })?;
            let settings = serde_json::to_value(&section.settings).map_err(|e| {
                GatewayError::Channel(SetupError::new(
                    format!("channels[{n}].settings"),
                    e.to_string(),
                ))
            })?;
            // Channel state lives in the store, scoped to the account.
            let channel_state = ChannelState::new(
                store.clone(),
                ChannelScope::new(section.kind.clone(), section.account.clone()),
                clock.clone(),
            );
            let plugin = factory
                .build(
                    ChannelSetup::new(
                        n,
                        name.clone(),
                        section.account.clone(),
                        settings,
                        channel_state,
                    )
                    .with_legacy_files(legacy.clone()),
                )
                .await
                .map_err(GatewayError::Channel)?;
            if plugin.name() != name {
                return Err(GatewayError::Channel(SetupError::new(
                    format!("channels[{n}]"),
                    format!(
                        "the {} factory built channel {:?} instead of {name:?}",
                        section.kind,
                        plugin.name()
                    ),
                )));
            }
            channels.push(Arc::new(
                Channel::new(
                    name,
                    section.kind.clone(),
                    section.account.clone(),
                    section.agent.clone(),
                    plugin,
                    section.max_turn_attempts,
                )
                .with_allow_bots(section.allow_bots)
                .with_commands(section.commands),
            ));
        }
        // What they hold is stored: a file left in place would be read again (adding nothing),
        // but the operator is told rather than the gateway starting with it half-retired.
        if let Some((path, error)) = legacy.retire_noted().into_iter().next() {
            return Err(GatewayError::Channel(SetupError::new(
                "state directory",
                format!(
                    "{} (kept by an earlier release) was imported but could not be renamed \
                     with the suffix .imported: {error}; make the state directory writable or \
                     move the file aside, then start again (it adds nothing a second time)",
                    path.display()
                ),
            )));
        }

        let messenger = Messenger::new(
            store.clone(),
            crate::crash_points::wrap(channels.iter().map(|c| c.plugin.sender.clone()).collect()),
            config.retry_policy(),
            clock.clone(),
            &acpx.instance_id().to_string(),
        );
        let (stop, stopped) = watch::channel(false);
        let counters = Arc::new(Counters::default());
        let turns = Arc::new(Turns::new(
            store.clone(),
            messenger.clone(),
            awareness.clone(),
            acpx.clone(),
            agents,
            config.durability.policy.to_policy(),
            counters.clone(),
            stopped,
        ));
        Ok(Arc::new(Gateway {
            config,
            state,
            store,
            messenger,
            awareness,
            acpx,
            channels,
            counters,
            turns,
            started_at: now_ms(),
            clock,
            stop,
            _lock: lock,
        }))
    }

    /// Starts the receive loops and the maintenance loop (send recovery, retention) until
    /// [`Gateway::shutdown`]. Pending sends are recovered by the maintenance loop's passes,
    /// beside the receive loops: a backlog left by an outage never holds new messages back.
    pub async fn run(self: &Arc<Self>) {
        match clawgate_store::InboundStore::list_unfinished_inbound(&*self.store, 100_000).await {
            Ok(unfinished) if !unfinished.is_empty() => println!(
                "inbound: {} message(s) accepted before the restart and not answered yet; \
                 their turns run again",
                unfinished.len()
            ),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "unfinished inbound records could not be counted"),
        }
        for channel in &self.channels {
            let gateway = self.clone();
            let channel = channel.clone();
            tokio::spawn(async move { gateway.serve_channel(channel).await });
        }
        let gateway = self.clone();
        tokio::spawn(async move { gateway.maintenance_loop().await });
    }

    /// Tells every loop to stop.
    pub fn request_stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Turns `true` once the gateway is told to stop (long-lived answers, such as the control
    /// API's event stream, end with it).
    pub fn stopped(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Clean shutdown: stop polling, let running turns finish (bounded), then close every
    /// agent session through the controller (leases closed). A turn still running then fails,
    /// its preview is removed, and its event stays unfinished: the next start replays it.
    pub async fn shutdown(&self) {
        self.request_stop();
        let grace = Duration::from_millis(self.config.gateway.shutdown_grace_ms);
        let deadline = tokio::time::Instant::now() + grace;
        while self.counters.turns_in_flight.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.close_agent_sessions().await;
        // The turns the closed sessions cut short end now: let each record what became of its
        // event (an interrupted attempt is given back) before the process exits.
        let deadline = tokio::time::Instant::now() + RECEIVE_SETTLE;
        while self.counters.receives_in_flight.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A receive context that was recording its event when the stop came may have opened a
        // session after the first pass (its turn refuses to once it sees the stop, but the
        // check and the open are not one step): close what is open now too.
        self.close_agent_sessions().await;
    }

    /// Closes every live agent session through the controller (verified, lease closed). A
    /// turn still running is asked to cancel first (`session/cancel`), so the agent ends it
    /// itself before its process goes.
    async fn close_agent_sessions(&self) {
        if self.turns.cancel_running().await > 0 {
            let deadline = tokio::time::Instant::now() + CANCEL_BEFORE_CLOSE;
            while self.counters.turns_in_flight.load(Ordering::SeqCst) > 0
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        for key in self.acpx.live_sessions().await {
            match self
                .acpx
                .close_session(&key, "gateway shutdown", now_ms())
                .await
            {
                Ok(outcome) => info!(session = %key, ?outcome, "agent session closed"),
                Err(e) => warn!(session = %key, error = %e, "agent session not closed"),
            }
        }
    }

    async fn maintenance_loop(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        let mut recovery = tokio::time::interval(Duration::from_secs(1));
        let mut retention = tokio::time::interval(Duration::from_secs(3600));
        let mut first_pass = true;
        let mut survivors = tokio::time::interval(SURVIVOR_RECHECK);
        let mut idle = tokio::time::interval(IDLE_SWEEP);
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = survivors.tick() => self.recheck_survivors().await,
                _ = idle.tick() => {
                    let closed = self.acpx.close_idle(now_ms()).await;
                    if closed > 0 {
                        info!(closed, "idle agent sessions closed");
                        if self.counters.turns_in_flight.load(Ordering::SeqCst) == 0 {
                            // Quiet again after work: the burst's freed heap goes back.
                            crate::memory::release_free_heap();
                        }
                    }
                }
                _ = recovery.tick() => {
                    match self.messenger.recover_paced(&RECOVERY_PACE).await {
                        Ok(report) if first_pass => {
                            first_pass = false;
                            info!(?report, "startup send recovery done");
                            if report.examined + report.deferred > 0 {
                                // What the operator should know after a crash, each reply
                                // counted once.
                                println!("{}", recovery_summary(&report));
                            }
                        }
                        Ok(_) => {}
                        Err(e) => warn!(error = %e, "send recovery pass failed; the next pass tries again"),
                    }
                }
                _ = retention.tick() => self.apply_retention().await,
            }
        }
    }

    /// Closes the leases whose processes outlived KILL once those are gone.
    async fn recheck_survivors(&self) {
        match self.acpx.recheck_survivors(now_ms()).await {
            Ok(outcomes) => {
                for (lease, outcome) in outcomes {
                    info!(%lease, ?outcome, "lease with processes that outlived KILL looked at again");
                }
            }
            Err(e) => warn!(error = %e, "survivor recheck failed"),
        }
    }

    async fn apply_retention(&self) {
        if let Err(e) = self.awareness.apply_retention().await {
            warn!(error = %e, "signal log retention failed");
        }
        if let Err(e) = self.acpx.prune_finished(now_ms()).await {
            warn!(error = %e, "lease retention failed");
        }
        let inbound_cutoff = days_before(self.config.retention.inbound_days);
        self.prune_in_slices("inbound", |slice| {
            clawgate_store::InboundStore::prune_completed_inbound(
                &*self.store,
                inbound_cutoff,
                slice,
            )
        })
        .await;
        let outbox_cutoff = days_before(self.config.retention.outbox_days);
        self.prune_in_slices("outbox", |slice| {
            clawgate_store::IntentStore::prune_finished_intents(&*self.store, outbox_cutoff, slice)
        })
        .await;
    }

    /// Runs `prune` until a slice comes back short: each slice is one write of the queue every
    /// send shares, and a stop is heard between them.
    async fn prune_in_slices<F, Fut>(&self, what: &str, prune: F)
    where
        F: Fn(u32) -> Fut,
        Fut: std::future::Future<Output = clawgate_store::StoreResult<u64>>,
    {
        while !*self.stop.borrow() {
            match prune(PRUNE_SLICE).await {
                Ok(n) if n < u64::from(PRUNE_SLICE) => break,
                Ok(_) => {}
                Err(e) => {
                    warn!(error = %e, "{what} retention failed");
                    break;
                }
            }
        }
    }

    /// Serves one channel account's inbound source while this gateway holds the account's
    /// lease (with several gateways on one database, one serves each account); waits for it
    /// again when another gateway took it.
    async fn serve_channel(self: Arc<Self>, channel: Arc<Channel>) {
        if channel.plugin.receiver.is_none() {
            return;
        }
        let ownership = AccountOwnership::new(
            self.store.clone(),
            self.acpx.instance_id().clone(),
            Duration::from_secs(self.config.state.account_lease_secs),
            self.clock.clone(),
        );
        let account = format!("{}/{}", channel.kind, channel.account);
        let mut stop = self.stop.subscribe();
        loop {
            let Some(lease) = ownership.acquire(&account, &mut stop).await else {
                return;
            };
            let (tenure, tenure_stop) = watch::channel(false);
            let runner = tokio::spawn(self.clone().receive_loop(channel.clone(), tenure_stop));
            let end = ownership.hold(lease, &mut stop).await;
            let _ = tenure.send(true);
            let _ = runner.await;
            if let TenureEnd::Stopped(lease) = end {
                ownership.release(&lease).await;
                return;
            }
        }
    }

    /// Runs one channel's inbound source until `stop`: each event through the channel's
    /// receive context to a turn.
    async fn receive_loop(self: Arc<Self>, channel: Arc<Channel>, stop: watch::Receiver<bool>) {
        let Some(normalizer) = channel.plugin.receiver.clone() else {
            return;
        };
        // Beside receiving, not before it: each untold dead letter is a send, and an
        // unreachable platform must not hold up the channel's new events.
        {
            let (turns, channel) = (self.turns.clone(), channel.clone());
            let since = now_ms().saturating_sub(UNTOLD_DEAD_LETTERS_WINDOW_MS);
            tokio::spawn(async move { turns.tell_untold_dead_letters(&channel, since).await });
        }
        let receiver = Receiver::new(
            self.store.clone(),
            channel.plugin.sender.clone(),
            normalizer.clone(),
            self.clock.clone(),
            ReceiveOptions {
                max_attempts: channel.max_turn_attempts,
                allow_bots: channel.allow_bots,
                account_id: Some(channel.account.clone()),
                ..ReceiveOptions::default()
            },
        );
        let key = WatermarkKey {
            channel: channel.name.clone(),
            account_id: channel.account.clone(),
            source: "updates".into(),
        };
        let handler = Arc::new(TurnHandler::new(
            self.turns.clone(),
            channel.clone(),
            receiver,
        ));
        SourceRunner::new(
            key,
            channel.plugin.source.clone(),
            normalizer,
            SourceStores {
                watermarks: self.store.clone(),
                inbound: self.store.clone(),
            },
            self.clock.clone(),
            handler,
            stop,
        )
        .run()
        .await;
    }
}

/// The startup line about the sends an earlier run left unfinished.
fn recovery_summary(report: &clawgate_messages::RecoveryReport) -> String {
    let mut line = format!(
        "send recovery: {} unfinished intent(s) examined: {} delivered",
        report.examined, report.committed
    );
    if report.reconciled_sent + report.reconciled_not_sent > 0 {
        line.push_str(&format!(
            " ({} part(s) found on the platform already, {} resent after the platform proved \
             them missing)",
            report.reconciled_sent, report.reconciled_not_sent
        ));
    }
    line.push_str(&format!(
        ", {} reply stream(s) without a final cancelled (their messages are answered again), \
         {} rescheduled, {} unknown outcome(s), {} failed",
        report.abandoned, report.rescheduled, report.unknown, report.failed
    ));
    if report.deferred > 0 {
        line.push_str(&format!(
            "; {} more left for the next passes (paced; new messages are answered meanwhile)",
            report.deferred
        ));
    }
    line
}

/// How each send recovery pass paces itself: a few intents per channel at once (a channel that
/// answers "rate limited" is left for the next pass), and at most half a minute per pass, so a
/// backlog drains over passes while replies to new messages go out beside it.
const RECOVERY_PACE: clawgate_messages::RecoveryPace = clawgate_messages::RecoveryPace {
    per_channel: 16,
    time_budget: Some(Duration::from_secs(30)),
};

/// How often sessions are looked at for idleness (an idle close happens within this of its
/// time).
const IDLE_SWEEP: Duration = Duration::from_secs(1);

/// How long a stopping gateway waits for the turns its closed agent sessions cut short.
const RECEIVE_SETTLE: Duration = Duration::from_secs(5);
/// How long running turns get to end after `session/cancel` before their sessions close.
const CANCEL_BEFORE_CLOSE: Duration = Duration::from_secs(2);

/// The environment of `agent`'s processes: the base allowlist, the variables it passes
/// through from the gateway's environment, then the ones it sets (validated already: none is
/// a gateway secret).
fn agent_env(agent: &crate::config::AgentSection) -> clawgate_acpx::AgentEnv {
    let mut env = clawgate_acpx::AgentEnv::base();
    for name in &agent.env_passthrough {
        if !env.pass_through(name) {
            warn!(agent = %agent.id, variable = %name,
                "env_passthrough names a variable the gateway's environment does not have");
        }
    }
    for (name, value) in &agent.env {
        env.set(name, value);
    }
    env
}

/// How many rows one retention write removes.
const PRUNE_SLICE: u32 = 500;
/// How far back a taken account looks for dead letters whose failure notice a crash cut off:
/// a day, so that a gateway down for a while still tells, but an old dead letter (or one from
/// before notices were recorded) does not reach a person out of the blue.
const UNTOLD_DEAD_LETTERS_WINDOW_MS: i64 = 24 * 60 * 60 * 1_000;
/// How often leases left `closing` by processes that outlived KILL are looked at again (such a
/// process is usually in an uninterruptible sleep that ends within seconds).
const SURVIVOR_RECHECK: Duration = Duration::from_secs(10);

/// The instant `days` days ago.
fn days_before(days: u64) -> i64 {
    now_ms().saturating_sub(i64::try_from(days.saturating_mul(86_400_000)).unwrap_or(i64::MAX))
}
