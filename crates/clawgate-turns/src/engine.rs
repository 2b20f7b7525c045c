//! The turn engine: what a turn needs of its host (the stores, engines, agents and the stop
//! signal), and one turn from an inbound event to its committed final.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use clawgate_acpx::{
    AcpRuntimeHandle, AgentEnv, EnsureInput, LifecycleController, SessionStart, SessionUse,
};
use clawgate_awareness::{Actor, Awareness, NewSession, Notice, StateChange};
use clawgate_channel_sdk::NormalizedInbound;
use clawgate_messages::{LiveOptions, Messenger, SendOptions, SendOutcome};
use clawgate_store::Store;
use clawgate_types::{IntentId, IntentStatus, MessageDurabilityPolicy, SessionKey};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use crate::commands::Command;
use crate::keys::{busy_key, failure_key, progress_key, reply_key, reply_message, session_key_for};
use crate::{Channel, TurnError};

/// Now, in the clock every durable record uses.
pub(crate) fn now_ms() -> clawgate_types::UnixMillis {
    use clawgate_types::clock::Clock as _;
    clawgate_types::clock::SystemClock.now_ms()
}

/// Counters shown by `status` and the control API.
#[derive(Debug, Default)]
pub struct Counters {
    /// Agent turns running.
    pub turns_in_flight: AtomicUsize,
    /// Receive contexts running (a turn and the write that finishes its inbound record).
    pub receives_in_flight: AtomicUsize,
    /// Turns that ended with their reply delivered (or left to an operator).
    pub turns_completed: AtomicU64,
    /// Turns that ended with an error (their events are tried again).
    pub turns_failed: AtomicU64,
    /// Turns an agent refused because it is not logged in (not retried).
    pub agent_auth_failures: AtomicU64,
    /// Prompts cancelled at their agent's `turn_timeout`.
    pub turn_deadlines: AtomicU64,
    /// Turns a person (`/stop`) or an operator cancelled.
    pub turns_cancelled: AtomicU64,
}

/// A turn whose agent is prompted now: what `/stop` needs to reach it.
#[derive(Debug)]
struct Running {
    handle: AcpRuntimeHandle,
    /// Set by a cancel from a person or an operator: the turn's final says it was stopped.
    cancelled: Arc<CancelFlag>,
}

/// Set once when a person or an operator cancels a turn; the turn waits on it.
#[derive(Debug, Default)]
struct CancelFlag {
    set: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl CancelFlag {
    fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        // One waiter (the turn): a permit is kept if it is not waiting yet.
        self.notify.notify_one();
    }

    fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    async fn wait(&self) {
        while !self.is_set() {
            self.notify.notified().await;
        }
    }
}

/// The line a preview shows while the agent works without visible output.
const STILL_WORKING: &str = "⏳ The agent is still working on this…";

/// Takes a running turn out of the table when the turn ends, however it ends.
struct RunningGuard<'a> {
    turns: &'a Turns,
    session: SessionKey,
}

impl Drop for RunningGuard<'_> {
    fn drop(&mut self) {
        self.turns
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.session);
    }
}

/// How one agent is started: its ACP adapter's argv and working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentCommand {
    /// The adapter's program and arguments.
    pub argv: Vec<String>,
    /// The directory it runs in.
    pub cwd: PathBuf,
    /// Its whole environment (`Debug` shows names only).
    pub env: AgentEnv,
    /// A turn that waits this long for an agent session (every one busy at the agent's
    /// `max_live`) tells the person once that the message is queued.
    pub busy_notice_after: Duration,
    /// One prompt may run this long; then the turn is cancelled (`session/cancel`, the session
    /// closed if the agent does not end the turn within `cancel_grace`) and counted as a
    /// failed attempt.
    pub turn_timeout: Duration,
    /// After this long without visible output the person is told once that the agent is
    /// still working.
    pub progress_notice_after: Duration,
    /// How long an agent asked to cancel a turn may take to end it before its session is
    /// closed.
    pub cancel_grace: Duration,
}

/// How long a turn waits for a busy agent before the person is told, by default.
pub const DEFAULT_BUSY_NOTICE_AFTER: Duration = Duration::from_secs(30);
/// How long one prompt may run, by default.
pub const DEFAULT_TURN_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a turn runs without visible output before the person hears it is still working.
pub const DEFAULT_PROGRESS_NOTICE_AFTER: Duration = Duration::from_secs(60);
/// How long a cancelled turn may take to end, by default.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(10);

impl AgentCommand {
    /// The adapter `argv`, run in `cwd` with the base environment
    /// ([`AgentEnv::base`]: `PATH`, `HOME`, locale, `TERM`, `TMPDIR`, `USER`).
    pub fn new(argv: Vec<String>, cwd: impl Into<PathBuf>) -> AgentCommand {
        AgentCommand {
            argv,
            cwd: cwd.into(),
            env: AgentEnv::base(),
            busy_notice_after: DEFAULT_BUSY_NOTICE_AFTER,
            turn_timeout: DEFAULT_TURN_TIMEOUT,
            progress_notice_after: DEFAULT_PROGRESS_NOTICE_AFTER,
            cancel_grace: DEFAULT_CANCEL_GRACE,
        }
    }

    /// As [`AgentCommand::new`], started with exactly `env`.
    #[must_use]
    pub fn with_env(mut self, env: AgentEnv) -> AgentCommand {
        self.env = env;
        self
    }

    /// As [`AgentCommand::new`], with a prompt deadline of `timeout`, a progress notice after
    /// `progress` without output, and `grace` for a cancelled turn to end.
    #[must_use]
    pub fn with_turn_limits(
        mut self,
        timeout: Duration,
        progress: Duration,
        grace: Duration,
    ) -> AgentCommand {
        self.turn_timeout = timeout;
        self.progress_notice_after = progress;
        self.cancel_grace = grace;
        self
    }

    /// As [`AgentCommand::new`], telling a person whose turn waits `after` for a busy agent.
    #[must_use]
    pub fn with_busy_notice_after(mut self, after: Duration) -> AgentCommand {
        self.busy_notice_after = after;
        self
    }
}

/// The live preview options of `channel`: its configured preview age, else the default.
fn live_options(channel: &Channel) -> LiveOptions {
    let mut options = LiveOptions::default();
    if let Some(age) = channel.plugin.preview_stale_after {
        options.stale_after_ms = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
    }
    options
}

/// Shows the channel's typing indicator in `target` at its interval, forever (the caller drops
/// it when the agent is done); never resolves on a channel without one.
async fn show_typing(
    channel: &Channel,
    target: &clawgate_types::MessageTarget,
) -> std::convert::Infallible {
    let sender = &channel.plugin.sender;
    let Some(interval) = sender.typing_interval() else {
        return std::future::pending().await;
    };
    loop {
        if let Err(error) = sender.show_typing(target).await {
            tracing::debug!(error = %error.message, "typing indicator not shown");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Runs the agent turns of every channel of one host: the stores, engines and agents a turn
/// needs, and the host's stop signal.
pub struct Turns {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) messenger: Messenger,
    awareness: Arc<Awareness>,
    acpx: Arc<LifecycleController>,
    /// Agent command per agent id.
    agents: HashMap<String, AgentCommand>,
    pub(crate) durability: MessageDurabilityPolicy,
    pub(crate) counters: Arc<Counters>,
    stop: watch::Receiver<bool>,
    /// The control API's `http://host:port`, once it listens: stale-state notices in a
    /// prompt link to the changed session's status there.
    control_url: std::sync::OnceLock<String>,
    /// The turns prompting their agent now, by session.
    running: std::sync::Mutex<HashMap<SessionKey, Running>>,
}

/// How many replies of one event may be abandoned before the event is given up.
const MAX_REPLY_GENERATIONS: u32 = 1_000;

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Turns")
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Turns {
    /// The engine over `store` (the same one `messenger`, `awareness` and `acpx` use): replies
    /// are sent through `messenger` with `durability`, agents started through `acpx` from
    /// `agents` (by agent id), progress counted in `counters`. Once `stop` turns `true`, a turn
    /// waiting for its final gives up ([`TurnError::Stopping`]) and its attempt is given back.
    pub fn new(
        store: Arc<dyn Store>,
        messenger: Messenger,
        awareness: Arc<Awareness>,
        acpx: Arc<LifecycleController>,
        agents: HashMap<String, AgentCommand>,
        durability: MessageDurabilityPolicy,
        counters: Arc<Counters>,
        stop: watch::Receiver<bool>,
    ) -> Turns {
        Turns {
            store,
            messenger,
            awareness,
            acpx,
            agents,
            durability,
            counters,
            stop,
            control_url: std::sync::OnceLock::new(),
            running: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// Where the control API listens (`http://host:port`): from now on the stale-state notices
    /// placed in prompts link to the changed session's status. Set once; later calls are
    /// ignored (the address is fixed for the run, so a pending notice's text stays the same).
    pub fn set_control_url(&self, url: impl Into<String>) {
        let _ = self.control_url.set(url.into());
    }

    /// The prompt of a turn: the watcher's pending stale-state notices, one line each, then the
    /// message. The agent sees what changed in the sessions it watches before it acts.
    fn prompt_with_notices(&self, notices: &[Notice], text: &str) -> String {
        if notices.is_empty() {
            return text.to_owned();
        }
        let url = self.control_url.get().map(String::as_str);
        let mut prompt = String::new();
        for notice in notices {
            prompt.push_str(&notice.text_with_link(url));
            prompt.push('\n');
        }
        prompt.push('\n');
        prompt.push_str(text);
        prompt
    }

    /// The counters this engine updates.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    /// Whether the host is stopping.
    pub(crate) fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// A dead-lettered event gets one visible answer instead of silence: a short notice that the
    /// agent could not answer, marked as gateway-failure output (another gateway in the room
    /// drops it as an echo, by marker). Durable and keyed by the event: sent once. Returns
    /// whether the notice is recorded (else the update stays unfinished and this is asked
    /// again).
    pub(crate) async fn tell_of_failure(
        &self,
        channel: &Channel,
        raw: &serde_json::Value,
        error: &str,
    ) -> bool {
        let Some(Ok(inbound)) = channel.plugin.receiver.as_ref().map(|r| r.normalize(raw)) else {
            return true;
        };
        let key = failure_key(&channel.name, &inbound.event_id);
        let text = "The agent could not answer this message; it has been set aside for an \
                    operator. Please try again later.";
        let code = clawgate_types::GatewayFailureCode::AgentFailedBeforeReply;
        match self.send_notice(channel, &inbound, key, text, code).await {
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

    /// The person's message reached an agent that is not logged in: they are told so (no
    /// secret, no internals) under the event's failure key, so the dead-letter notice that
    /// follows finds it sent and says nothing more.
    async fn tell_not_logged_in(&self, channel: &Channel, inbound: &NormalizedInbound) {
        let key = failure_key(&channel.name, &inbound.event_id);
        let text = "The agent is not logged in, so it cannot answer right now. An operator has \
                    been told; your message has been set aside.";
        let code = clawgate_types::GatewayFailureCode::MissingApiKey;
        if let Err(e) = self.send_notice(channel, inbound, key, text, code).await {
            warn!(error = %e, "the not-logged-in notice could not be recorded; the failure notice follows");
        }
    }

    /// An event whose attempts all died with the process: no agent runs again, but a reply an
    /// attempt delivered (or recorded) before dying is finished and completes the event, and a
    /// stream it left without a final is ended (its preview removed) before the notice goes out.
    pub(crate) async fn settle(
        &self,
        channel: &Channel,
        inbound: NormalizedInbound,
    ) -> Result<(), String> {
        let settled = match self.reply_for(channel, &inbound.event_id).await {
            Ok(Reply::Delivered) => Ok(()),
            Ok(Reply::Recorded(id)) => self.await_reply(&id).await,
            Ok(Reply::New(_)) => return Err(String::new()),
            Err(e) => Err(e),
        };
        settled.map_err(|e| e.to_string())
    }

    /// One agent turn for an inbound message on `channel`. Returns an error (retried) when the
    /// reply could not be produced; never sends a second reply for the same event.
    pub async fn turn(
        &self,
        channel: &Channel,
        inbound: NormalizedInbound,
    ) -> Result<(), TurnError> {
        self.turn_by(channel, inbound, None).await
    }

    /// [`Turns::turn`], with the message's author in the signal log given as `author` (an
    /// agent session relaying through `sessions_send`: identified by its session key, so its
    /// own message opens no notice for it) instead of the platform sender.
    pub(crate) async fn turn_by(
        &self,
        channel: &Channel,
        inbound: NormalizedInbound,
        author: Option<Actor>,
    ) -> Result<(), TurnError> {
        self.counters.turns_in_flight.fetch_add(1, Ordering::SeqCst);
        let asked = inbound.clone();
        let result = self.turn_inner(channel, inbound, author).await;
        self.counters.turns_in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Err(error) = &result
            && error.is_agent_auth()
        {
            self.counters
                .agent_auth_failures
                .fetch_add(1, Ordering::Relaxed);
            self.tell_not_logged_in(channel, &asked).await;
        }
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
        author: Option<Actor>,
    ) -> Result<(), TurnError> {
        let conversation = inbound.message.target.id.clone();
        let session = session_key_for(&channel.agent_id, &channel.name, &conversation)?;
        self.register(&session, &channel.agent_id, &conversation)
            .await?;
        let author = author.unwrap_or_else(|| {
            Actor::human(
                inbound
                    .message
                    .sender
                    .as_ref()
                    .map_or_else(|| "unknown".to_owned(), |s| s.id.clone()),
            )
        });
        // Best effort and deduplicated: a replayed turn logs the message once.
        self.awareness
            .record(
                &session,
                StateChange::human_direct_message(author, &channel.name)
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
        let text = inbound
            .message
            .body
            .as_ref()
            .map(|b| b.text.clone())
            .unwrap_or_default();
        if channel.commands
            && let Some(command) = Command::parse(&text)
        {
            return self
                .answer_command(channel, &inbound, &session, &reply_key, command)
                .await;
        }
        let AgentCommand {
            argv,
            cwd,
            env,
            busy_notice_after,
            turn_timeout,
            progress_notice_after,
            cancel_grace,
        } = self
            .agents
            .get(&channel.agent_id)
            .cloned()
            .ok_or_else(|| TurnError::NoAgent(channel.agent_id.clone()))?;
        // No agent session is opened once the gateway stops (its sessions are being closed).
        if self.stopping() {
            return Err(TurnError::Stopping);
        }
        let session_use = self
            .agent_session(
                channel,
                &inbound,
                EnsureInput {
                    session_key: session.clone(),
                    agent_id: channel.agent_id.clone(),
                    owner_session_key: session.clone(),
                    spawned_by: None,
                    adapter: argv,
                    env,
                    cwd,
                    now: now_ms(),
                },
                busy_notice_after,
            )
            .await?;
        let handle = session_use.handle().clone();
        if let SessionStart::Fresh { why, .. } = &handle.start {
            // The agent's memory of the conversation is gone: say so where watchers look.
            self.awareness
                .record(
                    &session,
                    StateChange::compacted(
                        Actor::system("gateway"),
                        format!(
                            "the agent session began afresh without its earlier history ({why})"
                        ),
                    )
                    // One entry per fresh ACP session: a process handed from session to
                    // session can begin several for the same conversation over time.
                    .with_dedupe_key(format!(
                        "fresh-session:{}:{}",
                        handle.lease_id, handle.acp_session_id
                    )),
                )
                .await;
        }

        let reply = reply_message(channel, &inbound, &reply_key, "");
        let options = SendOptions {
            durability: self.durability,
            idempotency_key: Some(reply_key.clone()),
            time_to_live_ms: None,
        };
        // Notices are acknowledged only once the agent answered the prompt that carried them:
        // a turn that dies first leaves them pending for the next one.
        let notices = self.awareness.pending_notices(&session);
        let prompt = self.prompt_with_notices(&notices, &text);
        // Previews need a durable intent (a preview must never be orphaned): without one the
        // reply is sent once, at the end.
        let mut live = match options.durability {
            MessageDurabilityPolicy::Disabled => None,
            policy => match self
                .messenger
                .begin_live(reply.clone(), options.clone(), live_options(channel))
                .await
            {
                Ok(live) => Some(live),
                Err(e) if policy == MessageDurabilityPolicy::BestEffort => {
                    warn!(error = %e, "no durable intent for the reply (best_effort): no preview, sending at the end");
                    None
                }
                Err(e) => return Err(TurnError::Recording(e)),
            },
        };

        // The agent streams chunks; the preview shows the text so far (edits coalesced by the
        // live context to the platform's rate).
        let (text_tx, mut text_rx) = mpsc::unbounded_channel::<String>();
        // Weak: the preview ends when the prompt's own sender goes, whatever the loop holds.
        let progress_tx = text_tx.downgrade();
        let produced = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut so_far = String::new();
        let chunk_seen = produced.clone();
        // Where the preview can carry the "still working" line, it does (the final replaces
        // it); elsewhere it is a notice of its own.
        let preview_carries_progress =
            live.is_some() && clawgate_messages::previews_possible(&channel.plugin.sender, &reply);
        let cancelled = self.track_running(&session, session_use.handle());
        info!(session = %session, lease_id = %handle.lease_id, "the agent is prompted");
        let _running = RunningGuard {
            turns: self,
            session: session.clone(),
        };
        let prompt_turn = self
            .acpx
            .prompt(session_use.handle(), &prompt, move |chunk| {
                so_far.push_str(chunk);
                if !so_far.trim().is_empty() {
                    chunk_seen.store(true, Ordering::SeqCst);
                }
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
        // The loop's futures borrow the preview: they end with this block.
        let (outcome, preview_error, timed_out, closed) = {
            // "Typing…" while the agent works, on channels that show it (best effort).
            let typing = show_typing(channel, &inbound.message.target);
            let work = async { tokio::join!(prompt_turn, preview) };
            tokio::pin!(work, typing);
            let deadline = tokio::time::sleep(turn_timeout);
            let progress = tokio::time::sleep(progress_notice_after);
            let grace = tokio::time::sleep(Duration::MAX);
            tokio::pin!(deadline, progress, grace);
            let mut timed_out = false;
            let mut cancelling = false;
            let mut told_progress = false;
            let mut closed = false;
            let (outcome, preview_error) = loop {
                tokio::select! {
                    both = &mut work => break both,
                    never = &mut typing => match never {},
                    () = &mut deadline, if !timed_out => {
                        timed_out = true;
                        self.counters.turn_deadlines.fetch_add(1, Ordering::Relaxed);
                        warn!(session = %session, seconds = turn_timeout.as_secs(),
                            "the agent's turn reached its deadline: cancelling it");
                        self.cancel_prompt(session_use.handle()).await;
                        if !cancelling {
                            cancelling = true;
                            grace.as_mut().reset(tokio::time::Instant::now() + cancel_grace);
                        }
                    }
                    () = &mut grace, if cancelling => {
                        if closed {
                            // Closed (or refused: not verifiably ours), and still no answer:
                            // the turn stops waiting rather than hang.
                            warn!(session = %session, "no answer after the session was closed: the turn gives up on it");
                            break (Err(clawgate_acpx::AcpxError::NotRunning(session.clone())), None);
                        }
                        // The agent did not end the turn it was asked to cancel: its session is
                        // closed (the prompt then fails as the process goes).
                        closed = true;
                        warn!(session = %session, "the agent ignored session/cancel: closing its session");
                        if let Err(e) = self
                            .acpx
                            .close_session(&session, "the agent ignored session/cancel", now_ms())
                            .await
                        {
                            warn!(session = %session, error = %e, "the session could not be closed");
                        }
                        grace.as_mut().reset(tokio::time::Instant::now() + cancel_grace);
                    }
                    () = &mut progress, if !told_progress && !cancelling => {
                        told_progress = true;
                        if !produced.load(Ordering::SeqCst) {
                            if preview_carries_progress {
                                if let Some(tx) = progress_tx.upgrade() {
                                    let _ = tx.send(STILL_WORKING.to_owned());
                                }
                            } else {
                                self.tell_progress(channel, &inbound).await;
                            }
                        }
                    }
                    () = cancelled.wait(), if !cancelling => {
                        cancelling = true;
                        grace.as_mut().reset(tokio::time::Instant::now() + cancel_grace);
                    }
                }
            };
            (outcome, preview_error, timed_out, closed)
        };
        let stopped = cancelled.is_set();
        // A turn the gateway's own stop cancelled (not a person's): worked on again after the
        // restart. A turn that finished within the stop's grace keeps its answer.
        let cancelled_by_stop = |outcome: &clawgate_acpx::TurnOutcome| {
            !stopped
                && self.stopping()
                && matches!(outcome.stop_reason, clawgate_acpx::StopReason::Cancelled)
        };
        let outcome = match outcome {
            _ if timed_out => {
                if let Some(live) = live {
                    let _ = live.abandon().await;
                }
                return Err(TurnError::Deadline {
                    seconds: turn_timeout.as_secs(),
                    closed: if closed {
                        ", and its session closed"
                    } else {
                        ""
                    },
                });
            }
            Ok(outcome) if cancelled_by_stop(&outcome) => {
                if let Some(live) = live {
                    let _ = live.abandon().await;
                }
                return Err(TurnError::Stopping);
            }
            Ok(outcome) => outcome,
            // A stopped turn whose session had to be closed: it ends as stopped all the same.
            Err(_) if stopped => clawgate_acpx::TurnOutcome {
                stop_reason: clawgate_acpx::StopReason::Cancelled,
                chunks: Vec::new(),
            },
            Err(e) => {
                if let Some(live) = live {
                    let _ = live.abandon().await;
                }
                return Err(TurnError::Agent(Box::new(e)));
            }
        };
        if let Some(e) = preview_error {
            warn!(error = %e, "preview update failed; the final is still delivered");
        }
        if !notices.is_empty() {
            let acknowledged = self.awareness.acknowledge_notices(&session, &notices).await;
            info!(
                shown = notices.len(),
                acknowledged = acknowledged.len(),
                "stale-state notices reached the agent"
            );
        }
        let mut text = outcome.chunks.concat();
        if stopped {
            self.counters
                .turns_cancelled
                .fetch_add(1, Ordering::Relaxed);
            text = if text.trim().is_empty() {
                "(stopped before the agent answered)".to_owned()
            } else {
                format!("{}\n\n(stopped)", text.trim_end())
            };
        } else if text.trim().is_empty() {
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
        .map_err(TurnError::Final)?;
        self.until_committed(&report).await?;
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

    /// A live agent session for the turn (see `LifecycleController::checkout`): when it waits
    /// `busy_after` for a slot, the person is told once that the message is queued; a stop
    /// ends the wait.
    async fn agent_session(
        &self,
        channel: &Channel,
        inbound: &NormalizedInbound,
        input: EnsureInput,
        busy_after: Duration,
    ) -> Result<SessionUse, TurnError> {
        let checkout = self.acpx.checkout(input);
        tokio::pin!(checkout);
        let mut stop = self.stop.clone();
        let stopped = async move {
            while !*stop.borrow() {
                if stop.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::pin!(stopped);
        let mut told = false;
        loop {
            tokio::select! {
                got = &mut checkout => return Ok(got?),
                () = &mut stopped => return Err(TurnError::Stopping),
                () = tokio::time::sleep(busy_after), if !told => {
                    told = true;
                    self.tell_busy(channel, inbound).await;
                }
            }
        }
    }

    /// Enters the turn prompting `handle`'s session in the table `/stop` looks in.
    fn track_running(&self, session: &SessionKey, handle: &AcpRuntimeHandle) -> Arc<CancelFlag> {
        let cancelled = Arc::new(CancelFlag::default());
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                session.clone(),
                Running {
                    handle: handle.clone(),
                    cancelled: cancelled.clone(),
                },
            );
        cancelled
    }

    /// `session/cancel` to the agent of `handle` (logged when it cannot be sent: the grace
    /// then closes the session).
    async fn cancel_prompt(&self, handle: &AcpRuntimeHandle) {
        if let Err(e) = self.acpx.cancel_turn(handle).await {
            warn!(session = %handle.session_key, error = %e, "session/cancel not sent");
        }
    }

    /// Cancels the turn running in `session` (ACP `session/cancel`; the session and its process
    /// stay): its final says it was stopped. Recorded in the signal log as `actor`'s. Returns
    /// whether a turn was running.
    pub async fn cancel_turn_of(&self, session: &SessionKey, actor: Actor) -> bool {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(session)
            .map(|r| (r.handle.clone(), r.cancelled.clone()));
        let Some((handle, cancelled)) = running else {
            return false;
        };
        cancelled.set();
        self.cancel_prompt(&handle).await;
        self.awareness
            .record(
                session,
                StateChange::run_completed(actor, "the running turn was cancelled (stop)"),
            )
            .await;
        info!(session = %session, "turn cancelled on request");
        true
    }

    /// Closes `session`'s agent session (a running turn is cancelled first): the next message
    /// begins a fresh ACP session, without the agent's memory of the conversation. Recorded in
    /// the signal log as `actor`'s. Returns whether a turn was running.
    pub async fn close_session_of(
        &self,
        session: &SessionKey,
        actor: Actor,
    ) -> Result<bool, TurnError> {
        let was_running = self.cancel_turn_of(session, actor.clone()).await;
        match self
            .acpx
            .reset_session(session, "a new session was asked for", now_ms())
            .await
        {
            Ok(_) | Err(clawgate_acpx::AcpxError::UnknownSession(_)) => {}
            Err(e) => return Err(TurnError::Agent(Box::new(e))),
        }
        self.awareness
            .record(
                session,
                StateChange::compacted(
                    actor,
                    "the agent session was closed; the next message begins a fresh one (new)",
                ),
            )
            .await;
        Ok(was_running)
    }

    /// `session/cancel` to every running turn (a stopping gateway, before it closes the
    /// sessions): each turn ends and its event is worked on again after the restart.
    pub async fn cancel_running(&self) -> usize {
        let handles: Vec<AcpRuntimeHandle> = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|r| r.handle.clone())
            .collect();
        for handle in &handles {
            self.cancel_prompt(handle).await;
        }
        handles.len()
    }

    /// A person's `/stop` or `/new`: done at once, and answered with one short line under
    /// the event's reply key (a replayed command finds its answer and does nothing again).
    async fn answer_command(
        &self,
        channel: &Channel,
        inbound: &NormalizedInbound,
        session: &SessionKey,
        reply_key: &str,
        command: Command,
    ) -> Result<(), TurnError> {
        let person = Actor::human(
            inbound
                .message
                .sender
                .as_ref()
                .map_or_else(|| "unknown".to_owned(), |s| s.id.clone()),
        );
        let answer = match command {
            Command::Stop => {
                if self.cancel_turn_of(session, person).await {
                    "Stopping the agent's current turn."
                } else {
                    "Nothing is running to stop."
                }
            }
            Command::New => {
                self.close_session_of(session, person).await?;
                "Started a new session: the agent begins afresh with your next message."
            }
        };
        let message = reply_message(channel, inbound, reply_key, answer);
        let options = SendOptions {
            durability: self.durability,
            idempotency_key: Some(reply_key.to_owned()),
            time_to_live_ms: None,
        };
        let report = self
            .messenger
            .send(message, options)
            .await
            .map_err(TurnError::Final)?;
        // As a final: the event completes once the answer is committed.
        self.until_committed(&report).await?;
        info!(?command, "command answered");
        Ok(())
    }

    /// Returns once the reply of `report` is committed: the event is completed only then. A
    /// reply scheduled for a retry or being reconciled is driven and waited for here.
    async fn until_committed(
        &self,
        report: &clawgate_messages::SendReport,
    ) -> Result<(), TurnError> {
        match (&report.outcome, &report.intent_id) {
            (
                SendOutcome::Sent { .. }
                | SendOutcome::AlreadySent { .. }
                | SendOutcome::Partial { .. },
                _,
            )
            | (_, None) => Ok(()),
            (_, Some(id)) => self.await_reply(id).await,
        }
    }

    /// Tells the person once (keyed by the event) that the agent is still working, where the
    /// reply's preview cannot say so.
    async fn tell_progress(&self, channel: &Channel, inbound: &NormalizedInbound) {
        let key = progress_key(&channel.name, &inbound.event_id);
        let code = clawgate_types::GatewayFailureCode::AgentStillWorking;
        match self
            .send_notice(channel, inbound, key, STILL_WORKING, code)
            .await
        {
            Ok(_) => {
                info!(event = %inbound.event_id, "the person was told the agent is still working")
            }
            Err(e) => warn!(error = %e, "the progress notice could not be sent"),
        }
    }

    /// Tells the person their message waits for a free agent: once per event (keyed).
    async fn tell_busy(&self, channel: &Channel, inbound: &NormalizedInbound) {
        let key = busy_key(&channel.name, &inbound.event_id);
        let text = "All agent sessions are busy right now; your message is queued and will be \
                    answered as soon as one is free.";
        let code = clawgate_types::GatewayFailureCode::AgentsBusy;
        match self.send_notice(channel, inbound, key, text, code).await {
            Ok(_) => {
                info!(event = %inbound.event_id, "the turn waits for a busy agent; the person was told")
            }
            Err(e) => warn!(error = %e, "the busy notice could not be sent"),
        }
    }

    /// Sends `text` to the person as the gateway's own output, once per `key` (durable and
    /// keyed): marked with `code`, so a bot in a shared room drops its echo.
    async fn send_notice(
        &self,
        channel: &Channel,
        inbound: &NormalizedInbound,
        key: String,
        text: &str,
        code: clawgate_types::GatewayFailureCode,
    ) -> Result<clawgate_messages::SendReport, clawgate_messages::MessagesError> {
        let mut notice = reply_message(channel, inbound, &key, text);
        notice.origin = Some(clawgate_types::MessageOrigin::gateway_failure(code));
        let options = SendOptions {
            durability: self.durability,
            idempotency_key: Some(key),
            time_to_live_ms: None,
        };
        self.messenger.send(notice, options).await
    }

    /// Creates the session row on first contact.
    async fn register(
        &self,
        session: &SessionKey,
        agent_id: &str,
        conversation: &str,
    ) -> Result<(), TurnError> {
        let known = self
            .awareness
            .session(session)
            .await
            .map_err(|e| TurnError::Session(e.to_string()))?;
        if known.is_none() {
            let mut new = NewSession::new(session.clone());
            new.agent_id = Some(agent_id.to_owned());
            new.label = Some(conversation.to_owned());
            self.awareness
                .create_session(new, Actor::system("gateway"))
                .await
                .map_err(|e| TurnError::Session(e.to_string()))?;
        }
        Ok(())
    }

    /// Where this event's reply stands. Generations of one event's reply are keyed
    /// `<channel>:reply:<event>:<generation>`; a cancelled one (a stream that never produced
    /// its final) is passed over. A stream an earlier attempt left without a final (a crash,
    /// a store or platform failure) is ended here first — its preview removed, the intent
    /// cancelled — so a fresh reply never stands beside it.
    async fn reply_for(&self, channel: &Channel, event_id: &str) -> Result<Reply, TurnError> {
        // Every generation in one read of the key index (not one read per generation).
        let prefix = reply_key(&channel.name, event_id, 0);
        let prefix = prefix.strip_suffix('0').unwrap_or(&prefix);
        let mut generations: std::collections::HashMap<u32, _> = self
            .store
            .find_intents_by_key_prefix(prefix, MAX_REPLY_GENERATIONS + 1)
            .await?
            .into_iter()
            .filter_map(|intent| {
                // Another event whose id extends this one (`e1:x`) has no number here.
                let generation = intent.idempotency_key.strip_prefix(prefix)?.parse().ok()?;
                Some((generation, intent))
            })
            .collect();
        for generation in 0..MAX_REPLY_GENERATIONS {
            let key = reply_key(&channel.name, event_id, generation);
            let Some(intent) = generations.remove(&generation) else {
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
                        .map_err(TurnError::Recovery)?;
                    if ended.is_some_and(|i| i.status == IntentStatus::Cancelled) {
                        continue;
                    }
                    return Err(TurnError::StreamStillOpen {
                        event: event_id.to_owned(),
                        intent: intent.id,
                    });
                }
                _ => return Ok(Reply::Recorded(intent.id)),
            }
        }
        Err(TurnError::TooManyReplies(event_id.to_owned()))
    }

    /// Waits until a recorded final is committed, driving it meanwhile (a retry that is due,
    /// a reconciliation): `Ok` once it is sent, or handed to an operator (an unknown outcome
    /// the adapter cannot reconcile, a cancel); an error when it failed for good.
    async fn await_reply(&self, id: &IntentId) -> Result<(), TurnError> {
        let mut stop = self.stop.clone();
        loop {
            let intent = self
                .messenger
                .recover_intent(id)
                .await
                .map_err(TurnError::Recovery)?
                .ok_or_else(|| TurnError::IntentGone(id.clone()))?;
            match intent.status {
                IntentStatus::Sent | IntentStatus::Cancelled => return Ok(()),
                IntentStatus::Failed => {
                    return Err(TurnError::Undelivered(intent.failure.as_ref().map_or_else(
                        || "no failure recorded".to_owned(),
                        |f| f.message.clone(),
                    )));
                }
                IntentStatus::UnknownAfterSend if intent.next_attempt_at.is_none() => {
                    warn!(intent = %id, "the reply's outcome is unknown and this channel cannot tell; left to an operator (outbox list)");
                    return Ok(());
                }
                _ => {}
            }
            if *stop.borrow() {
                return Err(TurnError::Stopping);
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

/// Where one event's reply stands (see [`Turns::reply_for`]).
enum Reply {
    /// None yet: start one under this key.
    New(String),
    /// Delivered: nothing to do.
    Delivered,
    /// Its final is recorded and not committed yet.
    Recorded(IntentId),
}
