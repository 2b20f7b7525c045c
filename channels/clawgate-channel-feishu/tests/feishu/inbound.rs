//! The event callback as Feishu drives it: the signature checked before anything is decrypted,
//! the answer held until the engine's record (a nack → 503 → Feishu's re-push under the same
//! event id), the URL verification, tampered and unsigned requests refused, and the receiver's
//! dedupe key the same for a redelivery and for a re-push under a new event id.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_feishu::crypto;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{EventSink, PushedEvent};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::peer::Peer;

/// The engine's side, as a test plays it: every event is kept; each is acked or nacked by the
/// next scripted answer (ack when the script is empty).
struct Sink {
    events: Mutex<Vec<Value>>,
    nacks: Mutex<VecDeque<bool>>,
    stop: watch::Sender<bool>,
}

impl Sink {
    fn new(script: &[bool]) -> Arc<Sink> {
        Arc::new(Sink {
            events: Mutex::new(Vec::new()),
            nacks: Mutex::new(script.iter().copied().collect()),
            stop: watch::channel(false).0,
        })
    }

    fn event_ids(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e["header"]["event_id"].as_str().unwrap().to_owned())
            .collect()
    }
}

#[clawgate_channel_sdk::async_trait]
impl EventSink for Sink {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw.clone());
        let nack = self.nacks.lock().unwrap().pop_front().unwrap_or(false);
        if nack {
            event.ack.nack("the test refuses it");
        } else {
            event.ack.ack();
        }
    }

    async fn stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }
}

async fn run(peer: &Peer, sink: Arc<Sink>) -> tokio::task::JoinHandle<()> {
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("Feishu's source is a callback");
    };
    let task = tokio::spawn(async move {
        let _ = feed.run(sink).await;
    });
    peer.listening().await;
    task
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_event_is_answered_200_only_after_the_record_and_redelivered_after_a_nack() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[true]);
    let task = run(&peer, sink.clone()).await;
    let chat = peer.sim.p2p("ada");
    let written = peer.sim.writes(&chat, "ada", "hello bot");
    assert!(peer.sim.events_settled(Duration::from_secs(20)).await);
    let statuses: Vec<(u32, Option<u16>)> = peer
        .sim
        .deliveries()
        .iter()
        .map(|d| (d.attempt, d.status))
        .collect();
    assert_eq!(statuses, [(1, Some(503)), (2, Some(200))]);
    assert_eq!(
        sink.event_ids(),
        [written.event_id.clone(), written.event_id]
    );
    // The receiver answers both with one dedupe key.
    let receiver = peer.plugin.receiver.clone().unwrap();
    let events = sink.events.lock().unwrap().clone();
    let keys: Vec<String> = events
        .iter()
        .map(|e| receiver.normalize(e).unwrap().event_id)
        .collect();
    assert_eq!(keys, [written.message_id.clone(), written.message_id]);
    sink.stop.send_replace(true);
    let _ = task.await;
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_repush_under_a_new_event_id_dedupes_on_the_message_id() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    let chat = peer.sim.group("team", &["ada"]);
    let written = peer.sim.writes(&chat, "ada", "once please");
    assert!(peer.sim.events_settled(Duration::from_secs(20)).await);
    // At least once, even after a 200: the same event again, and the message under a new id.
    peer.sim.redeliver(&written.event_id);
    let new_id = peer.sim.repush(&written.event_id).unwrap();
    until("three deliveries", || {
        sink.events.lock().unwrap().len() == 3
    })
    .await;
    let mut ids = sink.event_ids();
    ids.sort();
    let mut expected = vec![written.event_id.clone(), written.event_id.clone(), new_id];
    expected.sort();
    assert_eq!(ids, expected);
    let receiver = peer.plugin.receiver.clone().unwrap();
    for event in sink.events.lock().unwrap().iter() {
        assert_eq!(
            receiver.normalize(event).unwrap().event_id,
            written.message_id
        );
    }
    sink.stop.send_replace(true);
    let _ = task.await;
    peer.sim.stop().await;
}

#[tokio::test]
async fn tampered_unsigned_and_wrong_token_callbacks_are_refused_before_the_engine() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    assert_eq!(
        peer.sim.verify_url().await.map(|c| c.len()),
        Some(24),
        "the URL verification is answered with its challenge"
    );
    let key = peer.sim.config().encrypt_key.clone();
    let token = peer.sim.config().verification_token.clone();
    let event = |token: &str| {
        json!({ "schema": "2.0", "header": { "event_id": "ev-forged", "token": token,
            "event_type": "im.message.receive_v1", "app_id": "cli_x", "tenant_key": "t",
            "create_time": "1" }, "event": {} })
    };
    let sealed = |plain: &Value, key: &str| {
        json!({ "encrypt": crypto::encrypt(plain.to_string().as_bytes(), key, [7; 16]) })
            .to_string()
    };
    let http = reqwest::Client::new();
    let post = |body: String, signature: Option<String>| {
        let mut request = http
            .post(&peer.callback_url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(signature) = signature {
            request = request
                .header(crypto::TIMESTAMP_HEADER, "1700000000")
                .header(crypto::NONCE_HEADER, "n1")
                .header(crypto::SIGNATURE_HEADER, signature);
        }
        request.send()
    };
    let good = sealed(&event(&token), &key);
    let sign = |body: &str| crypto::sign("1700000000", "n1", &key, body.as_bytes());
    let cases: Vec<(&str, String, Option<String>, u16)> = vec![
        (
            "a tampered body",
            good.replace('A', "B"),
            Some(sign(&good)),
            401,
        ),
        ("no signature", good.clone(), None, 401),
        (
            "another key",
            sealed(&event(&token), "other key"),
            Some(sign(&sealed(&event(&token), "other key"))),
            400,
        ),
        (
            "a wrong token",
            sealed(&event("forged"), &key),
            Some(sign(&sealed(&event("forged"), &key))),
            401,
        ),
        (
            "plaintext",
            event(&token).to_string(),
            Some(sign(&event(&token).to_string())),
            400,
        ),
    ];
    for (name, body, signature, status) in cases {
        let answer = post(body, signature).await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{name}");
    }
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing refused reached the engine"
    );
    // The same event, signed correctly, is taken.
    let answer = post(good.clone(), Some(sign(&good))).await.unwrap();
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(sink.event_ids(), ["ev-forged"]);
    sink.stop.send_replace(true);
    let _ = task.await;
    peer.sim.stop().await;
}

#[tokio::test]
async fn an_unanswered_event_is_pushed_on_the_schedule_then_given_up() {
    let config = clawgate_channel_feishu::simulator::SimulatorConfig {
        redelivery_delays: vec![Duration::from_millis(30), Duration::from_millis(60)],
        ..crate::peer::quick()
    };
    let sim = clawgate_channel_feishu::simulator::FeishuSimulator::start(config)
        .await
        .unwrap();
    sim.set_callback_url(Some("http://127.0.0.1:9/nobody"));
    let chat = sim.p2p("ada");
    let written = sim.writes(&chat, "ada", "anyone?");
    assert!(sim.events_settled(Duration::from_secs(20)).await);
    let attempts: Vec<(String, u32, Option<u16>)> = sim
        .deliveries()
        .iter()
        .map(|d| (d.event_id.clone(), d.attempt, d.status))
        .collect();
    let id = written.event_id;
    assert_eq!(
        attempts,
        [(id.clone(), 1, None), (id.clone(), 2, None), (id, 3, None)],
        "the first push and one per delay"
    );
    // Each push is freshly signed: the signatures differ and each verifies.
    let key = sim.config().encrypt_key.clone();
    for d in sim.deliveries() {
        crypto::verify(
            Some(&d.timestamp),
            Some(&d.nonce),
            Some(&d.signature),
            &key,
            d.body.as_bytes(),
        )
        .unwrap();
    }
    sim.stop().await;
}
