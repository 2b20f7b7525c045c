//! Sends as the server answers them: threads by `root_id`, the props key and pending_post_id on
//! every post, refusals as failure classes, 429 honoured, and the two settlements of a lost
//! answer: inside the pending_post_id window by the same create, beyond it (or after a restart)
//! by the channel's posts matched on the props key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_channel_mattermost::simulator::{Fault, FaultKind, Route, SimulatorConfig};
use clawgate_channel_mattermost::{KEY_PROP, pending_post_id_of};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::ChannelScope;
use clawgate_messages::{Messenger, RetryPolicy};
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{Peer, build, build_from, settings_for};

pub(crate) fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "mattermost", target.clone(), ""),
        key,
    )
}

pub(crate) fn text(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

/// An engine over the peer's channel, on a fresh store and a driven clock.
pub(crate) fn engine(peer: &Peer) -> (tempfile::TempDir, Messenger, Arc<ManualClock>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let clock = Arc::new(ManualClock::new(1_000));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(
        store,
        vec![peer.plugin.sender.clone()],
        policy,
        clock.clone(),
        "mattermost-tests",
    );
    (dir, messenger, clock)
}

#[tokio::test]
async fn a_post_carries_its_key_and_pending_post_id_and_threads_under_the_root() {
    let peer = Peer::start().await;
    let channel = peer.channel("threads");
    let root = peer
        .sim
        .person_writes(&channel, &peer.person, "question", None);
    let reply = peer
        .sim
        .person_writes(&channel, &peer.person, "more", Some(&root.id));
    // The receiver gives an answer to the reply the root as its thread, never the reply's id.
    let inbound = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(&peer.sim.posted_event(&reply))
        .unwrap();
    let target = inbound.message.target.clone();
    assert_eq!(target.thread_id.as_deref(), Some(root.id.as_str()));
    let context = ctx(&target, "answer-1");
    let part = peer
        .plugin
        .sender
        .send_unit(&context, &text("answer"))
        .await
        .unwrap();
    let post = peer.sim.post(&part.platform_message_id).unwrap();
    assert_eq!(post.root_id, root.id);
    assert_eq!(part.thread_id.as_deref(), Some(root.id.as_str()));
    let key = context.unit_key(&text("answer"));
    assert_eq!(post.props[KEY_PROP], json!(key));
    assert_eq!(
        post.props["from_bot"], "true",
        "the server marks a bot's post"
    );
    assert_eq!(post.pending_post_id, pending_post_id_of(&key));
}

#[tokio::test]
async fn refusals_and_429_are_classified_and_nothing_lands() {
    let peer = Peer::start().await;
    let channel = peer.channel("refusals");
    let target = MessageTarget::group(&channel);
    let elsewhere = MessageTarget::group(peer.sim.add_channel("elsewhere", &[&peer.person]));
    let sender = peer.plugin.sender.clone();
    let refused = sender
        .send_unit(&ctx(&elsewhere, "not-member"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(refused.kind, DeliveryFailureKind::Permission, "{refused:?}");
    assert_eq!(refused.side_effect, SideEffect::None);
    peer.sim.inject(Fault::on(
        Route::CreatePost,
        FaultKind::RateLimited { reset_s: 7 },
    ));
    let limited = sender
        .send_unit(&ctx(&target, "limited"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(limited.kind, DeliveryFailureKind::RateLimit);
    assert_eq!(
        limited.retry_after_ms,
        Some(7_000),
        "X-Ratelimit-Reset is honoured"
    );
    // The reset holds the next call back rather than spending it.
    let held = sender
        .send_unit(&ctx(&target, "held"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(held.kind, DeliveryFailureKind::RateLimit);
    assert!(held.retry_after_ms.is_some_and(|ms| ms <= 7_000));
    let creates = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST")
        .count();
    assert_eq!(creates, 2, "the held send never reached the server");
    assert!(peer.texts(&channel).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_window_a_lost_send_is_settled_by_the_same_pending_post_id() {
    // The create is still in flight at the server when the client gives up on it.
    let peer = Peer::with(
        SimulatorConfig::default(),
        json!({ "require_mention": false, "request_timeout_ms": 300 }),
    )
    .await;
    let channel = peer.channel("window");
    let target = MessageTarget::group(&channel);
    let sender = peer.plugin.sender.clone();
    peer.sim
        .inject(Fault::on(Route::CreatePost, FaultKind::Hold));
    let context = ctx(&target, "window-1");
    let lost = sender.send_unit(&context, &text("once")).await.unwrap_err();
    assert_eq!(lost.side_effect, SideEffect::Possible, "{lost:?}");
    assert_eq!(peer.sim.in_flight(), 1);
    // Not in the channel yet, and inside the window: a resend is safe.
    assert_eq!(
        sender
            .reconcile_unknown_send(&context, &text("once"))
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    // While the first is in flight the server refuses the twin (500 pending); the adapter
    // reports that as unknown again rather than a refusal.
    let twin = sender.send_unit(&context, &text("once")).await.unwrap_err();
    assert_eq!(twin.side_effect, SideEffect::Possible, "{twin:?}");
    peer.sim.release();
    let deadline = Instant::now() + Duration::from_secs(5);
    while peer.sim.in_flight() > 0 {
        assert!(Instant::now() < deadline, "the held create never finished");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let resent = sender.send_unit(&context, &text("once")).await.unwrap();
    let posts = peer.sim.visible(&channel);
    assert_eq!(posts.len(), 1, "one post for three creates");
    assert_eq!(resent.platform_message_id, posts[0].id);
}

#[tokio::test]
async fn beyond_the_window_a_lost_send_is_found_by_its_props_key() {
    let peer = Peer::start().await;
    let channel = peer.channel("beyond");
    let target = MessageTarget::group(&channel);
    peer.sim
        .inject(Fault::on(Route::CreatePost, FaultKind::LoseAnswer));
    let context = ctx(&target, "beyond-1");
    let lost = peer
        .plugin
        .sender
        .send_unit(&context, &text("landed"))
        .await
        .unwrap_err();
    assert_eq!(lost.side_effect, SideEffect::Possible);
    // Both sides restart: the server forgot the pending_post_id, the gateway its attempt.
    peer.sim.restart();
    let state = tempfile::tempdir().unwrap();
    let restarted = build(&peer.sim, &peer.bot, state.path(), "mattermost", json!({}))
        .await
        .unwrap();
    let found = restarted
        .sender
        .reconcile_unknown_send(&context, &text("landed"))
        .await
        .unwrap();
    let landed = peer.sim.visible(&channel);
    assert_eq!(landed.len(), 1);
    match found {
        Reconciliation::Sent(part) => assert_eq!(part.platform_message_id, landed[0].id),
        other => panic!("the landed post is found by its key, got {other:?}"),
    }
    let listed = peer
        .sim
        .calls()
        .into_iter()
        .any(|c| c.method == "GET" && c.path == format!("/api/v4/channels/{channel}/posts"));
    assert!(listed, "settled from the channel's posts");
    // Another bot's post with the same key is not ours.
    let other = peer.sim.add_bot("impostor");
    peer.sim.join(&channel, &other);
    let never = ctx(&target, "beyond-never");
    let key = never.unit_key(&text("never"));
    let (status, _) = reqwest::Client::new()
        .post(format!("{}/api/v4/posts", peer.sim.url()))
        .bearer_auth(&other.token)
        .json(&json!({ "channel_id": channel, "message": "never", "props": { KEY_PROP: key } }))
        .send()
        .await
        .map(|r| (r.status().as_u16(), ()))
        .unwrap();
    assert_eq!(status, 201);
    assert_eq!(
        restarted
            .sender
            .reconcile_unknown_send(&never, &text("never"))
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "absent (no attempt can be in flight: no intent, none from this process)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_gateway_finds_a_lost_send_older_than_its_lookback_from_the_recorded_attempt() {
    let peer = Peer::start().await;
    let channel = peer.channel("handover");
    let target = MessageTarget::group(&channel);
    let dir = tempfile::tempdir().unwrap();
    // The gateways' clock, driven, from the simulator's now (its posts are stamped by the
    // real time).
    let real_now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let clock = Arc::new(ManualClock::new(real_now));
    let setup = || {
        let state = ChannelState::new(
            Arc::new(clawgate_store_sqlite::testing::open_store(dir.path())),
            ChannelScope::new("mattermost", "default"),
            clock.clone(),
        );
        ChannelSetup::new(
            0,
            "mattermost",
            "default",
            settings_for(&peer.sim, json!({ "reconcile_lookback_s": 60 })),
            state,
        )
    };
    let first = build_from(&peer.bot, &setup()).await.unwrap();
    peer.sim
        .inject(Fault::on(Route::CreatePost, FaultKind::LoseAnswer));
    let context = ctx(&target, "handover-1");
    let lost = first
        .sender
        .send_unit(&context, &text("landed"))
        .await
        .unwrap_err();
    assert_eq!(lost.side_effect, SideEffect::Possible);
    // Ten minutes on (the server long forgot the pending_post_id), another gateway takes the
    // account over: the post is older than its lookback, and the recorded first attempt says
    // where to look.
    peer.sim.restart();
    clock.advance(10 * 60 * 1000);
    let other = build_from(&peer.bot, &setup()).await.unwrap();
    let found = other
        .sender
        .reconcile_unknown_send(&context, &text("landed"))
        .await
        .unwrap();
    let landed = peer.sim.visible(&channel);
    assert_eq!(landed.len(), 1);
    match found {
        Reconciliation::Sent(part) => assert_eq!(part.platform_message_id, landed[0].id),
        other => panic!("the landed post is found from the recorded attempt, got {other:?}"),
    }
}
