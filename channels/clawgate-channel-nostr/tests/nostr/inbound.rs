//! The feed: gift wraps addressed to us, pushed to the engine, normalized by rumor; a run
//! after a restart resumes from the durable checkpoint and sees what arrived meanwhile.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_nostr::dm::{self, DmProtocol};
use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::Versioned;
use nostr_sdk::Keys;
use serde_json::Value;

use crate::peer::{Peer, build, build_from, settings};

/// The engine's side of the feed, for a test: every event kept, acked at once.
pub(crate) struct Sink {
    events: Mutex<Vec<Value>>,
    pub(crate) stop: tokio::sync::watch::Sender<bool>,
    tx: tokio::sync::mpsc::UnboundedSender<Value>,
}

impl Sink {
    /// A sink and the stream of what it is handed.
    pub(crate) fn new() -> (Sink, tokio::sync::mpsc::UnboundedReceiver<Value>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let sink = Sink {
            events: Mutex::default(),
            stop: tokio::sync::watch::channel(false).0,
            tx,
        };
        (sink, rx)
    }
}

impl Default for Sink {
    fn default() -> Sink {
        Sink::new().0
    }
}

#[async_trait]
impl EventSink for Sink {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw.clone());
        let _ = self.tx.send(event.raw.clone());
        event.ack.ack();
    }

    async fn stopped(&self) {
        let mut stop = self.stop.subscribe();
        let _ = stop.wait_for(|stop| *stop).await;
    }
}

impl Sink {
    fn texts(&self, receiver: &dyn MessageReceiveAdapter) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|raw| receiver.normalize(raw).ok())
            .filter_map(|n| n.message.body.map(|b| b.text))
            .collect()
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(20), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

fn run(
    plugin: &ChannelPlugin,
    sink: Arc<Sink>,
) -> tokio::task::JoinHandle<Result<(), SourceError>> {
    let InboundSource::Pushed(feed) = plugin.source.clone() else {
        panic!("the Nostr source is pushed");
    };
    tokio::spawn(async move { feed.run(sink).await })
}

/// The checkpoint (seconds) account `default` of channel `nostr` keeps in the store of `dir`.
async fn kept_checkpoint(dir: &std::path::Path) -> Option<u64> {
    clawgate_conformance::channel_state(dir, "nostr", "default")
        .value::<u64>("checkpoint")
        .await
        .unwrap()
        .map(|v| v.value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_an_earlier_release_kept_is_imported_once_and_read_from() {
    let peer = Peer::start().await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let us = peer.keys.public_key();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // An earlier release stopped ten days ago; a message written then waits on the relay,
    // older than a first start reads back.
    let stopped_at = now - 10 * 24 * 3600;
    let waiting = dm::build(
        DmProtocol::Nip17,
        &peer.person.keys,
        &us,
        "waiting since the upgrade",
        stopped_at,
        "legacy-1",
    )
    .unwrap();
    peer.person.publish(&waiting).await;
    let old_dir = tempfile::tempdir().unwrap();
    let file = old_dir
        .path()
        .join(format!("nostr-{}.checkpoint", us.to_hex()));
    std::fs::write(&file, stopped_at.to_string()).unwrap();
    let store = tempfile::tempdir().unwrap();
    let upgraded = || {
        clawgate_conformance::channel_setup(
            0,
            "nostr",
            "default",
            settings(&[peer.relay.url()], serde_json::json!({})),
            store.path(),
        )
        .with_legacy_files(LegacyFiles::in_dir(old_dir.path()))
    };
    let plugin = build_from(&peer.keys, &upgraded()).await;
    assert!(!file.exists(), "the file is set aside");
    assert_eq!(
        std::fs::read_to_string(
            old_dir
                .path()
                .join(format!("nostr-{}.checkpoint.imported", us.to_hex()))
        )
        .unwrap(),
        stopped_at.to_string()
    );
    assert_eq!(kept_checkpoint(store.path()).await, Some(stopped_at));
    let sink = Arc::new(Sink::default());
    let feed = run(&plugin, sink.clone());
    until("the message waiting since the imported checkpoint", || {
        sink.texts(receiver.as_ref()) == ["waiting since the upgrade"]
    })
    .await;
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
    // A crash after the import and before the file was set aside leaves it there: read again,
    // the stored checkpoint wins.
    let kept = kept_checkpoint(store.path()).await;
    std::fs::write(&file, "1").unwrap();
    build_from(&peer.keys, &upgraded()).await;
    assert!(!file.exists(), "the file is set aside");
    assert_eq!(kept_checkpoint(store.path()).await, kept, "imported once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_resumes_from_its_checkpoint_and_ignores_our_own_and_others_wraps() {
    let peer = Peer::start().await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let state = tempfile::tempdir().unwrap();
    let plugin = build(
        &peer.keys,
        settings(&[peer.relay.url()], serde_json::json!({})),
        state.path(),
    )
    .await;
    let sink = Arc::new(Sink::default());
    let feed = run(&plugin, sink.clone());
    let us = peer.keys.public_key();
    peer.person.send_dm(&us, "first").await;
    until("the first DM", || {
        sink.texts(receiver.as_ref()) == ["first"]
    })
    .await;
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
    let at = kept_checkpoint(state.path())
        .await
        .expect("a checkpoint once everything received was acked");
    assert!(at > 1_700_000_000, "{at}");

    // While no feed runs: a DM to us and one to someone else.
    peer.person.send_dm(&us, "while down").await;
    let stranger = Keys::generate();
    peer.person
        .send_dm(&stranger.public_key(), "not for us")
        .await;

    let restarted = build(
        &peer.keys,
        settings(&[peer.relay.url()], serde_json::json!({})),
        state.path(),
    )
    .await;
    let sink = Arc::new(Sink::default());
    let feed = run(&restarted, sink.clone());
    until("the DM sent while no feed ran", || {
        sink.texts(receiver.as_ref())
            .contains(&"while down".to_owned())
    })
    .await;
    // The replay window brings "first" again (the engine dedupes it by its rumor id); the
    // stranger's wrap is not even served (it is not p-tagged to us).
    let raws = sink.events.lock().unwrap().clone();
    let ids: Vec<String> = raws
        .iter()
        .filter_map(|raw| receiver.normalize(raw).ok())
        .map(|n| n.event_id)
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 2, "two messages: {ids:?}");
    assert!(raws.iter().all(|raw| receiver.normalize(raw).is_ok()));
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_relay_that_wants_auth_the_channel_authenticates_to_send_and_to_read() {
    let relay = clawgate_channel_nostr::testing::TestRelay::start_authenticating().await;
    let person = clawgate_channel_nostr::testing::Person::join(&relay).await;
    let keys = Keys::generate();
    let state = tempfile::tempdir().unwrap();
    let plugin = build(
        &keys,
        settings(&[relay.url()], serde_json::json!({})),
        state.path(),
    )
    .await;
    let sink = Arc::new(Sink::default());
    let feed = run(&plugin, sink.clone());
    let receiver = plugin.receiver.clone().unwrap();
    person.send_dm(&keys.public_key(), "behind auth").await;
    until("the DM read after AUTH", || {
        sink.texts(receiver.as_ref()) == ["behind auth"]
    })
    .await;
    let message = ChannelMessage::outbound(
        "a1",
        "nostr",
        MessageTarget::direct(person.id()),
        "answer behind auth",
    );
    let adapter = plugin.sender.clone();
    let batch = adapter
        .render()
        .unwrap()
        .render(&message, adapter.capabilities(), "auth-1")
        .unwrap();
    adapter
        .send_unit(&SendContext::new(message, "auth-1"), &batch.units[0])
        .await
        .unwrap();
    assert_eq!(
        person.texts_from(&relay, &keys.public_key()).await,
        vec!["answer behind auth"]
    );
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
}

/// Waits until the checkpoint `state` holds meets `done`; returns it.
async fn checkpoint_until(
    state: &clawgate_channel_sdk::ChannelState,
    what: &str,
    done: impl Fn(&Versioned<u64>) -> bool,
) -> Versioned<u64> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(kept) = state.value::<u64>("checkpoint").await.unwrap()
            && done(&kept)
        {
            return kept;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_superseded_by_another_gateway_keeps_its_checkpoint_and_a_new_run_takes_it_over() {
    let peer = Peer::start().await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let state = tempfile::tempdir().unwrap();
    let plugin = build(
        &peer.keys,
        settings(&[peer.relay.url()], serde_json::json!({})),
        state.path(),
    )
    .await;
    let sink = Arc::new(Sink::default());
    let feed = run(&plugin, sink.clone());
    let us = peer.keys.public_key();
    peer.person.send_dm(&us, "first").await;
    until("the first DM", || {
        sink.texts(receiver.as_ref()) == ["first"]
    })
    .await;
    let other_gateway = clawgate_conformance::channel_state(state.path(), "nostr", "default");
    let mine = checkpoint_until(&other_gateway, "the feed's checkpoint", |_| true).await;
    // Another gateway took the account over and wrote its checkpoint, held back by an event it
    // has not recorded yet.
    let theirs = mine.value - 600;
    let version = other_gateway.put("checkpoint", &theirs).await.unwrap();
    assert!(version > mine.version);
    // This feed has not stopped yet: a second later (the checkpoint counts seconds) it takes
    // another DM, acks it, then stops (its last write).
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    peer.person.send_dm(&us, "second").await;
    until("the second DM", || {
        sink.texts(receiver.as_ref()) == ["first", "second"]
    })
    .await;
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
    assert_eq!(
        other_gateway.value::<u64>("checkpoint").await.unwrap(),
        Some(Versioned {
            value: theirs,
            version
        }),
        "the other gateway's checkpoint is not overwritten"
    );
    // This gateway holds the account again later: its feed reads from the stored checkpoint and
    // moves it on once caught up.
    let sink = Arc::new(Sink::default());
    let feed = run(&plugin, sink.clone());
    checkpoint_until(&other_gateway, "the new run's checkpoint", |kept| {
        kept.version > version && kept.value > theirs
    })
    .await;
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_checkpoints_apart() {
    let peer = Peer::start().await;
    let store = tempfile::tempdir().unwrap();
    let setup = |account: &str| {
        clawgate_conformance::channel_setup(
            0,
            "nostr",
            account,
            settings(&[peer.relay.url()], serde_json::json!({})),
            store.path(),
        )
    };
    let (first_keys, second_keys) = (Keys::generate(), Keys::generate());
    let first_state = clawgate_conformance::channel_state(store.path(), "nostr", "default");
    let second_state = clawgate_conformance::channel_state(store.path(), "nostr", "second");
    // The first account stopped ten days ago; a message to each account waits on the relay
    // since then.
    let ten_days_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 10 * 24 * 3600;
    let first_version = first_state.put("checkpoint", &ten_days_ago).await.unwrap();
    for (keys, text, unit) in [
        (&first_keys, "to the first, while it was down", "old-1"),
        (&second_keys, "to the second, before it ever ran", "old-2"),
    ] {
        let wrap = dm::build(
            DmProtocol::Nip17,
            &peer.person.keys,
            &keys.public_key(),
            text,
            ten_days_ago,
            unit,
        )
        .unwrap();
        peer.person.publish(&wrap).await;
    }

    // The second account's first start reads from now, not from the first one's checkpoint.
    let second = build_from(&second_keys, &setup("second")).await;
    let sink = Arc::new(Sink::default());
    let feed = run(&second, sink.clone());
    checkpoint_until(&second_state, "the second account's checkpoint", |_| true).await;
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
    let second_kept = second_state
        .value::<u64>("checkpoint")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        sink.texts(second.receiver.clone().unwrap().as_ref()),
        Vec::<String>::new(),
        "the second account does not read back from the first account's checkpoint"
    );
    assert!(second_kept.value > ten_days_ago);
    assert_eq!(
        first_state.value::<u64>("checkpoint").await.unwrap(),
        Some(Versioned {
            value: ten_days_ago,
            version: first_version
        }),
        "the second account's writes leave the first account's checkpoint alone"
    );

    // The first account resumes from its own checkpoint.
    let first = build_from(&first_keys, &setup("default")).await;
    let receiver = first.receiver.clone().unwrap();
    let sink = Arc::new(Sink::default());
    let feed = run(&first, sink.clone());
    until(
        "the DM that waited since the first account's checkpoint",
        || sink.texts(receiver.as_ref()) == ["to the first, while it was down"],
    )
    .await;
    checkpoint_until(&first_state, "the first account's new checkpoint", |kept| {
        kept.version > first_version
    })
    .await;
    sink.stop.send_replace(true);
    feed.await.unwrap().unwrap();
    assert_eq!(
        second_state.value::<u64>("checkpoint").await.unwrap(),
        Some(second_kept),
        "the first account's writes leave the second account's checkpoint alone"
    );
}
