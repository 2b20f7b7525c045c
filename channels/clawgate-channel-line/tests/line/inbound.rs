//! The webhook source as LINE drives it: signatures checked before anything is read, the
//! answer held until the engine's record (a nack or no answer → 500 → LINE's redelivery with
//! `isRedelivery` and the same `webhookEventId`), redelivery off → given up, LINE's empty
//! connectivity check, batches answered only when every event is recorded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_line::signature;
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
            .map(|e| e["event"]["webhookEventId"].as_str().unwrap().to_owned())
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

/// Runs the peer's webhook source into `sink` until the returned guard's stop.
async fn run(peer: &Peer, sink: Arc<Sink>) -> tokio::task::JoinHandle<()> {
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("LINE's source is a webhook");
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

async fn post(peer: &Peer, body: &str, signature: Option<&str>) -> u16 {
    let mut request = reqwest::Client::new()
        .post(&peer.webhook_url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(signature) = signature {
        request = request.header("x-line-signature", signature);
    }
    request.send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn a_bad_or_missing_signature_is_refused_before_anything_is_read() {
    let peer = Peer::start().await;
    peer.sim.set_webhook_url(None);
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    let body = json!({ "destination": peer.sim.bot_user_id(), "events": [{
        "type": "message", "webhookEventId": "01J0000000000000000000000A", "timestamp": 1,
        "deliveryContext": { "isRedelivery": false }, "mode": "active",
        "source": { "type": "user", "userId": "U1" }, "replyToken": "t",
        "message": { "id": "1", "type": "text", "text": "hi", "quoteToken": "q" } }] })
    .to_string();
    let good = signature::sign(peer.sim.channel_secret().as_bytes(), body.as_bytes());
    let other = signature::sign(b"another channel's secret", body.as_bytes());
    assert_eq!(post(&peer, &body, None).await, 401);
    assert_eq!(post(&peer, &body, Some(&other)).await, 401);
    assert_eq!(post(&peer, &body, Some("bm90IGFuIEhNQUM=")).await, 401);
    let tampered = body.replace("\"hi\"", "\"hI\"");
    assert_eq!(post(&peer, &tampered, Some(&good)).await, 401);
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    assert_eq!(post(&peer, &body, Some(&good)).await, 200);
    assert_eq!(sink.event_ids(), ["01J0000000000000000000000A"]);
    let handed = sink.events.lock().unwrap()[0].clone();
    assert_eq!(handed["destination"], peer.sim.bot_user_id().as_str());
    assert!(handed["receivedAtMs"].as_u64().is_some());
    // LINE's "Verify" button: an empty event list, answered 200.
    let empty = json!({ "destination": peer.sim.bot_user_id(), "events": [] }).to_string();
    let signed = signature::sign(peer.sim.channel_secret().as_bytes(), empty.as_bytes());
    assert_eq!(post(&peer, &empty, Some(&signed)).await, 200);
    sink.stop.send_replace(true);
    task.await.unwrap();
    peer.sim.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_the_same_401_and_an_oversized_delivery_is_413() {
    let peer = Peer::start().await;
    peer.sim.set_webhook_url(None);
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    let body = json!({ "destination": peer.sim.bot_user_id(), "events": [{
        "type": "message", "webhookEventId": "01J0000000000000000000000B", "timestamp": 1,
        "deliveryContext": { "isRedelivery": false }, "mode": "active",
        "source": { "type": "user", "userId": "U1" }, "replyToken": "t",
        "message": { "id": "2", "type": "text", "text": "big", "quoteToken": "q" } }] })
    .to_string();
    let http = reqwest::Client::new();
    let request = || {
        http.post(&peer.webhook_url)
            .header("content-type", "application/json")
            .body(body.clone())
    };
    let forged = answer(request().header(
        signature::SIGNATURE_HEADER,
        signature::sign(b"another channel's secret", body.as_bytes()),
    ))
    .await;
    let unsigned = answer(request()).await;
    assert_eq!((forged.0, forged.2.as_str()), (401, "unauthorized"));
    assert_eq!(forged, unsigned, "a caller cannot tell why it was refused");
    // The delivery padded past the limit and signed: taken, it would reach the engine.
    let mut big = body.into_bytes();
    big.resize(clawgate_channel_line::MAX_BODY_BYTES + 1, b' ');
    let signed = signature::sign(peer.sim.channel_secret().as_bytes(), &big);
    let status = post_raw(
        &peer.webhook_url,
        &[(signature::SIGNATURE_HEADER, &signed)],
        big.clone(),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    // At the limit exactly, the same delivery is taken.
    big.truncate(clawgate_channel_line::MAX_BODY_BYTES);
    let taken = reqwest::Client::new()
        .post(&peer.webhook_url)
        .header("content-type", "application/json")
        .header(
            signature::SIGNATURE_HEADER,
            signature::sign(peer.sim.channel_secret().as_bytes(), &big),
        )
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status().as_u16(), 200);
    assert_eq!(sink.event_ids(), ["01J0000000000000000000000B"]);
    sink.stop.send_replace(true);
    task.await.unwrap();
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_delivery_not_recorded_is_answered_500_and_line_redelivers_it() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[true]);
    let task = run(&peer, sink.clone()).await;
    let user = peer.sim.user("redelivery");
    let written = peer.sim.user_writes(&user, "hello");
    assert!(peer.sim.events_settled(Duration::from_secs(20)).await);
    let deliveries = peer.sim.deliveries();
    let shape: Vec<(bool, Option<u16>)> = deliveries
        .iter()
        .map(|d| (d.is_redelivery, d.status))
        .collect();
    assert_eq!(shape, [(false, Some(500)), (true, Some(200))]);
    assert_eq!(
        sink.event_ids(),
        [written.event_id.clone(), written.event_id.clone()]
    );
    // The receiver sees one event: the engine's dedupe keys on it.
    let receiver = peer.plugin.receiver.clone().unwrap();
    let events = sink.events.lock().unwrap().clone();
    let first = receiver.normalize(&events[0]).unwrap();
    let again = receiver.normalize(&events[1]).unwrap();
    assert_eq!(first.event_id, again.event_id);
    assert_eq!(events[1]["event"]["deliveryContext"]["isRedelivery"], true);
    // Each delivery is signed as LINE signs it.
    for d in &deliveries {
        signature::verify(
            peer.sim.channel_secret().as_bytes(),
            Some(&d.signature),
            d.body.as_bytes(),
        )
        .unwrap();
    }
    sink.stop.send_replace(true);
    task.await.unwrap();
    peer.sim.stop().await;
}

#[tokio::test]
async fn without_redelivery_a_failed_delivery_is_given_up() {
    let peer = Peer::start().await;
    peer.sim.set_redelivery(false);
    let sink = Sink::new(&[true]);
    let task = run(&peer, sink.clone()).await;
    let user = peer.sim.user("noredelivery");
    let written = peer.sim.user_writes(&user, "hello");
    assert!(peer.sim.events_settled(Duration::from_secs(20)).await);
    assert_eq!(peer.sim.given_up_events(), [written.event_id]);
    assert_eq!(peer.sim.deliveries().len(), 1);
    sink.stop.send_replace(true);
    task.await.unwrap();
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_batch_is_answered_200_only_when_every_event_is_recorded() {
    let peer = Peer::start().await;
    peer.sim.set_webhook_url(None);
    let sink = Sink::new(&[false, true]);
    let task = run(&peer, sink.clone()).await;
    let event = |id: &str| {
        json!({ "type": "message", "webhookEventId": id, "timestamp": 1,
        "deliveryContext": { "isRedelivery": false }, "mode": "active",
        "source": { "type": "user", "userId": "U1" },
        "message": { "id": id, "type": "text", "text": "hi" } })
    };
    let body = json!({ "destination": "Ubot", "events": [event("E1"), event("E2")] }).to_string();
    let signed = signature::sign(peer.sim.channel_secret().as_bytes(), body.as_bytes());
    assert_eq!(post(&peer, &body, Some(&signed)).await, 500);
    assert_eq!(
        sink.event_ids(),
        ["E1", "E2"],
        "each event handed over on its own"
    );
    assert_eq!(post(&peer, &body, Some(&signed)).await, 200);
    until("both handed twice", || sink.event_ids().len() == 4).await;
    sink.stop.send_replace(true);
    task.await.unwrap();
    peer.sim.stop().await;
}

/// An answer as a caller sees it: status, content type, body.
async fn answer(request: reqwest::RequestBuilder) -> (u16, String, String) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let kind = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, kind, response.text().await.unwrap())
}

/// POSTs `body` to `url` over a raw connection, writing it while the answer is read (a listener
/// that refuses early may answer and close before all of it is sent): the answer's status line.
async fn post_raw(url: &str, headers: &[(&str, &str)], body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (addr, path) = url.trim_start_matches("http://").split_once('/').unwrap();
    let mut head = format!(
        "POST /{path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let (mut read, mut write) = tokio::net::TcpStream::connect(addr)
        .await
        .unwrap()
        .into_split();
    // The write side stays open until the answer is in: hyper drops a half-closed request.
    let writing = tokio::spawn(async move {
        if write.write_all(head.as_bytes()).await.is_ok() {
            let _ = write.write_all(&body).await;
        }
        std::future::pending::<()>().await;
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut answer)).await;
    writing.abort();
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}
