//! Runs a channel's [`InboundSource`]: every event goes to an [`EventHandler`] in its
//! conversation's order (conversations run concurrently) and is worked on until the handler
//! reports it finished.
//!
//! * A polling feed is polled from the durable watermark ([`PollingWatermark`]), which passes an
//!   event only once it and every event below it are finished; while events are unfinished the
//!   feed is polled without waiting, and what it hands out again is skipped.
//! * A pushed feed hands events over with their transport ack; each is recorded durably as it
//!   arrives (before it waits behind its conversation's earlier events), and the receive
//!   context acks it when its policy allows. Events recorded before a restart and never finished are worked on
//!   again from their stored payload (the platform will not push an acked event again).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    EventSink, InboundSource, MessageReceiveAdapter, NoTransportAck, PollFrom, PollWait,
    PollingFeed, PushedEvent, PushedFeed, TransportAck,
};
use clawgate_store::{InboundStore, WatermarkKey, WatermarkStore};
use tokio::sync::{Mutex, Notify, mpsc, watch};
use tracing::{info, warn};

use crate::{AckController, Clock, PollingWatermark};

/// What the gateway does with one inbound event.
#[async_trait]
pub trait EventHandler: Send + Sync + 'static {
    /// Works one attempt at `raw` (1 on the first). `true`: the event is finished (handled,
    /// dead-lettered, nothing more to do); `false`: try again after a backoff.
    async fn handle(&self, raw: &serde_json::Value, ack: &AckController, attempt: u32) -> bool;

    /// Makes a pushed event durable as it arrives, before it waits in its conversation's
    /// queue (see [`crate::Receiver::accept`]); an event it could not write is still queued
    /// and recorded when its turn comes. The default writes nothing.
    async fn accept(&self, raw: &serde_json::Value, ack: &AckController) {
        let _ = (raw, ack);
    }

    /// Whether `inbound` (an event as the channel normalized it) is a control command that must
    /// not wait behind its conversation's work (a person's `/stop` of the turn running there):
    /// it is worked on in a lane of its own. The default: none is.
    fn is_control(&self, inbound: &clawgate_channel_sdk::NormalizedInbound) -> bool {
        let _ = inbound;
        false
    }
}

/// Where a runner keeps its durable state.
#[derive(Clone)]
pub struct SourceStores {
    /// The polling watermark.
    pub watermarks: Arc<dyn WatermarkStore>,
    /// Unfinished inbound records (a pushed source's replay after a restart).
    pub inbound: Arc<dyn InboundStore>,
}

impl std::fmt::Debug for SourceStores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceStores").finish_non_exhaustive()
    }
}

/// Runs one channel account's inbound source until the stop signal.
pub struct SourceRunner {
    /// Conversation lanes alive now (each a task); see [`SourceRunner::lanes`].
    live_lanes: Arc<AtomicUsize>,
    key: WatermarkKey,
    source: InboundSource,
    normalizer: Arc<dyn MessageReceiveAdapter>,
    stores: SourceStores,
    clock: Arc<dyn Clock>,
    handler: Arc<dyn EventHandler>,
    stop: watch::Receiver<bool>,
}

impl std::fmt::Debug for SourceRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceRunner")
            .field("key", &self.key)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// One queued event and its ack.
struct Queued {
    raw: serde_json::Value,
    ack: Arc<AckController>,
    position: Option<i64>,
}

/// Events accepted and not finished yet; finishing one wakes the poll loop.
#[derive(Default)]
struct InFlight {
    count: AtomicUsize,
    finished: Notify,
}

impl InFlight {
    fn busy(&self) -> bool {
        self.count.load(Ordering::SeqCst) > 0
    }
}

impl SourceRunner {
    /// A runner for the source of the channel account `key` names (`key.source` tells a
    /// channel's feeds apart).
    pub fn new(
        key: WatermarkKey,
        source: InboundSource,
        normalizer: Arc<dyn MessageReceiveAdapter>,
        stores: SourceStores,
        clock: Arc<dyn Clock>,
        handler: Arc<dyn EventHandler>,
        stop: watch::Receiver<bool>,
    ) -> SourceRunner {
        SourceRunner {
            live_lanes: Arc::default(),
            key,
            source,
            normalizer,
            stores,
            clock,
            handler,
            stop,
        }
    }

    /// How many conversation lanes (one task each) are alive: one per conversation with events
    /// queued or in work — never one per conversation ever seen.
    pub fn lanes(&self) -> Arc<AtomicUsize> {
        self.live_lanes.clone()
    }

    /// Runs until the stop signal.
    pub async fn run(self) {
        let runner = Arc::new(self);
        match runner.source.clone() {
            InboundSource::Polling(feed) => runner.run_polling(feed).await,
            InboundSource::Pushed(feed) => runner.run_pushed(feed).await,
            _ => {}
        }
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// Sleeps `wait`; `false` when the stop signal came first.
    async fn pause(&self, wait: Duration) -> bool {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = stop.changed() => false,
            () = tokio::time::sleep(wait) => !self.stopped(),
        }
    }

    /// The conversation an event belongs to (its lane); events that do not normalize share
    /// one lane, where the receive context drops them.
    fn lane_of(&self, raw: &serde_json::Value) -> String {
        match self.normalizer.normalize(raw) {
            // Beside the conversation's lane, not behind it.
            Ok(inbound) if self.handler.is_control(&inbound) => {
                format!("{}\u{0}control", inbound.message.target.id)
            }
            Ok(inbound) => inbound.message.target.id,
            Err(_) => String::new(),
        }
    }

    async fn run_polling(self: Arc<Self>, feed: Arc<dyn PollingFeed>) {
        // Without the watermark nothing is polled: a store that cannot be read yet (locked,
        // busy) is retried rather than given up on.
        let watermark = loop {
            match PollingWatermark::open(
                self.stores.watermarks.clone(),
                self.clock.clone(),
                self.key.clone(),
            )
            .await
            {
                Ok(watermark) => break Arc::new(Mutex::new(watermark)),
                Err(e) => {
                    warn!(channel = %self.key.channel, error = %e, "polling watermark unreadable; retrying");
                    if !self.pause(Duration::from_secs(1)).await {
                        return;
                    }
                }
            }
        };
        let in_flight = Arc::new(InFlight::default());
        let lanes = Lanes::default();
        let mut failures = 0u32;
        let mut stop = self.stop.clone();
        while !self.stopped() {
            let from = {
                let watermark = watermark.lock().await;
                PollFrom::new(watermark.safe(), watermark.checkpoint().map(str::to_owned))
            };
            // Unfinished events stay on the platform until the watermark passes them, so a
            // long poll would return at once while one is worked on: poll without waiting.
            let wait = if in_flight.busy() {
                PollWait::Immediate
            } else {
                PollWait::Long
            };
            let polled = tokio::select! {
                _ = stop.changed() => return,
                polled = feed.poll(&from, wait) => polled,
            };
            let events = match polled {
                Ok(events) => {
                    failures = 0;
                    events
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    let wait = e.retry_after_ms.map_or_else(
                        || Duration::from_millis(200 * u64::from(failures.min(25))),
                        Duration::from_millis,
                    );
                    warn!(channel = %self.key.channel, error = %e.message, ?wait, "polling failed; retrying");
                    if !self.pause(wait).await {
                        return;
                    }
                    continue;
                }
            };
            let mut accepted = 0;
            for event in events {
                if !watermark
                    .lock()
                    .await
                    .accept_with_checkpoint(event.position, event.checkpoint.clone())
                {
                    continue;
                }
                accepted += 1;
                in_flight.count.fetch_add(1, Ordering::SeqCst);
                let lane = self.lane_of(&event.raw);
                lanes
                    .send(
                        &self,
                        lane,
                        Queued {
                            raw: event.raw,
                            ack: Arc::new(AckController::new(Arc::new(NoTransportAck))),
                            position: Some(event.position),
                        },
                        Some((watermark.clone(), in_flight.clone())),
                    )
                    .await;
            }
            if accepted == 0 && in_flight.busy() {
                // Until an event finishes (then the long poll is possible again), new events
                // are looked for every 25 ms.
                tokio::select! {
                    _ = stop.changed() => return,
                    () = in_flight.finished.notified() => {}
                    () = tokio::time::sleep(Duration::from_millis(25)) => {}
                }
            }
        }
    }

    async fn run_pushed(self: Arc<Self>, feed: Arc<dyn PushedFeed>) {
        let lanes = Lanes::default();
        self.replay_unfinished(&lanes).await;
        let sink: Arc<dyn EventSink> = Arc::new(Sink {
            runner: self.clone(),
            lanes,
        });
        let mut failures = 0u32;
        while !self.stopped() {
            match feed.run(sink.clone()).await {
                Ok(()) => failures = 0,
                Err(e) => {
                    failures = failures.saturating_add(1);
                    warn!(channel = %self.key.channel, error = %e.message, "inbound feed stopped; starting it again");
                }
            }
            let wait = Duration::from_millis(200 * u64::from(failures.clamp(1, 25)));
            if !self.pause(wait).await {
                return;
            }
        }
    }

    /// A pushed event recorded before a restart and never finished is worked on again from
    /// the platform payload its normalized message keeps (`ChannelMessage::raw`).
    async fn replay_unfinished(self: &Arc<Self>, lanes: &Lanes) {
        let records = match self.stores.inbound.list_unfinished_inbound(100_000).await {
            Ok(records) => records,
            Err(e) => {
                warn!(channel = %self.key.channel, error = %e, "unfinished inbound records unreadable; not replayed");
                return;
            }
        };
        let mut replayed = 0;
        for record in records
            .into_iter()
            .filter(|r| r.channel == self.key.channel && r.account_id == self.key.account_id)
        {
            let Some(raw) = record.payload.get("raw").filter(|r| !r.is_null()).cloned() else {
                warn!(event = %record.event_id, "unfinished event has no platform payload to replay (the adapter does not keep ChannelMessage::raw)");
                continue;
            };
            replayed += 1;
            let lane = self.lane_of(&raw);
            lanes
                .send(
                    self,
                    lane,
                    Queued {
                        raw,
                        ack: Arc::new(AckController::new(Arc::new(NoTransportAck))),
                        position: None,
                    },
                    None,
                )
                .await;
        }
        if replayed > 0 {
            info!(channel = %self.key.channel, replayed, "unfinished pushed events worked on again");
        }
    }

    /// One conversation's events, in order, each until finished. Once none is queued or in
    /// work, the lane takes itself out of `lanes` and ends; the conversation's next event opens
    /// a new one.
    async fn lane(
        self: Arc<Self>,
        key: String,
        mut queue: mpsc::UnboundedReceiver<(Queued, Option<Polled>)>,
        pending: Arc<AtomicUsize>,
        lanes: Lanes,
    ) {
        self.live_lanes.fetch_add(1, Ordering::SeqCst);
        while let Some((event, polled)) = queue.recv().await {
            let mut attempt = 0u32;
            let finished = loop {
                if self.stopped() {
                    // Left unfinished: a poll after the restart, or the replay of the durable
                    // record, brings it back.
                    event.ack.nack("the gateway is stopping");
                    break false;
                }
                attempt += 1;
                if self.handler.handle(&event.raw, &event.ack, attempt).await {
                    break true;
                }
                let wait = Duration::from_millis(250 * u64::from(attempt.min(20)));
                if !self.pause(wait).await {
                    event.ack.nack("the gateway is stopping");
                    break false;
                }
            };
            if let Some((watermark, in_flight)) = polled {
                if finished
                    && let Some(position) = event.position
                    && let Err(e) = watermark.lock().await.finish(position).await
                {
                    // Not finished durably: the event replays after a restart, and the
                    // receive context finds it done.
                    warn!(error = %e, "watermark not advanced");
                }
                in_flight.count.fetch_sub(1, Ordering::SeqCst);
                in_flight.finished.notify_one();
            }
            // Done with it (finished, or left for a restart): the lane may be idle now.
            if pending.fetch_sub(1, Ordering::SeqCst) == 1 {
                lanes.close_if_idle(&key, &pending).await;
            }
        }
        self.live_lanes.fetch_sub(1, Ordering::SeqCst);
    }
}

type Polled = (Arc<Mutex<PollingWatermark>>, Arc<InFlight>);

/// One conversation's queue, and how many of its events are queued or in work.
struct Lane {
    sender: mpsc::UnboundedSender<(Queued, Option<Polled>)>,
    pending: Arc<AtomicUsize>,
}

/// The per-conversation queues, shared by whoever hands events over and the lanes themselves.
/// A lane exists only while its conversation has events queued or in work: the lanes held are
/// the busy ones, however many conversations were ever seen.
#[derive(Clone, Default)]
struct Lanes(Arc<Mutex<HashMap<String, Lane>>>);

impl Lanes {
    async fn send(
        &self,
        runner: &Arc<SourceRunner>,
        key: String,
        event: Queued,
        polled: Option<Polled>,
    ) {
        let mut lanes = self.0.lock().await;
        let lane = lanes.entry(key.clone()).or_insert_with(|| {
            let (sender, queue) = mpsc::unbounded_channel();
            let pending = Arc::new(AtomicUsize::new(0));
            tokio::spawn(
                runner
                    .clone()
                    .lane(key, queue, pending.clone(), self.clone()),
            );
            Lane { sender, pending }
        });
        // Counted under the lock, so a lane that finds itself idle (under the same lock) has
        // nothing queued that it would drop.
        lane.pending.fetch_add(1, Ordering::SeqCst);
        if lane.sender.send((event, polled)).is_err() {
            lane.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Drops the lane of `key` if it is the one `pending` counts for and it is still idle: its
    /// sender goes, and its task ends at its next receive.
    async fn close_if_idle(&self, key: &str, pending: &Arc<AtomicUsize>) {
        let mut lanes = self.0.lock().await;
        if pending.load(Ordering::SeqCst) == 0
            && lanes
                .get(key)
                .is_some_and(|lane| Arc::ptr_eq(&lane.pending, pending))
        {
            lanes.remove(key);
            crate::sparse::shrink_map(&mut lanes);
        }
    }
}

/// The engine's side of a pushed feed.
struct Sink {
    runner: Arc<SourceRunner>,
    lanes: Lanes,
}

#[async_trait]
impl EventSink for Sink {
    async fn deliver(&self, event: PushedEvent) {
        let ack: Arc<dyn TransportAck> = event.ack;
        if self.runner.stopped() {
            ack.nack("the gateway is stopping");
            return;
        }
        let ack = Arc::new(AckController::new(ack));
        // Durable before it queues: an earlier turn of its conversation may run for minutes,
        // and the platform will not push it again.
        self.runner.handler.accept(&event.raw, &ack).await;
        let lane = self.runner.lane_of(&event.raw);
        self.lanes
            .send(
                &self.runner,
                lane,
                Queued {
                    raw: event.raw,
                    ack,
                    position: None,
                },
                None,
            )
            .await;
    }

    async fn stopped(&self) {
        let mut stop = self.runner.stop.clone();
        while !*stop.borrow() {
            if stop.changed().await.is_err() {
                return;
            }
        }
    }
}
