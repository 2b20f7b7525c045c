//! The channel's state in the gateway's store: a thread one gateway replied in is answered by
//! another on the same store, two accounts on one store keep their Eyre channels apart, and
//! the files an earlier release kept are imported once.

use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_tlon::simulator::ShipConfig;
use clawgate_channel_tlon::{CHANNEL_FILE, CHANNEL_VALUE, ChannelRecord, THREADS_FILE};
use serde_json::json;

use crate::inbound::{Recorder, run, subscribed};
use crate::peer::{NEST, Peer, build_as, config};
use crate::send::parent_post;

/// Whether `recorder` was handed an event carrying `text`.
fn saw(recorder: &Recorder, text: &str) -> bool {
    recorder
        .got
        .lock()
        .unwrap()
        .iter()
        .any(|raw| raw.to_string().contains(text))
}

#[tokio::test]
async fn a_thread_one_gateway_replied_in_is_answered_by_another_without_a_mention() {
    let peer = Peer::start().await;
    // Gateway B, on the same store, started (and reading the ship) before A replied.
    let b = peer.rebuilt().await;
    let (recorder, task) = run(&b, true);
    subscribed(&peer, 2).await;
    let parent = parent_post(&peer);
    let ctx = SendContext::new(
        ChannelMessage::outbound("t-1", "tlon", peer.thread(&parent), ""),
        "t-1",
    );
    peer.plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "an answer"))
        .await
        .unwrap();
    peer.ship
        .reply_from(NEST, &parent, "~nec", "and then?", false);
    peer.until("B was handed the follow-up", || saw(&recorder, "and then?"))
        .await;
    let receiver = b.receiver.clone().unwrap();
    assert_eq!(
        recorder.texts(receiver.as_ref()),
        ["~zod a question for the thread", "and then?"],
        "the mention, then the follow-up without one"
    );
    task.abort();
}

#[tokio::test]
async fn two_accounts_on_one_store_keep_their_eyre_channels_apart() {
    // An earlier release kept every Tlon account's Eyre channel in one eyre-channel.json: a
    // second account took the first one's channel as its own, found it missing on its ship and
    // dropped the record, and the first account lost what waited in its channel.
    let a = Peer::start().await;
    let other = Peer::with(
        ShipConfig {
            our: "~nec".into(),
            ..config()
        },
        json!({}),
    )
    .await;
    let b = build_as(
        &other.ship,
        &other.settings,
        a.state.path(),
        "second",
        LegacyFiles::none(),
    )
    .await;
    let (_, task) = run(&a.plugin, true);
    subscribed(&a, 2).await;
    task.abort();
    // A DM waits in A's channel while A is down; B starts on the same store.
    a.ship.dm_from("~bus", "while down");
    let (_, task) = run(&b, true);
    subscribed(&other, 2).await;
    task.abort();
    // A restarted reads its own channel: the DM comes, and no other channel is opened.
    let (again, task) = run(&a.rebuilt().await, true);
    a.until("the DM that waited", || saw(&again, "while down"))
        .await;
    assert_eq!(a.ship.subscriptions().len(), 2, "the same channel");
    task.abort();
}

#[tokio::test]
async fn the_files_of_an_earlier_release_are_imported_once() {
    let peer = Peer::start().await;
    // An earlier release's gateway opened a channel on the ship and replied in a thread; its
    // state directory held both files.
    let (_, task) = run(&peer.plugin, true);
    subscribed(&peer, 2).await;
    task.abort();
    let record = clawgate_conformance::channel_state(peer.state.path(), "tlon", "default")
        .value::<ChannelRecord>(CHANNEL_VALUE)
        .await
        .unwrap()
        .unwrap()
        .value;
    let parent = parent_post(&peer);
    let old = tempfile::tempdir().unwrap();
    let files = [
        (CHANNEL_FILE, serde_json::to_string(&record).unwrap()),
        (THREADS_FILE, format!("{NEST} {parent}\n")),
    ];
    for (name, content) in &files {
        std::fs::write(old.path().join(name), content).unwrap();
    }
    peer.ship.dm_from("~bus", "while upgrading");
    // The upgraded gateway, on a store that holds nothing yet.
    let store = tempfile::tempdir().unwrap();
    let upgraded = build_as(
        &peer.ship,
        &peer.settings,
        store.path(),
        "default",
        LegacyFiles::in_dir(old.path()),
    )
    .await;
    for (name, _) in &files {
        assert!(!old.path().join(name).exists(), "{name}");
        assert!(
            old.path().join(format!("{name}.imported")).is_file(),
            "{name}"
        );
    }
    let (recorder, task) = run(&upgraded, true);
    peer.until("the DM that waited in the old channel", || {
        saw(&recorder, "while upgrading")
    })
    .await;
    assert_eq!(peer.ship.subscriptions().len(), 2, "the same channel");
    peer.ship
        .reply_from(NEST, &parent, "~nec", "and then?", false);
    let receiver = upgraded.receiver.clone().unwrap();
    receiver
        .normalize(&peer.ship.last_event().unwrap())
        .expect("answered in the thread the old gateway replied in");
    task.abort();
    // A crash before the renames leaves the files in place: imported again, adding nothing.
    let state = clawgate_conformance::channel_state(store.path(), "tlon", "default");
    let version = |state: clawgate_channel_sdk::ChannelState| async move {
        state
            .value::<ChannelRecord>(CHANNEL_VALUE)
            .await
            .unwrap()
            .unwrap()
            .version
    };
    let before = version(state.clone()).await;
    for (name, content) in &files {
        std::fs::write(old.path().join(name), content).unwrap();
    }
    build_as(
        &peer.ship,
        &peer.settings,
        store.path(),
        "default",
        LegacyFiles::in_dir(old.path()),
    )
    .await;
    assert_eq!(version(state.clone()).await, before);
    let threads = state
        .book("participated-threads")
        .since::<serde_json::Value>(0)
        .await
        .unwrap();
    assert_eq!(threads.len(), 1);
}
