//! Sends as Google Chat answers them: client-assigned ids and requestIds on every create,
//! receipts with threads, reply options, refusals as failure classes, the per-space quota,
//! edits, deletes, and the durable reconciliation of an unknown send by GET of its id (found →
//! sent, 404 → not sent and sent again with the same ids).

use std::sync::Arc;

use clawgate_channel_googlechat::simulator::{Fault, FaultKind, Op, SimulatorConfig};
use clawgate_channel_googlechat::{GoogleChatOrigin, message_id_for};
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{Peer, quiet};

pub(crate) fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "googlechat", target.clone(), ""),
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
        "googlechat-tests",
    );
    (dir, messenger, clock)
}

fn creates(peer: &Peer) -> Vec<clawgate_channel_googlechat::simulator::CallRecord> {
    peer.sim
        .calls()
        .into_iter()
        .filter(|c| c.op == Op::Create)
        .collect()
}

#[tokio::test]
async fn every_create_carries_the_units_client_id_and_request_id_and_the_receipt_is_its_name() {
    let peer = Peer::start().await;
    let space = peer.room("ids");
    let target = MessageTarget::group(&space);
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx(&target, "ids-1"), &text("hello"))
        .await
        .unwrap();
    let id = message_id_for("ids-1#0", None);
    assert_eq!(part.platform_message_id, format!("{space}/messages/{id}"));
    let landed = peer.sim.messages(&space).pop().unwrap();
    assert_eq!(landed.name, part.platform_message_id);
    assert_eq!(landed.client_id.as_deref(), Some(id.as_str()));
    assert_eq!(part.thread_id.as_deref(), Some(landed.thread.as_str()));
    let call = creates(&peer).pop().unwrap();
    assert_eq!(call.param("messageId"), Some(id.as_str()));
    assert_eq!(call.param("requestId"), Some(id.as_str()));
    // Top level: no thread fields, no reply option.
    assert_eq!(call.param("messageReplyOption"), None);
    assert_eq!(call.body, json!({ "text": "hello" }));
}

#[tokio::test]
async fn replies_land_in_their_thread_and_an_unknown_thread_falls_back_to_a_new_one() {
    let peer = Peer::start().await;
    let space = peer.room("threads");
    let question = peer
        .sim
        .person_writes(&space, &peer.person, "question", None)
        .unwrap();
    let threaded = MessageTarget::group(&space).with_thread_id(Some(question.thread.clone()));
    let adapter = peer.plugin.sender.clone();
    let part = adapter
        .send_unit(&ctx(&threaded, "t-1"), &text("answer"))
        .await
        .unwrap();
    assert_eq!(part.thread_id.as_deref(), Some(question.thread.as_str()));
    let answer = peer.sim.messages(&space).pop().unwrap();
    assert!(answer.thread_reply, "{answer:?}");
    let call = creates(&peer).pop().unwrap();
    assert_eq!(
        call.param("messageReplyOption"),
        Some("REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD")
    );
    assert_eq!(call.body["thread"]["name"], json!(question.thread));
    // A thread that does not exist: the message starts one instead of failing.
    let gone = MessageTarget::group(&space).with_thread_id(Some(format!("{space}/threads/none")));
    let part = adapter
        .send_unit(&ctx(&gone, "t-2"), &text("fresh"))
        .await
        .unwrap();
    let fresh = peer.sim.messages(&space).pop().unwrap();
    assert!(!fresh.thread_reply);
    assert_ne!(fresh.thread, format!("{space}/threads/none"));
    assert_eq!(part.thread_id.as_deref(), Some(fresh.thread.as_str()));
    // A thread key of our own: the first message starts the thread, the next one joins it.
    let keyed = MessageTarget::group(&space).with_thread_id(Some("ticket-42".to_owned()));
    let first = adapter
        .send_unit(&ctx(&keyed, "t-3"), &text("one"))
        .await
        .unwrap();
    let second = adapter
        .send_unit(&ctx(&keyed, "t-4"), &text("two"))
        .await
        .unwrap();
    assert_eq!(first.thread_id, second.thread_id);
    assert!(peer.sim.messages(&space).pop().unwrap().thread_reply);
}

#[tokio::test]
async fn edits_patch_the_text_in_place_and_deletes_are_idempotent() {
    let peer = Peer::start().await;
    let space = peer.room("edits");
    let target = MessageTarget::group(&space);
    let adapter = peer.plugin.sender.clone();
    let c = ctx(&target, "e-1");
    let part = adapter.send_unit(&c, &text("draft")).await.unwrap();
    // The first patch's answer is lost: it is sent again, and the message shows it once.
    peer.sim.inject(Fault::on(Op::Patch, FaultKind::LoseAnswer));
    adapter.edit(&c, &part, &text("final")).await.unwrap();
    let shown = peer.sim.messages(&space).pop().unwrap();
    assert_eq!((shown.text.as_str(), shown.edits), ("final", 2));
    let patch = peer
        .sim
        .calls()
        .into_iter()
        .rfind(|c| c.op == Op::Patch)
        .unwrap();
    assert_eq!(patch.param("updateMask"), Some("text"));
    adapter.delete(&c, &part).await.unwrap();
    assert!(peer.texts(&space).is_empty());
    adapter.delete(&c, &part).await.unwrap();
}

#[tokio::test]
async fn the_per_space_quota_is_a_rate_limit_with_a_wait_and_nothing_lands() {
    let config = SimulatorConfig {
        rate_limits: true,
        ..quiet()
    };
    let peer = Peer::with(config, json!({})).await;
    let space = peer.room("quota");
    let target = MessageTarget::group(&space);
    let adapter = peer.plugin.sender.clone();
    let limit = clawgate_channel_googlechat::simulator::SPACE_WRITES_PER_MINUTE;
    for i in 0..limit {
        adapter
            .send_unit(&ctx(&target, &format!("q-{i}")), &text("x"))
            .await
            .unwrap();
    }
    let error = adapter
        .send_unit(&ctx(&target, "q-over"), &text("over"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(
        error.retry_after_ms.is_some_and(|ms| ms >= 1_000),
        "{error:?}"
    );
    assert_eq!(error.platform_code.as_deref(), Some("RESOURCE_EXHAUSTED"));
    assert_eq!(peer.texts(&space).len(), limit);
    // Another space has its own quota.
    let other = MessageTarget::group(peer.room("quota-2"));
    adapter
        .send_unit(&ctx(&other, "q-elsewhere"), &text("fine"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_proxy_page_is_an_unknown_outcome_and_a_removed_app_is_a_permission_refusal() {
    let peer = Peer::start().await;
    let space = peer.room("odd");
    let target = MessageTarget::group(&space);
    let adapter = peer.plugin.sender.clone();
    peer.sim
        .inject(Fault::on(Op::Create, FaultKind::NotGoogle(502)));
    let error = adapter
        .send_unit(&ctx(&target, "o-1"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    peer.sim.remove_app(&space, &peer.person);
    let error = adapter
        .send_unit(&ctx(&target, "o-2"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Permission, SideEffect::None)
    );
    assert!(
        error.message.contains("add the Chat app to the space"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn a_lost_create_reconciles_as_sent_by_a_get_of_its_client_id() {
    let peer = Peer::start().await;
    let space = peer.room("lost");
    let target = MessageTarget::group(&space);
    let adapter = peer.plugin.sender.clone();
    let c = ctx(&target, "l-1");
    peer.sim
        .inject(Fault::on(Op::Create, FaultKind::LoseAnswer));
    let error = adapter.send_unit(&c, &text("landed")).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let landed = peer.sim.messages(&space).pop().unwrap();
    match adapter
        .reconcile_unknown_send(&c, &text("landed"))
        .await
        .unwrap()
    {
        Reconciliation::Sent(part) => {
            assert_eq!(part.platform_message_id, landed.name);
            assert_eq!(part.thread_id.as_deref(), Some(landed.thread.as_str()));
        }
        other => panic!("a landed create reconciles as sent, got {other:?}"),
    }
    let get = peer
        .sim
        .calls()
        .into_iter()
        .rfind(|c| c.op == Op::Get)
        .unwrap();
    assert_eq!(
        get.path,
        format!("/v1/{space}/messages/{}", message_id_for("l-1#0", None))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_settles_both_outcomes_durably_with_one_message_each() {
    let peer = Peer::start().await;
    let space = peer.room("engine");
    let target = MessageTarget::group(&space);
    let (_dir, messenger, clock) = engine(&peer);
    // One create lands and loses its answer; the other never lands (a proxy's 502).
    peer.sim
        .inject(Fault::on(Op::Create, FaultKind::LoseAnswer));
    let landed = messenger
        .send(
            ChannelMessage::outbound("e-1", "googlechat", target.clone(), "landed"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    peer.sim
        .inject(Fault::on(Op::Create, FaultKind::NotGoogle(502)));
    let never = messenger
        .send(
            ChannelMessage::outbound("e-2", "googlechat", target.clone(), "never landed"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    for report in [&landed, &never] {
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    assert_eq!(peer.texts(&space), ["landed"]);
    for _ in 0..3 {
        clock.advance(5_000);
        messenger.recover().await.unwrap();
    }
    assert_eq!(peer.texts(&space), ["landed", "never landed"]);
    let calls = creates(&peer);
    let ids: Vec<_> = calls
        .iter()
        .map(|c| c.param("messageId").unwrap())
        .collect();
    let landed_id = peer.sim.messages(&space)[0].client_id.clone().unwrap();
    let never_id = ids[1];
    assert_ne!(landed_id, never_id);
    assert_eq!(
        ids,
        [landed_id.as_str(), never_id, never_id],
        "the landed one found by GET, never sent again; the other sent again under its ids"
    );
    assert_eq!(calls[2].param("requestId"), Some(never_id));
    let gets: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.op == Op::Get)
        .map(|c| c.status)
        .collect();
    assert!(gets.contains(&200) && gets.contains(&404), "{gets:?}");
}

#[tokio::test]
async fn a_taken_client_id_is_this_unit_sent_before_and_settles_as_sent() {
    let peer = Peer::start().await;
    let space = peer.room("taken");
    let target = MessageTarget::group(&space);
    let id = message_id_for("k-1#0", None);
    // The unit landed under another requestId (another instance, a forgotten request).
    let url = format!("{}v1/{space}/messages", peer.sim.api_url());
    let response = reqwest::Client::new()
        .post(&url)
        .bearer_auth(peer.sim.access_token())
        .query(&[("messageId", id.as_str()), ("requestId", "other-request")])
        .json(&json!({ "text": "first" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx(&target, "k-1"), &text("first"))
        .await
        .unwrap();
    assert_eq!(part.platform_message_id, format!("{space}/messages/{id}"));
    assert_eq!(peer.sim.messages(&space).len(), 1);
    let statuses: Vec<_> = creates(&peer).iter().map(|c| c.status).collect();
    assert_eq!(statuses, [200, 409]);
}

#[tokio::test]
async fn gateway_failure_output_carries_its_marker_in_the_client_id_and_stays_visible() {
    let peer = Peer::start().await;
    let space = peer.room("marked");
    let (_dir, messenger, _clock) = engine(&peer);
    let mut notice = ChannelMessage::outbound(
        "f-1",
        "googlechat",
        MessageTarget::group(&space),
        "Agent failed before reply.",
    );
    let origin =
        MessageOrigin::gateway_failure(clawgate_types::GatewayFailureCode::AgentFailedBeforeReply);
    notice.origin = Some(origin.clone());
    let report = messenger
        .send(notice, SendOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let landed = peer.sim.messages(&space).pop().unwrap();
    assert_eq!(landed.text, "Agent failed before reply.");
    let resource = peer.sim.resource(&landed);
    assert_eq!(GoogleChatOrigin.decode(&resource), Some(origin));
    assert!(landed.client_id.unwrap().starts_with("client-cgf1a-"));
}
