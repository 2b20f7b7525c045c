//! Sends and previews as Teams answers them: replies in channel threads, the test plan's
//! "native progress finalization" (a one-on-one preview is a Teams stream whose final message
//! is the answer, in place; its progress labels are the stream's informative updates), the fresh final when the person stopped the stream, a final whose
//! answer was lost settled by repeating it, 429 with `Retry-After`, renewed tokens, and the
//! failures an operator must fix.

use std::sync::Arc;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_teams::TeamsFactory;
use clawgate_channel_teams::simulator::{
    Fault, FaultKind, Op, SimulatorConfig, StreamState, TeamsSimulator,
};
use clawgate_messages::{LiveOptions, Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{Peer, quiet};

fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "teams", target.clone(), ""),
        key,
    )
}

fn text(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

/// An engine over the peer's channel, on a fresh store and a driven clock.
fn engine(peer: &Peer) -> (tempfile::TempDir, Messenger, Arc<ManualClock>) {
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
        "teams-tests",
    );
    (dir, messenger, clock)
}

fn outbound(target: &MessageTarget, key: &str, body: &str) -> ChannelMessage {
    ChannelMessage::outbound(key, "teams", target.clone(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_progress_finalization_a_one_on_one_preview_streams_and_its_final_ends_the_stream() {
    let peer = Peer::start().await;
    let chat = peer.sim.personal_chat(&peer.person);
    let target = MessageTarget::direct(&chat);
    let (_dir, messenger, clock) = engine(&peer);
    let mut live = messenger
        .begin_live(
            outbound(&target, "progress", ""),
            SendOptions::default(),
            LiveOptions::default(),
        )
        .await
        .unwrap();
    live.update("Looking").await.unwrap();
    clock.advance(1_000);
    live.update("Looking it up").await.unwrap();
    clock.advance(1_000);
    let report = live
        .finalize(outbound(&target, "progress", "It is 42."))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let shown = peer.sim.bot_visible(&chat);
    assert_eq!(shown.len(), 1, "one message: the stream became the answer");
    let stream = shown[0]
        .stream
        .as_ref()
        .expect("the preview was a Teams stream");
    assert_eq!(stream.state, StreamState::Final);
    assert_eq!(stream.streamed, ["Looking", "Looking it up"]);
    assert_eq!(shown[0].text, "It is 42.");
    let ops: Vec<Op> = peer
        .sim
        .calls()
        .iter()
        .filter(|c| c.op != Op::Token)
        .map(|c| c.op)
        .collect();
    assert_eq!(
        ops,
        [Op::Stream, Op::Stream, Op::StreamFinal],
        "no update, no second message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_progress_labels_are_informative_updates_of_the_stream_before_and_between_its_text()
{
    let peer = Peer::start().await;
    let chat = peer.sim.personal_chat(&peer.person);
    let target = MessageTarget::direct(&chat);
    let live = peer.plugin.sender.live().unwrap();
    let preview = ctx(&target, "informative~preview");
    let mut searching = text("");
    searching.payload["progress"] = json!(["Searching the docs"]);
    let part = live.show(&preview, &searching).await.unwrap();
    // The same label again is not shown twice; the text streams.
    let mut found = text("Found");
    found.payload["progress"] = json!(["Searching the docs"]);
    live.replace(&preview, &part, &found).await.unwrap();
    let mut reading = text("Found");
    reading.payload["progress"] = json!(["Searching the docs", { "label": "Reading page 3" }]);
    live.replace(&preview, &part, &reading).await.unwrap();
    let mut more = text("Found it: 42");
    more.payload["progress"] = json!(["Searching the docs", { "label": "Reading page 3" }]);
    live.replace(&preview, &part, &more).await.unwrap();
    let done = live
        .finalize(&ctx(&target, "informative"), &part, &text("It is 42."))
        .await
        .unwrap();
    assert_eq!(done.platform_message_id, part.platform_message_id);
    let shown = peer.sim.bot_visible(&chat);
    assert_eq!(shown.len(), 1, "the stream became the answer: {shown:?}");
    let stream = shown[0].stream.as_ref().expect("a Teams stream");
    assert_eq!(stream.state, StreamState::Final);
    assert_eq!(stream.informative, ["Searching the docs", "Reading page 3"]);
    assert_eq!(stream.streamed, ["Found", "Found it: 42"]);
    assert_eq!(stream.dropped, 0, "every request in order, a second apart");
    assert_eq!(shown[0].text, "It is 42.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_person_stopped_gets_its_final_as_a_message_of_its_own() {
    let peer = Peer::start().await;
    let chat = peer.sim.personal_chat(&peer.person);
    let target = MessageTarget::direct(&chat);
    let (_dir, messenger, clock) = engine(&peer);
    let mut live = messenger
        .begin_live(
            outbound(&target, "stopped", ""),
            SendOptions::default(),
            LiveOptions::default(),
        )
        .await
        .unwrap();
    live.update("Working").await.unwrap();
    clock.advance(1_000);
    let stream_id = peer.sim.bot_visible(&chat)[0].id.clone();
    assert!(peer.sim.cancel_stream(&stream_id));
    // The update after Stop is refused; the preview keeps what it showed.
    live.update("Working on it").await.unwrap();
    clock.advance(1_000);
    let report = live
        .finalize(outbound(&target, "stopped", "Done anyway."))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let shown = peer.sim.bot_visible(&chat);
    assert_eq!(
        shown.iter().map(|a| a.text.as_str()).collect::<Vec<_>>(),
        ["Done anyway."],
        "the stopped stream was removed and the final sent on its own: {shown:?}"
    );
    assert!(shown[0].stream.is_none());
    let stopped = peer
        .sim
        .activities(&chat)
        .into_iter()
        .find(|a| a.id == stream_id)
        .unwrap();
    assert_eq!(
        (stopped.deleted, stopped.stream.map(|s| s.state)),
        (true, Some(StreamState::CancelledByUser))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_final_whose_answer_was_lost_is_repeated_and_lands_once() {
    let peer = Peer::start().await;
    let chat = peer.sim.personal_chat(&peer.person);
    let target = MessageTarget::direct(&chat);
    let adapter = peer.plugin.sender.clone();
    let live = adapter.live().unwrap();
    let c = ctx(&target, "lost-final");
    let preview = live.show(&c, &text("Thinking")).await.unwrap();
    peer.sim
        .inject(Fault::on(Op::StreamFinal, FaultKind::LoseAnswer));
    let part = live
        .finalize(&c, &preview, &text("The end."))
        .await
        .unwrap();
    assert_eq!(part.platform_message_id, preview.platform_message_id);
    let finals: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.op == Op::StreamFinal)
        .map(|c| (c.status, c.answered))
        .collect();
    assert_eq!(
        finals,
        [(200, false), (403, true)],
        "the repeat found it completed"
    );
    let shown = peer.sim.bot_visible(&chat);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].text, "The end.");
}

#[tokio::test]
async fn a_reply_in_a_channel_goes_to_the_posts_thread_with_reply_to_id() {
    let peer = Peer::start().await;
    let channel = peer.channel("general");
    let post = peer
        .sim
        .person_writes(&channel, &peer.person, "question", None)
        .unwrap();
    let target = MessageTarget::group(&channel).with_thread_id(Some(post.id.clone()));
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx(&target, "reply"), &text("answer"))
        .await
        .unwrap();
    assert_eq!(part.thread_id.as_deref(), Some(post.id.as_str()));
    let shown = peer.sim.bot_visible(&channel);
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].id, part.platform_message_id);
    assert_eq!(shown[0].thread.as_deref(), Some(post.id.as_str()));
    assert_eq!(shown[0].reply_to_id.as_deref(), Some(post.id.as_str()));
    let call = peer
        .sim
        .calls()
        .into_iter()
        .find(|c| c.op == Op::Reply)
        .expect("the reply-to-activity route");
    assert!(
        call.path.ends_with(&format!(
            "{channel};messageid={}/activities/{}",
            post.id, post.id
        )),
        "{}",
        call.path
    );
}

#[tokio::test]
async fn a_429_is_a_rate_limit_with_its_retry_after_and_nothing_sent() {
    let peer = Peer::start().await;
    let chat = peer.group_chat("busy");
    peer.sim
        .inject(Fault::on(Op::Send, FaultKind::RateLimited(3)));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&MessageTarget::group(&chat), "busy"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit);
    assert_eq!(error.retry_after_ms, Some(3_000));
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(peer.sim.bot_visible(&chat).is_empty());
}

#[tokio::test]
async fn after_a_429_the_conversation_is_held_for_its_retry_after_and_others_are_not() {
    let peer = Peer::start().await;
    let chat = peer.group_chat("held");
    let other = peer.group_chat("free");
    // A minute: the second send always comes inside it.
    peer.sim
        .inject(Fault::on(Op::Send, FaultKind::RateLimited(60)));
    let sender = &peer.plugin.sender;
    let target = MessageTarget::group(&chat);
    sender
        .send_unit(&ctx(&target, "h1"), &text("x"))
        .await
        .unwrap_err();
    let held = sender
        .send_unit(&ctx(&target, "h2"), &text("y"))
        .await
        .unwrap_err();
    assert_eq!(held.kind, DeliveryFailureKind::RateLimit);
    assert!(
        held.retry_after_ms.is_some_and(|ms| ms > 0 && ms <= 60_000),
        "{held:?}"
    );
    let sends = |conversation: &str| {
        peer.sim
            .calls()
            .iter()
            .filter(|c| c.op == Op::Send && c.path.contains(conversation))
            .count()
    };
    assert_eq!(sends(&chat), 1, "the held send never reached Teams");
    sender
        .send_unit(&ctx(&MessageTarget::group(&other), "h3"), &text("z"))
        .await
        .unwrap();
    assert_eq!(peer.texts(&other), ["z"]);
}

#[tokio::test]
async fn a_revoked_token_is_replaced_and_the_send_goes_through() {
    let peer = Peer::start().await;
    let chat = peer.group_chat("tokens");
    let target = MessageTarget::group(&chat);
    peer.plugin
        .sender
        .send_unit(&ctx(&target, "t1"), &text("one"))
        .await
        .unwrap();
    assert_eq!(peer.sim.revoke_tokens(), 1);
    peer.plugin
        .sender
        .send_unit(&ctx(&target, "t2"), &text("two"))
        .await
        .unwrap();
    assert_eq!(peer.texts(&chat), ["one", "two"]);
    assert_eq!(
        peer.sim.token_requests(),
        2,
        "one fresh token after the 401"
    );
}

#[tokio::test]
async fn without_a_reference_or_service_url_a_send_names_the_conversation() {
    let peer = Peer::with(quiet(), json!({ "service_url": null })).await;
    let chat = peer.group_chat("nowhere");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&MessageTarget::group(&chat), "x"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::NotFound);
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(error.message.contains(&chat), "{}", error.message);
}

#[tokio::test]
async fn a_wrong_client_secret_stops_the_start_naming_the_setting_not_the_secret() {
    let sim = TeamsSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = json!({
        "app_id": sim.app_id(), "app_password_env": "TEAMS_APP_PASSWORD",
        "listen": "127.0.0.1:0", "token_url": sim.token_url(), "openid_url": sim.openid_url(),
    });
    let setup = clawgate_conformance::channel_setup(0, "teams", "default", settings, dir.path());
    let error = TeamsFactory
        .build_with_secrets(&setup, Secret::new("not-the-secret-value"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("channels[0].settings.app_password_env"),
        "{error}"
    );
    assert!(error.contains("invalid_client"), "{error}");
    assert!(!error.contains("not-the-secret-value"), "{error}");
}

#[tokio::test]
async fn a_misspelt_setting_and_a_plain_http_service_stop_the_start_naming_the_key() {
    let sim = TeamsSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = json!({
        "app_id": sim.app_id(), "app_password_env": "TEAMS_APP_PASSWORD",
        "listen": "127.0.0.1:0", "token_url": sim.token_url(), "openid_url": sim.openid_url(),
    });
    let mut misspelt = base.clone();
    misspelt["streeming"] = json!(false);
    let mut no_url = base.clone();
    no_url["service_url"] = json!("smba.trafficmanager.net/teams/");
    for (settings, key) in [
        (misspelt, "channels[0].settings"),
        (no_url, "channels[0].settings.service_url"),
    ] {
        let setup =
            clawgate_conformance::channel_setup(0, "teams", "default", settings, dir.path());
        let error = TeamsFactory
            .build_with_secrets(&setup, Secret::new(sim.app_password()))
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains(key), "{error}");
    }
}

#[tokio::test]
async fn a_2xx_whose_body_is_an_error_is_not_a_success() {
    let peer = Peer::start().await;
    let chat = peer.group_chat("dropped");
    // The answer Teams gives a stream update it dropped for its order, met by a send.
    peer.sim.inject(Fault::on(
        Op::Send,
        FaultKind::error(
            202,
            "ContentStreamSequenceOrderPreConditionFailed",
            "PreCondition failed",
        ),
    ));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&MessageTarget::group(&chat), "d"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Conflict, SideEffect::None),
        "{error:?}"
    );
    assert_eq!(
        error.platform_code.as_deref(),
        Some("ContentStreamSequenceOrderPreConditionFailed")
    );
}
