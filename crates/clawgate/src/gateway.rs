//! The running gateway: one state directory, its channels, agents and loops.
//!
//! Start order matters for exactly-once replies after a crash:
//! 1. the state directory is locked (one gateway per directory) and the store opened;
//! 2. agent processes left by an earlier run are reaped from *this instance's* leases;
//! 3. the send recovery pass runs (a preview without a final is removed, a recorded final is
//!    delivered or reconciled) before any inbound is polled;
//! 4. the receive loops poll from the durable watermark, so an update accepted but unfinished
//!    before the crash is processed again — and its reply key finds the delivered reply.
//!
//! One turn: inbound event → receive context (dedupe, echo gate, durable inbound record) →
//! session registry + signal log → agent prompt through the leased ACP runtime → live preview
//! edits → durable final (finalized in place) → receipt → the update is finished (watermark).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use clawgate_acpx::{ControllerConfig, EnsureInput, LifecycleController, system_table};
use clawgate_awareness::{
    Actor, Awareness, AwarenessConfig, NewSession, RetentionPolicy, StateChange,
};
use clawgate_channel_qa::{QaAdapter, QaPlatform, QaPlatformConfig, Update};
use clawgate_channel_sdk::NormalizedInbound;
use clawgate_messages::{
    AckController, DispatchError, LiveOptions, Messenger, PollingWatermark, ReceiveOptions,
    ReceiveOutcome, Receiver, SendOptions, SendOutcome, TransportAck,
};
use clawgate_store::{IntentStore, SqliteOptions, SqliteStore, Synchronous, WatermarkKey};
use clawgate_types::clock::{Clock, SystemClock};
use clawgate_types::{
    ChannelMessage, IntentId, IntentStatus, MessageBody, MessageDirection, MessageDurabilityPolicy,
    SessionKey, UnixMillis,
};
use tokio::sync::{Mutex, mpsc, watch};
use tracing::{Instrument, error, info, warn};

use crate::config::{Config, ConfigError};
use crate::state::{StateDir, StateLock};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("state database: {0}")]
    Store(#[from] clawgate_store::StoreError),
    #[error("agent runtime: {0}")]
    Acpx(#[from] clawgate_acpx::AcpxError),
    #[error("cannot find this program's own path (needed to start agents under the wrapper): {0}")]
    OwnPath(std::io::Error),
    #[error("cannot read the working directory (the agents' default cwd): {0}")]
    WorkingDir(std::io::Error),
    #[error("cannot read random bytes from /dev/urandom (for a token): {0}")]
    Random(std::io::Error),
    #[error("cannot start the embedded QA platform: {0}")]
    Platform(std::io::Error),
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

/// One configured chat account.
pub struct Channel {
    /// The channel name messages carry (`qa`, or `qa-<account>` for further accounts).
    pub name: String,
    pub account: String,
    pub agent_id: String,
    /// Holds the account token (its `Debug` never prints it).
    pub adapter: QaAdapter,
    pub base_url: String,
    /// The in-process platform, when this channel runs one.
    pub platform: Option<QaPlatform>,
    poll_timeout_ms: u64,
    max_turn_attempts: u32,
}

/// Never prints the token (the platform's configuration holds it too): a channel may end up in
/// a log line.
impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("name", &self.name)
            .field("account", &self.account)
            .field("agent_id", &self.agent_id)
            .field("base_url", &self.base_url)
            .field("adapter", &self.adapter)
            .field("embedded_platform", &self.platform.is_some())
            .finish_non_exhaustive()
    }
}

/// Counters shown by `status` and the control API.
#[derive(Debug, Default)]
pub struct Counters {
    pub turns_in_flight: AtomicUsize,
    /// Receive contexts running (a turn and the write that finishes its inbound record).
    pub receives_in_flight: AtomicUsize,
    pub turns_completed: AtomicU64,
    pub turns_failed: AtomicU64,
}

/// A started gateway.
pub struct Gateway {
    pub config: Config,
    pub state: StateDir,
    pub store: Arc<SqliteStore>,
    pub messenger: Messenger,
    pub awareness: Arc<Awareness<SqliteStore>>,
    pub acpx: Arc<LifecycleController<SqliteStore>>,
    pub channels: Vec<Arc<Channel>>,
    pub counters: Counters,
    pub started_at: UnixMillis,
    /// Agent argv per agent id (resolved once: the bundled agent is this binary).
    agents: HashMap<String, (Vec<String>, PathBuf)>,
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

/// Updates of one channel accepted and not finished yet; finishing one wakes the poll loop.
#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    finished: tokio::sync::Notify,
}

impl InFlight {
    fn busy(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }

    fn start(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    fn finish(&self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
        self.finished.notify_one();
    }
}

struct NoTransportAck;

/// Polling sources have no per-event transport ack: the offset (the durable watermark) is the
/// platform-side ack, moved only past finished updates.
impl TransportAck for NoTransportAck {
    fn ack(&self) {}
    fn nack(&self, _reason: &str) {}
}

fn now_ms() -> UnixMillis {
    SystemClock.now_ms()
}

/// 32 random bytes from the OS, hex.
pub fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

impl Gateway {
    /// Locks the state directory, opens the store, reaps earlier agent processes, starts the
    /// channels. Nothing is polled yet: [`Gateway::run`] does that after recovery.
    pub async fn start(config: Config) -> Result<Arc<Gateway>, GatewayError> {
        let state = StateDir::create(&config.state_dir)?;
        let lock = state.lock_exclusive()?;
        let options = SqliteOptions {
            synchronous: match config.durability.sync {
                crate::config::SyncMode::Full => Synchronous::Full,
                crate::config::SyncMode::Normal => Synchronous::Normal,
            },
            commit_hook: crate::crash_points::commit_hook(),
            ..SqliteOptions::default()
        };
        let store = Arc::new(SqliteStore::open_state_dir(state.path(), options)?);

        let exe = std::env::current_exe().map_err(GatewayError::OwnPath)?;
        let mut controller = ControllerConfig::new(exe.clone());
        controller.wrapper_args = vec![WRAPPER_SUBCOMMAND.to_owned()];
        controller.retention =
            Duration::from_secs(config.retention.lease_days.saturating_mul(86_400));
        let acpx =
            Arc::new(LifecycleController::new(store.clone(), system_table(), controller).await?);
        let report = acpx.reap_startup_orphans(now_ms()).await?;
        for (lease, outcome) in &report.outcomes {
            info!(%lease, ?outcome, "agent processes of an earlier run resolved");
        }
        if !report.outcomes.is_empty() {
            use clawgate_acpx::CloseOutcome as Outcome;
            let count =
                |of: fn(&Outcome) -> bool| report.outcomes.iter().filter(|(_, o)| of(o)).count();
            let reaped = count(|o| matches!(o, Outcome::Closed(_)));
            let gone = count(|o| matches!(o, Outcome::Lost(_) | Outcome::AlreadyFinished(_)));
            let refused = count(|o| matches!(o, Outcome::Refused(_)));
            let mut line = format!(
                "agent leases of an earlier run: {reaped} reaped (processes ended), {gone} already gone"
            );
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

        let mut agents = HashMap::new();
        for agent in &config.agents {
            let argv = if agent.command.is_empty() {
                vec![exe.display().to_string(), DEMO_AGENT_SUBCOMMAND.to_owned()]
            } else {
                agent.command.clone()
            };
            let cwd = match &agent.cwd {
                Some(dir) => dir.clone(),
                None => std::env::current_dir().map_err(GatewayError::WorkingDir)?,
            };
            agents.insert(agent.id.clone(), (argv, cwd));
        }

        let mut channels = Vec::new();
        for (n, section) in config.channels.iter().enumerate() {
            let name = if section.account == "default" {
                section.kind.clone()
            } else {
                format!("{}-{}", section.kind, section.account)
            };
            let configured_token = config.channel_token(n)?;
            let (platform, base_url, token) = match &section.base_url {
                Some(url) => (None, url.clone(), configured_token.unwrap_or_default()),
                None => {
                    let token = match configured_token {
                        Some(token) => token,
                        None => random_token().map_err(GatewayError::Random)?,
                    };
                    let platform = QaPlatform::start(QaPlatformConfig {
                        token: token.clone(),
                        state_path: Some(platform_state_file(state.path(), &name)),
                        ..QaPlatformConfig::default()
                    })
                    .await
                    .map_err(GatewayError::Platform)?;
                    let url = platform.base_url();
                    (Some(platform), url, token)
                }
            };
            let adapter = QaAdapter::new(&base_url, &token).with_channel(&name);
            channels.push(Arc::new(Channel {
                name,
                account: section.account.clone(),
                agent_id: section.agent.clone(),
                adapter,
                base_url,
                platform,
                poll_timeout_ms: section.poll_timeout_ms,
                max_turn_attempts: section.max_turn_attempts,
            }));
        }

        let clock = Arc::new(SystemClock);
        let messenger = Messenger::new(
            store.clone(),
            crate::crash_points::wrap(
                channels
                    .iter()
                    .map(|c| {
                        Arc::new(c.adapter.clone())
                            as Arc<dyn clawgate_channel_sdk::ChannelMessageAdapter>
                    })
                    .collect(),
            ),
            config.retry_policy(),
            clock.clone(),
            &acpx.instance_id().to_string(),
        );
        let (stop, _) = watch::channel(false);
        Ok(Arc::new(Gateway {
            config,
            state,
            store,
            messenger,
            awareness,
            acpx,
            channels,
            counters: Counters::default(),
            started_at: now_ms(),
            agents,
            clock,
            stop,
            _lock: lock,
        }))
    }

    /// Recovers pending sends, then runs the receive, recovery and retention loops until
    /// [`Gateway::shutdown`].
    pub async fn run(self: &Arc<Self>) {
        match self.messenger.recover().await {
            Ok(report) => {
                info!(?report, "startup send recovery done");
                if report.examined > 0 {
                    // What the operator should know after a crash, each reply counted once.
                    println!("{}", recovery_summary(&report));
                }
            }
            Err(e) => error!(error = %e, "startup send recovery failed; retried in the loop"),
        }
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
            tokio::spawn(async move { gateway.receive_loop(channel).await });
        }
        let gateway = self.clone();
        tokio::spawn(async move { gateway.maintenance_loop().await });
    }

    /// Tells every loop to stop.
    pub fn request_stop(&self) {
        let _ = self.stop.send(true);
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
        // The turns the closed sessions cut short end now: let each record what became of its
        // event (an interrupted attempt is given back) before the process exits.
        let deadline = tokio::time::Instant::now() + RECEIVE_SETTLE;
        while self.counters.receives_in_flight.load(Ordering::SeqCst) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn maintenance_loop(self: Arc<Self>) {
        let mut stop = self.stop.subscribe();
        let mut recovery = tokio::time::interval(Duration::from_secs(1));
        let mut retention = tokio::time::interval(Duration::from_secs(3600));
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = recovery.tick() => {
                    if let Err(e) = self.messenger.recover().await {
                        warn!(error = %e, "send recovery pass failed");
                    }
                }
                _ = retention.tick() => self.apply_retention().await,
            }
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

    /// Polls one channel from its durable watermark; each conversation is a lane processed in
    /// order, conversations run concurrently.
    async fn receive_loop(self: Arc<Self>, channel: Arc<Channel>) {
        let mut stop = self.stop.subscribe();
        let receiver = Arc::new(Receiver::new(
            self.store.clone(),
            Arc::new(channel.adapter.clone()),
            Arc::new(channel.adapter.clone()),
            self.clock.clone(),
            ReceiveOptions {
                max_attempts: channel.max_turn_attempts,
                ..ReceiveOptions::default()
            },
        ));
        let key = WatermarkKey {
            channel: channel.name.clone(),
            account_id: channel.account.clone(),
            source: "updates".into(),
        };
        // The watermark is where polling resumes: without it nothing is polled, so a store
        // that cannot be read yet (locked, busy) is retried rather than given up on.
        let watermark = loop {
            match PollingWatermark::open(self.store.clone(), self.clock.clone(), key.clone()).await
            {
                Ok(watermark) => break Arc::new(Mutex::new(watermark)),
                Err(e) => {
                    warn!(channel = %channel.name, error = %e, "polling watermark unreadable; retrying");
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        };
        let in_flight = Arc::new(InFlight::default());
        let mut lanes: HashMap<String, mpsc::UnboundedSender<Update>> = HashMap::new();
        let mut failures = 0u32;
        loop {
            if *stop.borrow() {
                return;
            }
            let offset = watermark.lock().await.next_offset();
            // Unfinished updates stay on the platform until the watermark passes them, so a
            // long poll would return at once while a turn runs: poll briefly instead.
            let busy = in_flight.busy();
            let timeout = if busy { 0 } else { channel.poll_timeout_ms };
            let updates = tokio::select! {
                _ = stop.changed() => return,
                updates = channel.adapter.get_updates(offset, timeout) => updates,
            };
            let updates = match updates {
                Ok(updates) => {
                    failures = 0;
                    updates
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = Duration::from_millis(200 * u64::from(failures.min(25)));
                    warn!(channel = %channel.name, error = %e.message, ?wait, "polling failed; retrying");
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep(wait) => continue,
                    }
                }
            };
            let mut accepted = 0;
            for update in updates {
                if !watermark.lock().await.accept(update.update_id) {
                    continue;
                }
                accepted += 1;
                in_flight.start();
                let conversation = update.message.conversation_id.clone();
                let lane = lanes.entry(conversation).or_insert_with(|| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(self.clone().lane(
                        channel.clone(),
                        receiver.clone(),
                        watermark.clone(),
                        in_flight.clone(),
                        rx,
                    ));
                    tx
                });
                // The lane lives as long as this loop holds its sender.
                let _ = lane.send(update);
            }
            if accepted == 0 && in_flight.busy() {
                // Until a turn finishes (then the long poll is possible again), new updates
                // are looked for every 25 ms.
                tokio::select! {
                    _ = stop.changed() => return,
                    _ = in_flight.finished.notified() => {}
                    _ = tokio::time::sleep(Duration::from_millis(25)) => {}
                }
            }
        }
    }

    /// One conversation's updates, in order. A failed turn is retried with backoff until it is
    /// handled or dead-lettered (the receive context counts attempts durably).
    async fn lane(
        self: Arc<Self>,
        channel: Arc<Channel>,
        receiver: Arc<Receiver>,
        watermark: Arc<Mutex<PollingWatermark>>,
        in_flight: Arc<InFlight>,
        mut updates: mpsc::UnboundedReceiver<Update>,
    ) {
        let stop = self.stop.subscribe();
        while let Some(update) = updates.recv().await {
            let raw = match serde_json::to_value(&update.message) {
                Ok(raw) => raw,
                Err(e) => {
                    error!(error = %e, "update not serializable");
                    continue;
                }
            };
            let mut attempt = 0u32;
            loop {
                if *stop.borrow() {
                    // Left unfinished: the next start replays it.
                    in_flight.finish();
                    return;
                }
                attempt += 1;
                let ack = AckController::new(Arc::new(NoTransportAck));
                let span = tracing::info_span!("turn", channel = %channel.name,
                    update = update.update_id, conversation = %update.message.conversation_id);
                let gateway = self.clone();
                let turn_channel = channel.clone();
                let settling = self.clone();
                let settle_channel = channel.clone();
                self.counters
                    .receives_in_flight
                    .fetch_add(1, Ordering::SeqCst);
                let outcome = receiver
                    .receive_or_settle(
                        &raw,
                        &ack,
                        |inbound| async move {
                            // A turn cut short by a stop is not the message's failure: its
                            // attempt is given back.
                            gateway.turn(&turn_channel, inbound).await.map_err(|e| {
                                if *gateway.stop.borrow() {
                                    DispatchError::interrupted(e)
                                } else {
                                    DispatchError::from(e)
                                }
                            })
                        },
                        |inbound| async move { settling.settle(&settle_channel, inbound).await },
                    )
                    .instrument(span)
                    .await;
                self.counters
                    .receives_in_flight
                    .fetch_sub(1, Ordering::SeqCst);
                let finished = match &outcome {
                    Ok(ReceiveOutcome::Failed {
                        dead_lettered: false,
                        error,
                        ..
                    }) => {
                        warn!(update = update.update_id, %error, attempt, "turn failed; retrying");
                        false
                    }
                    Ok(ReceiveOutcome::Failed {
                        dead_lettered: true,
                        error,
                        ..
                    }) => self.tell_of_failure(&channel, &raw, error).await,
                    // Dead-lettered by an earlier run that may have died before its notice was
                    // recorded: the notice is keyed by the event, so this sends it at most once.
                    Ok(ReceiveOutcome::Duplicate {
                        status: clawgate_store::InboundStatus::DeadLettered,
                    }) => {
                        self.tell_of_failure(&channel, &raw, "dead-lettered by an earlier run")
                            .await
                    }
                    Ok(_) => true,
                    Err(e) => {
                        warn!(update = update.update_id, error = %e, attempt, "receive failed; retrying");
                        false
                    }
                };
                if finished {
                    if let Err(e) = watermark.lock().await.finish(update.update_id).await {
                        // Not finished durably: the update replays after a restart, and its
                        // reply key finds the delivered reply.
                        warn!(error = %e, "watermark not advanced");
                    }
                    break;
                }
                let wait = Duration::from_millis(250 * u64::from(attempt.min(20)));
                tokio::time::sleep(wait).await;
            }
            in_flight.finish();
        }
    }

    /// A dead-lettered event gets one visible answer instead of silence: a short notice that the
    /// agent could not answer, marked as gateway-failure output (another gateway in the room
    /// drops it as an echo, by marker). Durable and keyed by the event: sent once. Returns
    /// whether the notice is recorded (else the update stays unfinished and this is asked
    /// again).
    async fn tell_of_failure(
        &self,
        channel: &Channel,
        raw: &serde_json::Value,
        error: &str,
    ) -> bool {
        use clawgate_channel_sdk::MessageReceiveAdapter as _;
        let Ok(inbound) = channel.adapter.normalize(raw) else {
            return true;
        };
        let key = format!("{}:failure:{}", channel.name, inbound.event_id);
        let mut notice = reply_message(
            channel,
            &inbound,
            &key,
            "The agent could not answer this message; it has been set aside for an operator. \
             Please try again later.",
        );
        notice.origin = Some(clawgate_types::MessageOrigin::gateway_failure(
            clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
        ));
        let options = SendOptions {
            durability: self.config.durability.policy.to_policy(),
            idempotency_key: Some(key),
            time_to_live_ms: None,
        };
        match self.messenger.send(notice, options).await {
            Ok(report) => {
                if !matches!(
                    report.outcome,
                    SendOutcome::AlreadySent { .. } | SendOutcome::InProgress { .. }
                ) {
                    warn!(event = %inbound.event_id, %error, "turn dead-lettered; the person was told");
                }
                true
            }
            Err(e) => {
                warn!(error = %e, "the failure notice could not be recorded; asked again");
                false
            }
        }
    }

    /// An event whose attempts all died with the process: no agent runs again, but a reply an
    /// attempt delivered (or recorded) before dying is finished and completes the event, and a
    /// stream it left without a final is ended (its preview removed) before the notice goes out.
    async fn settle(&self, channel: &Channel, inbound: NormalizedInbound) -> Result<(), String> {
        match self.reply_for(channel, &inbound.event_id).await? {
            Reply::Delivered => Ok(()),
            Reply::Recorded(id) => self.await_reply(&id).await,
            Reply::New(_) => Err(String::new()),
        }
    }

    /// One agent turn for an inbound message. Returns an error (retried) when the reply could
    /// not be produced; never sends a second reply for the same event.
    async fn turn(&self, channel: &Channel, inbound: NormalizedInbound) -> Result<(), String> {
        self.counters.turns_in_flight.fetch_add(1, Ordering::SeqCst);
        let result = self.turn_inner(channel, inbound).await;
        self.counters.turns_in_flight.fetch_sub(1, Ordering::SeqCst);
        match &result {
            Ok(()) => self
                .counters
                .turns_completed
                .fetch_add(1, Ordering::Relaxed),
            Err(_) => self.counters.turns_failed.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    async fn turn_inner(
        &self,
        channel: &Channel,
        inbound: NormalizedInbound,
    ) -> Result<(), String> {
        let conversation = inbound.message.target.id.clone();
        let session = session_key_for(&channel.agent_id, &channel.name, &conversation)?;
        self.register(&session, &channel.agent_id, &conversation)
            .await?;
        let author = inbound
            .message
            .sender
            .as_ref()
            .map_or_else(|| "unknown".to_owned(), |s| s.id.clone());
        // Best effort and deduplicated: a replayed turn logs the message once.
        self.awareness
            .record(
                &session,
                StateChange::human_direct_message(Actor::human(author), &channel.name)
                    .with_dedupe_key(format!("inbound:{}:{}", channel.name, inbound.event_id)),
            )
            .await;

        let reply_key = match self.reply_for(channel, &inbound.event_id).await? {
            Reply::New(key) => key,
            Reply::Delivered => {
                info!(event = %inbound.event_id, "the reply to this event was delivered already; nothing to do");
                return Ok(());
            }
            Reply::Recorded(id) => {
                // An earlier attempt recorded the final: it is delivered (or reconciled) before
                // the event is completed, never produced a second time.
                info!(event = %inbound.event_id, intent = %id, "the final of this event is recorded; finishing its delivery");
                return self.await_reply(&id).await;
            }
        };
        let (argv, cwd) = self
            .agents
            .get(&channel.agent_id)
            .cloned()
            .ok_or_else(|| format!("no agent {:?} configured", channel.agent_id))?;
        let handle = self
            .acpx
            .ensure_session(EnsureInput {
                session_key: session.clone(),
                agent_id: channel.agent_id.clone(),
                owner_session_key: session.clone(),
                spawned_by: None,
                adapter: argv,
                cwd,
                now: now_ms(),
            })
            .await
            .map_err(|e| e.to_string())?;

        let reply = reply_message(channel, &inbound, &reply_key, "");
        let options = SendOptions {
            durability: self.config.durability.policy.to_policy(),
            idempotency_key: Some(reply_key.clone()),
            time_to_live_ms: None,
        };
        let prompt = inbound
            .message
            .body
            .as_ref()
            .map(|b| b.text.clone())
            .unwrap_or_default();
        // Previews need a durable intent (a preview must never be orphaned): without one the
        // reply is sent once, at the end.
        let mut live = match options.durability {
            MessageDurabilityPolicy::Disabled => None,
            policy => match self
                .messenger
                .begin_live(reply.clone(), options.clone(), LiveOptions::default())
                .await
            {
                Ok(live) => Some(live),
                Err(e) if policy == MessageDurabilityPolicy::BestEffort => {
                    warn!(error = %e, "no durable intent for the reply (best_effort): no preview, sending at the end");
                    None
                }
                Err(e) => return Err(e.to_string()),
            },
        };

        // The agent streams chunks; the preview shows the text so far (edits coalesced by the
        // live context to the platform's rate).
        let (text_tx, mut text_rx) = mpsc::unbounded_channel::<String>();
        let mut so_far = String::new();
        let prompt_turn = self.acpx.prompt(&handle, &prompt, move |chunk| {
            so_far.push_str(chunk);
            let _ = text_tx.send(so_far.clone());
        });
        let preview = async {
            let mut error = None;
            while let Some(mut text) = text_rx.recv().await {
                while let Ok(newer) = text_rx.try_recv() {
                    text = newer;
                }
                if let Some(live) = live.as_mut()
                    && error.is_none()
                    && let Err(e) = live.update(&text).await
                {
                    error = Some(e.to_string());
                }
            }
            error
        };
        let (outcome, preview_error) = tokio::join!(prompt_turn, preview);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                if let Some(live) = live {
                    let _ = live.abandon().await;
                }
                return Err(format!("agent turn failed: {e}"));
            }
        };
        if let Some(e) = preview_error {
            warn!(error = %e, "preview update failed; the final is still delivered");
        }
        let mut text = outcome.chunks.concat();
        if text.trim().is_empty() {
            text = format!(
                "(the agent ended its turn without text: {:?})",
                outcome.stop_reason
            );
        }
        let final_message = reply_message(channel, &inbound, &reply_key, &text);
        let report = match live {
            Some(live) => live.finalize(final_message).await,
            None => self.messenger.send(final_message, options).await,
        }
        .map_err(|e| format!("the final could not be recorded or sent: {e}"))?;
        // The event is completed only once its final is committed: a final that is scheduled
        // for a retry or being reconciled is waited for here.
        match (&report.outcome, &report.intent_id) {
            (
                SendOutcome::Sent { .. }
                | SendOutcome::AlreadySent { .. }
                | SendOutcome::Partial { .. },
                _,
            )
            | (_, None) => {}
            (_, Some(id)) => self.await_reply(id).await?,
        }
        info!(outcome = ?report.outcome, "reply delivered");
        self.awareness
            .record(
                &session,
                StateChange::run_completed(Actor::agent(&session), "reply delivered")
                    .with_dedupe_key(format!("reply:{reply_key}")),
            )
            .await;
        Ok(())
    }

    /// Creates the session row on first contact.
    async fn register(
        &self,
        session: &SessionKey,
        agent_id: &str,
        conversation: &str,
    ) -> Result<(), String> {
        let known = self
            .awareness
            .session(session)
            .await
            .map_err(|e| e.to_string())?;
        if known.is_none() {
            let mut new = NewSession::new(session.clone());
            new.agent_id = Some(agent_id.to_owned());
            new.label = Some(conversation.to_owned());
            self.awareness
                .create_session(new, Actor::system("gateway"))
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Where this event's reply stands. Generations of one event's reply are keyed
    /// `<channel>:reply:<event>:<generation>`; a cancelled one (a stream that never produced
    /// its final) is passed over. A stream an earlier attempt left without a final (a crash,
    /// a store or platform failure) is ended here first — its preview removed, the intent
    /// cancelled — so a fresh reply never stands beside it.
    async fn reply_for(&self, channel: &Channel, event_id: &str) -> Result<Reply, String> {
        for generation in 0..1_000u32 {
            let key = format!("{}:reply:{}:{}", channel.name, event_id, generation);
            let found = self
                .store
                .find_intent_by_key(&key)
                .await
                .map_err(|e| e.to_string())?;
            let Some(intent) = found else {
                return Ok(Reply::New(key));
            };
            match intent.status {
                IntentStatus::Cancelled => continue,
                IntentStatus::Sent => return Ok(Reply::Delivered),
                _ if intent.awaits_final() => {
                    let ended = self
                        .messenger
                        .recover_intent(&intent.id)
                        .await
                        .map_err(|e| e.to_string())?;
                    if ended.is_some_and(|i| i.status == IntentStatus::Cancelled) {
                        continue;
                    }
                    return Err(format!(
                        "an earlier reply to event {event_id} (intent {}) is still streaming \
                         elsewhere or its preview could not be removed yet",
                        intent.id
                    ));
                }
                _ => return Ok(Reply::Recorded(intent.id)),
            }
        }
        Err(format!(
            "event {event_id} had 1000 abandoned replies; giving up"
        ))
    }

    /// Waits until a recorded final is committed, driving it meanwhile (a retry that is due,
    /// a reconciliation): `Ok` once it is sent, or handed to an operator (an unknown outcome
    /// the adapter cannot reconcile, a cancel); an error when it failed for good.
    async fn await_reply(&self, id: &IntentId) -> Result<(), String> {
        let mut stop = self.stop.subscribe();
        loop {
            let intent = self
                .messenger
                .recover_intent(id)
                .await
                .map_err(|e| format!("the reply's intent could not be read or worked on: {e}"))?
                .ok_or_else(|| format!("the reply's intent {id} is gone"))?;
            match intent.status {
                IntentStatus::Sent | IntentStatus::Cancelled => return Ok(()),
                IntentStatus::Failed => {
                    return Err(format!(
                        "the reply could not be delivered: {}",
                        intent
                            .failure
                            .as_ref()
                            .map_or("no failure recorded", |f| f.message.as_str())
                    ));
                }
                IntentStatus::UnknownAfterSend if intent.next_attempt_at.is_none() => {
                    warn!(intent = %id, "the reply's outcome is unknown and this channel cannot tell; left to an operator (outbox list)");
                    return Ok(());
                }
                _ => {}
            }
            if *stop.borrow() {
                return Err("stopping before the reply was delivered".into());
            }
            let wait = intent
                .next_attempt_at
                .map_or(250, |at| at.saturating_sub(now_ms()))
                .clamp(50, 1_000);
            tokio::select! {
                _ = stop.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())) => {}
            }
        }
    }
}

/// Where one event's reply stands (see [`Gateway::reply_for`]).
enum Reply {
    /// None yet: start one under this key.
    New(String),
    /// Delivered: nothing to do.
    Delivered,
    /// Its final is recorded and not committed yet.
    Recorded(IntentId),
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
    line
}

/// How long a stopping gateway waits for the turns its closed agent sessions cut short.
const RECEIVE_SETTLE: Duration = Duration::from_secs(5);

/// How many rows one retention write removes.
const PRUNE_SLICE: u32 = 500;

/// The instant `days` days ago.
fn days_before(days: u64) -> i64 {
    now_ms().saturating_sub(i64::try_from(days.saturating_mul(86_400_000)).unwrap_or(i64::MAX))
}

/// `agent:<agent>:<channel>:<conversation>` (characters a key refuses become `_`).
pub fn session_key_for(
    agent_id: &str,
    channel: &str,
    conversation: &str,
) -> Result<SessionKey, String> {
    let clean: String = conversation
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() || c == ':' {
                '_'
            } else {
                c
            }
        })
        .collect();
    SessionKey::for_agent(agent_id, &format!("{channel}:{clean}")).map_err(|e| e.to_string())
}

fn reply_message(
    channel: &Channel,
    inbound: &NormalizedInbound,
    reply_key: &str,
    text: &str,
) -> ChannelMessage {
    ChannelMessage {
        // Stable per reply key: the intent and the platform's idempotency key follow it.
        id: reply_key.to_owned(),
        channel: channel.name.clone(),
        account_id: Some(channel.account.clone()),
        direction: MessageDirection::Outbound,
        target: inbound.message.target.clone(),
        sender: None,
        body: Some(MessageBody {
            text: text.to_owned(),
            format: None,
        }),
        attachments: vec![],
        relation: None,
        origin: None,
        timestamp: None,
        raw: None,
    }
}

/// Where a state directory's files live.
pub fn platform_state_file(state: &Path, channel: &str) -> PathBuf {
    state.join(format!("{channel}-platform.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_never_prints_its_token() {
        let channel = Channel {
            name: "qa".into(),
            account: "default".into(),
            agent_id: "main".into(),
            adapter: QaAdapter::new("http://127.0.0.1:1", "s3cret-token"),
            base_url: "http://127.0.0.1:1".into(),
            platform: None,
            poll_timeout_ms: 1,
            max_turn_attempts: 1,
        };
        let printed = format!("{channel:?}");
        assert!(!printed.contains("s3cret-token"), "{printed}");
        assert!(printed.contains("redacted"), "{printed}");
        let adapter = format!("{:?}", channel.adapter);
        assert!(!adapter.contains("s3cret-token"), "{adapter}");
    }

    #[test]
    fn session_keys_are_agent_qualified_and_clean() {
        let key = session_key_for("main", "qa", "dm web:1").expect("key");
        assert_eq!(key.as_str(), "agent:main:qa:dm_web_1");
    }
}
