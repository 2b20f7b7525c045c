//! Sends: passive replies and their 40054005 settlement, active messages within the quota and
//! parked after a lost answer, token refresh, media tags, text as voice, secrets.

use std::time::Duration;

use clawgate_channel_qq::simulator::{Fault, FaultKind};
use clawgate_channel_qq::{CODE_DEDUPLICATED, msg_seq_of};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{SideEffect, types::MessageRelation};
use serde_json::json;

use crate::peer::{Peer, build, chat, quick, settings};

fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    let message = ChannelMessage::outbound(key, "qq", target.clone(), "");
    SendContext::new(message, key)
}

fn text(index: u32, text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::new(index, MessagePartKind::Text, json!({ "text": text }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_passive_answer_is_settled_by_the_40054005_repeat_with_an_id_less_receipt() {
    let peer = Peer::start().await;
    let (target, msg_id) = peer.person_with_id("lost-passive");
    let adapter = peer.plugin.sender.clone();
    let key = format!("qq:reply:{msg_id}:0");
    let ctx = ctx(&target, &key);
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let error = adapter
        .send_unit(&ctx, &text(0, "你好，世界"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    let Reconciliation::Sent(part) = adapter
        .reconcile_unknown_send(&ctx, &text(0, "你好，世界"))
        .await
        .unwrap()
    else {
        panic!("a passive reply that landed is settled as sent");
    };
    let seq = msg_seq_of(&format!("{key}#0"));
    assert_eq!(part.platform_message_id, format!("{msg_id}:{seq}"));
    assert_eq!(part.raw.as_ref().unwrap()["deduplicated"], true);
    // The platform's record: one message, under the unit's pair; the repeat was refused.
    let landed = peer.sim.messages(&chat(&target));
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].text, "你好，世界");
    assert_eq!(landed[0].reply_to.as_deref(), Some(msg_id.as_str()));
    assert_eq!(landed[0].msg_seq, Some(seq));
    let repeats: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.code == CODE_DEDUPLICATED)
        .collect();
    assert_eq!(repeats.len(), 1);
    assert_eq!(repeats[0].status, 400);
    // A unit whose answer was lost before it reached QQ is sent by the same check.
    let other = crate::send::ctx(&target, &format!("qq:reply:{msg_id}:1"));
    peer.sim.inject(Fault::new(FaultKind::ServerError(502)));
    assert!(adapter.send_unit(&other, &text(0, "second")).await.is_err());
    let Reconciliation::Sent(second) = adapter
        .reconcile_unknown_send(&other, &text(0, "second"))
        .await
        .unwrap()
    else {
        panic!("the check sends a reply that never landed");
    };
    assert!(second.platform_message_id.starts_with("ROBOT1.0_sim"));
    assert_eq!(peer.texts(&chat(&target)), vec!["你好，世界", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_passive_window_falls_back_to_active_messages_within_the_quota_then_refuses() {
    let peer = Peer::with(quick(), json!({ "active_quota_per_month": 2 })).await;
    let adapter = peer.plugin.sender.clone();
    for (case, expire) in [
        ("c2c", Duration::from_secs(3_601)),
        ("group", Duration::from_secs(301)),
    ] {
        let (target, msg_id) = if case == "c2c" {
            peer.person_with_id("window")
        } else {
            let msg_id = peer.sim.member_writes("G1", "M1", "hi");
            (MessageTarget::group("G1"), msg_id)
        };
        peer.sim.age_inbound(&msg_id, expire);
        for n in 0..3 {
            let ctx = ctx(&target, &format!("qq:reply:{msg_id}:{n}"));
            let sent = adapter
                .send_unit(&ctx, &text(0, &format!("late {n}")))
                .await;
            if n < 2 {
                let part = sent.unwrap();
                assert_eq!(part.raw.as_ref().unwrap()["passive"], false, "{case}");
            } else {
                let error = sent.unwrap_err();
                assert_eq!(error.kind, DeliveryFailureKind::Permission, "{case}");
                assert_eq!(error.side_effect, SideEffect::None, "{case}");
                assert!(
                    error.message.contains("active_quota_per_month"),
                    "{case}: {error}"
                );
            }
        }
        let landed = peer.sim.messages(&chat(&target));
        assert_eq!(landed.len(), 2, "{case}");
        assert!(landed.iter().all(|m| m.reply_to.is_none()), "{case}");
        assert_eq!(peer.sim.active_sent(&target.id), 2, "{case}");
    }
    // With active messages off, the refusal is immediate and says so.
    let off = Peer::with(quick(), json!({ "active_quota_per_month": 0 })).await;
    let (target, msg_id) = off.person_with_id("off");
    off.sim.age_inbound(&msg_id, Duration::from_secs(3_601));
    let error = off
        .plugin
        .sender
        .send_unit(
            &ctx(&target, &format!("qq:reply:{msg_id}:0")),
            &text(0, "late"),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission);
    assert!(error.message.contains("active messages are off"), "{error}");
    assert!(off.sim.all_messages().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_active_answer_is_parked_also_after_a_restart_and_never_sent_twice() {
    let peer = Peer::start().await;
    let (target, msg_id) = peer.person_with_id("active");
    peer.sim.age_inbound(&msg_id, Duration::from_secs(3_601));
    let adapter = peer.plugin.sender.clone();
    let answered = ctx(&target, &format!("qq:reply:{msg_id}:0"));
    let part = adapter
        .send_unit(&answered, &text(0, "answered"))
        .await
        .unwrap();
    let lost = ctx(&target, &format!("qq:reply:{msg_id}:1"));
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let error = adapter
        .send_unit(&lost, &text(0, "lost"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    // A second process on the same state directory (a restart).
    let restarted = build(
        peer.state.path(),
        settings(
            &peer.sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({}),
        ),
        &peer.sim.secret(),
    )
    .await
    .unwrap()
    .sender;
    for adapter in [adapter, restarted] {
        assert_eq!(
            adapter
                .reconcile_unknown_send(&lost, &text(0, "lost"))
                .await
                .unwrap(),
            Reconciliation::Undecidable
        );
        let Reconciliation::Sent(found) = adapter
            .reconcile_unknown_send(&answered, &text(0, "answered"))
            .await
            .unwrap()
        else {
            panic!("an answered active message is settled from the journal");
        };
        assert_eq!(found.platform_message_id, part.platform_message_id);
    }
    assert_eq!(peer.texts(&chat(&target)), vec!["answered", "lost"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_out_of_replies_goes_active_and_a_closed_window_on_recheck_parks() {
    let peer = Peer::start().await;
    let (target, msg_id) = peer.person_with_id("replies");
    let adapter = peer.plugin.sender.clone();
    for n in 0..6 {
        let ctx = ctx(&target, &format!("qq:reply:{msg_id}:{n}"));
        let part = adapter
            .send_unit(&ctx, &text(0, &format!("r{n}")))
            .await
            .unwrap();
        // QQ allows five replies to one message; the sixth goes out as an active message.
        assert_eq!(part.raw.as_ref().unwrap()["passive"], n < 5, "reply {n}");
    }
    // A passive reply whose answer was lost, checked after the window closed: parked.
    let (target, msg_id) = peer.person_with_id("late-check");
    let ctx = ctx(&target, &format!("qq:reply:{msg_id}:0"));
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    assert!(adapter.send_unit(&ctx, &text(0, "x")).await.is_err());
    peer.sim.age_inbound(&msg_id, Duration::from_secs(3_601));
    assert_eq!(
        adapter
            .reconcile_unknown_send(&ctx, &text(0, "x"))
            .await
            .unwrap(),
        Reconciliation::Undecidable
    );
    assert_eq!(peer.texts(&chat(&target)), vec!["x"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_fetched_again_once_and_the_send_goes_through() {
    let peer = Peer::start().await;
    let (target, msg_id) = peer.person_with_id("token");
    peer.sim.expire_tokens();
    let ctx = ctx(&target, &format!("qq:reply:{msg_id}:0"));
    peer.plugin
        .sender
        .send_unit(&ctx, &text(0, "after expiry"))
        .await
        .unwrap();
    let calls = peer.sim.calls();
    let tokens = calls
        .iter()
        .filter(|c| c.path == "/app/getAppAccessToken")
        .count();
    assert_eq!(tokens, 2, "the start-up token, then one after the 401");
    let refused: Vec<_> = calls.iter().filter(|c| c.status == 401).collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(peer.texts(&chat(&target)), vec!["after expiry"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_tags_are_uploaded_then_sent_as_msg_type_7_in_reading_order() {
    let peer = Peer::start().await;
    let (target, msg_id) = peer.person_with_id("media");
    let adapter = peer.plugin.sender.clone();
    let key = format!("qq:reply:{msg_id}:0");
    let message = ChannelMessage::outbound(
        "m",
        "qq",
        target.clone(),
        "a cat <qqimg>https://img.example/cat.png</qqimg> and a clip <qqvideo>https://v.example/c.mp4</qqvideo>",
    );
    let batch = adapter
        .render()
        .unwrap()
        .render(&message, adapter.capabilities(), &key)
        .unwrap();
    let ctx = ctx(&target, &key);
    for unit in &batch.units {
        assert_eq!(unit.payload["replyTo"], msg_id.as_str());
        adapter.send_unit(&ctx, unit).await.unwrap();
    }
    let landed = peer.sim.messages(&chat(&target));
    let shape: Vec<(u64, Option<(u64, String)>)> = landed
        .iter()
        .map(|m| (m.msg_type, m.media.clone()))
        .collect();
    assert_eq!(
        shape,
        vec![
            (0, None),
            (7, Some((1, "https://img.example/cat.png".to_owned()))),
            (0, None),
            (7, Some((2, "https://v.example/c.mp4".to_owned()))),
        ]
    );
    assert!(
        landed
            .iter()
            .all(|m| m.reply_to.as_deref() == Some(msg_id.as_str()))
    );
    let uploads = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path.ends_with("/files"))
        .count();
    assert_eq!(uploads, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_as_voice_speaks_through_the_tts_command_and_falls_back_to_text() {
    let tts = json!(["sh", "-c", "printf '#!SILK_V3'; cat"]);
    let peer = Peer::with(quick(), json!({ "tts_command": tts })).await;
    let (target, msg_id) = peer.person_with_id("voice");
    let adapter = peer.plugin.sender.clone();
    let key = format!("qq:reply:{msg_id}:0");
    let mut message = ChannelMessage::outbound("m", "qq", target.clone(), "早上好");
    message.body.as_mut().unwrap().format = Some("voice".into());
    let renderer = adapter.render().unwrap();
    let batch = renderer
        .render(&message, adapter.capabilities(), &key)
        .unwrap();
    assert_eq!(batch.units[0].kind, MessagePartKind::Voice);
    assert!(
        !adapter.previews(&message),
        "a spoken reply is not streamed"
    );
    adapter
        .send_unit(&ctx(&target, &key), &batch.units[0])
        .await
        .unwrap();
    let landed = peer.sim.messages(&chat(&target));
    let bytes = "#!SILK_V3早上好".len();
    assert_eq!(landed[0].media, Some((3, format!("data:{bytes} bytes"))));
    let upload = peer
        .sim
        .calls()
        .into_iter()
        .find(|c| c.path.ends_with("/files"))
        .unwrap();
    assert_eq!(upload.body["file_type"], 3);
    assert_eq!(upload.body["srv_send_msg"], false);
    // A command whose audio QQ refuses (not SILK) fails as a payload error: the fallback is
    // the plain text.
    let wav = Peer::with(
        quick(),
        json!({ "tts_command": ["sh", "-c", "printf RIFF; cat"], "text_as_voice": true }),
    )
    .await;
    let (target, msg_id) = wav.person_with_id("wav");
    let key = format!("qq:reply:{msg_id}:0");
    let message = ChannelMessage::outbound("m", "qq", target.clone(), "早上好");
    let sender = wav.plugin.sender.clone();
    let batch = sender
        .render()
        .unwrap()
        .render(&message, sender.capabilities(), &key)
        .unwrap();
    let error = sender
        .send_unit(&ctx(&target, &key), &batch.units[0])
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload, "{error}");
    let fallback = sender
        .render()
        .unwrap()
        .render_fallback(&message, sender.capabilities(), &key)
        .unwrap();
    sender
        .send_unit(&ctx(&target, &key), &fallback.units[0])
        .await
        .unwrap();
    assert_eq!(wav.texts(&chat(&target)), vec!["早上好"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_stops_the_build_naming_secret_env_and_no_secret_prints() {
    let peer = Peer::start().await;
    let error = build(
        tempfile::tempdir().unwrap().path(),
        settings(
            &peer.sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({}),
        ),
        "not-the-bot-secret",
    )
    .await
    .unwrap_err();
    assert_eq!(error.key, "channels[0].settings.secret_env");
    assert!(error.reason.contains("100016"), "{error}");
    assert!(!error.to_string().contains("not-the-bot-secret"));
    let secret = peer.sim.secret();
    let shown = format!("{:?}", peer.plugin);
    assert!(!shown.contains(&secret), "{shown}");
    // Nor does the simulator's record of the token request keep it.
    let token_call = peer
        .sim
        .calls()
        .into_iter()
        .find(|c| c.path == "/app/getAppAccessToken")
        .unwrap();
    assert!(!token_call.body.to_string().contains(&secret));
    let relation = Some(MessageRelation::reply_to("X"));
    let mut message = ChannelMessage::outbound("m", "qq", MessageTarget::channel("C"), "x");
    message.relation = relation;
    let error = peer
        .plugin
        .sender
        .send_unit(&SendContext::new(message, "k"), &text(0, "x"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_target_chosen_at_send_time_is_journaled_so_a_restart_settles_the_same_pair() {
    let peer = Peer::start().await;
    // A unit that names no inbound message (no reply key, no relation, no render choice):
    // it answers the chat's latest message, which only this process remembers.
    let (target, msg_id) = peer.person_with_id("chosen");
    let mut ctx = ctx(&target, "qq:relay:notice-1");
    ctx.intent_id = Some(
        clawgate_channel_sdk::types::IntentId::parse("0193b0c2-7d3e-7a11-8000-000000000001")
            .unwrap(),
    );
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx, &text(0, "a notice"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    // After a restart the chat's latest message is forgotten; the journal still names it.
    let restarted = build(
        peer.state.path(),
        settings(
            &peer.sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({}),
        ),
        &peer.sim.secret(),
    )
    .await
    .unwrap()
    .sender;
    let Reconciliation::Sent(part) = restarted
        .reconcile_unknown_send(&ctx, &text(0, "a notice"))
        .await
        .unwrap()
    else {
        panic!("the passive reply is settled by its journaled pair");
    };
    let seq = msg_seq_of("qq:relay:notice-1#0");
    assert_eq!(part.platform_message_id, format!("{msg_id}:{seq}"));
    assert_eq!(peer.texts(&chat(&target)), vec!["a notice"]);
}
