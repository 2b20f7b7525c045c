//! The inbound-source cases: the engine's [`SourceRunner`] over the channel's own source, each
//! event through a real receive context on a fresh state directory, judged by what the
//! dispatches saw.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::{ChannelPlugin, InboundSource};
use clawgate_messages::{
    AckController, EventHandler, ReceiveOptions, ReceiveOutcome, Receiver, SourceRunner,
    SourceStores,
};
use clawgate_store::WatermarkKey;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::SystemClock;
use tokio::sync::watch;

use crate::support::{addressed, fresh_engine};
use crate::{ConformancePeer, Outcome};

/// Counts, per message text, the events handed over and the dispatches (turns) they got.
struct Dispatches {
    receiver: Receiver,
    /// A text whose dispatch fails while this is set.
    failing: Mutex<Option<String>>,
    handed: Mutex<HashMap<String, u32>>,
    dispatched: Mutex<HashMap<String, u32>>,
    /// The texts whose dispatch succeeded, in the order it did.
    succeeded: Mutex<Vec<String>>,
}

fn text_of(raw: &serde_json::Value, plugin: &ChannelPlugin) -> String {
    plugin
        .receiver
        .as_ref()
        .and_then(|r| r.normalize(raw).ok())
        .and_then(|i| i.message.body.map(|b| b.text))
        .unwrap_or_default()
}

struct Handler {
    plugin: ChannelPlugin,
    counts: Arc<Dispatches>,
}

#[async_trait]
impl EventHandler for Handler {
    async fn handle(&self, raw: &serde_json::Value, ack: &AckController, _attempt: u32) -> bool {
        let text = text_of(raw, &self.plugin);
        *self
            .counts
            .handed
            .lock()
            .unwrap()
            .entry(text.clone())
            .or_default() += 1;
        let counts = self.counts.clone();
        let outcome = self
            .counts
            .receiver
            .receive(raw, ack, |_inbound| async move {
                *counts
                    .dispatched
                    .lock()
                    .unwrap()
                    .entry(text.clone())
                    .or_default() += 1;
                if counts.failing.lock().unwrap().as_deref() == Some(text.as_str()) {
                    Err(format!("planned failure of {text:?}"))
                } else {
                    counts.succeeded.lock().unwrap().push(text);
                    Ok(())
                }
            })
            .await;
        !matches!(
            outcome,
            Ok(ReceiveOutcome::Failed {
                dead_lettered: false,
                ..
            }) | Err(_)
        )
    }
}

/// A source runner over the peer's channel on `store`, until the returned sender stops it.
struct Running {
    counts: Arc<Dispatches>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(plugin: &ChannelPlugin, store: &Arc<SqliteStore>, failing: Option<&str>) -> Running {
        let receiver_adapter = plugin
            .receiver
            .clone()
            .expect("a channel with a source has a receiver");
        let clock = Arc::new(SystemClock);
        let counts = Arc::new(Dispatches {
            receiver: Receiver::new(
                store.clone(),
                plugin.sender.clone(),
                receiver_adapter.clone(),
                clock.clone(),
                // A planned failure is retried, never dead-lettered: after enough attempts a
                // dead letter is finished, and the watermark would rightly pass it — a fast
                // platform could get there before the case restarts the runner.
                ReceiveOptions {
                    max_attempts: u32::MAX,
                    ..ReceiveOptions::default()
                },
            ),
            failing: Mutex::new(failing.map(str::to_owned)),
            handed: Mutex::default(),
            dispatched: Mutex::default(),
            succeeded: Mutex::default(),
        });
        let (stop, stopped) = watch::channel(false);
        let runner = SourceRunner::new(
            WatermarkKey {
                channel: plugin.name().to_owned(),
                account_id: String::new(),
                source: "conformance".into(),
            },
            plugin.source.clone(),
            receiver_adapter,
            SourceStores {
                watermarks: store.clone(),
                inbound: store.clone(),
            },
            clock,
            Arc::new(Handler {
                plugin: plugin.clone(),
                counts: counts.clone(),
            }),
            stopped,
        );
        Running {
            counts,
            stop,
            task: tokio::spawn(runner.run()),
        }
    }

    fn dispatched(&self, text: &str) -> u32 {
        self.counts
            .dispatched
            .lock()
            .unwrap()
            .get(text)
            .copied()
            .unwrap_or(0)
    }

    fn handed(&self, text: &str) -> u32 {
        self.counts
            .handed
            .lock()
            .unwrap()
            .get(text)
            .copied()
            .unwrap_or(0)
    }

    fn all_dispatched(&self) -> HashMap<String, u32> {
        self.counts.dispatched.lock().unwrap().clone()
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the source runner stops when told")
            .unwrap();
    }
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn store_in(dir: &tempfile::TempDir) -> Arc<SqliteStore> {
    Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()))
}

pub async fn polling_source_never_passes_an_unfinished_event(
    peer: &impl ConformancePeer,
) -> Outcome {
    let plugin = peer.plugin();
    if !matches!(plugin.source, InboundSource::Polling(_)) {
        return Outcome::skipped("the channel's source is not a polling feed");
    }
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir);
    let first = Running::start(&plugin, &store, Some("second"));
    // Three conversations: one conversation's events run in order, so an unfinished one
    // would hold back the next of its own conversation, not the others.
    for text in ["first", "second", "third"] {
        peer.inject_inbound(&peer.target(&format!("polling-{text}")), text, false)
            .await
            .expect("a receiving channel's peer must be able to write into a conversation");
    }
    until(
        "the first and third events handled, the second tried",
        || {
            first.dispatched("first") == 1
                && first.dispatched("third") == 1
                && first.dispatched("second") >= 1
        },
    )
    .await;
    // A restart while the second is unfinished: the watermark cannot have passed it.
    first.stop().await;
    let second = Running::start(&plugin, &store, None);
    until(
        "the unfinished event polled again after the restart",
        || second.dispatched("second") == 1,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = second.all_dispatched();
    second.stop().await;
    assert_eq!(
        seen,
        HashMap::from([("second".to_owned(), 1)]),
        "after the restart only the unfinished event runs again; the finished ones are below \
         the watermark or deduplicated by their durable records"
    );
    Outcome::Passed
}

/// An event whose dispatch fails (retryably) is tried again before anything after it in its
/// conversation: the next events wait, handed over but not dispatched, and run in order once it
/// succeeded.
pub async fn a_retried_event_keeps_its_conversations_order(peer: &impl ConformancePeer) -> Outcome {
    let plugin = peer.plugin();
    if matches!(plugin.source, InboundSource::None) {
        return Outcome::skipped("the channel receives nothing");
    }
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir);
    let target = peer.target("order");
    let running = Running::start(&plugin, &store, Some("order-1"));
    peer.inject_inbound(&target, "order-1", false)
        .await
        .expect("a receiving channel's peer must be able to write into a conversation");
    until("the first event tried", || {
        running.dispatched("order-1") >= 1
    })
    .await;
    for text in ["order-2", "order-3"] {
        peer.inject_inbound(&target, text, false)
            .await
            .expect("a receiving channel's peer must be able to write into a conversation");
    }
    // Three more tries take over a second (the lane backs off 250 ms, 500 ms, …): the later
    // events have reached the runner by then, and wait behind the failing one.
    let tries = running.dispatched("order-1");
    until("the first event tried again", || {
        running.dispatched("order-1") >= tries + 3
    })
    .await;
    assert_eq!(
        (running.handed("order-2"), running.handed("order-3")),
        (0, 0),
        "the events after a failing one wait for it"
    );
    *running.counts.failing.lock().unwrap() = None;
    until("every event succeeded", || {
        running.counts.succeeded.lock().unwrap().len() >= 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let succeeded = running.counts.succeeded.lock().unwrap().clone();
    running.stop().await;
    // The retried event keeps its place; the two after it may reach the runner in either
    // order (some platforms deliver concurrently), each once.
    assert_eq!(succeeded.len(), 3, "each event once: {succeeded:?}");
    assert_eq!(succeeded[0], "order-1", "{succeeded:?}");
    let mut rest = succeeded[1..].to_vec();
    rest.sort();
    assert_eq!(rest, ["order-2", "order-3"], "{succeeded:?}");
    Outcome::Passed
}

pub async fn pushed_redelivery_is_deduplicated(peer: &impl ConformancePeer) -> Outcome {
    let plugin = peer.plugin();
    if !matches!(plugin.source, InboundSource::Pushed(_)) {
        return Outcome::skipped("the channel's source is not pushed (webhook or socket)");
    }
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir);
    let target = peer.target("redelivery");
    let running = Running::start(&plugin, &store, None);
    peer.inject_inbound(&target, "once", false)
        .await
        .expect("a receiving channel's peer must be able to write into a conversation");
    until("the event dispatched", || running.dispatched("once") == 1).await;
    assert!(
        peer.redeliver_pushed(),
        "a pushed source's peer must be able to deliver an event again"
    );
    until("the redelivery handed over", || running.handed("once") >= 2).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        running.dispatched("once"),
        1,
        "a redelivered event is deduplicated by its durable record, not run again"
    );
    running.stop().await;
    Outcome::Passed
}

pub async fn pushed_source_resumes_after_a_dropped_connection(
    peer: &impl ConformancePeer,
) -> Outcome {
    let plugin = peer.plugin();
    if !matches!(plugin.source, InboundSource::Pushed(_)) {
        return Outcome::skipped("the channel's source is not pushed (webhook or socket)");
    }
    let dir = tempfile::tempdir().unwrap();
    let store = store_in(&dir);
    let target = peer.target("resume");
    let running = Running::start(&plugin, &store, None);
    peer.inject_inbound(&target, "before", false)
        .await
        .expect("a receiving channel's peer must be able to write into a conversation");
    until("the first event dispatched", || {
        running.dispatched("before") == 1
    })
    .await;
    assert!(
        peer.drop_connection(),
        "a pushed source's peer must be able to drop the connection"
    );
    peer.inject_inbound(&target, "after", false)
        .await
        .expect("a receiving channel's peer must be able to write into a conversation");
    until("the event sent after the drop dispatched", || {
        running.dispatched("after") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let seen = running.all_dispatched();
    running.stop().await;
    assert_eq!(
        seen,
        HashMap::from([("before".to_owned(), 1), ("after".to_owned(), 1)]),
        "every event arrives across the reconnect, none twice"
    );
    Outcome::Passed
}

pub async fn live_preview_is_removed_when_abandoned(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    let target = peer.target("abandon");
    if !clawgate_messages::previews_possible(&adapter, &addressed(peer, &target, "abandon", "")) {
        return Outcome::skipped(
            "the engine shows no preview on this channel (it needs live.delete, and live.edit \
             or a live adapter)",
        );
    }
    let (_dir, messenger, _clock) = fresh_engine(peer);
    let mut live = messenger
        .begin_live(
            addressed(peer, &target, "abandon", ""),
            clawgate_messages::SendOptions::default(),
            clawgate_messages::LiveOptions::default(),
        )
        .await
        .unwrap();
    live.update("a draft that never gets a final")
        .await
        .unwrap();
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["a draft that never gets a final"],
        "the preview shows (through the live adapter when one is declared)"
    );
    live.abandon().await.unwrap();
    assert!(
        peer.visible_texts(&target).await.is_empty(),
        "an abandoned reply leaves no preview behind"
    );
    Outcome::Passed
}
