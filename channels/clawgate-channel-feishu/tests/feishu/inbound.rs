//! The event callback as Feishu drives it: the signature and its timestamp's freshness checked
//! before anything is decrypted, the answer held until the engine's record (a nack → 503 →
//! Feishu's re-push under the same event id), the URL verification (unsigned, rate limited),
//! every refusal one and the same answer (no padding oracle), and the receiver's dedupe key the
//! same for a redelivery and for a re-push under a new event id.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use clawgate_channel_feishu::crypto;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::types::clock::{Clock, SystemClock};
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
async fn every_refusal_is_one_answer_and_nothing_unsigned_reaches_the_engine() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    assert_eq!(
        peer.sim.verify_url().await.map(|c| c.len()),
        Some(24),
        "the URL verification is answered with its challenge"
    );
    let caller = Caller::new(&peer);
    let now = now_s();
    let good = caller.seal(&caller.event("ev-forged", &caller.token));
    let refused = caller.refusal().await;
    assert!(
        (400..500).contains(&refused.0),
        "a refusal is a client error: {refused:?}"
    );
    let bad_padding = corrupt_padding(&good);
    assert_eq!(
        crypto::decrypt(&encrypt_field(&bad_padding), &caller.key),
        Err(crypto::CallbackError::Undecryptable),
        "the corrupted body's padding is wrong"
    );
    let other_key = json!({ "encrypt": crypto::encrypt(
        caller.event("ev-forged", &caller.token).to_string().as_bytes(), "other key", [7; 16]) })
    .to_string();
    let not_json_inside = caller.seal_bytes(b"not json");
    let wrong_token = caller.seal(&caller.event("ev-forged", "forged"));
    let plaintext = caller.event("ev-forged", &caller.token).to_string();
    let not_json = "{not json".to_owned();
    let signed = |body: &str| caller.headers(body, now);
    let mut no_timestamp = signed(&good);
    no_timestamp.retain(|(name, _)| *name != crypto::TIMESTAMP_HEADER);
    let cases: Vec<(&str, &str, Headers)> = vec![
        (
            "corrupted padding, signed",
            &bad_padding,
            signed(&bad_padding),
        ),
        (
            "not JSON inside, signed",
            &not_json_inside,
            signed(&not_json_inside),
        ),
        (
            "another Encrypt Key, signed",
            &other_key,
            signed(&other_key),
        ),
        (
            "a wrong verification token, signed",
            &wrong_token,
            signed(&wrong_token),
        ),
        ("a plaintext event, signed", &plaintext, signed(&plaintext)),
        ("not JSON at all, signed", &not_json, signed(&not_json)),
        ("no timestamp", &good, no_timestamp),
        ("unsigned", &good, Vec::new()),
        ("unsigned, corrupted padding", &bad_padding, Vec::new()),
    ];
    for (name, body, headers) in cases {
        assert_eq!(caller.post(body, &headers).await, refused, "{name}");
    }
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing refused reached the engine"
    );
    // The same event, signed correctly, is taken.
    let answer = caller.post(&good, &signed(&good)).await;
    assert_eq!(answer.0, 200);
    assert_eq!(sink.event_ids(), ["ev-forged"]);
    sink.stop.send_replace(true);
    let _ = task.await;
    peer.sim.stop().await;
}

#[tokio::test]
async fn refusals_are_the_gateways_one_answer_and_an_event_over_the_limit_gets_413_unread() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    let caller = Caller::new(&peer);
    // Two different failures: a signature of other bytes, and a genuine one ten minutes old.
    let refused = caller.refusal().await;
    let stale = caller.seal(&caller.event("ev-stale", &caller.token));
    assert_eq!(
        caller
            .post(&stale, &caller.headers(&stale, now_s() - 600))
            .await,
        refused
    );
    assert_eq!((refused.0, refused.2.as_str()), (401, "unauthorized"));
    // A genuine, signed event over the limit: refused for its size, never decrypted.
    let mut big = caller.event("ev-big", &caller.token);
    big["event"]["pad"] = json!("a".repeat(clawgate_channel_feishu::MAX_BODY_BYTES));
    let body = caller.seal(&big);
    let status = raw_post(
        &caller.url,
        &caller.headers(&body, now_s()),
        body.as_bytes(),
    )
    .await;
    assert_eq!(status, 413);
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    sink.stop.send_replace(true);
    let _ = task.await;
    peer.sim.stop().await;
}

/// The status of the answer to `body` posted to `url` over a bare connection, read while the
/// body is still being written: the listener answers a body over its limit before reading it
/// and closes, which an HTTP client reports as a failed send. The sending side stays open
/// until the answer is read (a server may drop a request whose client hung up).
async fn raw_post(url: &str, headers: &[(&str, String)], body: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (authority, path) = url.trim_start_matches("http://").split_once('/').unwrap();
    let stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    let (mut read, mut write) = stream.into_split();
    let mut head = format!(
        "POST /{path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let body = body.to_vec();
    let writer = tokio::spawn(async move {
        if write.write_all(head.as_bytes()).await.is_ok() {
            let _ = write.write_all(&body).await;
        }
        write
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut answer)).await;
    writer.abort();
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"))
}

#[tokio::test]
async fn unsigned_requests_are_rate_limited_and_only_a_challenge_is_answered() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    let caller = Caller::new(&peer);
    let refused = caller.refusal().await;
    let challenge = |c: &str| {
        caller.seal(&json!({ "challenge": c, "token": caller.token, "type": "url_verification" }))
    };
    let answer = caller.post(&challenge("c1"), &Vec::new()).await;
    assert_eq!(answer.0, 200, "Feishu's unsigned URL verification");
    assert_eq!(
        serde_json::from_str::<Value>(&answer.2).unwrap(),
        json!({ "challenge": "c1" })
    );
    // Twice the burst the limit allows: each refused alike, decrypted or not.
    let unsigned_event = caller.seal(&caller.event("ev-unsigned", &caller.token));
    for _ in 0..2 * clawgate_channel_feishu::UNSIGNED_BURST {
        assert_eq!(caller.post(&unsigned_event, &Vec::new()).await, refused);
    }
    // The limit is spent: even a genuine challenge is refused now, unread.
    assert_eq!(
        caller.post(&challenge("c2"), &Vec::new()).await,
        refused,
        "unsigned requests are limited"
    );
    // Signed requests are not limited: a signed challenge and a signed event are taken.
    let signed_challenge = challenge("c3");
    let answer = caller
        .post(
            &signed_challenge,
            &caller.headers(&signed_challenge, now_s()),
        )
        .await;
    assert_eq!(
        serde_json::from_str::<Value>(&answer.2).unwrap(),
        json!({ "challenge": "c3" })
    );
    let event = caller.seal(&caller.event("ev-signed", &caller.token));
    let answer = caller.post(&event, &caller.headers(&event, now_s())).await;
    assert_eq!(answer.0, 200);
    assert_eq!(
        sink.event_ids(),
        ["ev-signed"],
        "nothing unsigned was taken"
    );
    sink.stop.send_replace(true);
    let _ = task.await;
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_signature_ten_minutes_old_is_refused_like_a_bad_one_and_one_a_minute_old_is_taken() {
    let peer = Peer::start().await;
    let sink = Sink::new(&[]);
    let task = run(&peer, sink.clone()).await;
    let caller = Caller::new(&peer);
    let refused = caller.refusal().await;
    // The tests' gateway runs on the system clock (`clawgate_conformance::channel_setup`).
    let now = now_s();
    let old = caller.seal(&caller.event("ev-old", &caller.token));
    assert_eq!(
        caller.post(&old, &caller.headers(&old, now - 600)).await,
        refused,
        "signed ten minutes ago: a replay"
    );
    let ahead = caller.seal(&caller.event("ev-ahead", &caller.token));
    assert_eq!(
        caller
            .post(&ahead, &caller.headers(&ahead, now + 600))
            .await,
        refused,
        "signed ten minutes ahead"
    );
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing stale taken"
    );
    let recent = caller.seal(&caller.event("ev-recent", &caller.token));
    let answer = caller
        .post(&recent, &caller.headers(&recent, now - 60))
        .await;
    assert_eq!(answer.0, 200, "signed a minute ago");
    assert_eq!(sink.event_ids(), ["ev-recent"]);
    sink.stop.send_replace(true);
    let _ = task.await;
    peer.sim.stop().await;

    // The window is a setting: fifteen minutes take the ten-minute-old request.
    let wide = Peer::with(
        crate::peer::quick(),
        json!({ "max_signature_age_secs": 900 }),
    )
    .await;
    let sink = Sink::new(&[]);
    let task = run(&wide, sink.clone()).await;
    let caller = Caller::new(&wide);
    let answer = caller
        .post(&old, &caller.headers(&old, now_s() - 600))
        .await;
    assert_eq!(answer.0, 200);
    assert_eq!(sink.event_ids(), ["ev-old"]);
    sink.stop.send_replace(true);
    let _ = task.await;
    let state = tempfile::tempdir().unwrap();
    let error = crate::peer::build(
        &wide.sim,
        state.path(),
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({ "max_signature_age_secs": 0 }),
        crate::peer::secrets(&wide.sim),
    )
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("max_signature_age_secs"),
        "{error}"
    );
    wide.sim.stop().await;
}

/// Request headers.
type Headers = Vec<(&'static str, String)>;

/// What a caller sees of an answer: the status, the headers but `date` (the server stamps
/// every answer with the time of day), and the body.
type Seen = (u16, Vec<(String, String)>, String);

/// The gateway's clock in these tests, in seconds.
fn now_s() -> u64 {
    u64::try_from(SystemClock.now_ms() / 1_000).unwrap()
}

/// The `encrypt` field of a sealed body.
fn encrypt_field(body: &str) -> String {
    serde_json::from_str::<Value>(body).unwrap()["encrypt"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// `body` with the last byte of its next-to-last cipher block flipped: in CBC that byte is
/// XORed into the last plaintext byte, the padding length, which then no longer matches.
fn corrupt_padding(body: &str) -> String {
    let mut data = STANDARD.decode(encrypt_field(body)).unwrap();
    let at = data.len() - 17;
    data[at] ^= 0x01;
    json!({ "encrypt": STANDARD.encode(data) }).to_string()
}

/// Someone posting to the listener: seals with the app's Encrypt Key, signs when asked.
struct Caller {
    http: reqwest::Client,
    url: String,
    key: String,
    token: String,
}

impl Caller {
    fn new(peer: &Peer) -> Caller {
        Caller {
            http: reqwest::Client::new(),
            url: peer.callback_url.clone(),
            key: peer.sim.config().encrypt_key.clone(),
            token: peer.sim.config().verification_token.clone(),
        }
    }

    fn event(&self, id: &str, token: &str) -> Value {
        json!({ "schema": "2.0", "header": { "event_id": id, "token": token,
            "event_type": "im.message.receive_v1", "app_id": "cli_x", "tenant_key": "t",
            "create_time": "1" }, "event": {} })
    }

    fn seal_bytes(&self, plain: &[u8]) -> String {
        json!({ "encrypt": crypto::encrypt(plain, &self.key, [7; 16]) }).to_string()
    }

    fn seal(&self, plain: &Value) -> String {
        self.seal_bytes(plain.to_string().as_bytes())
    }

    /// The signature headers of `body` sent at `at` (seconds).
    fn headers(&self, body: &str, at: u64) -> Headers {
        let at = at.to_string();
        vec![
            (
                crypto::SIGNATURE_HEADER,
                crypto::sign(&at, "n1", &self.key, body.as_bytes()),
            ),
            (crypto::TIMESTAMP_HEADER, at),
            (crypto::NONCE_HEADER, "n1".to_owned()),
        ]
    }

    async fn post(&self, body: &str, headers: &Headers) -> Seen {
        let mut request = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(body.to_owned());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(name, _)| *name != reqwest::header::DATE)
            .map(|(name, value)| (name.as_str().to_owned(), value.to_str().unwrap().to_owned()))
            .collect();
        headers.sort();
        let body = response.bytes().await.unwrap().to_vec();
        (status, headers, String::from_utf8(body).unwrap())
    }

    /// The answer to a well-formed event under a signature of another body: the refusal every
    /// other failure must look like.
    async fn refusal(&self) -> Seen {
        let body = self.seal(&self.event("ev-refused", &self.token));
        let mut headers = self.headers(&body, now_s());
        headers[0].1 = crypto::sign(&headers[1].1, "n1", &self.key, b"another body");
        self.post(&body, &headers).await
    }
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
