//! The live path through the engine: C2C stream previews, the accumulator timeout and the
//! fallback final (the seed's QQ Bot line: "the live adapter owns C2C streaming, accumulator
//! timeout and fallback final"; its test list: "QQ Bot accumulator timeout fallback"), and
//! groups, which get no stream.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_qq::CODE_STREAM_CLOSED;
use clawgate_channel_qq::simulator::{Fault, FaultKind, SimMessage};
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{LiveOptions, Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::ManualClock;

use crate::peer::{Peer, chat};

fn engine(peer: &Peer) -> (tempfile::TempDir, Messenger, Arc<ManualClock>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let clock = Arc::new(ManualClock::new(1_000));
    let messenger = Messenger::new(
        store,
        vec![peer.plugin.sender.clone()],
        RetryPolicy::default(),
        clock.clone(),
        "qq-live",
    );
    (dir, messenger, clock)
}

fn reply(target: &MessageTarget, text: &str) -> ChannelMessage {
    ChannelMessage::outbound("r", "qq", target.clone(), text)
}

fn options(msg_id: &str) -> SendOptions {
    SendOptions {
        idempotency_key: Some(format!("qq:reply:{msg_id}:0")),
        ..SendOptions::default()
    }
}

/// Streams `updates` into a reply, then finalizes it with `final_text`.
async fn stream(
    peer: &Peer,
    target: &MessageTarget,
    msg_id: &str,
    updates: &[&str],
    stall_after: Option<usize>,
    final_text: &str,
) -> SendOutcome {
    let (_dir, messenger, clock) = engine(peer);
    let mut live = messenger
        .begin_live(reply(target, ""), options(msg_id), LiveOptions::default())
        .await
        .unwrap();
    for (n, text) in updates.iter().enumerate() {
        if stall_after == Some(n) {
            // The agent goes quiet longer than QQ keeps a stream open.
            peer.sim.age_streams(Duration::from_secs(3_600));
        }
        live.update(text).await.unwrap();
        clock.advance(1_000);
    }
    live.finalize(reply(target, final_text))
        .await
        .unwrap()
        .outcome
}

fn visible(messages: &[SimMessage]) -> Vec<&SimMessage> {
    messages.iter().filter(|m| !m.recalled).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qq_bot_accumulator_timeout_fallback_sends_the_accumulated_text_as_one_plain_final() {
    let peer = Peer::start().await;
    let (target, msg_id) = peer.person_with_id("accumulator");
    let outcome = stream(
        &peer,
        &target,
        &msg_id,
        &[
            "Hello",
            "Hello, wor",
            "Hello, world, and after a long pause",
        ],
        Some(2),
        "Hello, world, and after a long pause: done.",
    )
    .await;
    assert!(matches!(outcome, SendOutcome::Sent { .. }), "{outcome:?}");
    let messages = peer.sim.messages(&chat(&target));
    // The stream showed "Hello" then "Hello, wor"; the chunk after the stall was refused
    // (QQ had closed the stream), and the stream was recalled.
    let streams: Vec<_> = messages.iter().filter(|m| m.stream.is_some()).collect();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].text, "Hello, wor");
    assert!(streams[0].recalled);
    let closed = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.code == CODE_STREAM_CLOSED)
        .count();
    assert_eq!(closed, 1);
    // One final, the whole accumulated text, a plain passive reply to the person's message.
    let shown = visible(&messages);
    assert_eq!(shown.len(), 1, "{messages:?}");
    assert_eq!(shown[0].text, "Hello, world, and after a long pause: done.");
    assert_eq!(shown[0].stream, None);
    assert_eq!(shown[0].reply_to.as_deref(), Some(msg_id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_c2c_stream_previews_by_appending_chunks_and_the_final_lands_once() {
    let peer = Peer::start().await;
    let (target, msg_id) = peer.person_with_id("stream");
    let outcome = stream(
        &peer,
        &target,
        &msg_id,
        &["一", "一二", "一二三", "rewritten"],
        None,
        "rewritten and final",
    )
    .await;
    assert!(matches!(outcome, SendOutcome::Sent { .. }), "{outcome:?}");
    let messages = peer.sim.messages(&chat(&target));
    let chunks: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.body.get("stream").is_some())
        .map(|c| {
            (
                c.body["content"].clone(),
                c.body["stream"]["index"].clone(),
                c.body["stream"]["reset"].clone(),
            )
        })
        .collect();
    assert_eq!(
        chunks,
        vec![
            ("一".into(), 1.into(), serde_json::Value::Null),
            ("二".into(), 2.into(), false.into()),
            ("三".into(), 3.into(), false.into()),
            ("rewritten".into(), 1.into(), true.into()),
        ],
        "appended deltas, a reset when the text changed"
    );
    let streams: Vec<_> = messages.iter().filter(|m| m.stream.is_some()).collect();
    assert_eq!(streams.len(), 1);
    assert!(streams[0].recalled, "QQ cannot edit: the preview goes");
    let shown = visible(&messages);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].text, "rewritten and final");
    // Two of the message's five replies: the stream and the final.
    assert_eq!(messages.iter().filter(|m| m.reply_to.is_some()).count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_and_a_group_reply_each_get_one_plain_final_and_no_preview() {
    let peer = Peer::start().await;
    // Streaming refused (a bot without the stream permission): no preview, the final plain.
    let (target, msg_id) = peer.person_with_id("refused");
    peer.sim.inject(
        Fault::new(FaultKind::Refuse(
            400,
            40_034_001,
            "stream not allowed".into(),
        ))
        .streams()
        .times(10),
    );
    let outcome = stream(
        &peer,
        &target,
        &msg_id,
        &["partial", "partial more"],
        None,
        "final",
    )
    .await;
    assert!(matches!(outcome, SendOutcome::Sent { .. }), "{outcome:?}");
    let messages = peer.sim.messages(&chat(&target));
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert_eq!(
        (messages[0].text.as_str(), messages[0].stream),
        ("final", None)
    );
    // A group: QQ streams C2C only.
    let msg_id = peer.sim.member_writes("G7", "M7", "hi bot");
    let group = MessageTarget::group("G7");
    assert!(!peer.plugin.sender.previews(&reply(&group, "")));
    let outcome = stream(
        &peer,
        &group,
        &msg_id,
        &["par", "partial"],
        None,
        "group final",
    )
    .await;
    assert!(matches!(outcome, SendOutcome::Sent { .. }), "{outcome:?}");
    let messages = peer.sim.messages(&chat(&group));
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].text, "group final");
    assert_eq!(messages[0].reply_to.as_deref(), Some(msg_id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapter_stops_a_stream_idle_past_its_own_accumulator_timeout_before_qq_does() {
    let peer = Peer::with(
        crate::peer::quick(),
        serde_json::json!({ "stream_idle_timeout_ms": 1 }),
    )
    .await;
    let (target, msg_id) = peer.person_with_id("own-timeout");
    let (_dir, messenger, clock) = engine(&peer);
    let mut live = messenger
        .begin_live(reply(&target, ""), options(&msg_id), LiveOptions::default())
        .await
        .unwrap();
    live.update("first words").await.unwrap();
    clock.advance(1_000);
    // Not waiting for anything: letting the 1 ms accumulator timeout pass on the monotonic
    // clock the adapter reads.
    std::thread::sleep(Duration::from_millis(20));
    live.update("first words, then more").await.unwrap();
    let outcome = live
        .finalize(reply(&target, "first words, then more, all of it"))
        .await
        .unwrap()
        .outcome;
    assert!(matches!(outcome, SendOutcome::Sent { .. }), "{outcome:?}");
    let chunks = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.body.get("stream").is_some())
        .count();
    assert_eq!(
        chunks, 1,
        "the idle stream was not continued: only its start went out"
    );
    let messages = peer.sim.messages(&chat(&target));
    let shown = visible(&messages);
    assert_eq!(shown.len(), 1, "{messages:?}");
    assert_eq!(shown[0].text, "first words, then more, all of it");
    assert!(messages.iter().any(|m| m.stream.is_some() && m.recalled));
}
