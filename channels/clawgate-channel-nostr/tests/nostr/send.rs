//! Sends the contract does not name: the relay's `duplicate:` answer, lookups by id after a
//! lost answer, a relay down before the write, and the rule over two relays.

use std::time::Duration;

use clawgate_channel_nostr::client::{RelayOutcome, publish_one};
use clawgate_channel_nostr::testing::TestRelay;
use clawgate_channel_sdk::prelude::*;
use nostr_sdk::pool::RelayNotification;
use nostr_sdk::{Client, Event, Filter, JsonUtil, Kind, RelayMessage};
use serde_json::json;

use crate::peer::{Peer, build, link, settings};

fn message(peer: &Peer, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "nostr", MessageTarget::direct(peer.person.id()), text)
}

/// The unit the engine would store for `message`: rendered, event inside.
fn rendered(
    adapter: &dyn ChannelMessageAdapter,
    message: &ChannelMessage,
    key: &str,
) -> RenderedMessageUnit {
    let batch = adapter
        .render()
        .expect("the channel renders its own events")
        .render(message, adapter.capabilities(), key)
        .unwrap();
    assert_eq!(batch.units.len(), 1);
    batch.units[0].clone()
}

/// Waits until the channel has seen `relay` go down (a write racing the drop is an unknown
/// outcome, which is another test's).
async fn until_down(plugin: &ChannelPlugin, relay: &TestRelay) {
    let url = relay.url();
    tokio::time::timeout(Duration::from_secs(20), async {
        while link(plugin)
            .connected()
            .await
            .iter()
            .any(|c| c.trim_end_matches('/') == url)
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the channel sees the relay go down");
}

async fn wraps_for(peer: &Peer, relay: &TestRelay) -> usize {
    relay
        .stored(
            Filter::new()
                .kind(Kind::GiftWrap)
                .pubkey(peer.person.keys.public_key()),
        )
        .await
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_event_is_published_again_and_the_relays_duplicate_answer_is_success() {
    let peer = Peer::start().await;
    let adapter = peer.sender();
    // With its own time: rendering it again later (below) must give the same event. Without
    // one the renderer takes the clock, and only the stored event is the same.
    let msg = message(&peer, "m1", "exactly once").with_timestamp(1_796_000_000_000);
    let unit = rendered(adapter.as_ref(), &msg, "key-1");
    let stored = Event::from_json(unit.payload["event"].to_string()).unwrap();
    let ctx = SendContext::new(msg.clone(), "key-1");
    let first = adapter.send_unit(&ctx, &unit).await.unwrap();
    assert_eq!(
        first.platform_message_id,
        stored.id.to_hex(),
        "the receipt is the stored event's id"
    );

    // The relay's own answer to that event once more, seen on the wire.
    let client = Client::default();
    client.add_relay(peer.relay.direct_url()).await.unwrap();
    client.connect().await;
    client.wait_for_connection(Duration::from_secs(10)).await;
    let relay = client.relay(peer.relay.direct_url()).await.unwrap();
    let mut notes = relay.notifications();
    let outcome = publish_one(
        &relay,
        &stored,
        Duration::from_secs(5),
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(outcome, RelayOutcome::Accepted);
    let mut answer = None;
    while let Ok(note) = notes.try_recv() {
        if let RelayNotification::Message {
            message:
                RelayMessage::Ok {
                    event_id,
                    status,
                    message,
                },
        } = note
            && event_id == stored.id
        {
            answer = Some((status, message.into_owned()));
        }
    }
    let (status, text) = answer.expect("the relay answered OK");
    assert!(status && text.starts_with("duplicate:"), "{status} {text}");

    // The adapter's retry, and a render of the same message again (a recovery), both land
    // as that one event.
    let again = adapter.send_unit(&ctx, &unit).await.unwrap();
    assert_eq!(again.platform_message_id, first.platform_message_id);
    let rerendered = rendered(adapter.as_ref(), &msg, "key-1");
    // A unit without its stored event derives the same one from the key and the time.
    let stripped = RenderedMessageUnit::new(
        0,
        MessagePartKind::Text,
        json!({ "text": "exactly once", "created_at": unit.payload["created_at"] }),
    );
    for other in [rerendered, stripped] {
        let part = adapter.send_unit(&ctx, &other).await.unwrap();
        assert_eq!(
            part.platform_message_id, first.platform_message_id,
            "same unit, same event"
        );
    }
    assert_eq!(
        wraps_for(&peer, &peer.relay).await,
        1,
        "one gift wrap on the relay"
    );
    assert_eq!(peer.said().await, vec!["exactly once"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_unknown_and_settled_by_looking_the_id_up() {
    let peer = Peer::start().await;
    let adapter = peer.sender();
    let msg = message(&peer, "m2", "answer lost");
    let unit = rendered(adapter.as_ref(), &msg, "key-2");
    let ctx = SendContext::new(msg.clone(), "key-2");
    peer.relay.lose_answer(0);
    let error = adapter.send_unit(&ctx, &unit).await.unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Unknown, SideEffect::Possible),
        "{error:?}"
    );
    let id = Event::from_json(unit.payload["event"].to_string())
        .unwrap()
        .id;
    assert!(
        peer.relay.has(&id).await,
        "the relay stored it; only the answer was lost"
    );
    assert!(
        link(&peer.plugin)
            .wait_connected(Duration::from_secs(20))
            .await
    );
    match adapter.reconcile_unknown_send(&ctx, &unit).await.unwrap() {
        Reconciliation::Sent(part) => assert_eq!(part.platform_message_id, id.to_hex()),
        other => panic!("found on the relay, got {other:?}"),
    }
    let never_msg = message(&peer, "m3", "never sent");
    let never = rendered(adapter.as_ref(), &never_msg, "key-3");
    let never_ctx = SendContext::new(never_msg, "key-3");
    assert_eq!(
        adapter
            .reconcile_unknown_send(&never_ctx, &never)
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "EOSE without it: not sent"
    );
    peer.relay.set_down(true);
    assert_eq!(
        adapter.reconcile_unknown_send(&ctx, &unit).await.unwrap(),
        Reconciliation::Unresolved,
        "a relay that cannot answer settles nothing"
    );
    peer.relay.set_down(false);
    assert_eq!(peer.said().await, vec!["answer lost"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_down_before_the_write_is_not_sent_and_the_retry_lands_once() {
    let peer = Peer::with(json!({ "connect_wait_ms": 300 })).await;
    let adapter = peer.sender();
    let msg = message(&peer, "m4", "after the outage");
    let unit = rendered(adapter.as_ref(), &msg, "key-4");
    let ctx = SendContext::new(msg, "key-4");
    peer.relay.set_down(true);
    until_down(&peer.plugin, &peer.relay).await;
    let error = adapter.send_unit(&ctx, &unit).await.unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Transient, SideEffect::None),
        "{error:?}"
    );
    assert_eq!(wraps_for(&peer, &peer.relay).await, 0);
    peer.relay.set_down(false);
    assert!(
        link(&peer.plugin)
            .wait_connected(Duration::from_secs(20))
            .await
    );
    adapter.send_unit(&ctx, &unit).await.unwrap();
    assert_eq!(peer.said().await, vec!["after the outage"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_classified_from_the_relays_prefix_and_nothing_is_stored() {
    let peer = Peer::start().await;
    let adapter = peer.sender();
    let msg = message(&peer, "m5", "refused");
    let unit = rendered(adapter.as_ref(), &msg, "key-5");
    let ctx = SendContext::new(msg, "key-5");
    peer.relay.refuse(1, 0, "not on the list");
    let error = adapter.send_unit(&ctx, &unit).await.unwrap_err();
    assert_eq!(
        (
            error.kind,
            error.side_effect,
            error.platform_code.as_deref()
        ),
        (
            DeliveryFailureKind::Permission,
            SideEffect::None,
            Some("blocked")
        ),
        "{error:?}"
    );
    assert!(
        error.message.contains("not on the list"),
        "{}",
        error.message
    );
    assert_eq!(wraps_for(&peer, &peer.relay).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_relays_the_rule_decides_sent_and_a_retry_completes_without_a_duplicate() {
    let peer = Peer::start().await;
    let second = TestRelay::start().await;
    let relays = [peer.relay.url(), second.url()];
    let state = tempfile::tempdir().unwrap();
    for (rule, expect_sent) in [("any", true), ("all", false)] {
        let plugin = build(
            &peer.keys,
            settings(
                &relays,
                json!({ "sent_when": rule, "connect_wait_ms": 300 }),
            ),
            state.path(),
        )
        .await;
        let adapter = plugin.sender.clone();
        let key = format!("two-{rule}");
        let msg = message(&peer, &key, &format!("rule {rule}"));
        let unit = rendered(adapter.as_ref(), &msg, &key);
        let ctx = SendContext::new(msg, key.clone());
        let id = Event::from_json(unit.payload["event"].to_string())
            .unwrap()
            .id;
        peer.relay.set_down(true);
        until_down(&plugin, &peer.relay).await;
        let sent = adapter.send_unit(&ctx, &unit).await;
        assert_eq!(sent.is_ok(), expect_sent, "{rule}: {sent:?}");
        if let Err(error) = &sent {
            assert_eq!(
                (error.kind, error.side_effect),
                (DeliveryFailureKind::Transient, SideEffect::None),
                "{error:?}"
            );
        }
        assert!(second.has(&id).await && !peer.relay.has(&id).await);
        peer.relay.set_down(false);
        assert!(link(&plugin).wait_connected(Duration::from_secs(20)).await);
        // The retry publishes the same event: the second relay answers `duplicate:`.
        adapter.send_unit(&ctx, &unit).await.unwrap();
        assert!(second.has(&id).await && peer.relay.has(&id).await);
    }
    assert_eq!(
        wraps_for(&peer, &second).await,
        2,
        "one wrap per message on each relay"
    );
    assert_eq!(wraps_for(&peer, &peer.relay).await, 2);

    // A quorum of two with one answer lost: unknown, then found on both.
    let plugin = build(
        &peer.keys,
        settings(&relays, json!({ "sent_when": "quorum", "quorum": 2 })),
        state.path(),
    )
    .await;
    let adapter = plugin.sender.clone();
    let msg = message(&peer, "quorum", "quorum of two");
    let unit = rendered(adapter.as_ref(), &msg, "quorum");
    let ctx = SendContext::new(msg, "quorum");
    second.lose_answer(0);
    let error = adapter.send_unit(&ctx, &unit).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    assert!(link(&plugin).wait_connected(Duration::from_secs(20)).await);
    assert!(matches!(
        adapter.reconcile_unknown_send(&ctx, &unit).await.unwrap(),
        Reconciliation::Sent(_)
    ));
    let mut texts = peer
        .person
        .texts_from(&second, &peer.keys.public_key())
        .await;
    texts.sort();
    assert_eq!(texts, vec!["quorum of two", "rule all", "rule any"]);
}
