//! One seeded run: people write, the platform fails as scripted, time passes, recovery passes
//! run, and the gateway process "crashes" at chosen durable writes — then the same checks as
//! the model, judged from the platform's record and the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clawgate_channel_sdk::NoTransportAck;
use clawgate_messages::{
    AckController, DispatchError, MessagesError, Messenger, ReceiveOptions, ReceiveOutcome,
    Receiver, RecoveryPace, RetryPolicy, SendOptions, SendOutcome,
};
use clawgate_store::{InboundStatus, InboundStore as _, IntentStore as _};
use clawgate_store_sqlite::{SqliteOptions, SqliteStore};

use crate::crash::Crash;
use clawgate_types::clock::ManualClock;
use clawgate_types::{ChannelMessage, IntentStatus, MessageTarget};

use crate::platform::{AdapterKind, CHANNEL, Fault, MAX_TEXT, SimPlatform};
use crate::rng::Rng;

/// A deliberately broken stand-in turn, to show the invariants catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The turn reports its message answered as soon as the reply is recorded, before the
    /// reply is sent and committed.
    CompleteBeforeCommit,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub adapter: AdapterKind,
    /// Steps of one run (messages, faults, time, recovery passes, crash points).
    pub steps: u32,
    pub bug: Option<Bug>,
}

impl Config {
    pub fn new(adapter: AdapterKind) -> Config {
        Config {
            adapter,
            steps: 24,
            bug: None,
        }
    }
}

/// What a run did, for the report and the replay check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// Every step and what came of it.
    pub trace: Vec<String>,
    pub messages: usize,
    pub crashes: u32,
    /// `(id, unit key, text)` of everything that landed, in order.
    pub landed: Vec<(String, String, String)>,
}

/// A broken invariant, with the run that led to it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub seed: u64,
    pub property: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {}: {}", self.seed, self.property)?;
        for (n, step) in self.trace.iter().enumerate() {
            writeln!(f, "  {n:>3}. {step}")?;
        }
        Ok(())
    }
}

/// The engines of one gateway process's life.
struct Life {
    messenger: Messenger,
    receiver: Receiver,
}

struct World {
    config: Config,
    store: Arc<SqliteStore>,
    platform: SimPlatform,
    clock: Arc<ManualClock>,
    crash: Arc<Crash>,
    life: Life,
    lives: u32,
    trace: Vec<String>,
    /// Event id → whether the stand-in agent fails on it (every attempt).
    poison: HashMap<String, bool>,
    messages: usize,
}

const START: i64 = 1_767_225_600_000;
const MAX_TURN_ATTEMPTS: u32 = 3;

fn reply_key(event: &str) -> String {
    format!("{CHANNEL}:reply:{event}")
}

fn failure_key(event: &str) -> String {
    format!("{CHANNEL}:failure:{event}")
}

fn outbound(event: &str, conversation: &str, text: String) -> ChannelMessage {
    ChannelMessage::outbound(
        format!("out-{event}"),
        CHANNEL,
        MessageTarget::direct(conversation),
        text,
    )
    .with_account_id("bot")
}

impl World {
    fn new(config: Config) -> World {
        let crash = Arc::new(Crash::default());
        let store = Arc::new(
            SqliteStore::open_in_memory(SqliteOptions {
                commit_hook: Some(crash.hook()),
                // One write per commit: how many writes the writer finds queued together
                // depends on thread timing, and the crash counts commits.
                max_batch: 1,
                ..SqliteOptions::default()
            })
            .unwrap_or_else(|e| panic!("in-memory store: {e}")),
        );
        let platform = SimPlatform::new(config.adapter, crash.dead.clone());
        let clock = Arc::new(ManualClock::new(START));
        let life = Self::life(&store, &platform, &clock, 0);
        World {
            config,
            store,
            platform,
            clock,
            crash,
            life,
            lives: 0,
            trace: Vec::new(),
            poison: HashMap::new(),
            messages: 0,
        }
    }

    fn life(
        store: &Arc<SqliteStore>,
        platform: &SimPlatform,
        clock: &Arc<ManualClock>,
        n: u32,
    ) -> Life {
        let adapter = Arc::new(platform.clone());
        let messenger = Messenger::new(
            store.clone(),
            vec![adapter.clone()],
            RetryPolicy::default(),
            clock.clone(),
            &format!("life-{n}"),
        );
        let receiver = Receiver::new(
            store.clone(),
            adapter.clone(),
            adapter,
            clock.clone(),
            ReceiveOptions {
                max_attempts: MAX_TURN_ATTEMPTS,
                account_id: Some("bot".into()),
                ..ReceiveOptions::default()
            },
        );
        Life {
            messenger,
            receiver,
        }
    }

    /// A millisecond passes before each new intent: the store orders intents by creation
    /// time, then by their (random) id, so distinct times keep every run's order the seed's.
    fn tick(&self) {
        self.clock.advance(1);
    }

    fn dead(&self) -> bool {
        self.crash.dead.load(Ordering::SeqCst)
    }

    /// After a crash: a new process on the same state, which first tells of dead letters
    /// without their notice and works on unfinished events again (as a gateway start does).
    async fn restart_if_dead(&mut self) {
        if !self.dead() {
            return;
        }
        self.lives += 1;
        self.trace
            .push(format!("CRASHED; restart (life {})", self.lives));
        self.crash.dead.store(false, Ordering::SeqCst);
        self.life = Self::life(&self.store, &self.platform, &self.clock, self.lives);
        self.sweep_dead_letters().await;
        self.replay_unfinished().await;
    }

    /// The stand-in turn: the agent answers with a reply of two units, sent durably under the
    /// event's key; the message counts as answered once the reply is committed (or handed to
    /// an operator). A reply not delivered yet gives the attempt back: recovery delivers it and
    /// a later replay finds it sent.
    async fn turn(&self, event: &str, conversation: &str) -> Result<(), DispatchError> {
        if self.poison.get(event).copied().unwrap_or(false) {
            return Err(DispatchError::from("the agent failed".to_owned()));
        }
        let text = format!("{event}: {}", "answer ".repeat(MAX_TEXT / 6));
        let key = reply_key(event);
        self.tick();
        let report = self
            .life
            .messenger
            .send(
                outbound(event, conversation, text),
                SendOptions {
                    idempotency_key: Some(key.clone()),
                    ..SendOptions::default()
                },
            )
            .await
            .map_err(|e| DispatchError::interrupted(e.to_string()))?;
        if self.config.bug == Some(Bug::CompleteBeforeCommit) {
            return Ok(());
        }
        match report.outcome {
            SendOutcome::Sent { .. } | SendOutcome::AlreadySent { .. } => Ok(()),
            _ => match self.store.find_intent_by_key(&key).await {
                Ok(Some(intent)) if handed_over(&intent) => Ok(()),
                _ => Err(DispatchError::interrupted("the reply is not delivered yet")),
            },
        }
    }

    async fn receive(&mut self, raw: serde_json::Value) {
        let ack = AckController::new(Arc::new(NoTransportAck));
        let event = raw["id"].as_str().unwrap_or_default().to_owned();
        let conversation = raw["conversation"].as_str().unwrap_or_default().to_owned();
        let outcome = {
            let world = &*self;
            world
                .life
                .receiver
                .receive_or_settle(
                    &raw,
                    &ack,
                    |_| world.turn(&event, &conversation),
                    |_| async { Err(String::new()) },
                )
                .await
        };
        let dead_lettered = matches!(
            outcome,
            Ok(ReceiveOutcome::Failed {
                dead_lettered: true,
                ..
            })
        );
        self.trace
            .push(format!("receive {event}: {}", brief(&outcome)));
        if dead_lettered {
            self.tell_of_failure(&event, &conversation).await;
        }
    }

    /// The person is told once that the message could not be answered (keyed by the event).
    async fn tell_of_failure(&mut self, event: &str, conversation: &str) {
        self.tick();
        let result = self
            .life
            .messenger
            .send(
                outbound(event, conversation, format!("{event}: could not answer")),
                SendOptions {
                    idempotency_key: Some(failure_key(event)),
                    ..SendOptions::default()
                },
            )
            .await;
        self.trace
            .push(format!("tell of failure {event}: {}", brief_send(&result)));
    }

    async fn sweep_dead_letters(&mut self) {
        let Ok(records) = self
            .store
            .list_inbound(Some(InboundStatus::DeadLettered), 1_000)
            .await
        else {
            return;
        };
        for record in records {
            if matches!(
                self.store
                    .find_intent_by_key(&failure_key(&record.event_id))
                    .await,
                Ok(None)
            ) {
                let conversation = record.payload["raw"]["conversation"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                self.tell_of_failure(&record.event_id, &conversation).await;
            }
        }
    }

    async fn replay_unfinished(&mut self) {
        let Ok(records) = self.store.list_unfinished_inbound(1_000).await else {
            return;
        };
        for record in records {
            if self.dead() {
                return;
            }
            let raw = record.payload["raw"].clone();
            if !raw.is_null() {
                self.receive(raw).await;
            }
        }
    }

    async fn recover(&mut self) {
        let pace = RecoveryPace {
            per_channel: 1,
            time_budget: None,
        };
        let report = self.life.messenger.recover_paced(&pace).await;
        self.trace.push(match report {
            Ok(r) => format!(
                "recovery pass: examined {} committed {} reconciled sent/not {}/{}",
                r.examined, r.committed, r.reconciled_sent, r.reconciled_not_sent
            ),
            Err(e) => format!("recovery pass: {e}"),
        });
    }

    async fn step(&mut self, rng: &mut Rng) {
        match rng.below(100) {
            0..=29 => {
                self.messages += 1;
                let id = format!("e{}", self.messages);
                let conversation = format!("dm-{}", rng.below(3));
                self.poison.insert(id.clone(), rng.chance(10));
                let raw = SimPlatform::event(&id, &conversation, &format!("message {id}"));
                self.receive(raw).await;
            }
            30..=49 => {
                let fault = match rng.below(4) {
                    0 => Fault::Refuse,
                    1 => Fault::LoseAnswer,
                    2 => Fault::LostBeforeLanding,
                    _ => Fault::CannotTell,
                };
                self.trace.push(format!("platform: next call {fault:?}"));
                self.platform.inject(fault);
            }
            50..=64 => {
                let ms = [500, 5_000, 60_000, 180_000][rng.below(4) as usize];
                self.clock.advance(ms);
                self.trace.push(format!("time passes: {ms} ms"));
            }
            65..=79 => self.recover().await,
            80..=84 => self.replay_unfinished().await,
            _ => {
                let armed = self.crash.arm_at_random(rng, 6);
                self.trace.push(armed);
            }
        }
        self.restart_if_dead().await;
    }

    /// No more faults or crashes: time passes and recovery runs until nothing is left to do.
    async fn settle(&mut self) {
        self.platform.clear_faults();
        self.crash.disarm();
        self.restart_if_dead().await;
        self.trace
            .push("settling: no more faults or crashes".into());
        for _ in 0..40 {
            self.clock.advance(10 * 60_000);
            self.recover().await;
            self.replay_unfinished().await;
        }
    }

    /// Runs a check with its reads left out of the crash count.
    async fn checked<'a, F, Fut>(&'a self, check: F) -> Result<(), String>
    where
        F: FnOnce(&'a World) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        self.crash.checking.store(true, Ordering::SeqCst);
        let result = check(self).await;
        self.crash.checking.store(false, Ordering::SeqCst);
        result
    }

    /// The invariants that hold after every step.
    async fn check_step(&self) -> Result<(), String> {
        for record in self.inbound().await {
            if record.status == InboundStatus::Completed {
                let reply = self
                    .store
                    .find_intent_by_key(&reply_key(&record.event_id))
                    .await;
                let settled = matches!(&reply, Ok(Some(i)) if i.status == IntentStatus::Sent || handed_over(i));
                if !settled {
                    return Err(format!(
                        "the event {} is completed while its reply is neither committed nor \
                         handed to an operator ({:?})",
                        record.event_id,
                        reply.map(|i| i.map(|i| i.status))
                    ));
                }
            }
        }
        self.check_platform()
    }

    /// At most once per unit (the platform never deduplicates), unless the adapter says
    /// duplicates are acceptable and the platform really takes them.
    fn check_platform(&self) -> Result<(), String> {
        let mut copies: BTreeMap<String, usize> = BTreeMap::new();
        for landed in self.platform.landed() {
            *copies.entry(landed.unit_key).or_default() += 1;
        }
        match copies.into_iter().find(|(_, n)| *n > 1) {
            Some((unit, n)) => Err(format!("at most once: unit {unit} landed {n} times")),
            None => Ok(()),
        }
    }

    /// After settling: every accepted message ended with its reply delivered (every unit, as
    /// the receipt says), its failure notice delivered, or its reply handed to an operator.
    async fn check_end(&self) -> Result<(), String> {
        let landed = self.platform.landed();
        for record in self.inbound().await {
            let key = match record.status {
                InboundStatus::Completed => reply_key(&record.event_id),
                InboundStatus::DeadLettered => failure_key(&record.event_id),
                other => {
                    return Err(format!(
                        "the event {} is still {other:?} after settling",
                        record.event_id
                    ));
                }
            };
            let intent = match self.store.find_intent_by_key(&key).await {
                Ok(Some(intent)) => intent,
                other => return Err(format!("no intent {key} for a finished event: {other:?}")),
            };
            if handed_over(&intent) && self.parking_allowed(&intent) {
                continue;
            }
            if intent.status != IntentStatus::Sent {
                return Err(format!(
                    "{key} ended {:?}: neither delivered nor handed to an operator",
                    intent.status
                ));
            }
            let receipt_ids = intent
                .receipt
                .map(|r| r.platform_message_ids)
                .unwrap_or_default();
            let on_platform: Vec<String> = landed
                .iter()
                .filter(|l| l.unit_key.starts_with(&format!("{key}#")))
                .map(|l| l.id.clone())
                .collect();
            if receipt_ids != on_platform {
                return Err(format!(
                    "{key}: the receipt names {receipt_ids:?}, the platform holds {on_platform:?}"
                ));
            }
        }
        Ok(())
    }

    /// An unknown outcome may be left to an operator only where nothing can settle it: an
    /// adapter that cannot reconcile, or a platform that kept answering "cannot tell" for the
    /// whole reconciliation window (counted from when the outcome became unknown to the write
    /// that parked it).
    fn parking_allowed(&self, intent: &clawgate_types::DurableSendIntent) -> bool {
        self.config.adapter == AdapterKind::Neither
            || intent.failure.as_ref().is_some_and(|f| {
                intent.updated_at - f.at >= RetryPolicy::default().reconcile_window_ms
            })
    }

    async fn inbound(&self) -> Vec<clawgate_store::InboundRecord> {
        let mut all = Vec::new();
        for status in [
            InboundStatus::Received,
            InboundStatus::Completed,
            InboundStatus::DeadLettered,
        ] {
            all.extend(
                self.store
                    .list_inbound(Some(status), 10_000)
                    .await
                    .unwrap_or_default(),
            );
        }
        all
    }
}

/// Parked for an operator: an unknown outcome nobody will ask about again.
fn handed_over(intent: &clawgate_types::DurableSendIntent) -> bool {
    intent.status == IntentStatus::UnknownAfterSend && intent.next_attempt_at.is_none()
}

fn brief(outcome: &Result<ReceiveOutcome, MessagesError>) -> String {
    match outcome {
        Ok(ReceiveOutcome::Handled { .. }) => "handled".into(),
        Ok(ReceiveOutcome::Failed {
            dead_lettered,
            error,
            ..
        }) => format!(
            "failed ({error}){}",
            if *dead_lettered {
                ", dead-lettered"
            } else {
                ""
            }
        ),
        Ok(ReceiveOutcome::Duplicate { status }) => format!("duplicate ({status:?})"),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("error: {e}"),
    }
}

fn brief_send(result: &Result<clawgate_messages::SendReport, MessagesError>) -> String {
    match result {
        Ok(report) => match &report.outcome {
            SendOutcome::Sent { .. } => "sent".into(),
            SendOutcome::AlreadySent { .. } => "already sent".into(),
            SendOutcome::InProgress { status } => format!("in progress ({status:?})"),
            SendOutcome::RetryScheduled { .. } => "retry scheduled".into(),
            SendOutcome::Unknown { .. } => "unknown".into(),
            other => format!("{other:?}"),
        },
        Err(e) => format!("error: {e}"),
    }
}

/// Runs one seed. The same seed and config give the same run, step for step.
pub fn run_seed(seed: u64, config: &Config) -> Result<Run, Violation> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("a current-thread runtime: {e}"));
    runtime.block_on(async {
        let mut world = World::new(config.clone());
        let mut rng = Rng::new(seed);
        let violation = |world: &World, property: String| Violation {
            seed,
            property,
            trace: world.trace.clone(),
        };
        for _ in 0..config.steps {
            world.step(&mut rng).await;
            if let Err(property) = world.checked(World::check_step).await {
                return Err(violation(&world, property));
            }
        }
        world.settle().await;
        if let Err(property) = world.checked(World::check_step).await {
            return Err(violation(&world, property));
        }
        if let Err(property) = world.checked(World::check_end).await {
            return Err(violation(&world, property));
        }
        Ok(Run {
            trace: world.trace.clone(),
            messages: world.messages,
            crashes: world.lives,
            landed: world
                .platform
                .landed()
                .into_iter()
                .map(|l| (l.id, l.unit_key, l.text))
                .collect(),
        })
    })
}
