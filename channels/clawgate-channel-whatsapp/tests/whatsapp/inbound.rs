//! Receiving webhooks: signatures checked before parsing, the verification handshake, 503
//! until the durable record and Meta's redelivery deduplicated, batches split into one event
//! per message, statuses routed to the status book and never made turns, read receipts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_whatsapp::signature;
use clawgate_messages::{
    AckController, EventHandler, ReceiveOptions, Receiver, SourceRunner, SourceStores,
};
use clawgate_store::WatermarkKey;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::SystemClock;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::peer::{Peer, VERIFY_TOKEN, quick};

/// Counts, per text, the dispatches the source's events got.
struct Counting {
    receiver: Receiver,
    plugin: ChannelPlugin,
    dispatched: Arc<Mutex<HashMap<String, u32>>>,
}

#[async_trait]
impl EventHandler for Counting {
    async fn handle(&self, raw: &Value, ack: &AckController, _attempt: u32) -> bool {
        let body = self
            .plugin
            .receiver
            .as_ref()
            .and_then(|r| r.normalize(raw).ok())
            .and_then(|i| i.message.body.map(|b| b.text))
            .unwrap_or_default();
        let counts = self.dispatched.clone();
        let outcome = self
            .receiver
            .receive(raw, ack, |_| async move {
                *counts.lock().unwrap().entry(body).or_default() += 1;
                Ok::<(), String>(())
            })
            .await;
        outcome.is_ok()
    }
}

struct Running {
    dispatched: Arc<Mutex<HashMap<String, u32>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(plugin: &ChannelPlugin, store: &Arc<SqliteStore>) -> Running {
        let normalizer = plugin.receiver.clone().unwrap();
        let dispatched = Arc::new(Mutex::new(HashMap::new()));
        let (stop, stopped) = watch::channel(false);
        let handler = Counting {
            receiver: Receiver::new(
                store.clone(),
                plugin.sender.clone(),
                normalizer.clone(),
                Arc::new(SystemClock),
                ReceiveOptions::default(),
            ),
            plugin: plugin.clone(),
            dispatched: dispatched.clone(),
        };
        let runner = SourceRunner::new(
            WatermarkKey {
                channel: plugin.name().to_owned(),
                account_id: String::new(),
                source: "webhook".into(),
            },
            plugin.source.clone(),
            normalizer,
            SourceStores {
                watermarks: store.clone(),
                inbound: store.clone(),
            },
            Arc::new(SystemClock),
            Arc::new(handler),
            stopped,
        );
        Running {
            dispatched,
            stop,
            task: tokio::spawn(runner.run()),
        }
    }

    fn seen(&self) -> HashMap<String, u32> {
        self.dispatched.lock().unwrap().clone()
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Polls `check` until it holds, up to 30 s.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    (dir, store)
}

async fn post(url: &str, body: &str, signature: Option<String>) -> u16 {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(signature) = signature {
        request = request.header(signature::SIGNATURE_HEADER, signature);
    }
    request.send().await.unwrap().status().as_u16()
}

fn counts(pairs: &[(&str, u32)]) -> HashMap<String, u32> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_forged_and_tampered_deliveries_are_refused_before_parsing() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let running = Running::start(&peer.attached_plugin(), &store);
    let person = peer.person("signed");
    peer.sim.person_writes(&person.id, "Ada", "genuine");
    until("the genuine message", || {
        running.seen().contains_key("genuine")
    })
    .await;
    // Meta records an attempt's status once our answer reaches it, which may be just after
    // the turn saw the message (and an attempt made before the listener was ready was a 503).
    until("Meta's record of the genuine delivery answered 200", || {
        peer.sim
            .deliveries()
            .last()
            .is_some_and(|d| d.attempts.last() == Some(&200))
    })
    .await;
    let genuine = peer.sim.deliveries().pop().unwrap();
    // Another message: new text, new wamid (the genuine one's id would be deduplicated).
    let wamid = genuine.body["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = genuine
        .body
        .to_string()
        .replace("genuine", "forged")
        .replace(&wamid, &format!("{wamid}F"));
    let secret = peer.sim.app_secret();
    assert_eq!(post(&peer.webhook_url, &body, None).await, 401, "unsigned");
    assert_eq!(
        post(
            &peer.webhook_url,
            &body,
            Some(signature::sign(b"not-the-secret", body.as_bytes()))
        )
        .await,
        401,
        "signed with another secret"
    );
    let signed_original = signature::sign(secret.as_bytes(), genuine.body.to_string().as_bytes());
    assert_eq!(
        post(&peer.webhook_url, &body, Some(signed_original)).await,
        401,
        "a tampered body"
    );
    assert_eq!(
        post(&peer.webhook_url, &body, Some("sha256=nothex".into())).await,
        401,
        "a malformed header"
    );
    // Not even parsed: garbage under a bad signature is refused like the rest, and garbage
    // under a good one is a 400.
    assert_eq!(
        post(&peer.webhook_url, "{not json", Some("sha256=00".into())).await,
        401
    );
    assert_eq!(
        post(
            &peer.webhook_url,
            "{not json",
            Some(signature::sign(secret.as_bytes(), b"{not json"))
        )
        .await,
        400
    );
    // The same forged body, properly signed, would have been a turn: the refusals above are
    // the signature's doing.
    assert_eq!(
        post(
            &peer.webhook_url,
            &body,
            Some(signature::sign(secret.as_bytes(), body.as_bytes()))
        )
        .await,
        200
    );
    until("the signed copy", || running.seen().contains_key("forged")).await;
    assert_eq!(running.seen(), counts(&[("genuine", 1), ("forged", 1)]));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_the_same_401_and_an_oversized_notification_is_413() {
    let peer = Peer::start().await;
    let InboundSource::Pushed(attach) = peer.attached_plugin().source else {
        panic!("the WhatsApp source is pushed");
    };
    let tally = Arc::new(Tally::default());
    let attached = {
        let tally = tally.clone();
        tokio::spawn(async move { attach.run(tally).await })
    };
    let from = crate::peer::number_for("oversized");
    let body = json!({ "object": "whatsapp_business_account", "entry": [{ "id": "WABA",
        "changes": [{ "field": "messages", "value": { "messaging_product": "whatsapp",
            "metadata": { "display_phone_number": "15550000000",
                "phone_number_id": peer.sim.phone_number_id() },
            "contacts": [{ "profile": { "name": "Ada" }, "wa_id": from }],
            "messages": [{ "from": from, "id": "wamid.BIG", "timestamp": "1",
                "type": "text", "text": { "body": "big" } }] } }] }] })
    .to_string();
    let http = reqwest::Client::new();
    let request = || {
        http.post(&peer.webhook_url)
            .header("content-type", "application/json")
            .body(body.clone())
    };
    // A mismatch and a missing header were 403 and 401 with different texts: now one answer.
    let forged = answer(request().header(
        signature::SIGNATURE_HEADER,
        signature::sign(b"not-the-secret", body.as_bytes()),
    ))
    .await;
    let unsigned = answer(request()).await;
    assert_eq!((forged.0, forged.2.as_str()), (401, "unauthorized"));
    assert_eq!(forged, unsigned, "a caller cannot tell why it was refused");
    // The notification padded past the limit and signed: taken, it would reach the engine.
    let mut big = body.into_bytes();
    big.resize(clawgate_channel_whatsapp::MAX_BODY_BYTES + 1, b' ');
    let signed = signature::sign(peer.sim.app_secret().as_bytes(), &big);
    let status = post_raw(
        &peer.webhook_url,
        &[(signature::SIGNATURE_HEADER, &signed)],
        big.clone(),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
    assert_eq!(
        tally.delivered.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached the engine"
    );
    // At the limit exactly (above axum's own 2 MB default), the same notification is taken.
    big.truncate(clawgate_channel_whatsapp::MAX_BODY_BYTES);
    let taken = reqwest::Client::new()
        .post(&peer.webhook_url)
        .header("content-type", "application/json")
        .header(
            signature::SIGNATURE_HEADER,
            signature::sign(peer.sim.app_secret().as_bytes(), &big),
        )
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status().as_u16(), 200);
    assert_eq!(tally.delivered.load(std::sync::atomic::Ordering::SeqCst), 1);
    tally.stop.notify_one();
    attached.await.unwrap().unwrap();
}

#[tokio::test]
async fn the_verification_handshake_echoes_the_challenge_only_for_our_token() {
    let peer = Peer::start().await;
    assert!(
        peer.sim
            .subscribe(&peer.webhook_url, VERIFY_TOKEN)
            .await
            .is_ok()
    );
    let refused = peer
        .sim
        .subscribe(&peer.webhook_url, "guessed")
        .await
        .unwrap_err();
    assert!(refused.contains("403"), "{refused}");
    let answer = |mode: &'static str, token: &'static str| {
        let url = peer.webhook_url.clone();
        async move {
            let response = reqwest::Client::new()
                .get(url)
                .query(&[
                    ("hub.mode", mode),
                    ("hub.verify_token", token),
                    ("hub.challenge", "1158201444"),
                ])
                .send()
                .await
                .unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    assert_eq!(
        answer("subscribe", VERIFY_TOKEN).await,
        (200, "1158201444".to_owned())
    );
    assert_eq!(answer("unsubscribe", VERIFY_TOKEN).await.0, 403);
    assert_eq!(answer("subscribe", "meatyhamhoc").await.0, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_wait_with_503_until_recorded_and_redeliveries_make_one_turn() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let person = peer.person("redelivery");
    // Nobody records yet (the gateway is down): Meta hears 503 and tries again.
    peer.sim.person_writes(&person.id, "Ada", "while down");
    until("a refused attempt", || {
        peer.sim.deliveries()[0].attempts.len() >= 2
    })
    .await;
    assert!(peer.sim.deliveries()[0].attempts.iter().all(|s| *s == 503));
    let running = Running::start(&peer.attached_plugin(), &store);
    until("the redelivered message", || {
        running.seen().contains_key("while down")
    })
    .await;
    assert!(peer.sim.deliveries_settled(Duration::from_secs(20)).await);
    assert_eq!(peer.sim.deliveries()[0].attempts.last(), Some(&200));
    // Meta sends it again (a copy for another app, a retry that raced its answer), also
    // after a restart: one turn.
    peer.sim.replay(0);
    assert!(peer.sim.deliveries_settled(Duration::from_secs(20)).await);
    running.stop().await;
    let running = Running::start(&peer.attached_plugin(), &store);
    peer.sim.replay(0);
    peer.sim.person_writes(&person.id, "Ada", "after restart");
    until("the next message", || {
        running.seen().contains_key("after restart")
    })
    .await;
    assert!(peer.sim.deliveries_settled(Duration::from_secs(20)).await);
    running.stop().await;
    let replays = peer.sim.deliveries().iter().filter(|d| d.acked).count();
    assert_eq!(replays, 4, "every copy was answered 200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_one_event_per_message_and_statuses_are_never_turns() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let running = Running::start(&peer.attached_plugin(), &store);
    let person = peer.person("batch");
    peer.sim
        .person_writes_batch(&person.id, "Ada", &["one", "two", "three"]);
    until("three turns", || running.seen().len() == 3).await;
    // Statuses of a send of ours settle the book; they dispatch nothing.
    let ctx = SendContext::new(
        ChannelMessage::outbound("s-1", "whatsapp", person.clone(), ""),
        "s-1",
    );
    peer.plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "an answer"))
        .await
        .unwrap();
    let wamid = peer.sim.sent(&person.id)[0].wamid.clone();
    assert!(peer.sim.person_reads(&wamid));
    assert!(peer.sim.deliveries_settled(Duration::from_secs(20)).await);
    let statuses: Vec<String> = peer
        .sim
        .deliveries()
        .iter()
        .filter_map(|d| {
            d.body
                .pointer("/entry/0/changes/0/value/statuses/0/status")
                .cloned()
        })
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect();
    assert_eq!(statuses.len(), 3, "{statuses:?}");
    for status in ["sent", "delivered", "read"] {
        assert!(statuses.iter().any(|s| s == status), "{statuses:?}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        running.seen(),
        counts(&[("one", 1), ("two", 1), ("three", 1)])
    );
    running.stop().await;
    let book = peer.status_book().await;
    let evidence = book.get("s-1#0").await.unwrap().unwrap();
    assert!(evidence.accepted);
    assert_eq!(evidence.wamid.as_deref(), Some(wamid.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_messages_are_marked_read_when_the_account_says_so() {
    let peer = Peer::with(quick(), json!({ "mark_read": true })).await;
    let (_dir, store) = store();
    let running = Running::start(&peer.attached_plugin(), &store);
    let person = peer.person("reads");
    let wamid = peer.sim.person_writes(&person.id, "Ada", "seen?");
    until("the message read", || {
        peer.sim
            .inbound()
            .iter()
            .any(|m| m.wamid == wamid && m.read)
    })
    .await;
    let read = peer
        .sim
        .calls()
        .into_iter()
        .find(|c| c.body.get("status").is_some())
        .unwrap();
    assert_eq!(read.body["message_id"], json!(wamid));
    assert_eq!(read.status, 200);
    running.stop().await;
}

/// An engine side that counts what reaches it.
#[derive(Default)]
struct Tally {
    delivered: std::sync::atomic::AtomicUsize,
    stop: tokio::sync::Notify,
}

#[async_trait]
impl EventSink for Tally {
    async fn deliver(&self, event: PushedEvent) {
        self.delivered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        event.ack.ack();
    }
    async fn stopped(&self) {
        self.stop.notified().await;
    }
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
