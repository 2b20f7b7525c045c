//! The Gateway feed against the simulator's Gateway: identify with intents, heartbeats, resume
//! after a drop (missed events replayed once), op 7, invalid sessions, fatal close codes, and the
//! durable `seq` that lets a restarted gateway resume.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_discord::simulator::{SimulatorConfig, WriteOptions};
use clawgate_channel_discord::{INTENTS, SessionRecord};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::Versioned;
use clawgate_channel_sdk::{EventSink, LegacyFiles, PushedEvent};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::peer::{Peer, build, build_from, settings_for};

/// An engine stand-in: keeps every event, acks it unless told not to.
struct Sink {
    events: Mutex<Vec<Value>>,
    ack: bool,
    stop: watch::Receiver<bool>,
}

#[async_trait]
impl EventSink for Sink {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw.clone());
        if self.ack {
            event.ack.ack();
        } else {
            event.ack.nack("not taken");
        }
    }

    async fn stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
    }
}

struct Running {
    sink: Arc<Sink>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), SourceError>>,
}

impl Running {
    fn start(plugin: &ChannelPlugin, ack: bool) -> Running {
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("the Discord source is pushed");
        };
        let (stop, stopped) = watch::channel(false);
        let sink = Arc::new(Sink {
            events: Mutex::new(Vec::new()),
            ack,
            stop: stopped,
        });
        let dyn_sink: Arc<dyn EventSink> = sink.clone();
        let task = tokio::spawn(async move { feed.run(dyn_sink).await });
        Running { sink, stop, task }
    }

    fn texts(&self) -> Vec<String> {
        self.sink
            .events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    async fn stop(self) -> Result<(), SourceError> {
        let _ = self.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap()
    }
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn quick_heartbeats() -> SimulatorConfig {
    SimulatorConfig {
        heartbeat_interval: Duration::from_millis(150),
        ..SimulatorConfig::fast()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_identifies_with_message_content_and_keeps_heartbeating() {
    let peer = Peer::with(quick_heartbeats(), json!({})).await;
    let running = Running::start(&peer.plugin, true);
    until("a session", || peer.sim.connected(&peer.bot) == 1).await;
    let stats = peer.sim.gateway_stats(&peer.bot);
    assert_eq!(stats.intents, INTENTS);
    assert_ne!(stats.intents & (1 << 15), 0, "MESSAGE_CONTENT");
    until("three heartbeats acked", || {
        peer.sim.gateway_stats(&peer.bot).heartbeats >= 3
    })
    .await;
    let channel = peer.sim.add_channel("hb");
    peer.sim.person_writes(
        &channel,
        &peer.person,
        "still there?",
        WriteOptions::default(),
    );
    until("the message", || running.texts() == vec!["still there?"]).await;
    // Heartbeats kept the connection: no zombie close, no reconnect.
    assert_eq!(peer.sim.gateway_stats(&peer.bot).identifies, 1);
    assert_eq!(peer.sim.gateway_stats(&peer.bot).resumes, 0);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_drop_the_feed_resumes_and_gets_what_it_missed_once() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("resume");
    let running = Running::start(&peer.plugin, true);
    until("a session", || peer.sim.connected(&peer.bot) == 1).await;
    peer.sim
        .person_writes(&channel, &peer.person, "one", WriteOptions::default());
    until("one", || running.texts().len() == 1).await;
    assert_eq!(peer.sim.disconnect(&peer.bot), 1);
    peer.sim
        .person_writes(&channel, &peer.person, "two", WriteOptions::default());
    peer.sim
        .person_writes(&channel, &peer.person, "three", WriteOptions::default());
    until("the missed messages", || running.texts().len() == 3).await;
    let stats = peer.sim.gateway_stats(&peer.bot);
    assert_eq!(
        (stats.identifies, stats.resumes),
        (1, 1),
        "resumed, not re-identified"
    );
    // Op 7: reconnect and resume again.
    peer.sim.request_reconnect(&peer.bot);
    until("a second resume", || {
        peer.sim.gateway_stats(&peer.bot).resumes == 2 && peer.sim.connected(&peer.bot) == 1
    })
    .await;
    peer.sim
        .person_writes(&channel, &peer.person, "four", WriteOptions::default());
    until("four", || running.texts().len() == 4).await;
    assert_eq!(running.texts(), vec!["one", "two", "three", "four"]);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_session_that_cannot_be_resumed_is_replaced_by_a_new_identify() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("invalid");
    let running = Running::start(&peer.plugin, true);
    until("a session", || peer.sim.connected(&peer.bot) == 1).await;
    peer.sim.invalidate_session(&peer.bot, false);
    until("a second identify", || {
        peer.sim.gateway_stats(&peer.bot).identifies == 2 && peer.sim.connected(&peer.bot) == 1
    })
    .await;
    assert_eq!(peer.sim.gateway_stats(&peer.bot).resumes, 0);
    peer.sim.person_writes(
        &channel,
        &peer.person,
        "new session",
        WriteOptions::default(),
    );
    until("the message", || running.texts() == vec!["new session"]).await;
    // A resumable invalid session is resumed.
    peer.sim.invalidate_session(&peer.bot, true);
    until("a resume", || {
        peer.sim.gateway_stats(&peer.bot).resumes == 1
    })
    .await;
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_or_a_disallowed_intent_ends_the_feed_naming_what_to_fix() {
    let peer = Peer::start().await;
    let running = Running::start(&peer.plugin, true);
    until("a session", || peer.sim.connected(&peer.bot) == 1).await;
    peer.sim.close(&peer.bot, 4004);
    let error = tokio::time::timeout(Duration::from_secs(10), running.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth);
    assert!(
        error.message.contains("4004") && error.message.contains("token"),
        "{}",
        error.message
    );

    let strict = Peer::with(
        SimulatorConfig {
            message_content_allowed: false,
            ..SimulatorConfig::fast()
        },
        json!({}),
    )
    .await;
    let running = Running::start(&strict.plugin, true);
    let error = tokio::time::timeout(Duration::from_secs(10), running.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        error.message.contains("4014") && error.message.contains("Message Content"),
        "{}",
        error.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_feed_resumes_from_the_durable_seq_and_gets_only_what_was_not_recorded() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("restart");
    let first = Running::start(&peer.plugin, true);
    until("a session", || peer.sim.connected(&peer.bot) == 1).await;
    peer.sim
        .person_writes(&channel, &peer.person, "recorded", WriteOptions::default());
    until("recorded", || first.texts().len() == 1).await;
    first.stop().await.unwrap();
    peer.sim.person_writes(
        &channel,
        &peer.person,
        "while down",
        WriteOptions::default(),
    );
    // A new process: a new plugin from the same state directory.
    let again = build(
        &peer.factory,
        &peer.sim,
        &peer.bot,
        peer.state.path(),
        "discord",
        json!({}),
    )
    .await
    .unwrap();
    let second = Running::start(&again, false);
    until("the missed message", || second.texts().len() == 1).await;
    assert_eq!(second.texts(), vec!["while down"]);
    assert_eq!(peer.sim.gateway_stats(&peer.bot).resumes, 1);
    // That one was not taken (nacked): the next process gets it again.
    second.stop().await.unwrap();
    let third_plugin = build(
        &peer.factory,
        &peer.sim,
        &peer.bot,
        peer.state.path(),
        "discord",
        json!({}),
    )
    .await
    .unwrap();
    let third = Running::start(&third_plugin, true);
    until("the unrecorded message again", || third.texts().len() == 1).await;
    assert_eq!(third.texts(), vec!["while down"]);
    third.stop().await.unwrap();
}

/// The session account `default` of channel `discord` keeps in the store of `dir`.
async fn kept_session(dir: &std::path::Path) -> Option<Versioned<SessionRecord>> {
    clawgate_conformance::channel_state(dir, "discord", "default")
        .value::<SessionRecord>("gateway-session")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_an_earlier_release_kept_is_imported_once_and_resumed() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("upgrade");
    let first = Running::start(&peer.plugin, true);
    until("a session", || peer.sim.connected(&peer.bot) == 1).await;
    peer.sim
        .person_writes(&channel, &peer.person, "recorded", WriteOptions::default());
    until("recorded", || first.texts().len() == 1).await;
    first.stop().await.unwrap();
    peer.sim.person_writes(
        &channel,
        &peer.person,
        "while down",
        WriteOptions::default(),
    );
    // The earlier release's file: the session as JSON, named after the channel.
    let session = kept_session(peer.state.path()).await.unwrap().value;
    let old_dir = tempfile::tempdir().unwrap();
    let file = old_dir.path().join("discord-discord-session.json");
    std::fs::write(&file, serde_json::to_vec(&session).unwrap()).unwrap();
    let store = tempfile::tempdir().unwrap();
    let upgraded = || {
        clawgate_conformance::channel_setup(
            0,
            "discord",
            "default",
            settings_for(&peer.sim, json!({})),
            store.path(),
        )
        .with_legacy_files(LegacyFiles::in_dir(old_dir.path()))
    };
    let plugin = build_from(&peer.factory, &peer.bot, &upgraded())
        .await
        .unwrap();
    assert!(!file.exists(), "the file is set aside");
    assert!(
        old_dir
            .path()
            .join("discord-discord-session.json.imported")
            .exists()
    );
    let second = Running::start(&plugin, true);
    until("the missed message", || second.texts().len() == 1).await;
    assert_eq!(second.texts(), vec!["while down"]);
    assert_eq!(
        peer.sim.gateway_stats(&peer.bot).resumes,
        1,
        "the imported session is resumed"
    );
    second.stop().await.unwrap();
    // A crash after the import and before the file was set aside leaves it there: read again,
    // the stored session wins.
    let kept = kept_session(store.path()).await.unwrap();
    std::fs::write(&file, serde_json::to_vec(&session).unwrap()).unwrap();
    build_from(&peer.factory, &peer.bot, &upgraded())
        .await
        .unwrap();
    assert!(!file.exists(), "the file is set aside");
    assert_eq!(
        kept_session(store.path()).await,
        Some(kept),
        "imported once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_superseded_by_another_gateway_keeps_its_session_and_a_new_run_takes_it_over() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("takeover");
    let running = Running::start(&peer.plugin, true);
    until("a session", || peer.sim.connected(&peer.bot) == 1).await;
    peer.sim
        .person_writes(&channel, &peer.person, "one", WriteOptions::default());
    until("one", || running.texts().len() == 1).await;
    // Another gateway took the account over and wrote its own session, through its own handle
    // on the same store and scope.
    let mine = kept_session(peer.state.path()).await.unwrap();
    let theirs = SessionRecord {
        session_id: "the-other-gateways-session".into(),
        resume_gateway_url: mine.value.resume_gateway_url.clone(),
        seq: 1,
    };
    let version = clawgate_conformance::channel_state(peer.state.path(), "discord", "default")
        .put("gateway-session", &theirs)
        .await
        .unwrap();
    assert!(version > mine.version);
    // This feed has not stopped yet: it takes more events and acks them, then stops (its last
    // write).
    peer.sim
        .person_writes(&channel, &peer.person, "two", WriteOptions::default());
    until("two", || running.texts().len() == 2).await;
    running.stop().await.unwrap();
    assert_eq!(
        kept_session(peer.state.path()).await,
        Some(Versioned {
            value: theirs.clone(),
            version
        }),
        "the other gateway's session is not overwritten"
    );
    // This gateway holds the account again later: its feed runs again from the stored session
    // (unknown to Discord here, so a new identify) and writes its new one over it.
    let again = Running::start(&peer.plugin, true);
    until("a new identify", || {
        peer.sim.gateway_stats(&peer.bot).identifies == 2 && peer.sim.connected(&peer.bot) == 1
    })
    .await;
    // (The session is `null` between the refused resume and the new READY.)
    let state = clawgate_conformance::channel_state(peer.state.path(), "discord", "default");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kept = state
            .value::<Option<SessionRecord>>("gateway-session")
            .await
            .unwrap()
            .unwrap();
        if let Some(session) = kept.value.filter(|_| kept.version > version) {
            assert_ne!(session.session_id, theirs.session_id);
            break;
        }
        assert!(Instant::now() < deadline, "the new session is written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    again.stop().await.unwrap();
}
