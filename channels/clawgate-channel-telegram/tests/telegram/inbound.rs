//! The channel's side of updates: the factory's checks, 409s from a second poller, the webhook
//! secret.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_telegram::SECRET_HEADER;
use clawgate_channel_telegram::simulator::{BotApiSimulator, SimUser, WriteOptions};
use serde_json::json;

use crate::peer::{Peer, build, quiet};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_stops_the_start_naming_the_setting() {
    let sim = BotApiSimulator::start(quiet()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let setup = clawgate_conformance::channel_setup(
        3,
        "telegram",
        "default",
        json!({ "token_env": "TG_TOKEN", "api_base": sim.base_url() }),
        state.path(),
    );
    let error = clawgate_channel_telegram::TelegramFactory
        .build_with_secrets(&setup, Secret::new("999:wrong"), None)
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[3].settings.token_env");
    assert!(error.reason.contains("TG_TOKEN"), "{error}");
    assert!(error.reason.contains("401"), "{error}");
    assert!(
        !error.reason.contains("999:wrong"),
        "the token never prints: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_mode_names_each_missing_setting() {
    let sim = BotApiSimulator::start(quiet()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let error = build(&sim, state.path(), json!({ "mode": "webhook" }))
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[0].settings.webhook_listen", "{error}");
    let error = build(
        &sim,
        state.path(),
        json!({ "mode": "webhook", "webhook_listen": "127.0.0.1:1", "webhook_url": "https://x" }),
    )
    .await
    .map(|_| ())
    .err();
    assert!(
        error.is_none(),
        "the secret is given by the peer: {error:?}"
    );
    let error = build(&sim, state.path(), json!({ "poll_timeout_s": 90 }))
        .await
        .unwrap_err();
    assert_eq!(error.key, "channels[0].settings.poll_timeout_s");
    let error = build(&sim, state.path(), json!({ "pol_timeout_s": 9 }))
        .await
        .unwrap_err();
    assert_eq!(
        error.key, "channels[0].settings.pol_timeout_s",
        "unknown keys are refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_poller_is_reported_as_another_instance_and_paced() {
    let peer = Peer::polling().await;
    let InboundSource::Polling(feed) = &peer.plugin.source else {
        panic!("polling");
    };
    let from = PollFrom::new(0, None);
    // The first long poll holds; a second poller of the same bot ends it with a 409.
    let held = {
        let feed = feed.clone();
        let from = from.clone();
        tokio::spawn(async move { feed.poll(&from, PollWait::Long).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = reqwest::Client::new()
        .get(format!(
            "{}/bot{}/getUpdates?timeout=1",
            peer.sim.base_url(),
            peer.sim.token()
        ))
        .send();
    let (first, _) = tokio::join!(held, other);
    let error = first.unwrap().unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Conflict);
    assert!(
        error.message.contains("another instance polls this bot"),
        "{error:?}"
    );
    assert!(
        error.retry_after_ms.unwrap_or(0) >= 3_000,
        "never a tight retry loop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_confirms_only_what_the_watermark_passed() {
    let peer = Peer::polling().await;
    let InboundSource::Polling(feed) = &peer.plugin.source else {
        panic!("polling");
    };
    let chat = peer.sim.supergroup("poll", false);
    let ada = SimUser::person(1, "Ada");
    for text in ["one", "two", "three"] {
        peer.sim
            .user_writes(chat, &ada, text, WriteOptions::default());
    }
    let events = feed
        .poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap();
    assert_eq!(events.len(), 3);
    let second = events[1].position;
    // The watermark passed the first only: the other two are handed out again.
    let again = feed
        .poll(
            &PollFrom::new(events[0].position, None),
            PollWait::Immediate,
        )
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|e| e.position).collect::<Vec<_>>()[0],
        second
    );
    assert_eq!(
        peer.sim.pending_updates(),
        2,
        "only the first was confirmed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_request_without_the_secret_is_refused_and_reaches_nobody() {
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let url = format!("http://127.0.0.1:{port}/telegram");
    let peer = Peer::start(
        quiet(),
        json!({
            "mode": "webhook",
            "webhook_listen": format!("127.0.0.1:{port}"),
            "webhook_url": url,
            "webhook_secret_env": "UNUSED",
        }),
    )
    .await;
    let InboundSource::Pushed(feed) = &peer.plugin.source else {
        panic!("pushed");
    };
    let sink = Arc::new(Collect::default());
    let running = {
        let feed = feed.clone();
        let sink = sink.clone();
        tokio::spawn(async move { feed.run(sink).await })
    };
    let client = reqwest::Client::new();
    let update = json!({ "update_id": 5, "message": { "message_id": 1, "date": 1,
        "chat": { "id": 1, "type": "private" }, "text": "forged" } });
    let mut status = None;
    for _ in 0..100 {
        match client
            .post(&url)
            .header(SECRET_HEADER, "not-the-secret")
            .json(&update)
            .send()
            .await
        {
            Ok(answer) => {
                status = Some(answer.status().as_u16());
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert_eq!(status, Some(401));
    let no_header = client.post(&url).json(&update).send().await.unwrap();
    assert_eq!(no_header.status().as_u16(), 401);
    let garbage = client
        .post(&url)
        .header(SECRET_HEADER, crate::peer::WEBHOOK_SECRET)
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status().as_u16(), 400);
    assert_eq!(sink.count(), 0, "nothing reached the engine");
    sink.stop();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_the_same_401_and_an_oversized_update_is_413() {
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let listen = format!("127.0.0.1:{port}");
    let url = format!("http://{listen}/telegram");
    let peer = Peer::start(
        quiet(),
        json!({
            "mode": "webhook",
            "webhook_listen": listen,
            "webhook_url": url,
            "webhook_secret_env": "UNUSED",
        }),
    )
    .await;
    let InboundSource::Pushed(feed) = &peer.plugin.source else {
        panic!("pushed");
    };
    let sink = Arc::new(Collect::default());
    let running = {
        let feed = feed.clone();
        let sink = sink.clone();
        tokio::spawn(async move { feed.run(sink).await })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(&listen).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "never listened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let client = reqwest::Client::new();
    let update = json!({ "update_id": 6, "message": { "message_id": 1, "date": 1,
        "chat": { "id": 1, "type": "private" }, "text": "forged" } });
    let wrong = answer(
        client
            .post(&url)
            .header(SECRET_HEADER, "not-the-secret-at-all")
            .json(&update),
    )
    .await;
    let missing = answer(client.post(&url).json(&update)).await;
    assert_eq!((wrong.0, wrong.2.as_str()), (401, "unauthorized"));
    assert_eq!(wrong, missing, "a caller cannot tell why it was refused");
    // A genuine update with the right secret, padded past the limit: taken, it would be a turn.
    let status = post_raw(
        &url,
        &[(SECRET_HEADER, crate::peer::WEBHOOK_SECRET)],
        padded(&update, clawgate_channel_telegram::MAX_BODY_BYTES + 1),
    )
    .await;
    assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
    assert_eq!(sink.count(), 0, "nothing reached the engine");
    // At the limit exactly, the same update is taken.
    let taken = client
        .post(&url)
        .header(SECRET_HEADER, crate::peer::WEBHOOK_SECRET)
        .header("content-type", "application/json")
        .body(padded(&update, clawgate_channel_telegram::MAX_BODY_BYTES))
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status().as_u16(), 200);
    assert_eq!(sink.count(), 1);
    sink.stop();
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

/// `value` as JSON followed by whitespace up to `length` bytes: still the same JSON.
fn padded(value: &serde_json::Value, length: usize) -> Vec<u8> {
    let mut body = value.to_string().into_bytes();
    body.resize(length, b' ');
    body
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

/// An engine side that takes events and acks them.
#[derive(Default)]
struct Collect {
    events: std::sync::Mutex<Vec<serde_json::Value>>,
    stop: tokio::sync::Notify,
}

impl Collect {
    fn count(&self) -> usize {
        self.events.lock().unwrap().len()
    }
    fn stop(&self) {
        self.stop.notify_one();
    }
}

#[async_trait]
impl EventSink for Collect {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw.clone());
        event.ack.ack();
    }
    async fn stopped(&self) {
        self.stop.notified().await;
    }
}
