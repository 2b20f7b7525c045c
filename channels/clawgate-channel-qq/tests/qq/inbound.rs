//! The callback listener: signatures and their timestamps' freshness checked before anything
//! is read, the op 13 URL validation, heartbeats, and dispatches acknowledged only once
//! recorded (else pushed again).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_qq::QqFactory;
use clawgate_channel_qq::signature;
use clawgate_channel_qq::simulator::QqSimulator;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::ChannelScope;
use clawgate_channel_sdk::types::clock::{Clock, ManualClock, SystemClock};
use serde_json::{Value, json};

use crate::peer::{Peer, build, quick, settings};

/// A sink that records what it is handed and acks (or nacks) it.
#[derive(Default)]
struct Recording {
    events: Mutex<Vec<Value>>,
    nack: bool,
}

#[async_trait]
impl EventSink for Recording {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw.clone());
        if self.nack {
            event.ack.nack("test");
        } else {
            event.ack.ack();
        }
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

/// Runs the peer's real listener with `sink` (the peer's relay forwards to it).
async fn attach(peer: &Peer, sink: Arc<Recording>) -> tokio::task::JoinHandle<()> {
    let InboundSource::Pushed(feed) = peer.attached_plugin().source else {
        unreachable!()
    };
    let handle = tokio::spawn(async move {
        let _ = feed.run(sink).await;
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !peer.attached() {
        assert!(
            std::time::Instant::now() < deadline,
            "the sink never attached"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle
}

async fn post(url: &str, headers: &[(&str, String)], body: &str) -> (u16, String) {
    let mut request = reqwest::Client::new().post(url).body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Request headers.
type Headers = Vec<(&'static str, String)>;

/// Seconds by the wall clock (the peer's gateway runs on the system clock).
fn wall_s() -> u64 {
    u64::try_from(SystemClock.now_ms() / 1_000).unwrap()
}

fn signed(secret: &str, body: &str) -> Headers {
    signed_at(secret, body, wall_s())
}

/// The signature headers of `body` sent at `at` (seconds).
fn signed_at(secret: &str, body: &str, at: u64) -> Headers {
    let ts = at.to_string();
    vec![
        (
            "x-signature-ed25519",
            signature::sign(secret, &ts, body.as_bytes()).unwrap(),
        ),
        ("x-signature-timestamp", ts),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_or_missing_signature_is_refused_before_the_body_is_read_and_nothing_recorded() {
    let peer = Peer::start().await;
    let sink = Arc::new(Recording::default());
    let task = attach(&peer, sink.clone()).await;
    let url = &peer.callback_url;
    let secret = peer.sim.secret();
    let event = json!({ "op": 0, "id": "e1", "t": "C2C_MESSAGE_CREATE",
        "d": { "id": "m1", "content": "hi", "author": { "user_openid": "U1" } } })
    .to_string();
    let mut tampered = signed(&secret, &event);
    tampered[1].1 = (wall_s() + 1).to_string();
    let cases: Vec<(&str, Headers, String, u16)> = vec![
        ("no headers", Vec::new(), event.clone(), 401),
        (
            "another secret",
            signed("not-the-secret", &event),
            event.clone(),
            401,
        ),
        ("another timestamp", tampered, event.clone(), 401),
        (
            "signed other bytes",
            signed(&secret, "{}"),
            event.clone(),
            401,
        ),
        (
            "not hex",
            vec![
                ("x-signature-ed25519", "zz".repeat(64)),
                ("x-signature-timestamp", "1".into()),
            ],
            event.clone(),
            401,
        ),
        // Refused 401, not 400: the (unparseable) body was never looked at.
        ("garbage, unsigned", Vec::new(), "{not json".into(), 401),
        // Signed but not JSON: refused after the check, as a bad request.
        (
            "garbage, signed",
            signed(&secret, "{not json"),
            "{not json".into(),
            400,
        ),
    ];
    for (case, headers, body, status) in cases {
        assert_eq!(post(url, &headers, &body).await.0, status, "{case}");
    }
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    // A signed heartbeat is answered with its ack, a signed dispatch handed over.
    let heartbeat = json!({ "op": 1, "d": 42 }).to_string();
    let (status, answer) = post(url, &signed(&secret, &heartbeat), &heartbeat).await;
    // Compared as JSON: key order depends on serde_json's features, not on the protocol.
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!((status, answer), (200, json!({ "op": 11, "d": 42 })));
    let (status, answer) = post(url, &signed(&secret, &event), &event).await;
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!((status, answer), (200, json!({ "op": 12, "d": 0 })));
    assert_eq!(sink.events.lock().unwrap().len(), 1);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_the_gateways_one_answer_and_a_dispatch_over_the_limit_gets_413_unread() {
    let peer = Peer::start().await;
    let sink = Arc::new(Recording::default());
    let task = attach(&peer, sink.clone()).await;
    let url = &peer.callback_url;
    let secret = peer.sim.secret();
    let event = json!({ "op": 0, "id": "e1", "t": "C2C_MESSAGE_CREATE",
        "d": { "id": "m1", "content": "hi", "author": { "user_openid": "U1" } } })
    .to_string();
    // Two different failures: no signature, and another secret's.
    let unsigned = post(url, &[], &event).await;
    let forged = post(url, &signed("not-the-secret", &event), &event).await;
    assert_eq!(unsigned, forged);
    assert_eq!(unsigned, (401, "unauthorized".to_owned()));
    // A genuine, signed dispatch over the limit: refused for its size, never handed on.
    let big = json!({ "op": 0, "id": "e2", "t": "C2C_MESSAGE_CREATE",
        "d": { "id": "m2", "content": "a".repeat(clawgate_channel_qq::MAX_BODY_BYTES),
            "author": { "user_openid": "U1" } } })
    .to_string();
    let status = raw_post(url, &signed(&secret, &big), big.as_bytes()).await;
    assert_eq!(status, 413);
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
    task.abort();
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
        "POST /{path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {}\r\n\
         Connection: close\r\n",
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_validation_is_answered_with_our_signature_of_the_token() {
    let peer = Peer::start().await;
    peer.sim.validate_url(&peer.callback_url).await.unwrap();
    // A listener holding another secret signs with another key: QQ would refuse the URL, and
    // the validation request itself is refused (its signature does not verify).
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let other = build(
        tempfile::tempdir().unwrap().path(),
        settings(
            &peer.sim,
            port,
            &json!({ "token_base": "http://127.0.0.1:1" }),
        ),
        "another-secret",
    )
    .await
    .unwrap();
    let InboundSource::Pushed(feed) = other.source.clone() else {
        unreachable!()
    };
    let sink = Arc::new(Recording::default());
    let task = tokio::spawn(async move {
        let _ = feed.run(sink).await;
    });
    let url = format!("http://127.0.0.1:{port}/qq/callback");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let refused = loop {
        match peer.sim.validate_url(&url).await {
            Err(why) if why.contains("HTTP 0") && std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => break other,
        }
    };
    assert!(refused.is_err(), "{refused:?}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unrecorded_dispatch_is_answered_d1_and_qq_pushes_it_again() {
    let peer = Peer::with(quick(), json!({})).await;
    let sink = Arc::new(Recording {
        nack: true,
        ..Recording::default()
    });
    let task = attach(&peer, sink.clone()).await;
    peer.sim.person_writes("U42", "are you there?");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while sink.events.lock().unwrap().len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "pushed again after d: 1"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let delivery = &peer.sim.deliveries()[0];
    assert!(!delivery.acked);
    assert!(delivery.attempts.len() >= 2);
    assert!(delivery.attempts.iter().all(|status| *status == 0));
    task.abort();
}

/// A channel on `sim` listening on `port` whose gateway clock is `clock`, its source running
/// with `sink`; waits until it listens.
async fn listening_on(
    sim: &QqSimulator,
    state: &std::path::Path,
    port: u16,
    overrides: &Value,
    clock: Arc<dyn Clock>,
    sink: Arc<Recording>,
) -> tokio::task::JoinHandle<()> {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(state));
    let setup = ChannelSetup::new(
        0,
        "qq",
        "default",
        settings(sim, port, overrides),
        ChannelState::new(store, ChannelScope::new("qq", "default"), clock),
    );
    let plugin = QqFactory
        .build_with_secret(&setup, Secret::new(sim.secret()))
        .await
        .unwrap();
    let InboundSource::Pushed(feed) = plugin.source.clone() else {
        unreachable!()
    };
    let task = tokio::spawn(async move {
        let _ = feed.run(sink).await;
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never came up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signature_ten_minutes_old_is_refused_like_a_bad_one_and_one_a_minute_old_is_taken() {
    // The gateway's clock an hour ahead of the wall clock: freshness is its call, not the
    // host's.
    let now = wall_s() + 3_600;
    let clock = Arc::new(ManualClock::new(i64::try_from(now * 1_000).unwrap()));
    let sim = QqSimulator::start(quick()).await.unwrap();
    let secret = sim.secret();
    let state = tempfile::tempdir().unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let sink = Arc::new(Recording::default());
    let task = listening_on(&sim, state.path(), port, &json!({}), clock, sink.clone()).await;
    let url = format!("http://127.0.0.1:{port}/qq/callback");
    let event = json!({ "op": 0, "id": "e1", "t": "C2C_MESSAGE_CREATE",
        "d": { "id": "m1", "content": "hi", "author": { "user_openid": "U1" } } })
    .to_string();
    let bad = post(&url, &signed_at("not-the-secret", &event, now), &event).await;
    assert_eq!(bad.0, 401);
    let validation = json!({ "op": 13,
        "d": { "plain_token": "Arq0D5A61EgUu4OxUvOp", "event_ts": "1" } })
    .to_string();
    let cases = [
        ("ten minutes old", &event, now - 600),
        ("ten minutes ahead", &event, now + 600),
        ("fresh by the wall clock only", &event, wall_s()),
        ("a URL validation ten minutes old", &validation, now - 600),
    ];
    for (case, body, at) in cases {
        assert_eq!(
            post(&url, &signed_at(&secret, body, at), body).await,
            bad,
            "{case}: the same answer as a bad signature"
        );
    }
    assert!(
        sink.events.lock().unwrap().is_empty(),
        "nothing stale taken"
    );
    let (status, answer) = post(&url, &signed_at(&secret, &event, now - 60), &event).await;
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        (status, answer),
        (200, json!({ "op": 12, "d": 0 })),
        "a minute old"
    );
    assert_eq!(sink.events.lock().unwrap().len(), 1);
    task.abort();

    // The window is a setting: fifteen minutes take the ten-minute-old dispatch.
    let clock = Arc::new(ManualClock::new(i64::try_from(now * 1_000).unwrap()));
    let state = tempfile::tempdir().unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let sink = Arc::new(Recording::default());
    let wide = json!({ "max_signature_age_secs": 900 });
    let task = listening_on(&sim, state.path(), port, &wide, clock, sink.clone()).await;
    let url = format!("http://127.0.0.1:{port}/qq/callback");
    let (status, _) = post(&url, &signed_at(&secret, &event, now - 600), &event).await;
    assert_eq!(status, 200);
    assert_eq!(sink.events.lock().unwrap().len(), 1);
    task.abort();
    let error = build(
        tempfile::tempdir().unwrap().path(),
        settings(&sim, port, &json!({ "max_signature_age_secs": 0 })),
        &secret,
    )
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("max_signature_age_secs"),
        "{error}"
    );
}
