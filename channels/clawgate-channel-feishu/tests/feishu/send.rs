//! Sends as Feishu answers them: the unit's `uuid` on every create and reply, a lost answer
//! settled by resending the same `uuid` (no second message) or, past the window, from the chat's
//! history; `code ≠ 0` under HTTP 200 is a refusal; text / post / card rendering through the
//! render adapter; the seed's duplicate-final suppression (the streaming card is the final, no
//! extra message) and the 300309 fallback to a full card update.

use clawgate_channel_feishu::simulator::{CARDS_PATH, Fault, FaultKind};
use clawgate_channel_feishu::uuid_of;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::types::{
    MessageBody, MessagePartKind, MessageRelation, RenderedMessageUnit,
};
use clawgate_channel_sdk::{Reconciliation, SendContext, SideEffect};
use serde_json::{Value, json};

use crate::peer::{Peer, quick};

fn message(chat: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound("m1", "feishu", MessageTarget::group(chat), text)
}

/// The units the channel's renderer makes of `message`.
fn render(peer: &Peer, message: &ChannelMessage, key: &str) -> Vec<RenderedMessageUnit> {
    let adapter = &peer.plugin.sender;
    adapter
        .render()
        .unwrap()
        .render(message, adapter.capabilities(), key)
        .unwrap()
        .units
}

fn creates(peer: &Peer) -> Vec<Value> {
    peer.sim
        .calls()
        .into_iter()
        .filter(|c| c.method == "POST" && c.path.starts_with("/open-apis/im/v1/messages"))
        .map(|c| c.body)
        .collect()
}

#[tokio::test]
async fn a_lost_answer_is_settled_by_the_same_uuid_without_a_second_message() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    let person = peer.sim.writes(&chat, "ada", "question");
    let mut m = message(&chat, "the answer");
    m.relation = Some(MessageRelation::reply_to_inbound(&person.message_id));
    let ctx = SendContext::new(m.clone(), "feishu:reply:1");
    let unit = &render(&peer, &m, "feishu:reply:1")[0];
    peer.sim.inject(Fault::once(FaultKind::LoseAnswer));
    let lost = peer.plugin.sender.send_unit(&ctx, unit).await.unwrap_err();
    assert_eq!(lost.side_effect, SideEffect::Possible);
    let Reconciliation::Sent(part) = peer
        .plugin
        .sender
        .reconcile_unknown_send(&ctx, unit)
        .await
        .unwrap()
    else {
        panic!("the resend under the same uuid settles it");
    };
    let shown = peer.sim.bot_messages(&chat);
    assert_eq!(shown.len(), 1, "one message: {shown:?}");
    assert_eq!(shown[0].message_id, part.platform_message_id);
    assert_eq!(
        shown[0].parent_id.as_deref(),
        Some(person.message_id.as_str())
    );
    let uuid = uuid_of(&ctx.unit_key(unit));
    let sent: Vec<Value> = creates(&peer)
        .into_iter()
        .map(|b| b["uuid"].clone())
        .collect();
    assert_eq!(
        sent,
        [json!(uuid), json!(uuid)],
        "both attempts carried the unit's uuid"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn past_the_uuid_window_history_finds_the_message_or_proves_it_absent() {
    let peer = Peer::with(quick(), json!({ "uuid_window_ms": 0 })).await;
    let chat = peer.sim.group("g", &["ada"]);
    let m = message(&chat, "landed before the hour passed");
    let ctx = SendContext::new(m.clone(), "k1");
    let unit = &render(&peer, &m, "k1")[0];
    peer.sim.inject(Fault::once(FaultKind::LoseAnswer));
    peer.plugin.sender.send_unit(&ctx, unit).await.unwrap_err();
    peer.sim.expire_uuids();
    // Other messages around it, one of the bot's with other text: only the exact content counts.
    peer.sim
        .writes(&chat, "ada", "landed before the hour passed");
    let other = message(&chat, "something else");
    let other_ctx = SendContext::new(other.clone(), "k0");
    peer.plugin
        .sender
        .send_unit(&other_ctx, &render(&peer, &other, "k0")[0])
        .await
        .unwrap();
    let Reconciliation::Sent(part) = peer
        .plugin
        .sender
        .reconcile_unknown_send(&ctx, unit)
        .await
        .unwrap()
    else {
        panic!("history has it");
    };
    assert_eq!(
        peer.texts(&chat),
        ["landed before the hour passed", "something else"]
    );
    assert_eq!(
        peer.sim.bot_messages(&chat)[0].message_id,
        part.platform_message_id
    );
    // A gateway error page after the call: it never landed, and history proves it.
    let absent = message(&chat, "never landed");
    let absent_ctx = SendContext::new(absent.clone(), "k2");
    let absent_unit = &render(&peer, &absent, "k2")[0];
    peer.sim.inject(Fault::once(FaultKind::ServerError(502)));
    let lost = peer
        .plugin
        .sender
        .send_unit(&absent_ctx, absent_unit)
        .await
        .unwrap_err();
    assert_eq!(
        lost.side_effect,
        SideEffect::Possible,
        "a 502 page is not Feishu's answer"
    );
    assert_eq!(
        peer.plugin
            .sender
            .reconcile_unknown_send(&absent_ctx, absent_unit)
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    let listed: Vec<String> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.method == "GET" && c.path == "/open-apis/im/v1/messages")
        .map(|c| c.query)
        .collect();
    assert!(
        listed.iter().all(|q| q.contains("container_id_type=chat")),
        "{listed:?}"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_code_in_a_200_body_is_a_refusal_and_sends_nothing() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    let m = message(&chat, "refused");
    let ctx = SendContext::new(m.clone(), "k");
    let unit = &render(&peer, &m, "k")[0];
    peer.sim.inject(Fault::once(FaultKind::Refuse(
        200,
        230_099,
        "Failed to create card content".into(),
    )));
    let error = peer.plugin.sender.send_unit(&ctx, unit).await.unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::InvalidPayload, SideEffect::None)
    );
    assert!(error.message.contains("230099"), "{}", error.message);
    peer.sim.inject(Fault::once(FaultKind::ChatRateLimited));
    let limited = peer.plugin.sender.send_unit(&ctx, unit).await.unwrap_err();
    assert_eq!(limited.kind, DeliveryFailureKind::RateLimit);
    peer.sim.inject(Fault::once(FaultKind::RateLimited(4)));
    let limited = peer.plugin.sender.send_unit(&ctx, unit).await.unwrap_err();
    assert_eq!(
        (limited.kind, limited.retry_after_ms),
        (DeliveryFailureKind::RateLimit, Some(4_000))
    );
    assert!(peer.sim.bot_messages(&chat).is_empty());
    // An expired tenant token is fetched again and the call goes through once.
    peer.sim.expire_tokens();
    peer.plugin.sender.send_unit(&ctx, unit).await.unwrap();
    assert_eq!(peer.texts(&chat), ["refused"]);
    peer.sim.stop().await;
}

#[tokio::test]
async fn text_markdown_and_card_render_through_the_render_adapter() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    for (format, msg_type) in [
        (None, "text"),
        (Some("markdown"), "post"),
        (Some("card"), "interactive"),
    ] {
        let mut m = message(&chat, &format!("**{msg_type}**"));
        let mut body = MessageBody::new(format!("**{msg_type}**"));
        body.format = format.map(str::to_owned);
        m.body = Some(body);
        let key = format!("k-{msg_type}");
        let ctx = SendContext::new(m.clone(), &key);
        for unit in render(&peer, &m, &key) {
            peer.plugin.sender.send_unit(&ctx, &unit).await.unwrap();
        }
    }
    let shown: Vec<(String, String)> = peer
        .sim
        .bot_messages(&chat)
        .into_iter()
        .map(|m| (m.msg_type, m.text))
        .collect();
    assert_eq!(
        shown,
        [
            ("text".to_owned(), "**text**".to_owned()),
            ("post".to_owned(), "**post**".to_owned()),
            ("interactive".to_owned(), "**interactive**".to_owned()),
        ]
    );
    peer.sim.stop().await;
}

fn preview(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::new(0, MessagePartKind::Preview, json!({ "text": text }))
}

#[tokio::test]
async fn the_streaming_card_is_the_final_and_no_second_message_carries_it() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    let m = message(&chat, "");
    let ctx = SendContext::new(m.clone(), "reply-1");
    let live = peer.plugin.sender.live().unwrap();
    let shown = live.show(&ctx, &preview("Thinking")).await.unwrap();
    live.replace(&ctx, &shown, &preview("Thinking about"))
        .await
        .unwrap();
    live.replace(&ctx, &shown, &preview("Thinking about it"))
        .await
        .unwrap();
    assert!(live.can_finalize_in_place(&shown));
    let final_unit = &render(&peer, &message(&chat, "The answer is 42."), "reply-1")[0];
    let part = live.finalize(&ctx, &shown, final_unit).await.unwrap();
    assert_eq!(part.platform_message_id, shown.platform_message_id);
    let bot = peer.sim.bot_messages(&chat);
    assert_eq!(bot.len(), 1, "the final is the card: {bot:?}");
    assert_eq!(bot[0].text, "The answer is 42.");
    assert!(!bot[0].streaming, "streaming is closed");
    let sequences: Vec<i64> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path.starts_with(CARDS_PATH) && c.method != "POST")
        .map(|c| c.body["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(sequences.len(), 4, "three streamed texts and the settings");
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "strictly increasing: {sequences:?}"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_card_whose_streaming_was_closed_is_replaced_whole() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    let ctx = SendContext::new(message(&chat, ""), "reply-2");
    let live = peer.plugin.sender.live().unwrap();
    let shown = live.show(&ctx, &preview("Draft")).await.unwrap();
    let card = peer.sim.bot_messages(&chat)[0].card_id.clone().unwrap();
    assert!(peer.sim.close_streaming(&card));
    live.replace(&ctx, &shown, &preview("Draft two"))
        .await
        .unwrap();
    assert_eq!(peer.texts(&chat), ["Draft two"]);
    let final_unit = &render(&peer, &message(&chat, "Final text"), "reply-2")[0];
    live.finalize(&ctx, &shown, final_unit).await.unwrap();
    assert_eq!(peer.texts(&chat), ["Final text"]);
    let codes: Vec<(String, i64)> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path.starts_with(CARDS_PATH))
        .map(|c| {
            (
                format!("{} {}", c.method, c.path.rsplit('/').next().unwrap()),
                c.code,
            )
        })
        .collect();
    assert_eq!(
        codes.iter().filter(|(_, code)| *code == 300_309).count(),
        2,
        "{codes:?}"
    );
    assert_eq!(
        codes
            .iter()
            .filter(|(call, code)| call.starts_with("PUT ")
                && !call.ends_with("content")
                && *code == 0)
            .count(),
        2,
        "{codes:?}"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_preview_settled_after_a_lost_answer_is_recalled_not_finalized() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    let mut m = message(&chat, "");
    m.id = "reply-3".into();
    let mut ctx = SendContext::new(m, "reply-3~preview");
    ctx.intent_id = None;
    let live = peer.plugin.sender.live().unwrap();
    peer.sim.inject(Fault::once(FaultKind::LoseAnswer));
    let unit = preview("Partial");
    live.show(&ctx, &unit).await.unwrap_err();
    let Reconciliation::Sent(part) = peer
        .plugin
        .sender
        .reconcile_unknown_send(&ctx, &unit)
        .await
        .unwrap()
    else {
        panic!("the same uuid settles the preview");
    };
    assert_eq!(
        peer.sim.bot_messages(&chat).len(),
        1,
        "the resend made no second card message"
    );
    assert!(
        !live.can_finalize_in_place(&part),
        "its card entity is not certain"
    );
    live.remove(
        &ctx,
        &part,
        clawgate_channel_sdk::types::LiveCancelReason::Error,
    )
    .await
    .unwrap();
    assert!(peer.sim.bot_messages(&chat).is_empty());
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_reply_to_a_thread_lands_in_the_thread() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    let root = peer.sim.writes(&chat, "ada", "topic");
    let inside = peer
        .sim
        .writes_in_thread(&root.message_id, "ada", "in the thread")
        .unwrap();
    let event = peer.sim.event(&inside.event_id).unwrap();
    let inbound = peer
        .plugin
        .receiver
        .clone()
        .unwrap()
        .normalize(&event)
        .unwrap()
        .message;
    let thread = inbound.target.thread_id.clone().unwrap();
    let mut m = ChannelMessage::outbound("r", "feishu", inbound.target.clone(), "threaded answer");
    m.relation = Some(MessageRelation::reply_to_inbound(&inside.message_id));
    let ctx = SendContext::new(m.clone(), "k");
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx, &render(&peer, &m, "k")[0])
        .await
        .unwrap();
    assert_eq!(part.thread_id.as_deref(), Some(thread.as_str()));
    let reply = creates(&peer).pop().unwrap();
    assert_eq!(reply["reply_in_thread"], true);
    peer.sim.stop().await;
}

/// A UUID v7 intent id created now (the engine's ids are these).
fn intent_id_now() -> clawgate_channel_sdk::types::IntentId {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let hex = format!("{ms:012x}");
    clawgate_channel_sdk::types::IntentId::parse(format!(
        "{}-{}-7000-8000-000000000001",
        &hex[..8],
        &hex[8..12]
    ))
    .unwrap()
}

#[tokio::test]
async fn after_a_restart_a_recent_intents_unit_is_settled_by_its_uuid() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    let m = message(&chat, "sent before the crash");
    let mut ctx = SendContext::new(m.clone(), "feishu:reply:crash");
    ctx.intent_id = Some(intent_id_now());
    let unit = &render(&peer, &m, "feishu:reply:crash")[0];
    peer.sim.inject(Fault::once(FaultKind::LoseAnswer));
    peer.plugin.sender.send_unit(&ctx, unit).await.unwrap_err();
    let restarted = peer.rebuilt(&json!({})).await;
    let Reconciliation::Sent(part) = restarted
        .sender
        .reconcile_unknown_send(&ctx, unit)
        .await
        .unwrap()
    else {
        panic!("the uuid settles it after the restart");
    };
    let bot = peer.sim.bot_messages(&chat);
    assert_eq!(bot.len(), 1, "{bot:?}");
    assert_eq!(bot[0].message_id, part.platform_message_id);
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_refused_app_secret_stops_the_start_naming_its_setting() {
    let peer = Peer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut secrets = crate::peer::secrets(&peer.sim);
    secrets.app_secret = Secret::new("not the secret");
    let error = crate::peer::build(
        &peer.sim,
        dir.path(),
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({}),
        secrets,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("app_secret_env") && error.contains("10014"),
        "{error}"
    );
    assert!(
        !error.contains("not the secret"),
        "the secret never prints: {error}"
    );
    let unknown = crate::peer::build(
        &peer.sim,
        dir.path(),
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({ "answer_deadline_ms": 3000 }),
        crate::peer::secrets(&peer.sim),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(unknown.contains("answer_deadline_ms"), "{unknown}");
    peer.sim.stop().await;
}

#[tokio::test]
async fn probing_for_a_preview_that_never_landed_leaves_nothing_behind() {
    let peer = Peer::start().await;
    let chat = peer.sim.group("g", &["ada"]);
    // After a restart the engine asks whether a preview it has no record of exists.
    let mut ctx = SendContext::new(message(&chat, ""), "reply-4~preview");
    ctx.intent_id = Some(intent_id_now());
    let probe = preview("");
    assert_eq!(
        peer.plugin
            .sender
            .reconcile_unknown_send(&ctx, &probe)
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    assert!(
        peer.sim.bot_messages(&chat).is_empty(),
        "the probe's own message is recalled"
    );
    // One that did land is found (and is the engine's to remove).
    peer.sim.inject(Fault::once(FaultKind::LoseAnswer));
    let live = peer.plugin.sender.live().unwrap();
    let lost = preview("Partial");
    let mut landed_ctx = SendContext::new(message(&chat, ""), "reply-5~preview");
    landed_ctx.intent_id = Some(intent_id_now());
    live.show(&landed_ctx, &lost).await.unwrap_err();
    let restarted = peer.rebuilt(&json!({})).await;
    let Reconciliation::Sent(part) = restarted
        .sender
        .reconcile_unknown_send(&landed_ctx, &probe)
        .await
        .unwrap()
    else {
        panic!("the landed preview is found");
    };
    let bot = peer.sim.bot_messages(&chat);
    assert_eq!(bot.len(), 1, "{bot:?}");
    assert_eq!(
        (bot[0].message_id.as_str(), bot[0].text.as_str()),
        (part.platform_message_id.as_str(), "Partial")
    );
    peer.sim.stop().await;
}
