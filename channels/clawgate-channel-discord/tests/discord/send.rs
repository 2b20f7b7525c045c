//! Sends as Discord answers them: the nonce and its window, locked-down mentions, replies and
//! threads, the rate limiter, the invalid-request budget, and previews cancelled for media, an
//! error or an explicit reply (test-plan: "Discord: preview cancel on media/error/explicit
//! reply; prepared finals go through the send context; nonce").

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_discord::nonce_of;
use clawgate_channel_discord::simulator::{
    Fault, FaultKind, Limit, Route, SimulatorConfig, WriteOptions,
};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::ChannelScope;
use clawgate_messages::{LiveOptions, Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::MessageRelation;
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{Peer, build, build_from, settings_for};

fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "discord", target.clone(), ""),
        key,
    )
}

fn text(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

/// Statuses of the calls on `route`, in order.
fn statuses(peer: &Peer, route: Route) -> Vec<u16> {
    peer.sim
        .calls()
        .into_iter()
        .filter(|c| c.route == route)
        .map(|c| c.status)
        .collect()
}

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
        "discord-tests",
    );
    (dir, messenger, clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_create_carries_the_units_nonce_and_a_resend_returns_the_first_message() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("nonce");
    let target = MessageTarget::group(&channel);
    let adapter = peer.plugin.sender.clone();
    let ctx = ctx(&target, "reply-1");
    let first = adapter.send_unit(&ctx, &text("hello")).await.unwrap();
    let again = adapter.send_unit(&ctx, &text("hello")).await.unwrap();
    assert_eq!(first.platform_message_id, again.platform_message_id);
    assert_eq!(
        peer.texts(&channel),
        vec!["hello"],
        "Discord deduped the resend"
    );
    let bodies: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.route == Route::CreateMessage)
        .map(|c| c.body)
        .collect();
    assert_eq!(bodies.len(), 2);
    for body in bodies {
        assert_eq!(body["nonce"], json!(nonce_of("reply-1#0")));
        assert_eq!(body["enforce_nonce"], json!(true));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mentions_are_locked_down_so_nobody_is_pinged_by_accident() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("mentions");
    let adapter = peer.plugin.sender.clone();
    let pinging = format!("@everyone @here look, <@{}>", peer.person.id);
    adapter
        .send_unit(&ctx(&MessageTarget::group(&channel), "m"), &text(&pinging))
        .await
        .unwrap();
    let landed = &peer.sim.messages(&channel)[0];
    assert_eq!(landed.content, pinging);
    assert!(!landed.mention_everyone, "no @everyone ping");
    assert!(
        landed.mentions.is_empty(),
        "no user ping: {:?}",
        landed.mentions
    );
    // The same text without allowed_mentions does ping (the simulator parses like Discord).
    let raw = peer
        .sim
        .person_writes(&channel, &peer.other_bot, &pinging, WriteOptions::default());
    assert!(raw.mention_everyone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_names_its_question_and_still_lands_when_the_question_is_gone_and_threads_are_channels()
 {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("replies");
    let question = peer
        .sim
        .person_writes(&channel, &peer.person, "why?", WriteOptions::default());
    let adapter = peer.plugin.sender.clone();
    let mut message = ChannelMessage::outbound("r", "discord", MessageTarget::group(&channel), "");
    message.relation = Some(MessageRelation::reply_to(&question.id));
    let part = adapter
        .send_unit(&SendContext::new(message.clone(), "r"), &text("because"))
        .await
        .unwrap();
    assert_eq!(
        part.reply_to_id.as_deref(),
        Some(question.id.as_str()),
        "the receipt keeps the reply target"
    );
    let landed = peer.sim.messages(&channel);
    assert_eq!(landed[1].reply_to.as_deref(), Some(question.id.as_str()));
    // A second chunk does not answer again.
    let second = adapter
        .send_unit(
            &SendContext::new(message.clone(), "r"),
            &RenderedMessageUnit::text(1, "and more"),
        )
        .await
        .unwrap();
    assert_eq!(second.reply_to_id, None);
    let mut gone = message.clone();
    gone.relation = Some(MessageRelation::reply_to("123456789012345678"));
    adapter
        .send_unit(&SendContext::new(gone, "gone"), &text("still here"))
        .await
        .unwrap();
    assert_eq!(
        peer.texts(&channel).last().map(String::as_str),
        Some("still here")
    );
    let thread = peer.sim.add_thread(&channel, "topic");
    let in_thread = MessageTarget::group(&channel).with_thread_id(Some(thread.clone()));
    adapter
        .send_unit(&ctx(&in_thread, "t"), &text("in the thread"))
        .await
        .unwrap();
    assert_eq!(peer.texts(&thread), vec!["in the thread"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limiter_waits_out_an_empty_bucket_instead_of_collecting_429s() {
    let config = SimulatorConfig {
        create_limit: Limit::new(2, Duration::from_millis(600)),
        ..SimulatorConfig::fast()
    };
    let peer = Peer::with(config, json!({})).await;
    let channel = peer.sim.add_channel("burst");
    let adapter = peer.plugin.sender.clone();
    for n in 0..6 {
        adapter
            .send_unit(
                &ctx(&MessageTarget::group(&channel), &format!("b{n}")),
                &text(&format!("{n}")),
            )
            .await
            .unwrap();
    }
    assert_eq!(peer.texts(&channel).len(), 6);
    assert_eq!(
        statuses(&peer, Route::CreateMessage),
        vec![200; 6],
        "never a 429"
    );
    assert_eq!(peer.sim.invalid_requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_reported_with_its_retry_after_and_the_next_call_waits_for_it() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("limited");
    let adapter = peer.plugin.sender.clone();
    peer.sim.inject(Fault::on(
        Route::CreateMessage,
        FaultKind::RateLimited {
            retry_after: 0.4,
            global: false,
        },
    ));
    let target = MessageTarget::group(&channel);
    let error = adapter
        .send_unit(&ctx(&target, "a"), &text("a"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit);
    assert_eq!(error.side_effect, SideEffect::None);
    assert_eq!(error.retry_after_ms, Some(400));
    adapter
        .send_unit(&ctx(&target, "a"), &text("a"))
        .await
        .unwrap();
    let calls = peer.sim.calls();
    let creates: Vec<_> = calls
        .iter()
        .filter(|c| c.route == Route::CreateMessage)
        .collect();
    assert_eq!(
        creates.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![429, 200]
    );
    assert_eq!(creates[0].scope.as_deref(), Some("user"));
    // A global 429 holds every route, not only the one that met it.
    peer.sim.inject(Fault::on(
        Route::CreateMessage,
        FaultKind::RateLimited {
            retry_after: 0.3,
            global: true,
        },
    ));
    let error = adapter
        .send_unit(&ctx(&target, "g"), &text("g"))
        .await
        .unwrap_err();
    assert_eq!(error.retry_after_ms, Some(300));
    let part = MessageReceiptPart::new(
        peer.sim.messages(&channel)[0].id.clone(),
        MessagePartKind::Text,
        0,
    );
    adapter
        .edit(&ctx(&target, "a"), &part, &text("edited"))
        .await
        .unwrap();
    assert_eq!(
        peer.sim.invalid_requests(),
        2,
        "only the two injected 429s were refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_refused_again_and_again_stops_calling_before_discord_bans_it() {
    let peer = Peer::with(
        SimulatorConfig::fast(),
        json!({ "invalid_request_budget": 3 }),
    )
    .await;
    let channel = peer.sim.add_channel("refused");
    let adapter = peer.plugin.sender.clone();
    let target = MessageTarget::group(&channel);
    for n in 0..3 {
        peer.sim.inject(Fault::on(
            Route::CreateMessage,
            FaultKind::Error {
                status: 403,
                code: 50013,
                message: "Missing Permissions".into(),
            },
        ));
        let error = adapter
            .send_unit(&ctx(&target, &format!("p{n}")), &text("x"))
            .await
            .unwrap_err();
        assert_eq!(error.kind, DeliveryFailureKind::Permission);
    }
    let held = adapter
        .send_unit(&ctx(&target, "p3"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(held.kind, DeliveryFailureKind::RateLimit, "{held:?}");
    assert_eq!(held.side_effect, SideEffect::None);
    assert!(held.retry_after_ms.is_some());
    assert_eq!(
        statuses(&peer, Route::CreateMessage),
        vec![403, 403, 403],
        "the fourth call never left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_found_by_its_nonce_and_a_send_outside_the_window_that_cannot_be_found_is_parked()
 {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("lost");
    let target = MessageTarget::group(&channel);
    let adapter = peer.plugin.sender.clone();
    peer.sim
        .inject(Fault::on(Route::CreateMessage, FaultKind::LoseAnswer));
    let lost_ctx = ctx(&target, "lost");
    let error = adapter
        .send_unit(&lost_ctx, &text("landed"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let found = adapter
        .reconcile_unknown_send(&lost_ctx, &text("landed"))
        .await
        .unwrap();
    let landed = peer.sim.messages(&channel)[0].id.clone();
    assert!(
        matches!(&found, Reconciliation::Sent(part) if part.platform_message_id == landed),
        "{found:?}"
    );
    // Never sent, no memory of a first attempt, and the channel's whole history was read.
    let never = ctx(&target, "never");
    assert_eq!(
        adapter
            .reconcile_unknown_send(&never, &text("x"))
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    // With more history than one page, an unknown send of unknown age cannot be settled.
    for n in 0..100 {
        peer.sim.person_writes(
            &channel,
            &peer.person,
            &format!("chatter {n}"),
            WriteOptions::default(),
        );
    }
    assert_eq!(
        adapter
            .reconcile_unknown_send(&never, &text("x"))
            .await
            .unwrap(),
        Reconciliation::Unresolved
    );
    // A reply to a question younger than the window: the resend's nonce dedupes, so it may go.
    let question = peer
        .sim
        .person_writes(&channel, &peer.person, "q", WriteOptions::default());
    let mut reply = ChannelMessage::outbound("y", "discord", target.clone(), "");
    reply.relation = Some(MessageRelation::reply_to(&question.id));
    let reply_ctx = SendContext::new(reply, "young");
    assert_eq!(
        adapter
            .reconcile_unknown_send(&reply_ctx, &text("x"))
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
}

/// A page of a person's messages in `channel`: a send before them is no longer among the
/// recent messages a reconciliation reads.
fn bury(peer: &Peer, channel: &str) {
    for n in 0..100 {
        peer.sim.person_writes(
            channel,
            &peer.person,
            &format!("chatter {n}"),
            WriteOptions::default(),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_gateway_settles_a_lost_send_from_the_attempt_the_first_one_recorded() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("handover");
    let target = MessageTarget::group(&channel);
    peer.sim
        .inject(Fault::on(Route::CreateMessage, FaultKind::LoseAnswer));
    let lost = ctx(&target, "handed-over");
    let error = peer
        .plugin
        .sender
        .send_unit(&lost, &text("once"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let landed = peer.sim.messages(&channel)[0].id.clone();
    bury(&peer, &channel);
    // Another gateway takes the account over: the same account on the same store.
    let other = build(
        &peer.factory,
        &peer.sim,
        &peer.bot,
        peer.state.path(),
        "discord",
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(
        other
            .sender
            .reconcile_unknown_send(&lost, &text("once"))
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "the first attempt, recorded in the store, is inside the nonce window: the resend dedupes"
    );
    let resent = other.sender.send_unit(&lost, &text("once")).await.unwrap();
    assert_eq!(resent.platform_message_id, landed);
    assert_eq!(peer.texts(&channel), vec!["once"], "one message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_send_older_than_the_nonce_window_by_the_gateways_clock_is_parked() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("aged");
    let target = MessageTarget::group(&channel);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    // The account's state on a driven gateway clock.
    let setup = || {
        let state = ChannelState::new(
            Arc::new(clawgate_store_sqlite::testing::open_store(dir.path())),
            ChannelScope::new("discord", "default"),
            clock.clone(),
        );
        ChannelSetup::new(
            0,
            "discord",
            "default",
            settings_for(&peer.sim, json!({ "nonce_window_s": 120 })),
            state,
        )
    };
    let first = build_from(&peer.factory, &peer.bot, &setup())
        .await
        .unwrap();
    peer.sim
        .inject(Fault::on(Route::CreateMessage, FaultKind::LoseAnswer));
    let lost = ctx(&target, "aged");
    first
        .sender
        .send_unit(&lost, &text("once"))
        .await
        .unwrap_err();
    bury(&peer, &channel);
    let second = build_from(&peer.factory, &peer.bot, &setup())
        .await
        .unwrap();
    assert_eq!(
        second
            .sender
            .reconcile_unknown_send(&lost, &text("once"))
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    clock.advance(121_000);
    assert_eq!(
        second
            .sender
            .reconcile_unknown_send(&lost, &text("once"))
            .await
            .unwrap(),
        Reconciliation::Unresolved,
        "past the window by the gateway's clock a resend could be a second message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_nonce_window_discord_creates_a_second_message_which_is_why_the_adapter_reads_history()
 {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("window");
    let adapter = peer.plugin.sender.clone();
    let c = ctx(&MessageTarget::group(&channel), "w");
    adapter.send_unit(&c, &text("once")).await.unwrap();
    peer.sim.advance_clock(Duration::from_secs(6 * 60));
    adapter.send_unit(&c, &text("once")).await.unwrap();
    assert_eq!(
        peer.texts(&channel),
        vec!["once", "once"],
        "the simulator forgets nonces like Discord"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_is_edited_into_the_final_and_its_receipt_carries_the_message_id() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("live");
    let target = MessageTarget::group(&channel);
    let (_dir, messenger, clock) = engine(&peer);
    let reply = |t: &str| ChannelMessage::outbound("l", "discord", target.clone(), t);
    let mut live = messenger
        .begin_live(reply(""), SendOptions::default(), LiveOptions::default())
        .await
        .unwrap();
    live.update("Thinking").await.unwrap();
    clock.advance(1_500);
    live.update("Thinking harder").await.unwrap();
    clock.advance(1_500);
    let report = live.finalize(reply("Done.")).await.unwrap();
    let landed = peer.sim.messages(&channel);
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].content, "Done.");
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{:?}", report.outcome)
    };
    assert_eq!(receipt.parts[0].platform_message_id, landed[0].id);
    assert_eq!(statuses(&peer, Route::EditMessage), vec![200, 200]);
}

/// Begins a preview showing "Draft" and returns the preview's message id.
async fn previewing(
    peer: &Peer,
    messenger: &Messenger,
    target: &MessageTarget,
    start: ChannelMessage,
) -> (clawgate_messages::LivePreview, String) {
    let mut live = messenger
        .begin_live(start, SendOptions::default(), LiveOptions::default())
        .await
        .unwrap();
    live.update("Draft").await.unwrap();
    let preview = peer.sim.messages(&peer.channel(target))[0].id.clone();
    (live, preview)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_is_cancelled_when_the_final_carries_media() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("media");
    let target = MessageTarget::group(&channel);
    let (_dir, messenger, _clock) = engine(&peer);
    let (live, preview) = previewing(
        &peer,
        &messenger,
        &target,
        ChannelMessage::outbound("m", "discord", target.clone(), ""),
    )
    .await;
    let image = MessageAttachment::new(MessagePartKind::Media)
        .with_url("https://files.example/chart.png")
        .with_mime_type("image/png");
    let final_message =
        ChannelMessage::outbound("m", "discord", target.clone(), "Here is the chart.")
            .with_attachments(vec![image]);
    live.finalize(final_message).await.unwrap();
    let landed = peer.sim.messages(&channel);
    assert!(
        landed.iter().all(|m| m.id != preview),
        "the preview was deleted"
    );
    let texts: Vec<_> = landed.iter().map(|m| m.content.as_str()).collect();
    assert_eq!(
        texts,
        vec!["Here is the chart.", "https://files.example/chart.png"]
    );
    assert_eq!(statuses(&peer, Route::DeleteMessage), vec![204]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_is_cancelled_when_finalizing_it_fails_and_the_final_goes_out_normally() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("error");
    let target = MessageTarget::group(&channel);
    let (_dir, messenger, _clock) = engine(&peer);
    let (live, preview) = previewing(
        &peer,
        &messenger,
        &target,
        ChannelMessage::outbound("e", "discord", target.clone(), ""),
    )
    .await;
    peer.sim.inject(Fault::on(
        Route::EditMessage,
        FaultKind::Error {
            status: 403,
            code: 50013,
            message: "Missing Permissions".into(),
        },
    ));
    live.finalize(ChannelMessage::outbound(
        "e",
        "discord",
        target.clone(),
        "Final answer.",
    ))
    .await
    .unwrap();
    let landed = peer.sim.messages(&channel);
    assert_eq!(landed.len(), 1);
    assert_ne!(landed[0].id, preview);
    assert_eq!(landed[0].content, "Final answer.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_is_cancelled_for_an_explicit_reply_and_the_final_answers_its_target() {
    let peer = Peer::start().await;
    let channel = peer.sim.add_channel("explicit");
    let target = MessageTarget::group(&channel);
    let question = peer.sim.person_writes(
        &channel,
        &peer.person,
        "which one?",
        WriteOptions::default(),
    );
    let (_dir, messenger, _clock) = engine(&peer);
    let (live, preview) = {
        let mut live = messenger
            .begin_live(
                ChannelMessage::outbound("x", "discord", target.clone(), ""),
                SendOptions::default(),
                LiveOptions::default(),
            )
            .await
            .unwrap();
        live.update("Draft").await.unwrap();
        let preview = peer.texts(&channel);
        assert_eq!(preview, vec!["Draft"]);
        let id = peer
            .sim
            .messages(&channel)
            .into_iter()
            .find(|m| m.author_id == peer.bot.id)
            .unwrap()
            .id;
        (live, id)
    };
    let mut final_message = ChannelMessage::outbound("x", "discord", target.clone(), "That one.");
    final_message.relation = Some(MessageRelation::reply_to(&question.id));
    let report = live.finalize(final_message).await.unwrap();
    let ours: Vec<_> = peer
        .sim
        .messages(&channel)
        .into_iter()
        .filter(|m| m.author_id == peer.bot.id)
        .collect();
    assert_eq!(ours.len(), 1);
    assert_ne!(ours[0].id, preview, "the preview went");
    assert_eq!(
        ours[0].reply_to.as_deref(),
        Some(question.id.as_str()),
        "the reply target is preserved"
    );
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{:?}", report.outcome)
    };
    assert_eq!(
        receipt.parts[0].reply_to_id.as_deref(),
        Some(question.id.as_str())
    );
    // The final went through the send context: its create carries the final's own nonce.
    let final_create = peer
        .sim
        .calls()
        .into_iter()
        .rfind(|c| c.route == Route::CreateMessage)
        .unwrap();
    assert_eq!(final_create.body["content"], json!("That one."));
    assert_eq!(final_create.body["enforce_nonce"], json!(true));
    assert_eq!(final_create.body["nonce"].as_str().map(str::len), Some(25));
}
