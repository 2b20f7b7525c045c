//! What the contract does not name: drop reasons as refusals of their class on both
//! transports, the rate limit by user type, the duplicate rule, replies, lost answers, and the
//! link's PING/RECONNECT handling.

use std::time::Duration;

use clawgate_channel_sdk::SideEffect;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::types::MessageRelation;
use clawgate_channel_twitch::limits::DUPLICATE_SUFFIX;
use clawgate_channel_twitch::simulator::{AttemptOutcome, Fault, FaultKind, SimulatorConfig, Via};
use serde_json::json;

use crate::peer::{CHANNEL, Peer, build, link, settings, until};

async fn send(
    peer: &Peer,
    plugin: &ChannelPlugin,
    text: &str,
    reply_to: Option<&str>,
) -> Result<MessageReceiptPart, SendError> {
    let _ = peer;
    let mut message = ChannelMessage::outbound(
        "m",
        "twitch",
        MessageTarget::group(format!("#{CHANNEL}")),
        text,
    );
    if let Some(parent) = reply_to {
        message = message.with_relation(MessageRelation::reply_to_inbound(parent));
    }
    let ctx = SendContext::new(message, "key");
    let unit = RenderedMessageUnit::new(0, MessagePartKind::Text, json!({ "text": text }));
    plugin.sender.send_unit(&ctx, &unit).await
}

fn via(transport: &str) -> serde_json::Value {
    json!({ "send_via": transport })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_drop_is_a_refusal_of_its_class_on_both_transports_and_nothing_lands() {
    use DeliveryFailureKind::*;
    for transport in ["helix", "irc"] {
        // (case, what the moderators do, the drop reason, its class)
        type Setup = fn(&Peer);
        let cases: [(&str, Setup, &str, DeliveryFailureKind); 5] = [
            (
                "banned",
                |p| p.sim.ban(CHANNEL, &p.bot_login(), true),
                "msg_banned",
                Permission,
            ),
            (
                "timed out",
                |p| p.sim.timeout(CHANNEL, &p.bot_login(), 600),
                "msg_timedout",
                Permission,
            ),
            (
                "AutoMod",
                |p| p.sim.automod_hold(CHANNEL, "forbidden"),
                "msg_rejected",
                InvalidPayload,
            ),
            (
                "slow mode",
                |p| p.sim.set_slow_mode(CHANNEL, 30),
                "msg_slowmode",
                RateLimit,
            ),
            (
                "rate limit",
                |p| {
                    let kind = FaultKind::IrcDrop {
                        msg_id: "msg_ratelimit".into(),
                        message: "Your message was not sent because you are sending messages too quickly.".into(),
                    };
                    p.sim.inject(Fault::once(kind));
                    p.sim.inject(Fault::once(FaultKind::HelixDrop {
                        code: "msg_ratelimit".into(),
                        message: "Your message was not sent because you are sending messages too quickly.".into(),
                    }));
                },
                "msg_ratelimit",
                RateLimit,
            ),
        ];
        for (case, setup, code, kind) in cases {
            let peer = Peer::with(SimulatorConfig::default(), via(transport)).await;
            peer.joined().await;
            if code == "msg_slowmode" {
                send(
                    &peer,
                    &peer.plugin,
                    "first, before the slow mode bites",
                    None,
                )
                .await
                .unwrap();
            }
            setup(&peer);
            let before = peer.said(CHANNEL).len();
            let error = send(&peer, &peer.plugin, "a forbidden reply", None)
                .await
                .expect_err(case);
            assert_eq!(error.kind, kind, "{transport} {case}: {error:?}");
            assert_eq!(error.side_effect, SideEffect::None, "{transport} {case}");
            assert_eq!(
                error.platform_code.as_deref(),
                Some(code),
                "{transport} {case}"
            );
            if kind == RateLimit {
                assert!(
                    error.retry_after_ms.is_some_and(|ms| ms >= 1_000),
                    "{error:?}"
                );
            }
            assert_eq!(
                peer.said(CHANNEL).len(),
                before,
                "{transport} {case}: nothing landed"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_consecutive_messages_each_land_and_a_fresh_process_recovers_from_a_duplicate_drop()
 {
    for transport in ["helix", "irc"] {
        let peer = Peer::with(SimulatorConfig::default(), via(transport)).await;
        for _ in 0..3 {
            send(&peer, &peer.plugin, "same words", None).await.unwrap();
        }
        let landed: Vec<String> = peer
            .sim
            .messages(CHANNEL)
            .into_iter()
            .map(|m| m.text)
            .collect();
        let suffixed = format!("same words{DUPLICATE_SUFFIX}");
        assert_eq!(
            landed,
            ["same words", suffixed.as_str(), "same words"],
            "{transport}"
        );
        assert!(
            peer.sim
                .attempts()
                .iter()
                .all(|a| a.outcome != AttemptOutcome::Dropped("msg_duplicate".into())),
            "{transport}: the suffix kept Twitch from dropping any"
        );
        // A restarted gateway does not know its last text: Twitch drops the repeat, the
        // adapter sends it again told apart, once.
        let fresh = build(&peer.sim, settings(&peer.sim, via(transport))).await;
        let receipt = send(&peer, &fresh, "same words", None).await.unwrap();
        let attempts = peer.sim.attempts();
        let tail: Vec<&AttemptOutcome> =
            attempts.iter().rev().take(2).map(|a| &a.outcome).collect();
        assert_eq!(
            tail[1],
            &AttemptOutcome::Dropped("msg_duplicate".into()),
            "{transport}"
        );
        assert_eq!(
            tail[0],
            &AttemptOutcome::Sent(receipt.platform_message_id.clone()),
            "{transport}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_normal_user_is_held_at_20_per_30_s_locally_and_a_moderator_at_100() {
    let peer = Peer::with(SimulatorConfig::default(), json!({ "send_wait_ms": 300 })).await;
    peer.joined().await;
    for n in 0..20 {
        send(&peer, &peer.plugin, &format!("message {n}"), None)
            .await
            .unwrap();
    }
    let error = send(&peer, &peer.plugin, "the 21st", None)
        .await
        .expect_err("held back");
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(
        error.retry_after_ms.is_some_and(|ms| ms > 20_000),
        "{error:?}"
    );
    assert!(
        error.platform_code.is_none(),
        "refused here, not by Twitch: {error:?}"
    );
    assert_eq!(peer.sim.attempts().len(), 20, "the 21st never left");

    // As a moderator the same account may send 100.
    peer.sim.set_moderator(CHANNEL, &peer.bot_login(), true);
    let l = link(&peer.plugin);
    until("the moderator badge", || l.elevated(CHANNEL)).await;
    for n in 20..40 {
        send(&peer, &peer.plugin, &format!("message {n}"), None)
            .await
            .unwrap();
    }
    assert_eq!(peer.said(CHANNEL).len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_local_limit_twitchs_own_rate_limit_drop_is_classified() {
    let peer = Peer::with(
        SimulatorConfig::default(),
        json!({ "rate_limit": false, "send_via": "irc" }),
    )
    .await;
    for n in 0..20 {
        send(&peer, &peer.plugin, &format!("message {n}"), None)
            .await
            .unwrap();
    }
    let error = send(&peer, &peer.plugin, "the 21st", None)
        .await
        .expect_err("dropped");
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit, "{error:?}");
    assert_eq!(error.platform_code.as_deref(), Some("msg_ratelimit"));
    assert_eq!(peer.said(CHANNEL).len(), 20);
    // The window passes on Twitch's clock; the same account sends again.
    peer.sim.advance_clock(Duration::from_secs(31));
    send(&peer, &peer.plugin, "after the window", None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_carry_the_parent_and_receipts_are_twitchs_message_ids() {
    for transport in ["helix", "irc"] {
        let peer = Peer::with(SimulatorConfig::default(), via(transport)).await;
        peer.joined().await;
        let asked = peer
            .sim
            .person_writes(CHANNEL, &peer.person, "@clawgate_bot hi", None);
        let receipt = send(&peer, &peer.plugin, "hello ada", Some(&asked.id))
            .await
            .unwrap();
        let mine = peer.sim.messages(CHANNEL).pop().unwrap();
        assert_eq!(mine.text, "hello ada");
        assert_eq!(receipt.platform_message_id, mine.id, "{transport}");
        assert_eq!(
            mine.reply_parent.map(|p| p.0),
            Some(asked.id.clone()),
            "{transport}"
        );
        assert_eq!(
            mine.via,
            if transport == "irc" {
                Via::Irc
            } else {
                Via::Helix
            }
        );
        // A reply to a message Twitch does not know is dropped (msg_rejected), not sent.
        let error = send(&peer, &peer.plugin, "to nowhere", Some("no-such-id"))
            .await
            .unwrap_err();
        assert_eq!(
            error.kind,
            DeliveryFailureKind::InvalidPayload,
            "{transport}: {error:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_unknown_and_the_message_is_on_twitch() {
    for (transport, fault) in [
        ("helix", FaultKind::HelixLoseAnswer),
        ("irc", FaultKind::IrcCutAfterPost),
    ] {
        let peer = Peer::with(SimulatorConfig::default(), via(transport)).await;
        peer.joined().await;
        peer.sim.inject(Fault::once(fault));
        let error = send(&peer, &peer.plugin, "did it land?", None)
            .await
            .unwrap_err();
        assert_eq!(
            error.kind,
            DeliveryFailureKind::Unknown,
            "{transport}: {error:?}"
        );
        assert_eq!(error.side_effect, SideEffect::Possible, "{transport}");
        assert_eq!(peer.said(CHANNEL), ["did it land?"], "{transport}");
        // The link comes back and the next message goes; until the drop is noticed a send
        // fails as not sent (Transient, no side effect), which the engine retries.
        let mut tries = 0;
        while let Err(error) = send(&peer, &peer.plugin, "next", None).await {
            assert_eq!(
                (error.kind, error.side_effect),
                (DeliveryFailureKind::Transient, SideEffect::None),
                "{error:?}"
            );
            tries += 1;
            assert!(tries < 50, "the link never came back");
        }
        assert_eq!(peer.said(CHANNEL), ["did it land?", "next"], "{transport}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helix_errors_and_a_bad_token_are_classified() {
    let peer = Peer::start().await;
    peer.joined().await;
    peer.sim.inject(Fault::once(FaultKind::HelixError {
        status: 429,
        message: "Request limit exceeded".into(),
    }));
    let error = send(&peer, &peer.plugin, "x", None).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit);
    assert!(
        error.retry_after_ms.is_some_and(|ms| ms <= 61_000),
        "from Ratelimit-Reset: {error:?}"
    );
    peer.sim.inject(Fault::once(FaultKind::HelixError {
        status: 503,
        message: "".into(),
    }));
    let error = send(&peer, &peer.plugin, "x", None).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Transient);
    // The points bucket runs dry: a real 429 with its headers.
    let tight = Peer::with(
        SimulatorConfig {
            helix_points_per_minute: 2,
            ..SimulatorConfig::default()
        },
        json!({}),
    )
    .await;
    send(&tight, &tight.plugin, "one", None).await.unwrap();
    send(&tight, &tight.plugin, "two", None).await.unwrap();
    let error = send(&tight, &tight.plugin, "three", None)
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit, "{error:?}");
    assert_eq!(error.platform_code.as_deref(), Some("429"));
    // A wrong token: the chat login fails, and so does the send, as Auth.
    let setup = clawgate_conformance::channel_setup_in_memory(
        0,
        "twitch",
        "default",
        settings(&peer.sim, json!({})),
    );
    let wrong = clawgate_channel_twitch::TwitchFactory
        .build_with_secrets(&setup, Secret::new("oauth:wrong"))
        .await
        .unwrap();
    let error = send(&peer, &wrong, "x", None).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Auth, "{error:?}");
    assert!(
        !format!("{error:?}").contains("wrong"),
        "the token never prints"
    );
    assert!(
        link(&wrong)
            .refused()
            .is_some_and(|r| r.contains("Login authentication failed"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_the_account_does_not_join_is_not_found_at_once() {
    let peer = Peer::start().await;
    let ctx = SendContext::new(
        ChannelMessage::outbound("m", "twitch", MessageTarget::group("#elsewhere"), "hi"),
        "key",
    );
    let unit = RenderedMessageUnit::new(0, MessagePartKind::Text, json!({ "text": "hi" }));
    let error = peer.plugin.sender.send_unit(&ctx, &unit).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::NotFound, "{error:?}");
    assert!(error.message.contains("channels"), "{error:?}");
    assert!(peer.sim.attempts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pings_are_answered_and_a_reconnect_request_rejoins() {
    let peer = Peer::start().await;
    peer.joined().await;
    let login = peer.bot_login();
    let first = link(&peer.plugin).session().unwrap();
    peer.sim.ping_all();
    until("our PONG", || peer.sim.pongs(&login) >= 1).await;
    peer.sim.reconnect_all();
    let l = link(&peer.plugin);
    until("a new session", || l.session().is_some_and(|s| s > first)).await;
    until("back in the channel", || {
        peer.sim.joined(&login).iter().any(|c| c == CHANNEL)
    })
    .await;
    send(&peer, &peer.plugin, "still here", None).await.unwrap();
    assert_eq!(peer.said(CHANNEL), ["still here"]);
}
