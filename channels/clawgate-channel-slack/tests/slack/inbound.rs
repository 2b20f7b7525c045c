//! Receiving from the Events API: signatures and replays refused, URL verification, the 2xx
//! only after the durable record, retries and resends deduplicated, edits and deletes not
//! prompts, and marked gateway-failure echoes from bots dropped before bot authorization.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use clawgate_channel_sdk::NoTransportAck;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_slack::signature;
use clawgate_channel_slack::simulator::ConversationKind;
use clawgate_messages::{
    AckController, EventHandler, ReceiveOptions, ReceiveOutcome, Receiver, SourceRunner,
    SourceStores,
};
use clawgate_store::WatermarkKey;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::{ManualClock, SystemClock};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};

use crate::peer::Peer;

/// Counts, per text, the dispatches the source's events got; holds every event until a permit
/// is given when `gate` is set (the durable record not yet written).
struct Counting {
    receiver: Receiver,
    plugin: ChannelPlugin,
    dispatched: Arc<Mutex<HashMap<String, u32>>>,
    gate: Option<Arc<Semaphore>>,
}

#[async_trait]
impl EventHandler for Counting {
    async fn handle(&self, raw: &Value, ack: &AckController, _attempt: u32) -> bool {
        if let Some(gate) = &self.gate {
            let _permit = gate.acquire().await.unwrap();
        }
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
    fn start(
        plugin: &ChannelPlugin,
        store: &Arc<SqliteStore>,
        gate: Option<Arc<Semaphore>>,
    ) -> Running {
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
            gate,
        };
        let runner = SourceRunner::new(
            WatermarkKey {
                channel: plugin.name().to_owned(),
                account_id: String::new(),
                source: "events".into(),
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

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    (dir, store)
}

/// Posts `body` to the listener with these signature headers; the status and body.
async fn post(
    url: &str,
    body: &str,
    timestamp: Option<String>,
    signature: Option<String>,
) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(timestamp) = timestamp {
        request = request.header(signature::TIMESTAMP_HEADER, timestamp);
    }
    if let Some(signature) = signature {
        request = request.header(signature::SIGNATURE_HEADER, signature);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_forged_tampered_and_replayed_requests_are_refused() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store, None);
    let secret = peer.sim.signing_secret();
    let url = peer.events_url.clone();
    // The listener is up once URL verification answers (signed, fresh).
    let verification =
        json!({ "token": "t", "challenge": "c0ffee", "type": "url_verification" }).to_string();
    let answer;
    let sign = |ts: u64, body: &str| {
        (
            Some(ts.to_string()),
            Some(signature::sign(
                secret.as_bytes(),
                &ts.to_string(),
                body.as_bytes(),
            )),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ts, sig) = sign(now_s(), &verification);
        if let Ok(response) = reqwest::Client::new()
            .post(&url)
            .header(signature::TIMESTAMP_HEADER, ts.unwrap())
            .header(signature::SIGNATURE_HEADER, sig.unwrap())
            .body(verification.clone())
            .send()
            .await
        {
            answer = (response.status().as_u16(), response.text().await.unwrap());
            break;
        }
        assert!(Instant::now() < deadline, "the listener never came up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        answer,
        (200, "c0ffee".to_owned()),
        "URL verification answers the challenge"
    );
    let room = peer
        .sim
        .create_conversation("room", ConversationKind::Public, true);
    peer.sim.set_request_url(None);
    peer.sim.person_writes(&room, &peer.person, "forged?", None);
    let event = peer.last_event().to_string();
    let now = now_s();
    let (good_ts, good_sig) = sign(now, &event);
    let (old_ts, old_sig) = sign(now - signature::MAX_AGE_S - 60, &event);
    let other_sig = Some(signature::sign(
        b"not the secret",
        &now.to_string(),
        event.as_bytes(),
    ));
    let cases = [
        ("unsigned", event.clone(), None, None),
        ("no signature", event.clone(), good_ts.clone(), None),
        ("another secret", event.clone(), good_ts.clone(), other_sig),
        (
            "tampered body",
            event.replace("forged?", "forged!"),
            good_ts.clone(),
            good_sig.clone(),
        ),
        (
            "replayed (old timestamp, valid signature)",
            event.clone(),
            old_ts,
            old_sig,
        ),
        (
            "signature of another timestamp",
            event.clone(),
            Some((now - 1).to_string()),
            good_sig.clone(),
        ),
    ];
    for (name, body, ts, sig) in cases {
        let (status, _) = post(&url, &body, ts, sig).await;
        assert_eq!(status, 401, "{name}");
    }
    assert!(running.seen().is_empty(), "nothing refused was dispatched");
    let (status, _) = post(&url, &event, good_ts, good_sig).await;
    assert_eq!(status, 200, "the genuine request");
    assert_eq!(running.seen(), HashMap::from([("forged?".to_owned(), 1)]));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_timestamp_is_checked_against_the_gateways_clock() {
    // The gateway's clock ten minutes ahead of the wall clock: freshness is its call.
    let gateway_now_s = now_s() + 600;
    let clock = Arc::new(ManualClock::new(
        i64::try_from(gateway_now_s).unwrap() * 1_000,
    ));
    let peer = Peer::with_on(crate::peer::quiet(), json!({}), Some(clock)).await;
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store, None);
    peer.listening().await;
    let secret = peer.sim.signing_secret();
    let verification =
        json!({ "token": "t", "challenge": "c0ffee", "type": "url_verification" }).to_string();
    let signed = |ts: u64| {
        let ts = ts.to_string();
        let sig = signature::sign(secret.as_bytes(), &ts, verification.as_bytes());
        (Some(ts), Some(sig))
    };
    let (ts, sig) = signed(now_s());
    let (status, _) = post(&peer.events_url, &verification, ts, sig).await;
    assert_eq!(
        status, 401,
        "fresh by the wall clock, ten minutes old by the gateway's"
    );
    let (ts, sig) = signed(gateway_now_s);
    assert_eq!(
        post(&peer.events_url, &verification, ts, sig).await,
        (200, "c0ffee".to_owned()),
        "fresh by the gateway's clock"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_2xx_before_the_durable_record_and_slacks_retry_is_deduplicated() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let gate = Arc::new(Semaphore::new(0));
    let running = Running::start(&peer.plugin, &store, Some(gate.clone()));
    peer.listening().await;
    let room = peer
        .sim
        .create_conversation("room", ConversationKind::Public, true);
    peer.sim.person_writes(&room, &peer.person, "held", None);
    let event_id = peer.sim.event_ids().pop().unwrap();
    // Not recorded yet: the listener answers 503 at its deadline, and Slack retries.
    until("an unanswered delivery", || {
        peer.sim.deliveries().iter().any(|d| d.event_id == event_id)
    })
    .await;
    let first = peer
        .sim
        .deliveries()
        .into_iter()
        .find(|d| d.event_id == event_id)
        .unwrap();
    assert_eq!(first.status, Some(503), "{first:?}");
    assert!(running.seen().is_empty());
    gate.add_permits(1_000);
    until("the event acknowledged", || {
        peer.sim
            .deliveries()
            .iter()
            .any(|d| d.event_id == event_id && d.status == Some(200))
    })
    .await;
    let acked = peer
        .sim
        .deliveries()
        .into_iter()
        .find(|d| d.event_id == event_id && d.status == Some(200))
        .unwrap();
    assert!(acked.retry_num >= 1, "acknowledged on a retry: {acked:?}");
    until("the dispatch", || running.seen().get("held") == Some(&1)).await;
    assert!(peer.sim.events_settled(Duration::from_secs(30)).await);
    assert_eq!(
        running.seen(),
        HashMap::from([("held".to_owned(), 1)]),
        "the held first attempt and the retry are one event"
    );
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_resends_under_new_event_ids_edits_and_deletes_make_one_turn() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store, None);
    peer.listening().await;
    let room = peer
        .sim
        .create_conversation("room", ConversationKind::Public, true);
    let message = peer.sim.person_writes(&room, &peer.person, "once", None);
    let event_id = peer.sim.event_ids().pop().unwrap();
    until("the dispatch", || running.seen().get("once") == Some(&1)).await;
    // Slack's retry of an answered delivery, and the same message under a new event id.
    peer.sim.redeliver(&event_id);
    let resent = peer.sim.resend_event(&event_id).unwrap();
    assert_ne!(resent, event_id);
    peer.sim.person_edits(&room, &message.ts, "once, edited");
    peer.sim.person_deletes(&room, &message.ts);
    assert!(peer.sim.events_settled(Duration::from_secs(30)).await);
    let statuses: Vec<Option<u16>> = peer.sim.deliveries().iter().map(|d| d.status).collect();
    assert!(
        statuses.iter().all(|s| *s == Some(200)),
        "every delivery answered 2xx: {:?}",
        peer.sim.deliveries()
    );
    let retried = peer
        .sim
        .deliveries()
        .into_iter()
        .filter(|d| d.event_id == event_id)
        .map(|d| (d.retry_num, d.retry_reason))
        .collect::<Vec<_>>();
    assert_eq!(retried, [(0, None), (1, Some("http_timeout".to_owned()))]);
    assert_eq!(running.seen(), HashMap::from([("once".to_owned(), 1)]));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marked_echoes_from_bots_drop_before_allow_bots_and_unmarked_ones_meet_it() {
    let peer = Peer::start().await;
    let room = peer
        .sim
        .create_conversation("bots", ConversationKind::Public, true);
    let other = peer.sim.other_bot("another-gateway");
    let notice = "Agent failed before reply.";
    let marker = serde_json::to_value(MessageOrigin::gateway_failure(
        clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
    ))
    .unwrap();
    let marked_meta = json!({ "event_type": clawgate_channel_slack::METADATA_EVENT_TYPE,
        "event_payload": { "key": "x#0", "origin": marker } });
    peer.sim
        .bot_writes(&room, &other, notice, None, Some(marked_meta));
    let marked = peer.last_event();
    peer.sim.bot_writes(&room, &other, notice, None, None);
    let unmarked = peer.last_event();
    peer.sim.person_writes(&room, &peer.person, notice, None);
    let person = peer.last_event();
    for allow_bots in [false, true] {
        let (_dir, store) = store();
        let receiver = Receiver::new(
            store,
            peer.plugin.sender.clone(),
            peer.plugin.receiver.clone().unwrap(),
            Arc::new(SystemClock),
            ReceiveOptions {
                allow_bots,
                ..ReceiveOptions::default()
            },
        );
        let mut outcomes = Vec::new();
        for raw in [&marked, &unmarked, &person] {
            let ack = AckController::new(Arc::new(NoTransportAck));
            outcomes.push(
                receiver
                    .receive(raw, &ack, |_| async { Ok::<(), String>(()) })
                    .await
                    .unwrap(),
            );
        }
        assert!(
            matches!(outcomes[0], ReceiveOutcome::DroppedEcho),
            "allow_bots={allow_bots}: {:?}",
            outcomes[0]
        );
        if allow_bots {
            assert!(
                matches!(outcomes[1], ReceiveOutcome::Handled { .. }),
                "the same text unmarked is authorized normally: {:?}",
                outcomes[1]
            );
        } else {
            assert!(
                matches!(outcomes[1], ReceiveOutcome::Unauthorized),
                "{:?}",
                outcomes[1]
            );
        }
        assert!(
            matches!(outcomes[2], ReceiveOutcome::Handled { .. }),
            "{:?}",
            outcomes[2]
        );
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_the_same_401_and_an_oversized_event_is_413() {
    let peer = Peer::start().await;
    peer.sim.set_request_url(None);
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("the Events API source is pushed");
    };
    let tally = Arc::new(Tally::default());
    let running = {
        let tally = tally.clone();
        tokio::spawn(async move { feed.run(tally).await })
    };
    peer.listening().await;
    let secret = peer.sim.signing_secret();
    let event = json!({ "type": "event_callback", "event_id": "Ev0BIG", "event_time": now_s(),
        "event": { "type": "message", "channel": "C0BIG", "user": "U0BIG", "text": "big",
            "ts": "1700000000.000100", "channel_type": "channel" } });
    let body = event.to_string();
    let ts = now_s().to_string();
    let http = reqwest::Client::new();
    let request = || {
        http.post(&peer.events_url)
            .header("content-type", "application/json")
            .body(body.clone())
    };
    let forged = answer(request().header(signature::TIMESTAMP_HEADER, &ts).header(
        signature::SIGNATURE_HEADER,
        signature::sign(b"not the secret", &ts, body.as_bytes()),
    ))
    .await;
    let unsigned = answer(request()).await;
    assert_eq!((forged.0, forged.2.as_str()), (401, "unauthorized"));
    assert_eq!(forged, unsigned, "a caller cannot tell why it was refused");
    // The event padded past the limit and signed: taken, it would reach the engine.
    let mut big = body.into_bytes();
    big.resize(clawgate_channel_slack::MAX_BODY_BYTES + 1, b' ');
    let signed = signature::sign(secret.as_bytes(), &ts, &big);
    let status = post_raw(
        &peer.events_url,
        &[
            (signature::TIMESTAMP_HEADER, &ts),
            (signature::SIGNATURE_HEADER, &signed),
        ],
        big.clone(),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
    assert_eq!(
        tally.delivered.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached the engine"
    );
    // At the limit exactly, the same delivery is taken.
    big.truncate(clawgate_channel_slack::MAX_BODY_BYTES);
    let taken = reqwest::Client::new()
        .post(&peer.events_url)
        .header("content-type", "application/json")
        .header(signature::TIMESTAMP_HEADER, &ts)
        .header(
            signature::SIGNATURE_HEADER,
            signature::sign(secret.as_bytes(), &ts, &big),
        )
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status().as_u16(), 200);
    assert_eq!(tally.delivered.load(std::sync::atomic::Ordering::SeqCst), 1);
    tally.stop.notify_one();
    running.await.unwrap().unwrap();
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
