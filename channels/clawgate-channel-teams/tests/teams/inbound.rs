//! Receiving activities: the Bot Framework JWT checked before anything (missing, another key,
//! another key's channel, expired, wrong issuer, audience or service URL: 401), the 2xx only
//! after the durable record, retried POSTs deduplicated by the activity id, installs and other
//! activities not prompts, and the service URL of every conversation kept in the store for
//! later sends (after a restart, and where no `service_url` is configured).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_teams::simulator::{ConversationKind, keys};
use clawgate_channel_teams::{ConversationReference, TeamsFactory};
use clawgate_messages::{
    AckController, EventHandler, ReceiveOptions, Receiver, SourceRunner, SourceStores,
};
use clawgate_store::WatermarkKey;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::SystemClock;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::peer::{Peer, quiet};

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
        self.receiver
            .receive(raw, ack, |_| async move {
                *counts.lock().unwrap().entry(body).or_default() += 1;
                Ok::<(), String>(())
            })
            .await
            .is_ok()
    }
}

pub(crate) struct Running {
    dispatched: Arc<Mutex<HashMap<String, u32>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    pub(crate) fn start(plugin: &ChannelPlugin, store: &Arc<SqliteStore>) -> Running {
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
                source: "messages".into(),
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

    pub(crate) fn seen(&self) -> HashMap<String, u32> {
        self.dispatched.lock().unwrap().clone()
    }

    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

pub(crate) async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    (dir, store)
}

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_activities_are_dispatched_once_and_retried_posts_deduplicated() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store);
    peer.listening().await;
    let chat = peer.sim.personal_chat(&peer.person);
    let written = peer
        .sim
        .person_writes(&chat, &peer.person, "hello", None)
        .unwrap();
    until("the message dispatched", || {
        running.seen().get("hello") == Some(&1)
    })
    .await;
    assert!(peer.sim.events_settled(Duration::from_secs(10)).await);
    // Every activity acknowledged 200, the install included (not a prompt, still answered).
    let statuses: Vec<Option<u16>> = peer.sim.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(statuses, [Some(200), Some(200)]);
    // A retried POST (the Bot Framework did not get the answer) is the same event.
    assert!(peer.sim.redeliver(&format!("{chat}|{}", written.id)));
    until("the retry acknowledged", || {
        peer.sim.deliveries().len() == 3
    })
    .await;
    assert!(peer.sim.events_settled(Duration::from_secs(10)).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(running.seen(), HashMap::from([("hello".to_owned(), 1)]));
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_are_not_the_bot_frameworks_for_this_bot_are_refused_before_the_body() {
    let peer = Peer::start().await;
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store);
    peer.listening().await;
    let chat = peer.sim.personal_chat(&peer.person);
    let written = peer
        .sim
        .person_writes(&chat, &peer.person, "genuine", None)
        .unwrap();
    until("the genuine one dispatched", || {
        running.seen().get("genuine") == Some(&1)
    })
    .await;
    let mut body = peer.sim.event_of(&written).unwrap();
    body["id"] = json!("forged-1");
    body["text"] = json!("forged");
    let service = peer.sim.service_url();
    let app = peer.sim.app_id();
    let good = keys::activity_claims(&app, &service);
    let with = |key: &str, value: Value| {
        let mut claims = good.clone();
        claims[key] = value;
        claims
    };
    let mut other_channel = body.clone();
    other_channel["channelId"] = json!("slack");
    let cases: Vec<(&str, Option<String>, Value)> = vec![
        ("no token", None, body.clone()),
        ("not a JWT", Some("Bearer abc".into()), body.clone()),
        (
            "a key the JWKS does not list",
            Some(format!("Bearer {}", keys::sign_as(&good, "other-key"))),
            body.clone(),
        ),
        (
            "another bot's audience",
            Some(format!(
                "Bearer {}",
                keys::sign(&with("aud", json!("other-app")))
            )),
            body.clone(),
        ),
        (
            "another issuer",
            Some(format!(
                "Bearer {}",
                keys::sign(&with("iss", json!("https://sts.windows.net/x/")))
            )),
            body.clone(),
        ),
        (
            "expired an hour ago",
            Some(format!(
                "Bearer {}",
                keys::sign(&with("exp", json!(now() - 3_600)))
            )),
            body.clone(),
        ),
        (
            "another service URL",
            Some(format!(
                "Bearer {}",
                keys::sign(&with("serviceurl", json!("https://evil.example/")))
            )),
            body.clone(),
        ),
        (
            "a channel the key is not endorsed for",
            Some(format!("Bearer {}", keys::sign(&good))),
            other_channel,
        ),
    ];
    let http = reqwest::Client::new();
    for (case, authorization, body) in cases {
        let mut request = http.post(&peer.endpoint).json(&body);
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let status = request.send().await.unwrap().status().as_u16();
        assert_eq!(status, 401, "{case}");
    }
    // The same forged body with a genuine token for it goes through: the refusals were the tokens.
    let status = http
        .post(&peer.endpoint)
        .header("authorization", format!("Bearer {}", keys::sign(&good)))
        .json(&body)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16();
    assert_eq!(status, 200);
    until("the signed one dispatched", || {
        running.seen().get("forged") == Some(&1)
    })
    .await;
    assert_eq!(running.seen().len(), 2, "{:?}", running.seen());
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_the_same_401_and_an_oversized_activity_is_413() {
    let peer = Peer::start().await;
    peer.sim.set_endpoint(None);
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("the Teams source is pushed");
    };
    let tally = Arc::new(Tally::default());
    let running = {
        let tally = tally.clone();
        tokio::spawn(async move { feed.run(tally).await })
    };
    peer.listening().await;
    let service = peer.sim.service_url();
    let genuine = keys::sign(&keys::activity_claims(&peer.sim.app_id(), &service));
    let body = json!({ "type": "message", "id": "big-1", "channelId": "msteams",
        "serviceUrl": service, "text": "big", "timestamp": "2025-01-01T00:00:00Z",
        "from": { "id": "29:ada", "name": "Ada" },
        "recipient": { "id": format!("28:{}", peer.sim.app_id()) },
        "conversation": { "id": "a:big", "conversationType": "personal" } })
    .to_string();
    let http = reqwest::Client::new();
    let request = || {
        http.post(&peer.endpoint)
            .header("content-type", "application/json")
            .body(body.clone())
    };
    // The unknown key's id was in the old answer; no token at all was another text.
    let unknown_key = answer(request().header(
        "authorization",
        format!(
            "Bearer {}",
            keys::sign_as(
                &keys::activity_claims(&peer.sim.app_id(), &service),
                "other-key"
            )
        ),
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
    // The activity padded past the limit, with a genuine token: taken, it would reach the engine.
    let mut big = body.into_bytes();
    big.resize(clawgate_channel_teams::MAX_BODY_BYTES + 1, b' ');
    let bearer = format!("Bearer {genuine}");
    let status = post_raw(&peer.endpoint, &[("authorization", &bearer)], big.clone()).await;
    assert_eq!(status, "HTTP/1.1 413 Payload Too Large");
    assert_eq!(
        tally.delivered.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "nothing reached the engine"
    );
    // At the limit exactly, the same delivery is taken.
    big.truncate(clawgate_channel_teams::MAX_BODY_BYTES);
    let taken = reqwest::Client::new()
        .post(&peer.endpoint)
        .header("content-type", "application/json")
        .header("authorization", &bearer)
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status().as_u16(), 200);
    assert_eq!(tally.delivered.load(std::sync::atomic::Ordering::SeqCst), 1);
    tally.stop.notify_one();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_url_of_each_conversation_is_kept_for_sends_after_a_restart() {
    // No configured service URL: the bot sends only where Teams told it to.
    let peer = Peer::with(quiet(), json!({ "service_url": null })).await;
    let (_dir, store) = store();
    let running = Running::start(&peer.plugin, &store);
    peer.listening().await;
    let channel = peer.channel("general");
    let post = peer
        .sim
        .person_writes(&channel, &peer.person, "ask", None)
        .unwrap();
    until("the post dispatched", || {
        running.seen().get("ask") == Some(&1)
    })
    .await;
    running.stop().await;
    let state = clawgate_conformance::channel_state(peer.state.path(), "teams", "default");
    let reference = |conversation: &str| {
        let state = state.clone();
        let name = format!("reference/{conversation}");
        async move {
            state
                .value::<ConversationReference>(&name)
                .await
                .unwrap()
                .map(|v| v.value)
        }
    };
    assert_eq!(
        reference(&channel).await,
        Some(ConversationReference {
            service_url: peer.sim.service_url(),
            conversation_type: "channel".into(),
        })
    );
    // A new process on the same state directory answers in the thread.
    let mut settings = json!({
        "app_id": peer.sim.app_id(), "app_password_env": "UNUSED_IN_TESTS",
        "listen": "127.0.0.1:0", "token_url": peer.sim.token_url(),
        "openid_url": peer.sim.openid_url(),
    });
    settings["request_timeout_ms"] = json!(3000);
    let setup =
        clawgate_conformance::channel_setup(0, "teams", "default", settings, peer.state.path());
    let again = TeamsFactory
        .build_with_secrets(&setup, Secret::new(peer.sim.app_password()))
        .await
        .unwrap();
    let target = MessageTarget::group(&channel).with_thread_id(Some(post.id.clone()));
    again
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("r", "teams", target.clone(), ""),
                "r",
            ),
            &RenderedMessageUnit::text(0, "answer"),
        )
        .await
        .unwrap();
    let shown = peer.sim.bot_visible(&channel);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].thread.as_deref(), Some(post.id.as_str()));
    // An install alone teaches the reference too (a proactive send needs nothing more).
    let group = peer.sim.conversation(
        ConversationKind::GroupChat,
        "crew",
        std::slice::from_ref(&peer.person),
    );
    let running = Running::start(&peer.plugin, &store);
    let deadline = Instant::now() + Duration::from_secs(20);
    while reference(&group).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the install was never acknowledged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(running.seen().is_empty(), "an install is not a prompt");
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
