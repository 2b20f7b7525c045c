//! The webhook listener as Zalo posts to it: the signature and its timestamp's freshness
//! checked before anything else (one 401 for every refusal, nothing handed on), 200 only
//! once the event is recorded (500 and a redelivery otherwise), people's texts normalized and
//! deduped by `msg_id` through the engine, and our own sends' `oa_send_text` echoes written to
//! the echo book, never a turn.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::ChannelScope;
use clawgate_channel_sdk::types::clock::{Clock, ManualClock, SystemClock};
use clawgate_channel_zalo::simulator::ZaloSimulator;
use clawgate_channel_zalo::{ZaloFactory, signature};
use serde_json::{Value, json};

use crate::peer::{build, quick, settings};
use crate::send::reply;

/// What the source hands on; `ack` decides whether each event counts as recorded.
struct Recording {
    events: Mutex<Vec<Value>>,
    ack: Mutex<bool>,
}

#[async_trait]
impl EventSink for Recording {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw.clone());
        if *self.ack.lock().unwrap() {
            event.ack.ack();
        } else {
            event.ack.nack("the store is unavailable");
        }
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

struct Listening {
    sim: ZaloSimulator,
    plugin: ChannelPlugin,
    url: String,
    sink: Arc<Recording>,
    _task: tokio::task::JoinHandle<()>,
    _state: tempfile::TempDir,
}

async fn listening() -> Listening {
    listening_with(&json!({}), None).await
}

/// A listener with `overrides` over the default settings, on a gateway whose clock is `clock`
/// (the system's when `None`).
async fn listening_with(overrides: &Value, clock: Option<Arc<dyn Clock>>) -> Listening {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let settings = settings(&sim, port, overrides);
    let plugin = match clock {
        None => build(&sim, state.path(), settings, &sim.authorize()).await,
        Some(clock) => {
            let store = Arc::new(clawgate_store_sqlite::testing::open_store(state.path()));
            let setup = ChannelSetup::new(
                0,
                "zalo",
                "default",
                settings,
                ChannelState::new(store, ChannelScope::new("zalo", "default"), clock),
            );
            ZaloFactory
                .build_with_secrets(
                    &setup,
                    Secret::new(sim.app_secret()),
                    Secret::new(sim.oa_secret_key()),
                    Secret::new(sim.authorize()),
                )
                .await
        }
    }
    .unwrap();
    let sink = Arc::new(Recording {
        events: Mutex::new(Vec::new()),
        ack: Mutex::new(true),
    });
    let InboundSource::Pushed(feed) = plugin.source.clone() else {
        panic!("pushed")
    };
    let as_sink: Arc<dyn EventSink> = sink.clone();
    let task = tokio::spawn(async move {
        let _ = feed.run(as_sink).await;
    });
    let url = format!("http://127.0.0.1:{port}/zalo/webhook");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
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
    Listening {
        sim,
        plugin,
        url,
        sink,
        _task: task,
        _state: state,
    }
}

async fn post(url: &str, body: &str, signature: Option<&str>) -> u16 {
    answer(url, body, signature).await.0
}

/// The status and body of the answer to `body` posted with `signature`.
async fn answer(url: &str, body: &str, signature: Option<&str>) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(signature) = signature {
        request = request.header("X-ZEvent-Signature", signature);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// Milliseconds by the wall clock.
fn wall_ms() -> u64 {
    u64::try_from(SystemClock.now_ms()).unwrap()
}

#[tokio::test]
async fn unsigned_or_wrongly_signed_events_are_refused_before_anything_reads_them() {
    let l = listening().await;
    let now = wall_ms().to_string();
    let body = json!({
        "app_id": l.sim.app_id(), "event_name": "user_send_text", "timestamp": now,
        "sender": { "id": "8333" }, "recipient": { "id": l.sim.oa_id() },
        "message": { "msg_id": "forged", "text": "let me in" },
    })
    .to_string();
    let app = l.sim.app_id();
    let good = signature::sign(&app, body.as_bytes(), &now, &l.sim.oa_secret_key());
    let wrong_secret = signature::sign(&app, body.as_bytes(), &now, "guess");
    // Signed over another timestamp than the body's.
    let wrong_stamp = signature::sign(
        &app,
        body.as_bytes(),
        &format!("{now}1"),
        &l.sim.oa_secret_key(),
    );
    // Every failure gets one answer: which check failed is not told.
    let refused = (401, "unauthorized".to_owned());
    assert_eq!(answer(&l.url, &body, None).await, refused);
    assert_eq!(answer(&l.url, &body, Some("mac=zz")).await, refused);
    assert_eq!(answer(&l.url, &body, Some(&wrong_secret)).await, refused);
    assert_eq!(answer(&l.url, &body, Some(&wrong_stamp)).await, refused);
    let tampered = body.replace("let me in", "let me in!");
    assert_eq!(answer(&l.url, &tampered, Some(&good)).await, refused);
    assert!(
        l.sink.events.lock().unwrap().is_empty(),
        "nothing was handed on"
    );
    assert_eq!(post(&l.url, &body, Some(&good)).await, 200);
    assert_eq!(l.sink.events.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn an_event_over_the_limit_gets_413_unread() {
    let l = listening().await;
    let now = wall_ms().to_string();
    let text = "a".repeat(clawgate_channel_zalo::MAX_BODY_BYTES);
    let body = json!({
        "app_id": l.sim.app_id(), "event_name": "user_send_text", "timestamp": now,
        "sender": { "id": "8333" }, "recipient": { "id": l.sim.oa_id() },
        "message": { "msg_id": "big", "text": text },
    })
    .to_string();
    let good = signature::sign(
        &l.sim.app_id(),
        body.as_bytes(),
        &now,
        &l.sim.oa_secret_key(),
    );
    // Genuine and signed, but over the limit: refused for its size, never handed on.
    let headers = [
        ("content-type", "application/json".to_owned()),
        ("x-zevent-signature", good),
    ];
    assert_eq!(raw_post(&l.url, &headers, body.as_bytes()).await, 413);
    assert!(
        l.sink.events.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
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

#[tokio::test]
async fn an_event_not_recorded_is_answered_500_and_zalo_posts_it_again() {
    let l = listening().await;
    *l.sink.ack.lock().unwrap() = false;
    l.sim.set_webhook_url(Some(&l.url));
    let msg_id = l.sim.person_writes("8444", "are you there?");
    // Refused while the store is down; taken once it is back.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while l.sink.events.lock().unwrap().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no redelivery");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    *l.sink.ack.lock().unwrap() = true;
    assert!(l.sim.deliveries_settled(Duration::from_secs(20)).await);
    let delivery = l.sim.deliveries().remove(0);
    assert!(delivery.acked);
    assert!(delivery.attempts.len() >= 3, "{:?}", delivery.attempts);
    assert!(
        delivery.attempts[..delivery.attempts.len() - 1]
            .iter()
            .all(|s| *s == 500)
    );
    assert_eq!(delivery.attempts.last(), Some(&200));
    // Every copy is the same event, so the engine's durable dedupe sees one msg_id.
    let receiver = l.plugin.receiver.clone().unwrap();
    let ids: std::collections::BTreeSet<_> = l
        .sink
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|raw| receiver.normalize(raw).unwrap().event_id)
        .collect();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), vec![msg_id]);
}

#[tokio::test]
async fn our_own_sends_come_back_as_echoes_that_settle_sends_and_are_never_turns() {
    let l = listening().await;
    l.sim.set_webhook_url(Some(&l.url));
    let user = "8555";
    l.sim.person_writes(user, "hello");
    assert!(l.sim.deliveries_settled(Duration::from_secs(20)).await);
    let ctx = SendContext::new(reply(&MessageTarget::direct(user), "echo-1", ""), "echo-1");
    let part = l
        .plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "hi back"))
        .await
        .unwrap();
    assert!(l.sim.deliveries_settled(Duration::from_secs(20)).await);
    let echo = l
        .sim
        .deliveries()
        .into_iter()
        .find(|d| d.body["event_name"] == "oa_send_text")
        .unwrap();
    assert!(echo.acked);
    assert_eq!(
        echo.body["message"]["msg_id"],
        part.platform_message_id.as_str()
    );
    // The engine only ever saw the person's message.
    let events = l.sink.events.lock().unwrap().clone();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["event_name"], "user_send_text");
    // Even handed to the receiver directly, an echo is not answered.
    let receiver = l.plugin.receiver.clone().unwrap();
    assert!(matches!(
        receiver.normalize(&echo.body),
        Err(ReceiveError::Ignored { .. })
    ));
}

/// Zalo signs the event's time and a retry carries it (reported schedule up to 1 h), so the
/// default window is two hours: a retry an hour late is taken, three hours off is refused.
#[tokio::test]
async fn a_signature_outside_the_window_is_refused_like_a_bad_one_and_a_retry_an_hour_late_is_taken()
 {
    // The gateway's clock three hours ahead of the wall clock: freshness is its call, not the
    // host's.
    let now = wall_ms() + 3 * 3_600_000;
    let clock = || -> Arc<dyn Clock> { Arc::new(ManualClock::new(i64::try_from(now).unwrap())) };
    let l = listening_with(&json!({}), Some(clock())).await;
    let (app, secret) = (l.sim.app_id(), l.sim.oa_secret_key());
    // The signed timestamp is the body's own `timestamp` field (milliseconds).
    let event = |name: &str, msg_id: &str, at: Value| {
        json!({
            "app_id": app, "event_name": name, "timestamp": at,
            "sender": { "id": "8333" }, "recipient": { "id": l.sim.oa_id() },
            "message": { "msg_id": msg_id, "text": "hello" },
        })
        .to_string()
    };
    let text = |msg_id: &str, at: u64| event("user_send_text", msg_id, json!(at.to_string()));
    let sign = |body: &str, secret: &str| {
        let at = signature::timestamp_of(body.as_bytes()).unwrap();
        signature::sign(&app, body.as_bytes(), &at, secret)
    };
    let forged = text("m-forged", now);
    let bad = answer(&l.url, &forged, Some(&sign(&forged, "guess"))).await;
    assert_eq!(bad.0, 401);
    const THREE_HOURS: u64 = 3 * 3_600_000;
    let cases = [
        ("three hours old", text("m-old", now - THREE_HOURS)),
        ("three hours ahead", text("m-ahead", now + THREE_HOURS)),
        ("fresh by the wall clock only", text("m-wall", wall_ms())),
        (
            "an echo three hours old",
            event(
                "oa_send_text",
                "m-echo",
                json!((now - THREE_HOURS).to_string()),
            ),
        ),
        (
            "not a time",
            event("user_send_text", "m-nat", json!("soon")),
        ),
    ];
    for (case, body) in cases {
        assert_eq!(
            answer(&l.url, &body, Some(&sign(&body, &secret))).await,
            bad,
            "{case}: the same answer as a bad signature"
        );
    }
    assert!(
        l.sink.events.lock().unwrap().is_empty(),
        "nothing stale was handed on"
    );
    let recent = text("m-recent", now - 3_600_000);
    assert_eq!(
        post(&l.url, &recent, Some(&sign(&recent, &secret))).await,
        200
    );
    // Zalo's timestamp may come as a JSON number too.
    let number = event("user_send_text", "m-number", json!(now - 60_000));
    assert_eq!(
        post(&l.url, &number, Some(&sign(&number, &secret))).await,
        200
    );
    assert_eq!(l.sink.events.lock().unwrap().len(), 2);

    // The window is a setting: five minutes refuse a ten-minute-old event.
    let wide = listening_with(&json!({ "max_signature_age_secs": 300 }), Some(clock())).await;
    let old = text("m-old", now - 600_000);
    assert_eq!(
        answer(&wide.url, &old, Some(&sign(&old, &secret))).await,
        bad
    );
    let fresh = text("m-fresh", now - 60_000);
    assert_eq!(
        post(&wide.url, &fresh, Some(&sign(&fresh, &secret))).await,
        200
    );
    assert_eq!(wide.sink.events.lock().unwrap().len(), 1);
    let state = tempfile::tempdir().unwrap();
    let error = build(
        &wide.sim,
        state.path(),
        settings(
            &wide.sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({ "max_signature_age_secs": 0 }),
        ),
        &wide.sim.authorize(),
    )
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("max_signature_age_secs"),
        "{error}"
    );
}
