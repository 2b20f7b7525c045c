//! Receiving interaction events: the bearer JWT checked before anything (missing, forged,
//! expired, wrong issuer or audience: 401), the 2xx only after the durable record, redeliveries
//! deduplicated by the message name, other events not prompts, and marked gateway-failure
//! echoes from bots dropped in rooms before `allowBots` while unmarked ones meet it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use clawgate_channel_googlechat::simulator::{GoogleChatSimulator, SpaceKind, keys};
use clawgate_channel_googlechat::{EventsConfig, EventsSource, TokenError, message_id_for};
use clawgate_channel_sdk::NoTransportAck;
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{
    AckController, EventHandler, ReceiveOptions, ReceiveOutcome, Receiver, SourceRunner,
    SourceStores,
};
use clawgate_store::WatermarkKey;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::{Clock, ManualClock, SystemClock};
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

fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    (dir, store)
}

/// Posts `body` to the listener with `authorization`; the status.
async fn post(url: &str, body: &str, authorization: Option<String>) -> u16 {
    let mut request = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    request.send().await.unwrap().status().as_u16()
}

fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn bearer(claims: &Value) -> Option<String> {
    Some(format!("Bearer {}", keys::sign(claims)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_forged_expired_and_misaddressed_tokens_are_refused_before_the_body() {
    let peer = Peer::start().await;
    peer.sim.set_endpoint_url(None);
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store, None);
    peer.listening().await;
    let room = peer.room("tokens");
    let message = peer
        .sim
        .person_writes(&room, &peer.person, "checked?", None)
        .unwrap();
    let event = peer.sim.event(&message.name).unwrap().to_string();
    let url = &peer.events_url;
    let audience = peer.sim.audience();
    let good = keys::event_claims(&audience);
    let mut wrong_aud = good.clone();
    wrong_aud["aud"] = json!("999999999999");
    let mut wrong_iss = good.clone();
    wrong_iss["iss"] = json!("someone@example.iam.gserviceaccount.com");
    let mut expired = good.clone();
    expired["iat"] = json!(now_s() - 7_200);
    expired["exp"] = json!(now_s() - 3_600);
    let mut no_exp = good.clone();
    no_exp.as_object_mut().unwrap().remove("exp");
    let genuine = keys::sign(&good);
    // The signature of another body of claims: a forged token.
    let (head, rest) = genuine.split_once('.').unwrap();
    let signature = rest.rsplit_once('.').unwrap().1;
    let forged_claims = keys::sign(&wrong_aud);
    let forged_payload = forged_claims.split('.').nth(1).unwrap();
    let forged = format!("{head}.{forged_payload}.{signature}");
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no header", None),
        ("not bearer", Some(format!("Basic {genuine}"))),
        ("garbage", Some("Bearer not.a.jwt".to_owned())),
        ("forged signature", Some(format!("Bearer {forged}"))),
        ("wrong audience", bearer(&wrong_aud)),
        ("wrong issuer", bearer(&wrong_iss)),
        ("expired", bearer(&expired)),
        ("no expiry", bearer(&no_exp)),
        (
            "a key the JWKS does not list",
            Some(format!("Bearer {}", keys::sign_as(&good, "some-other-key"))),
        ),
    ];
    for (what, authorization) in cases {
        assert_eq!(post(url, &event, authorization).await, 401, "{what}");
    }
    assert!(
        running.seen().is_empty(),
        "nothing refused reaches the engine"
    );
    assert_eq!(
        post(url, &event, bearer(&good)).await,
        200,
        "the genuine request"
    );
    until("the dispatch", || {
        running.seen().get("checked?") == Some(&1)
    })
    .await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_the_same_401_and_an_oversized_event_is_413() {
    let peer = Peer::start().await;
    peer.sim.set_endpoint_url(None);
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("the Google Chat source is pushed");
    };
    let tally = Arc::new(Tally::default());
    let running = {
        let tally = tally.clone();
        tokio::spawn(async move { feed.run(tally).await })
    };
    peer.listening().await;
    let good = keys::event_claims(&peer.sim.audience());
    let body = json!({ "type": "MESSAGE", "eventTime": "2025-01-01T00:00:00Z",
        "space": { "name": "spaces/BIG", "spaceType": "SPACE" },
        "user": { "name": "users/1", "displayName": "Ada", "type": "HUMAN" },
        "message": { "name": "spaces/BIG/messages/1", "text": "big", "argumentText": "big",
            "sender": { "name": "users/1", "type": "HUMAN" } } })
    .to_string();
    let http = reqwest::Client::new();
    let request = || {
        http.post(&peer.events_url)
            .header("content-type", "application/json")
            .body(body.clone())
    };
    // The unknown key's id was in the old answer; no token at all was another text.
    let unknown_key = answer(request().header(
        "authorization",
        format!("Bearer {}", keys::sign_as(&good, "some-other-key")),
    ))
    .await;
    let missing = answer(request()).await;
    assert_eq!(
        (unknown_key.0, unknown_key.2.as_str()),
        (401, "unauthorized")
    );
    assert_eq!(
        unknown_key, missing,
        "a caller cannot tell why it was refused"
    );
    // The event padded past the limit, with a genuine token: taken, it would reach the engine.
    let mut big = body.into_bytes();
    big.resize(clawgate_channel_googlechat::MAX_BODY_BYTES + 1, b' ');
    let genuine = bearer(&good).unwrap();
    let status = post_raw(
        &peer.events_url,
        &[("authorization", &genuine)],
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
    big.truncate(clawgate_channel_googlechat::MAX_BODY_BYTES);
    let taken = reqwest::Client::new()
        .post(&peer.events_url)
        .header("content-type", "application/json")
        .header("authorization", &genuine)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status().as_u16(), 200);
    assert_eq!(tally.delivered.load(std::sync::atomic::Ordering::SeqCst), 1);
    tally.stop.notify_one();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_token_expires_by_the_gateways_clock() {
    let sim = GoogleChatSimulator::start(crate::peer::quiet())
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new(SystemClock.now_ms()));
    let source = EventsSource::new(
        EventsConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            path: "/googlechat/events".into(),
            audience: sim.audience(),
            certs_url: sim.jwks_url(),
            answer_deadline: Duration::from_secs(1),
        },
        clock.clone(),
    );
    // Valid for an hour by the wall clock and by the gateway's, now.
    let token = bearer(&keys::event_claims(&sim.audience()));
    source.verify(token.as_deref()).await.unwrap();
    // An hour and the leeway later on the gateway's clock, none on the wall clock.
    clock.advance(3_661_000);
    let error = source.verify(token.as_deref()).await.unwrap_err();
    assert!(
        matches!(&error, TokenError::Rejected(reason) if reason.contains("expired")),
        "{error}"
    );
    sim.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_2xx_before_the_durable_record_and_the_redelivery_is_deduplicated() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let gate = Arc::new(Semaphore::new(0));
    let running = Running::start(&peer.plugin, &store, Some(gate.clone()));
    peer.listening().await;
    let room = peer.room("held");
    let message = peer
        .sim
        .person_writes(&room, &peer.person, "held", None)
        .unwrap();
    let id = message.name.clone();
    until("an unanswered delivery", || {
        peer.sim.deliveries().iter().any(|d| d.event_id == id)
    })
    .await;
    let first = peer
        .sim
        .deliveries()
        .into_iter()
        .find(|d| d.event_id == id)
        .unwrap();
    assert_ne!(first.status, Some(200), "{first:?}");
    assert!(running.seen().is_empty());
    gate.add_permits(1_000);
    assert!(peer.sim.events_settled(Duration::from_secs(60)).await);
    until("the dispatch", || running.seen().get("held") == Some(&1)).await;
    let acked = peer
        .sim
        .deliveries()
        .into_iter()
        .find(|d| d.event_id == id && d.status == Some(200))
        .unwrap();
    assert!(
        acked.attempt >= 1,
        "acknowledged on a later attempt: {acked:?}"
    );
    // Delivered again after its 2xx: the same message name, one turn.
    peer.sim.redeliver(&id);
    assert!(peer.sim.events_settled(Duration::from_secs(30)).await);
    let answered = peer
        .sim
        .deliveries()
        .into_iter()
        .filter(|d| d.event_id == id && d.status == Some(200))
        .count();
    assert_eq!(answered, 2);
    assert_eq!(running.seen(), HashMap::from([("held".to_owned(), 1)]));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn space_membership_events_are_acknowledged_and_not_prompts() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store, None);
    peer.listening().await;
    let room = peer.room("membership");
    let dm = peer.sim.dm(&peer.person);
    peer.sim.person_writes(&dm, &peer.person, "in a dm", None);
    peer.sim.remove_app(&room, &peer.person);
    assert!(peer.sim.events_settled(Duration::from_secs(30)).await);
    until("the dispatch", || running.seen().get("in a dm") == Some(&1)).await;
    let kinds: Vec<String> = peer
        .sim
        .event_ids()
        .iter()
        .filter_map(|id| peer.sim.event(id))
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "ADDED_TO_SPACE",
            "ADDED_TO_SPACE",
            "MESSAGE",
            "REMOVED_FROM_SPACE"
        ]
    );
    assert!(peer.sim.deliveries().iter().all(|d| d.status == Some(200)));
    assert_eq!(running.seen(), HashMap::from([("in a dm".to_owned(), 1)]));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marked_echoes_from_bots_drop_in_rooms_before_allow_bots_and_unmarked_ones_meet_it() {
    let peer = Peer::start().await;
    let room = peer.room("bots");
    let other = peer.sim.other_bot("another-gateway");
    let notice = "Agent failed before reply.";
    let origin =
        MessageOrigin::gateway_failure(clawgate_types::GatewayFailureCode::AgentFailedBeforeReply);
    let marked_id = message_id_for("their-reply#0", Some(&origin));
    let event_of = |m: Option<clawgate_channel_googlechat::simulator::SimMessage>| {
        peer.sim.event(&m.unwrap().name).unwrap()
    };
    let marked = event_of(peer.sim.bot_writes(&room, &other, notice, Some(&marked_id)));
    let plain_id = message_id_for("their-other#0", None);
    let unmarked = event_of(peer.sim.bot_writes(&room, &other, notice, Some(&plain_id)));
    let person = event_of(peer.sim.person_writes(&room, &peer.person, notice, None));
    // In a direct message the marked echo is no room echo: it meets allowBots like any bot's.
    let dm_space = peer
        .sim
        .create_space("bot dm", SpaceKind::DirectMessage, Some(&peer.person));
    let dm_marked = event_of(
        peer.sim
            .bot_writes(&dm_space, &other, notice, Some(&marked_id)),
    );
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
        for raw in [&marked, &unmarked, &person, &dm_marked] {
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
        for bot_outcome in [&outcomes[1], &outcomes[3]] {
            if allow_bots {
                assert!(
                    matches!(bot_outcome, ReceiveOutcome::Handled { .. }),
                    "authorized normally: {bot_outcome:?}"
                );
            } else {
                assert!(
                    matches!(bot_outcome, ReceiveOutcome::Unauthorized),
                    "{bot_outcome:?}"
                );
            }
        }
        assert!(
            matches!(outcomes[2], ReceiveOutcome::Handled { .. }),
            "{:?}",
            outcomes[2]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_cannot_be_fetched_answer_503_so_the_event_comes_again() {
    let closed = clawgate_conformance::ports::reserve_loopback_port();
    let peer = Peer::with(
        crate::peer::quiet(),
        json!({ "certs_url": format!("http://127.0.0.1:{closed}/jwks") }),
    )
    .await;
    peer.sim.set_endpoint_url(None);
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store, None);
    peer.listening().await;
    let room = peer.room("no-keys");
    let message = peer
        .sim
        .person_writes(&room, &peer.person, "wait", None)
        .unwrap();
    let event = peer.sim.event(&message.name).unwrap().to_string();
    let good = bearer(&keys::event_claims(&peer.sim.audience()));
    assert_eq!(post(&peer.events_url, &event, good).await, 503);
    assert!(running.seen().is_empty());
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
