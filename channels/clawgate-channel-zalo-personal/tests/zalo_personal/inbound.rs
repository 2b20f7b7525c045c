//! Inbound through the engine: a message pushed twice is one record and one reply; the
//! account's own messages are never answered; a frame that does not decrypt under the
//! connection's cipher key (forged, corrupted) is dropped before it is parsed, and nothing is
//! recorded; group messages only from the groups listed.

use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use serde_json::json;

use crate::peer::{GROUP, Peer, user_for};

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_message_pushed_twice_is_one_event_with_one_id() {
    let peer = Peer::start().await;
    let person = user_for("twice");
    let msg_id = peer.sim.person_writes(&person, "once please");
    until("read", || peer.seen(&msg_id)).await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let raw = peer.sim.raw_event(&msg_id).unwrap();
    let first = receiver.normalize(&raw).unwrap();
    assert_eq!(first.event_id, msg_id, "the event id is Zalo's msgId");
    assert!(peer.sim.redeliver() >= 1);
    // The redelivered frame decodes to the same event id (the engine's durable record
    // dedupes it; the conformance case pushed_redelivery_is_deduplicated runs that end to end).
    assert_eq!(receiver.normalize(&raw).unwrap().event_id, first.event_id);
}

#[tokio::test]
async fn our_own_messages_and_forged_frames_are_never_handed_over() {
    let peer = Peer::start().await;
    let person = user_for("own");
    // Our own send comes back on the listener (the echo); it is not a turn.
    let adapter = peer.plugin.sender.clone();
    let message = ChannelMessage::outbound(
        "own-1",
        "zalo-personal",
        MessageTarget::direct(&person),
        "our words",
    );
    let part = adapter
        .send_unit(
            &SendContext::new(message, "own-1"),
            &RenderedMessageUnit::text(0, "our words"),
        )
        .await
        .unwrap();
    let forged = peer.sim.push_forged(&person, "forged").unwrap();
    peer.read_up().await;
    assert!(
        !peer.seen(&part.platform_message_id),
        "our own message was handed over"
    );
    assert!(
        !peer.seen(&forged),
        "a frame under another key was handed over"
    );
    // Its raw form, were it handed over, is ignored by the receiver too.
    let receiver = peer.plugin.receiver.clone().unwrap();
    let own = peer.sim.raw_event(&part.platform_message_id).unwrap();
    assert_eq!(own["message"]["uidFrom"], "0");
    assert!(matches!(
        receiver.normalize(&own),
        Err(ReceiveError::Ignored { .. })
    ));
}

#[tokio::test]
async fn group_messages_are_answered_only_in_the_groups_listed() {
    let peer = Peer::start().await;
    let receiver = peer.plugin.receiver.clone().unwrap();
    let listed = peer
        .sim
        .member_writes(GROUP, &user_for("member"), "hi group");
    let other = peer
        .sim
        .member_writes("5000000000000000999", &user_for("member"), "elsewhere");
    until("both read", || peer.seen(&listed) && peer.seen(&other)).await;
    let got = receiver
        .normalize(&peer.sim.raw_event(&listed).unwrap())
        .unwrap();
    assert_eq!(got.message.target, MessageTarget::group(GROUP));
    assert_eq!(got.message.sender.as_ref().unwrap().id, user_for("member"));
    assert!(matches!(
        receiver.normalize(&peer.sim.raw_event(&other).unwrap()),
        Err(ReceiveError::Ignored { .. })
    ));
    assert!(matches!(
        receiver.normalize(&json!({ "thread": "group", "message": { "msgId": "1" } })),
        Err(ReceiveError::Malformed { .. })
    ));
}

#[tokio::test]
async fn messages_written_while_no_listener_is_connected_are_missed() {
    // Zalo has no catch-up: the simulator pushes nothing later, and says so in its record.
    let peer = Peer::start().await;
    peer.sim.drop_sockets();
    // Written before the listener is back.
    let missed = peer.sim.person_writes(&user_for("gap"), "into the gap");
    let record = peer.sim.inbound();
    let entry = record.iter().find(|i| i.message.msg_id == missed).unwrap();
    // drop_sockets forgets the connection at once, before the channel can reconnect.
    assert_eq!(entry.pushed_to, None, "pushed to nobody");
    assert!(peer.sim.opened(2, Duration::from_secs(20)).await);
    peer.read_up().await;
    assert!(!peer.seen(&missed), "no catch-up after a reconnect");
}
