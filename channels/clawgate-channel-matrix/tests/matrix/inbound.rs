//! Receiving from Synapse: `/sync` from a durable `since` token across restarts, own events,
//! echoes of another gateway's failure notices, invites, and `/sync` errors.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::Versioned;
use clawgate_channel_sdk::{LegacyFiles, NoTransportAck};
use clawgate_messages::{
    AckController, EventHandler, ReceiveOptions, ReceiveOutcome, Receiver, SourceRunner,
    SourceStores,
};
use clawgate_store::WatermarkKey;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::SystemClock;
use reqwest::Method;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::peer::{Peer, build, build_from, setup};
use crate::proxy::FaultKind;
use clawgate_channel_matrix::testing::enc;

fn text(raw: &Value) -> &str {
    raw.pointer("/content/body")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

async fn poll(plugin: &ChannelPlugin, from: &PollFrom) -> Vec<PolledEvent> {
    let InboundSource::Polling(feed) = &plugin.source else {
        panic!("the Matrix source polls");
    };
    feed.poll(from, PollWait::Immediate).await.unwrap()
}

/// Polls until `texts` all arrived (Synapse may hand a just-written event to the next sync).
async fn poll_until(plugin: &ChannelPlugin, from: &PollFrom, texts: &[&str]) -> Vec<PolledEvent> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = poll(plugin, from).await;
        let seen: Vec<&str> = events.iter().map(|e| text(&e.raw)).collect();
        if texts.iter().all(|t| seen.contains(t)) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "waiting for {texts:?}, polled {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_events_are_never_polled_and_others_come_with_their_room() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    peer.plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("own", "matrix", MessageTarget::group(room.clone()), ""),
                "own",
            ),
            &RenderedMessageUnit::text(0, "from the gateway"),
        )
        .await
        .unwrap();
    peer.write(
        &peer.ada,
        &room,
        json!({ "msgtype": "m.text", "body": "from ada" }),
    )
    .await;
    let events = poll_until(&peer.plugin, &PollFrom::new(0, None), &["from ada"]).await;
    let texts: Vec<&str> = events.iter().map(|e| text(&e.raw)).collect();
    assert_eq!(
        texts,
        vec!["from ada"],
        "our own event is not an inbound event"
    );
    let inbound = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(&events[0].raw)
        .unwrap();
    assert_eq!(inbound.message.target.id, room);
    assert_eq!(
        inbound.message.sender.as_ref().map(|s| s.id.as_str()),
        Some(peer.ada.user_id.as_str())
    );
    assert_eq!(events[0].position, 1);
    assert!(
        events[0].checkpoint.is_some(),
        "the since token is the checkpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_echo_from_a_bot_is_dropped_and_an_unmarked_one_meets_bot_authorization() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let receiver = Receiver::new(
        store,
        peer.plugin.sender.clone(),
        peer.plugin.receiver.clone().unwrap(),
        Arc::new(SystemClock),
        ReceiveOptions::default(),
    );
    let notice = "Agent failed before reply.";
    let marker = serde_json::to_value(MessageOrigin::gateway_failure(
        clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
    ))
    .unwrap();
    let marked = peer
        .write(
            &peer.otherbot,
            &room,
            json!({ "msgtype": "m.notice", "body": notice, "org.clawgate.origin": marker }),
        )
        .await;
    let unmarked = peer
        .write(
            &peer.otherbot,
            &room,
            json!({ "msgtype": "m.notice", "body": notice }),
        )
        .await;
    let person = peer
        .write(
            &peer.ada,
            &room,
            json!({ "msgtype": "m.text", "body": notice }),
        )
        .await;
    let mut dispatched = Vec::new();
    let mut outcomes = Vec::new();
    for raw in [&marked, &unmarked, &person] {
        let ack = AckController::new(Arc::new(NoTransportAck));
        let outcome = receiver
            .receive(raw, &ack, |inbound| {
                dispatched.push(inbound.event_id.clone());
                async { Ok::<(), String>(()) }
            })
            .await
            .unwrap();
        outcomes.push(outcome);
    }
    assert!(
        matches!(outcomes[0], ReceiveOutcome::DroppedEcho),
        "{:?}",
        outcomes[0]
    );
    assert!(
        matches!(outcomes[1], ReceiveOutcome::Unauthorized),
        "the same text unmarked goes through bot authorization: {:?}",
        outcomes[1]
    );
    assert!(
        matches!(outcomes[2], ReceiveOutcome::Handled { .. }),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(
        dispatched,
        vec![person["event_id"].as_str().unwrap().to_owned()]
    );
}

/// Counts, per text, the dispatches a source runner's events got.
struct Counting {
    receiver: Receiver,
    plugin: ChannelPlugin,
    failing: Option<String>,
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
        let fail = self.failing.as_deref() == Some(body.as_str());
        let outcome = self
            .receiver
            .receive(raw, ack, |_| async move {
                *counts.lock().unwrap().entry(body).or_default() += 1;
                if fail {
                    Err("planned failure".to_owned())
                } else {
                    Ok(())
                }
            })
            .await;
        !matches!(
            outcome,
            Ok(ReceiveOutcome::Failed {
                dead_lettered: false,
                ..
            }) | Err(_)
        )
    }
}

struct Running {
    dispatched: Arc<Mutex<HashMap<String, u32>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(plugin: &ChannelPlugin, store: &Arc<SqliteStore>, failing: Option<&str>) -> Running {
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
            failing: failing.map(str::to_owned),
            dispatched: dispatched.clone(),
        };
        let runner = SourceRunner::new(
            WatermarkKey {
                channel: plugin.name().to_owned(),
                account_id: String::new(),
                source: "sync".into(),
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

    async fn until(&self, what: &str, check: impl Fn(&HashMap<String, u32>) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !check(&self.seen()) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_account_resumes_sync_without_skipping_or_replaying() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    // One room, written before the first poll: one `/sync` answer holds both, the finished
    // event first (a checkpoint past the whole answer would skip the unfinished one).
    for body in ["finished", "unfinished"] {
        peer.write(
            &peer.ada,
            &room,
            json!({ "msgtype": "m.text", "body": body }),
        )
        .await;
    }
    let first = Running::start(&peer.plugin, &store, Some("unfinished"));
    first
        .until("both events handed over", |s| {
            s.get("finished") == Some(&1) && s.get("unfinished").is_some_and(|n| *n >= 1)
        })
        .await;
    first.stop().await;
    // Written while the gateway is down.
    peer.write(
        &peer.ada,
        &room,
        json!({ "msgtype": "m.text", "body": "while down" }),
    )
    .await;
    // A new process: a channel built afresh on the same state directory and store.
    let restarted = build(
        &peer.proxy.base,
        &peer.gateway,
        &peer.otherbot,
        peer.state.path(),
        json!({}),
    )
    .await
    .unwrap();
    let second = Running::start(&restarted, &store, None);
    second
        .until("the unfinished and the new event", |s| {
            s.get("unfinished") == Some(&1) && s.get("while down") == Some(&1)
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = second.seen();
    second.stop().await;
    assert_eq!(
        seen,
        HashMap::from([("unfinished".to_owned(), 1), ("while down".to_owned(), 1)]),
        "after the restart the finished event is not run again and nothing is skipped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_before_the_first_inbound_event_survive_a_restart() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    // The peer's channel listened once (its start token is kept); it stops before any event.
    peer.write(
        &peer.ada,
        &room,
        json!({ "msgtype": "m.text", "body": "early" }),
    )
    .await;
    let restarted = build(
        &peer.proxy.base,
        &peer.gateway,
        &peer.otherbot,
        peer.state.path(),
        json!({}),
    )
    .await
    .unwrap();
    let events = poll_until(&restarted, &PollFrom::new(0, None), &["early"]).await;
    assert_eq!(events.len(), 1);
}

/// The first `since` token the store keeps for Matrix account `account`.
async fn kept_start(dir: &std::path::Path, account: &str) -> Option<Versioned<String>> {
    clawgate_conformance::channel_state(dir, "matrix", account)
        .value::<String>("sync-start")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_sync_starts_apart() {
    // The peer's account (`default`) listened once: its start is kept.
    let peer = Peer::start().await;
    let first_start = kept_start(peer.state.path(), "default").await;
    let second = peer.synapse.register("second").await;
    let created = peer
        .synapse
        .call(
            &second,
            Method::POST,
            "createRoom",
            Some(json!({ "preset": "private_chat", "invite": [peer.ada.user_id] })),
        )
        .await;
    let room = created["room_id"].as_str().unwrap().to_owned();
    peer.synapse
        .call(
            &peer.ada,
            Method::POST,
            &format!("join/{}", enc(&room)),
            Some(json!({})),
        )
        .await;
    peer.write(
        &peer.ada,
        &room,
        json!({ "msgtype": "m.text", "body": "before the second account started" }),
    )
    .await;
    // The second account, on the same store: it listens from its own first start (one token
    // file for both accounts handed it the first account's older token, and with it history).
    let second_setup = || {
        setup(
            &peer.proxy.base,
            &second,
            &peer.otherbot,
            peer.state.path(),
            "second",
            json!({}),
        )
    };
    let plugin = build_from(&second_setup(), &second).await.unwrap();
    let first_poll = poll(&plugin, &PollFrom::new(0, None)).await;
    let texts: Vec<&str> = first_poll.iter().map(|e| text(&e.raw)).collect();
    assert!(
        texts.is_empty(),
        "history from before the second account's first start is not answered: {texts:?}"
    );
    peer.write(
        &peer.ada,
        &room,
        json!({ "msgtype": "m.text", "body": "while the second account was down" }),
    )
    .await;
    let restarted = build_from(&second_setup(), &second).await.unwrap();
    let events = poll_until(
        &restarted,
        &PollFrom::new(0, None),
        &["while the second account was down"],
    )
    .await;
    let texts: Vec<&str> = events.iter().map(|e| text(&e.raw)).collect();
    assert_eq!(
        texts,
        vec!["while the second account was down"],
        "the restarted second account resumes from its own start"
    );
    let first_start = first_start.expect("the first account's start is kept");
    assert_eq!(
        kept_start(peer.state.path(), "default").await,
        Some(first_start.clone()),
        "the first account's start is untouched"
    );
    let second_start = kept_start(peer.state.path(), "second").await.unwrap();
    assert_ne!(second_start.value, first_start.value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_start_an_earlier_release_kept_is_imported_once() {
    let peer = Peer::start().await;
    let room = peer.room(json!({})).await;
    // The token an earlier release kept at its first start, then a message after it.
    let old_token = peer
        .synapse
        .call(&peer.gateway, Method::GET, "sync?timeout=0", None)
        .await["next_batch"]
        .as_str()
        .unwrap()
        .to_owned();
    peer.write(
        &peer.ada,
        &room,
        json!({ "msgtype": "m.text", "body": "after the old start" }),
    )
    .await;
    let old_dir = tempfile::tempdir().unwrap();
    let file = old_dir.path().join("matrix-sync-start");
    std::fs::write(&file, format!("{old_token}\n")).unwrap();
    let store = tempfile::tempdir().unwrap();
    let upgraded = || {
        setup(
            &peer.proxy.base,
            &peer.gateway,
            &peer.otherbot,
            store.path(),
            "default",
            json!({}),
        )
        .with_legacy_files(LegacyFiles::in_dir(old_dir.path()))
    };
    let plugin = build_from(&upgraded(), &peer.gateway).await.unwrap();
    assert!(!file.exists(), "the file is set aside");
    assert_eq!(
        std::fs::read_to_string(old_dir.path().join("matrix-sync-start.imported")).unwrap(),
        format!("{old_token}\n")
    );
    let imported = Versioned {
        value: old_token,
        version: 1,
    };
    assert_eq!(
        kept_start(store.path(), "default").await,
        Some(imported.clone())
    );
    // The upgraded account resumes from the kept token: the message after it is answered.
    let events = poll_until(&plugin, &PollFrom::new(0, None), &["after the old start"]).await;
    assert_eq!(events.len(), 1);
    // A crash after the import and before the file was set aside leaves it there: read again,
    // the stored token wins and is written no second time.
    std::fs::write(&file, "s_a_later_token").unwrap();
    build_from(&upgraded(), &peer.gateway).await.unwrap();
    assert!(!file.exists(), "the file is set aside");
    build_from(&upgraded(), &peer.gateway).await.unwrap();
    assert_eq!(
        kept_start(store.path(), "default").await,
        Some(imported),
        "imported once"
    );
}

/// A room Ada created and invited the gateway to.
async fn invited(peer: &Peer) -> String {
    let created = peer
        .synapse
        .call(
            &peer.ada,
            Method::POST,
            "createRoom",
            Some(json!({ "preset": "private_chat", "invite": [peer.gateway.user_id] })),
        )
        .await;
    created["room_id"].as_str().unwrap().to_owned()
}

/// The users joined to `room`.
async fn members(peer: &Peer, room: &str) -> Vec<String> {
    let answer = peer
        .synapse
        .call(
            &peer.ada,
            Method::GET,
            &format!("rooms/{}/joined_members", enc(room)),
            None,
        )
        .await;
    answer["joined"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invites_are_joined_when_configured_and_left_waiting_otherwise() {
    let peer = Peer::start().await;
    let room = invited(&peer).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !members(&peer, &room).await.contains(&peer.gateway.user_id) {
        assert!(Instant::now() < deadline, "the invite was not joined");
        poll(&peer.plugin, &PollFrom::new(0, None)).await;
    }
    peer.write(
        &peer.ada,
        &room,
        json!({ "msgtype": "m.text", "body": "welcome" }),
    )
    .await;
    poll_until(&peer.plugin, &PollFrom::new(0, None), &["welcome"]).await;

    let waiting_state = tempfile::tempdir().unwrap();
    let waiting = build(
        &peer.proxy.base,
        &peer.gateway,
        &peer.otherbot,
        waiting_state.path(),
        json!({ "auto_join": false }),
    )
    .await
    .unwrap();
    poll(&waiting, &PollFrom::new(0, None)).await;
    let other = invited(&peer).await;
    for _ in 0..5 {
        poll(&waiting, &PollFrom::new(0, None)).await;
    }
    assert!(
        !members(&peer, &other).await.contains(&peer.gateway.user_id),
        "auto_join = false leaves the invite to an operator"
    );
    // An invite from before an account's first start is in its first answer only. A new
    // device: Synapse answers a repeated first /sync of one device from its response cache.
    let early = invited(&peer).await;
    let fresh_state = tempfile::tempdir().unwrap();
    let device = peer.synapse.login("clawgate").await;
    let fresh = build(
        &peer.proxy.base,
        &device,
        &peer.otherbot,
        fresh_state.path(),
        json!({}),
    )
    .await
    .unwrap();
    poll(&fresh, &PollFrom::new(0, None)).await;
    assert!(
        members(&peer, &early).await.contains(&peer.gateway.user_id),
        "an invite waiting at the first start is joined"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_rate_limits_and_refused_tokens_are_classified() {
    let peer = Peer::start().await;
    let InboundSource::Polling(feed) = &peer.plugin.source else {
        panic!("the Matrix source polls");
    };
    peer.proxy.inject_on(
        "/sync",
        1,
        FaultKind::Refuse(
            429,
            json!({ "errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests", "retry_after_ms": 2500 }),
        ),
    );
    let error = feed
        .poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit, "{error:?}");
    assert_eq!(
        error.retry_after_ms,
        Some(2500),
        "the engine waits as long as asked"
    );
    peer.proxy.inject_on(
        "/sync",
        1,
        FaultKind::matrix(401, "M_UNKNOWN_TOKEN", "Invalid access token passed."),
    );
    let error = feed
        .poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth, "{error:?}");
    assert!(error.message.contains("token_env"), "{error:?}");
    peer.proxy.inject_on(
        "/sync",
        1,
        FaultKind::matrix(403, "M_FORBIDDEN", "You are not allowed"),
    );
    let error = feed
        .poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error:?}");
    // And the next poll goes through again.
    feed.poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap();
}
