//! The WebSocket feed across restarts of the gateway: inside the server's resume window it
//! resumes (no hello, the missed events from its durable `seq`, no REST); beyond the 128-event
//! dead queue it gets a fresh connection and re-fetches the missed posts over REST, each once; a
//! gateway stopped in the middle of that re-fetch re-fetches again when it next resumes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_mattermost::SocketRecord;
use clawgate_channel_mattermost::simulator::SimUser;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::Versioned;
use clawgate_channel_sdk::{EventSink, LegacyFiles, PushedEvent};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::peer::{Peer, build, build_from, settings_for};

/// Records what the feed hands over and acks it at once; with `stop_after`, the gateway stops
/// (its feed ending wherever it is) when the event after that many comes, which is not acked.
struct Sink {
    events: Mutex<Vec<Value>>,
    stop: watch::Sender<bool>,
    stop_after: Option<usize>,
}

#[clawgate_channel_sdk::async_trait]
impl EventSink for Sink {
    async fn deliver(&self, event: PushedEvent) {
        let mut events = self.events.lock().unwrap();
        if self.stop_after.is_some_and(|n| events.len() >= n) {
            let _ = self.stop.send(true);
            return;
        }
        events.push(event.raw);
        event.ack.ack();
    }

    async fn stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// A feed of a channel built on `state`, running until stopped.
struct Feed {
    sink: Arc<Sink>,
    task: tokio::task::JoinHandle<()>,
}

impl Feed {
    async fn start(peer: &Peer, state: &std::path::Path) -> Feed {
        Feed::start_stopping_after(peer, state, None).await
    }

    async fn start_stopping_after(
        peer: &Peer,
        state: &std::path::Path,
        stop_after: Option<usize>,
    ) -> Feed {
        let plugin = build(
            &peer.sim,
            &peer.bot,
            state,
            "mattermost",
            json!({ "require_mention": false }),
        )
        .await
        .unwrap();
        Feed::run(plugin, stop_after)
    }

    /// The feed of `plugin`, running until stopped.
    fn run(plugin: ChannelPlugin, stop_after: Option<usize>) -> Feed {
        let InboundSource::Pushed(feed) = plugin.source else {
            panic!("the Mattermost source is pushed");
        };
        let sink = Arc::new(Sink {
            events: Mutex::new(Vec::new()),
            stop: watch::channel(false).0,
            stop_after,
        });
        let running = sink.clone();
        let task = tokio::spawn(async move {
            feed.run(running).await.unwrap();
        });
        Feed { sink, task }
    }

    /// Post messages handed over, by message.
    fn messages(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for event in self.sink.events.lock().unwrap().iter() {
            let post: Value =
                serde_json::from_str(event["data"]["post"].as_str().unwrap()).unwrap();
            *counts
                .entry(post["message"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        counts
    }

    async fn until(&self, what: &str, check: impl Fn(&HashMap<String, usize>) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check(&self.messages()) {
            assert!(Instant::now() < deadline, "{what}: {:?}", self.messages());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) {
        let _ = self.sink.stop.send(true);
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the feed stops within 10 s of the gateway stopping")
            .unwrap();
    }
}

fn lists(peer: &Peer) -> usize {
    peer.sim
        .calls()
        .into_iter()
        .filter(|c| c.method == "GET" && c.path.ends_with("/posts"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_inside_the_window_resumes_from_the_durable_seq() {
    let peer = Peer::start().await;
    let channel = peer.channel("resume");
    let state = tempfile::tempdir().unwrap();
    let feed = Feed::start(&peer, state.path()).await;
    assert!(peer.socket_open().await);
    peer.sim
        .person_writes(&channel, &peer.person, "before", None);
    feed.until("the first post", |m| m.get("before") == Some(&1))
        .await;
    feed.stop().await;
    for text in ["while down 1", "while down 2", "while down 3"] {
        peer.sim.person_writes(&channel, &peer.person, text, None);
    }
    let again = Feed::start(&peer, state.path()).await;
    again
        .until("the posts written while down", |m| m.len() == 3)
        .await;
    let seen = again.messages();
    assert!(seen.values().all(|n| *n == 1), "{seen:?}");
    assert!(
        !seen.contains_key("before"),
        "recorded before: not replayed"
    );
    let stats = peer.sim.socket_stats();
    assert_eq!((stats.fresh, stats.resumed), (1, 1));
    assert_eq!(lists(&peer), 0, "a resume needs no REST re-fetch");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_the_dead_queue_the_missed_posts_are_refetched_over_rest() {
    let peer = Peer::start().await;
    let channel = peer.channel("refetch");
    let dm = peer.sim.add_dm(&peer.bot, &peer.person);
    let state = tempfile::tempdir().unwrap();
    let feed = Feed::start(&peer, state.path()).await;
    assert!(peer.socket_open().await);
    peer.sim
        .person_writes(&channel, &peer.person, "before", None);
    feed.until("the first post", |m| m.get("before") == Some(&1))
        .await;
    feed.stop().await;
    for n in 0..130 {
        peer.sim
            .person_writes(&channel, &peer.person, &format!("missed {n}"), None);
    }
    peer.sim
        .person_writes(&dm, &peer.person, "missed in the DM", None);
    let again = Feed::start(&peer, state.path()).await;
    again
        .until("every missed post", |m| {
            m.keys().filter(|k| k.starts_with("missed")).count() == 131
        })
        .await;
    let seen = again.messages();
    assert!(
        seen.iter()
            .filter(|(k, _)| k.starts_with("missed"))
            .all(|(_, n)| *n == 1),
        "each missed post once: {seen:?}"
    );
    // The re-fetch starts a little before the recorded time: "before" may come again, and
    // the engine's durable dedupe by post id drops it.
    assert!(seen.get("before").is_none_or(|n| *n == 1));
    let stats = peer.sim.socket_stats();
    assert_eq!((stats.fresh, stats.resumed), (2, 0));
    assert!(lists(&peer) >= 2, "the channel and the DM were listed");
    // The DM's event says it is direct, so the receiver answers it without a mention.
    let events = again.sink.events.lock().unwrap().clone();
    let dm_event = events
        .iter()
        .find(|e| {
            e["data"]["post"]
                .as_str()
                .unwrap()
                .contains("missed in the DM")
        })
        .unwrap();
    assert_eq!(dm_event["data"]["channel_type"], "D");
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_mid_refetch_refetches_when_it_resumes_that_connection() {
    let peer = Peer::start().await;
    let channel = peer.channel("cut-short");
    let state = tempfile::tempdir().unwrap();
    let feed = Feed::start(&peer, state.path()).await;
    assert!(peer.socket_open().await);
    peer.sim
        .person_writes(&channel, &peer.person, "before", None);
    feed.until("the first post", |m| m.get("before") == Some(&1))
        .await;
    feed.stop().await;
    // Beyond the dead queue: the next start gets a fresh connection and re-fetches.
    for n in 0..130 {
        peer.sim
            .person_writes(&channel, &peer.person, &format!("missed {n}"), None);
    }
    let cut = Feed::start_stopping_after(&peer, state.path(), Some(10)).await;
    tokio::time::timeout(Duration::from_secs(10), cut.task)
        .await
        .expect("the gateway stops in the middle of the re-fetch")
        .unwrap();
    let recorded = cut.sink.events.lock().unwrap().len();
    assert_eq!(recorded, 10, "ten posts recorded before the stop");
    // The fresh connection is resumed (no hello, its dead queue holds none of the posts
    // written before it existed): the owed re-fetch must bring the rest.
    let again = Feed::start(&peer, state.path()).await;
    again
        .until("the posts the cut-short re-fetch did not record", |m| {
            (10..130).all(|n| m.contains_key(&format!("missed {n}")))
        })
        .await;
    let stats = peer.sim.socket_stats();
    assert_eq!(
        (stats.fresh, stats.resumed),
        (2, 1),
        "the last start resumed"
    );
    // Once paid, the debt is gone: a further resume needs no REST.
    again.stop().await;
    let lists_before = lists(&peer);
    peer.sim
        .person_writes(&channel, &peer.person, "after the re-fetch", None);
    let last = Feed::start(&peer, state.path()).await;
    last.until("the post written while down", |m| {
        m.get("after the re-fetch") == Some(&1)
    })
    .await;
    assert_eq!(peer.sim.socket_stats().resumed, 2);
    assert_eq!(
        lists(&peer),
        lists_before,
        "a paid re-fetch is not repeated"
    );
    last.stop().await;
}

/// The WebSocket record account `default` of channel `mattermost` keeps in the store of `dir`.
async fn kept_record(dir: &std::path::Path) -> Option<Versioned<SocketRecord>> {
    kept_record_of(dir, "default").await
}

/// The WebSocket record `account` of channel `mattermost` keeps in the store of `dir`.
async fn kept_record_of(dir: &std::path::Path, account: &str) -> Option<Versioned<SocketRecord>> {
    clawgate_conformance::channel_state(dir, "mattermost", account)
        .value::<SocketRecord>("websocket")
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_an_earlier_release_kept_is_imported_once_and_resumed() {
    let peer = Peer::start().await;
    let channel = peer.channel("upgrade");
    let state = tempfile::tempdir().unwrap();
    let feed = Feed::start(&peer, state.path()).await;
    assert!(peer.socket_open().await);
    peer.sim
        .person_writes(&channel, &peer.person, "before", None);
    feed.until("the first post", |m| m.get("before") == Some(&1))
        .await;
    feed.stop().await;
    for text in ["while down 1", "while down 2"] {
        peer.sim.person_writes(&channel, &peer.person, text, None);
    }
    // The earlier release's file: the record as JSON, named after the channel.
    let record = kept_record(state.path()).await.unwrap().value;
    let old_dir = tempfile::tempdir().unwrap();
    let file = old_dir.path().join("mattermost-mattermost-socket.json");
    std::fs::write(&file, serde_json::to_vec(&record).unwrap()).unwrap();
    let store = tempfile::tempdir().unwrap();
    let upgraded = || {
        clawgate_conformance::channel_setup(
            0,
            "mattermost",
            "default",
            settings_for(&peer.sim, json!({ "require_mention": false })),
            store.path(),
        )
        .with_legacy_files(LegacyFiles::in_dir(old_dir.path()))
    };
    let plugin = build_from(&peer.bot, &upgraded()).await.unwrap();
    assert!(!file.exists(), "the file is set aside");
    assert!(
        old_dir
            .path()
            .join("mattermost-mattermost-socket.json.imported")
            .exists()
    );
    let again = Feed::run(plugin, None);
    again
        .until("the posts written while down", |m| m.len() == 2)
        .await;
    assert!(!again.messages().contains_key("before"), "not replayed");
    let stats = peer.sim.socket_stats();
    assert_eq!(
        (stats.fresh, stats.resumed),
        (1, 1),
        "the imported connection is resumed"
    );
    again.stop().await;
    // A crash after the import and before the file was set aside leaves it there: read again,
    // the stored record wins.
    let kept = kept_record(store.path()).await.unwrap();
    std::fs::write(&file, serde_json::to_vec(&record).unwrap()).unwrap();
    build_from(&peer.bot, &upgraded()).await.unwrap();
    assert!(!file.exists(), "the file is set aside");
    assert_eq!(kept_record(store.path()).await, Some(kept), "imported once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_superseded_by_another_gateway_keeps_its_record_and_a_new_run_takes_it_over() {
    let peer = Peer::start().await;
    let channel = peer.channel("takeover");
    let state = tempfile::tempdir().unwrap();
    let plugin = build(
        &peer.sim,
        &peer.bot,
        state.path(),
        "mattermost",
        json!({ "require_mention": false }),
    )
    .await
    .unwrap();
    let feed = Feed::run(plugin.clone(), None);
    assert!(peer.socket_open().await);
    peer.sim
        .person_writes(&channel, &peer.person, "before", None);
    feed.until("the first post", |m| m.get("before") == Some(&1))
        .await;
    // Another gateway took the account over and wrote its own record, through its own handle
    // on the same store and scope.
    let mine = kept_record(state.path()).await.unwrap();
    let theirs = SocketRecord {
        connection_id: "the-other-gateways-connection".into(),
        sequence_number: 7,
        create_at: mine.value.create_at,
        refetch_owed: false,
    };
    let version = clawgate_conformance::channel_state(state.path(), "mattermost", "default")
        .put("websocket", &theirs)
        .await
        .unwrap();
    assert!(version > mine.version);
    // This feed has not stopped yet: it takes more posts and acks them, then stops (its last
    // write).
    peer.sim
        .person_writes(&channel, &peer.person, "after", None);
    feed.until("the post after the takeover", |m| {
        m.get("after") == Some(&1)
    })
    .await;
    feed.stop().await;
    assert_eq!(
        kept_record(state.path()).await,
        Some(Versioned {
            value: theirs.clone(),
            version
        }),
        "the other gateway's record is not overwritten"
    );
    // This gateway holds the account again later: its feed runs again from the stored record
    // (a connection the server does not know: a fresh one) and writes its own over it.
    let again = Feed::run(plugin, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let kept = kept_record(state.path()).await.unwrap();
        if kept.version > version {
            assert_ne!(kept.value.connection_id, theirs.connection_id);
            break;
        }
        assert!(Instant::now() < deadline, "the new connection is written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(peer.sim.socket_stats().fresh, 2);
    again.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_records_apart() {
    let peer = Peer::start().await;
    let second_bot = peer.sim.add_bot("second");
    let channel = peer
        .sim
        .add_channel("both", &[&peer.bot, &second_bot, &peer.person]);
    let state = tempfile::tempdir().unwrap();
    let account = |account: &'static str, bot: &SimUser| {
        let setup = clawgate_conformance::channel_setup(
            0,
            "mattermost",
            account,
            settings_for(&peer.sim, json!({ "require_mention": false })),
            state.path(),
        );
        let bot = bot.clone();
        async move { Feed::run(build_from(&bot, &setup).await.unwrap(), None) }
    };
    let (first, second) = (
        account("default", &peer.bot).await,
        account("second", &second_bot).await,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while peer.sim.socket_stats().open < 2 {
        assert!(Instant::now() < deadline, "both sockets open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    peer.sim
        .person_writes(&channel, &peer.person, "to both", None);
    first
        .until("the post", |m| m.get("to both") == Some(&1))
        .await;
    second
        .until("the post", |m| m.get("to both") == Some(&1))
        .await;
    first.stop().await;
    second.stop().await;
    let first_record = kept_record_of(state.path(), "default").await.unwrap();
    let second_record = kept_record_of(state.path(), "second").await.unwrap();
    assert_ne!(
        first_record.value.connection_id, second_record.value.connection_id,
        "each account keeps its own connection"
    );
    peer.sim
        .person_writes(&channel, &peer.person, "while both were down", None);

    // Each account resumes its own connection, and its writes leave the other's record alone.
    let second = account("second", &second_bot).await;
    second
        .until("the post written while down", |m| {
            m.get("while both were down") == Some(&1)
        })
        .await;
    second.stop().await;
    assert_eq!(
        kept_record_of(state.path(), "default").await,
        Some(first_record),
        "the second account's writes leave the first account's record alone"
    );
    let second_record = kept_record_of(state.path(), "second").await.unwrap();
    let first = account("default", &peer.bot).await;
    first
        .until("the post written while down", |m| {
            m.get("while both were down") == Some(&1)
        })
        .await;
    first.stop().await;
    assert_eq!(
        kept_record_of(state.path(), "second").await,
        Some(second_record),
        "the first account's writes leave the second account's record alone"
    );
    let stats = peer.sim.socket_stats();
    assert_eq!(
        (stats.fresh, stats.resumed),
        (2, 2),
        "each account's first start is fresh, and each restart resumed its own connection"
    );
    assert_eq!(lists(&peer), 0, "a resume needs no REST re-fetch");
}
