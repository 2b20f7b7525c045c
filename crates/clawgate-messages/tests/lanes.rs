//! A source runner keeps one lane (a task) per conversation only while the conversation has
//! events queued or in work: after thousands of conversations went idle no lane is left, and a
//! conversation whose lane ended between its messages still gets them in order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::testing::{MemoryChannel, MemoryPlatform};
use clawgate_messages::{AckController, EventHandler, SourceRunner, SourceStores};
use clawgate_store::WatermarkKey;
use clawgate_types::clock::SystemClock;

/// Finishes every event at once, recording (conversation, text) in the order handled.
struct Recording {
    plugin: clawgate_channel_sdk::ChannelPlugin,
    handled: Mutex<Vec<(String, String)>>,
    count: AtomicUsize,
}

#[async_trait]
impl EventHandler for Recording {
    async fn handle(&self, raw: &serde_json::Value, ack: &AckController, _attempt: u32) -> bool {
        let inbound = self
            .plugin
            .receiver
            .as_ref()
            .expect("a receiver")
            .normalize(raw)
            .expect("a memory event normalizes");
        let text = inbound.message.body.map(|b| b.text).unwrap_or_default();
        self.handled
            .lock()
            .expect("lock")
            .push((inbound.message.target.id, text));
        self.count.fetch_add(1, Ordering::SeqCst);
        ack.ack();
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lane_outlives_its_conversations_events() {
    const CONVERSATIONS: usize = 20_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let platform = MemoryPlatform::new();
    let plugin = MemoryChannel::new("memory", platform.clone())
        .pushed()
        .plugin();
    let handler = Arc::new(Recording {
        plugin: plugin.clone(),
        handled: Mutex::default(),
        count: AtomicUsize::new(0),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let runner = SourceRunner::new(
        WatermarkKey {
            channel: "memory".into(),
            account_id: String::new(),
            source: "lanes".into(),
        },
        plugin.source.clone(),
        plugin.receiver.clone().expect("a receiver"),
        SourceStores {
            watermarks: store.clone(),
            inbound: store.clone(),
        },
        Arc::new(SystemClock),
        handler.clone(),
        stopped,
    );
    let lanes = runner.lanes();
    let task = tokio::spawn(runner.run());
    // One conversation written to between thousands of others: its order must hold although
    // its idle lane is dropped and opened again between its messages.
    for n in 0..CONVERSATIONS {
        if n % 5_000 == 0 {
            platform.write("steady", "alice", &format!("steady {}", n / 5_000), false);
        }
        platform.write(&format!("c-{n}"), "alice", "hello", false);
    }
    let expected = CONVERSATIONS + CONVERSATIONS / 5_000;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while handler.count.load(Ordering::SeqCst) < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "handled {} of {expected}",
            handler.count.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every conversation is idle now: each lane ended right after its last event.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while lanes.load(Ordering::SeqCst) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} lanes alive after {CONVERSATIONS} idle conversations",
            lanes.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let steady: Vec<String> = handler
        .handled
        .lock()
        .expect("lock")
        .iter()
        .filter(|(conversation, _)| conversation == "steady")
        .map(|(_, text)| text.clone())
        .collect();
    assert_eq!(steady, ["steady 0", "steady 1", "steady 2", "steady 3"]);
    let _ = stop.send(true);
    task.await.expect("the runner stops");
}
