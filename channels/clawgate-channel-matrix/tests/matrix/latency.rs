//! A person talks to the gateway through Synapse: each message goes `/sync` → the engine's
//! source runner → a receive context whose dispatch sends the final through the engine. Exactly
//! one final per message, counted from Synapse's own room history, and the inbound → final
//! latency (from the person's send to the final's event in Synapse) as p50 / p99.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{
    AckController, EventHandler, Messenger, ReceiveOptions, Receiver, RetryPolicy, SendOptions,
    SendOutcome, SourceRunner, SourceStores,
};
use clawgate_store::WatermarkKey;
use clawgate_types::MessageRelation;
use clawgate_types::clock::SystemClock;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::peer::Peer;

const MESSAGES: usize = 40;

/// Answers every message with `re: <text>` as a reply, and reports when the final landed.
struct Answering {
    receiver: Receiver,
    messenger: Messenger,
    landed: mpsc::UnboundedSender<(String, Instant)>,
}

#[async_trait]
impl EventHandler for Answering {
    async fn handle(&self, raw: &Value, ack: &AckController, _attempt: u32) -> bool {
        let messenger = self.messenger.clone();
        let landed = self.landed.clone();
        let outcome = self
            .receiver
            .receive(raw, ack, |inbound| async move {
                let text = inbound.message.body.map(|b| b.text).unwrap_or_default();
                let mut reply = ChannelMessage::outbound(
                    format!("re-{}", inbound.event_id),
                    "matrix",
                    inbound.message.target.clone(),
                    format!("re: {text}"),
                );
                reply.relation = Some(MessageRelation::reply_to(inbound.event_id.clone()));
                let report = messenger
                    .send(reply, SendOptions::default())
                    .await
                    .map_err(|e| e.to_string())?;
                if !matches!(report.outcome, SendOutcome::Sent { .. }) {
                    return Err(format!("the final was not sent: {report:?}"));
                }
                let _ = landed.send((text, Instant::now()));
                Ok::<(), String>(())
            })
            .await;
        outcome.is_ok()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64) * p).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_gets_exactly_one_final_per_message_through_synapse() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let clock = Arc::new(SystemClock);
    let messenger = Messenger::new(
        store.clone(),
        vec![peer.plugin.sender.clone()],
        RetryPolicy::default(),
        clock.clone(),
        "latency",
    );
    let normalizer = peer.plugin.receiver.clone().unwrap();
    let (landed, mut finals) = mpsc::unbounded_channel();
    let (stop, stopped) = watch::channel(false);
    let runner = SourceRunner::new(
        WatermarkKey {
            channel: "matrix".into(),
            account_id: String::new(),
            source: "sync".into(),
        },
        peer.plugin.source.clone(),
        normalizer.clone(),
        SourceStores {
            watermarks: store.clone(),
            inbound: store.clone(),
        },
        clock.clone(),
        Arc::new(Answering {
            receiver: Receiver::new(
                store.clone(),
                peer.plugin.sender.clone(),
                normalizer,
                clock,
                ReceiveOptions::default(),
            ),
            messenger,
            landed,
        }),
        stopped,
    );
    let task = tokio::spawn(runner.run());
    let mut latencies = Vec::new();
    for i in 0..MESSAGES {
        let text = format!("message {i}");
        let started = Instant::now();
        peer.write(
            &peer.ada,
            &room,
            json!({ "msgtype": "m.text", "body": text }),
        )
        .await;
        let (answered, at) = tokio::time::timeout(Duration::from_secs(30), finals.recv())
            .await
            .expect("a final within 30 s")
            .unwrap();
        assert_eq!(answered, text, "finals come in order");
        latencies.push(at - started);
    }
    let _ = stop.send(true);
    task.await.unwrap();
    let finals: Vec<String> = peer.texts(&room).await;
    let expected: Vec<String> = (0..MESSAGES).map(|i| format!("re: message {i}")).collect();
    assert_eq!(
        finals, expected,
        "exactly one final per message in Synapse's history"
    );
    latencies.sort();
    eprintln!(
        "matrix: inbound → final through Synapse {}: p50 {:.1} ms, p99 {:.1} ms over {MESSAGES} messages",
        clawgate_channel_matrix::testing::SYNAPSE_VERSION,
        percentile(&latencies, 0.50).as_secs_f64() * 1_000.0,
        percentile(&latencies, 0.99).as_secs_f64() * 1_000.0,
    );
}
