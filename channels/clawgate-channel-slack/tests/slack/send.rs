//! Sends as Slack answers them: receipts with threads, Slack's refusals as failure classes,
//! edits, deletes, the token check at start, origin metadata, and the reconciliation of an
//! unknown send from history by the unit's metadata key (found → sent, absent once the
//! platform settled → not sent).

use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_slack::simulator::{ConversationKind, Fault, FaultKind, SimulatorConfig};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{Peer, quiet};

pub(crate) fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "slack", target.clone(), ""),
        key,
    )
}

pub(crate) fn text(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn channel(peer: &Peer, name: &str) -> MessageTarget {
    MessageTarget::group(
        peer.sim
            .create_conversation(name, ConversationKind::Public, true),
    )
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
        "slack-tests",
    );
    (dir, messenger, clock)
}

#[tokio::test]
async fn receipts_are_channel_and_ts_and_keep_the_thread() {
    let peer = Peer::start().await;
    let target = channel(&peer, "receipts");
    let question = peer
        .sim
        .person_writes(&target.id, &peer.person, "question", None);
    let threaded = target.clone().with_thread_id(Some(question.ts.clone()));
    let adapter = peer.plugin.sender.clone();
    let part = adapter
        .send_unit(&ctx(&threaded, "r-1"), &text("answer"))
        .await
        .unwrap();
    let landed = peer.sim.messages(&target.id).pop().unwrap();
    assert_eq!(part.platform_message_id, landed.ts);
    assert_eq!(part.thread_id.as_deref(), Some(question.ts.as_str()));
    assert_eq!(part.edit_token.as_deref(), Some(target.id.as_str()));
    assert_eq!(landed.thread_ts.as_deref(), Some(question.ts.as_str()));
    // The unit's key rides in the message metadata.
    let meta = landed.metadata.unwrap();
    assert_eq!(meta["event_type"], "clawgate_message");
    assert_eq!(meta["event_payload"]["key"], "r-1#0");
    // An edit stays in the thread; a delete removes the message and a repeat is no error.
    adapter
        .edit(&ctx(&threaded, "r-1"), &part, &text("answer, edited"))
        .await
        .unwrap();
    assert_eq!(peer.texts(&target.id), ["answer, edited"]);
    adapter.delete(&ctx(&threaded, "r-1"), &part).await.unwrap();
    adapter.delete(&ctx(&threaded, "r-1"), &part).await.unwrap();
    assert!(peer.texts(&target.id).is_empty());
}

#[tokio::test]
async fn slacks_refusals_are_failure_classes_with_no_side_effect() {
    use DeliveryFailureKind::*;
    let peer = Peer::with(SimulatorConfig::default(), json!({})).await;
    let adapter = peer.plugin.sender.clone();
    let outside = MessageTarget::group(peer.sim.create_conversation(
        "outside",
        ConversationKind::Public,
        false,
    ));
    let archived = channel(&peer, "archived");
    peer.sim.archive(&archived.id);
    let cases = [
        (
            MessageTarget::group("C0NOPE"),
            NotFound,
            "channel_not_found",
        ),
        (outside, Permission, "not_in_channel"),
        (archived, Permission, "is_archived"),
    ];
    for (target, kind, code) in cases {
        let error = adapter
            .send_unit(&ctx(&target, code), &text("x"))
            .await
            .unwrap_err();
        assert_eq!(
            (
                error.kind,
                error.side_effect,
                error.platform_code.as_deref()
            ),
            (kind, SideEffect::None, Some(code)),
            "{error:?}"
        );
    }
    // The per-channel limit: a real 429 with Retry-After, reported in milliseconds.
    let busy = channel(&peer, "busy");
    let mut limited = None;
    for n in 0..6 {
        if let Err(error) = adapter
            .send_unit(&ctx(&busy, &format!("b-{n}")), &text("burst"))
            .await
        {
            limited = Some(error);
            break;
        }
    }
    let limited = limited.expect("the burst meets the limit");
    assert_eq!(
        (limited.kind, limited.side_effect),
        (RateLimit, SideEffect::None)
    );
    assert!(limited.retry_after_ms.unwrap() >= 1_000, "{limited:?}");
    peer.sim.revoke_token();
    let error = adapter
        .send_unit(&ctx(&busy, "revoked"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, Auth);
    assert!(
        error.message.contains("token_env"),
        "says what to do: {error:?}"
    );
    // internal_error may have half-happened: an unknown outcome, never a definite one.
    let peer = Peer::start().await;
    let target = channel(&peer, "internal");
    peer.sim.inject(Fault::on(
        "chat.postMessage",
        FaultKind::Error("internal_error".into()),
    ));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&target, "i"), &text("x"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (Unknown, SideEffect::Possible)
    );
}

#[tokio::test]
async fn update_errors_are_classified_and_a_lost_edit_answer_is_sent_again() {
    let peer = Peer::start().await;
    let target = channel(&peer, "updates");
    let adapter = peer.plugin.sender.clone();
    let c = ctx(&target, "u-1");
    let part = adapter.send_unit(&c, &text("first")).await.unwrap();
    let error = adapter
        .edit(&c, &part, &text(&"x".repeat(4_001)))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.platform_code.as_deref()),
        (DeliveryFailureKind::InvalidPayload, Some("msg_too_long"))
    );
    peer.sim
        .inject(Fault::on("chat.update", FaultKind::LoseAnswer));
    adapter.edit(&c, &part, &text("second")).await.unwrap();
    assert_eq!(peer.texts(&target.id), ["second"]);
    let updates = peer
        .sim
        .calls()
        .iter()
        .filter(|c| c.method == "chat.update")
        .count();
    assert_eq!(updates, 3, "the refused one, the lost one and its repeat");
    peer.sim
        .close_edit_window(&target.id, &part.platform_message_id);
    let error = adapter.edit(&c, &part, &text("third")).await.unwrap_err();
    assert_eq!(
        (error.kind, error.platform_code.as_deref()),
        (DeliveryFailureKind::Permission, Some("edit_window_closed"))
    );
}

#[tokio::test]
async fn a_refused_token_stops_the_start_naming_the_setting() {
    let peer = Peer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let setup = clawgate_conformance::channel_setup(
        0,
        "slack",
        "default",
        json!({
            "token_env": "SLACK_BOT_TOKEN",
            "signing_secret_env": "SLACK_SIGNING_SECRET",
            "api_base": peer.sim.api_url(),
            "events_listen": "127.0.0.1:0",
        }),
        dir.path(),
    );
    let error = clawgate_channel_slack::SlackFactory
        .build_with_secrets(&setup, Secret::new("xoxb-wrong"), Secret::new("s"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("token_env") && error.contains("invalid_auth"),
        "{error}"
    );
    assert!(
        !error.contains("xoxb-wrong"),
        "the token never prints: {error}"
    );
    let unknown = clawgate_conformance::channel_setup(
        0,
        "slack",
        "default",
        json!({ "token_env": "T", "signing_secret_env": "S", "events_listen": "127.0.0.1:0",
                "channel_allowlist": [] }),
        dir.path(),
    );
    let error = clawgate_channel_slack::SlackFactory
        .build_with_secrets(&unknown, Secret::new("x"), Secret::new("s"))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("channel_allowlist"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_failure_output_carries_its_origin_in_metadata_and_stays_visible() {
    let peer = Peer::start().await;
    let target = channel(&peer, "origin");
    let (_dir, messenger, _clock) = engine(&peer);
    let marker =
        MessageOrigin::gateway_failure(clawgate_types::GatewayFailureCode::AgentFailedBeforeReply);
    let mut notice =
        ChannelMessage::outbound("o-1", "slack", target.clone(), "Agent failed before reply.");
    notice.origin = Some(marker.clone());
    let report = messenger
        .send(notice, SendOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let landed = peer.sim.messages(&target.id).pop().unwrap();
    assert_eq!(landed.text, "Agent failed before reply.");
    let meta = landed.metadata.unwrap();
    assert_eq!(
        meta["event_payload"]["origin"],
        serde_json::to_value(&marker).unwrap()
    );
    assert!(
        meta["event_payload"]["key"]
            .as_str()
            .unwrap()
            .ends_with("o-1#0"),
        "{meta}"
    );
}

/// Asks until the answer is not `Unresolved` (the platform settled), up to 30 s.
async fn settled_answer(
    adapter: &Arc<dyn ChannelMessageAdapter>,
    ctx: &SendContext,
    unit: &RenderedMessageUnit,
) -> (Reconciliation, u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut unresolved = 0;
    loop {
        match adapter.reconcile_unknown_send(ctx, unit).await.unwrap() {
            Reconciliation::Unresolved => {
                unresolved += 1;
                assert!(Instant::now() < deadline, "never settled");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            answer => return (answer, unresolved),
        }
    }
}

#[tokio::test]
async fn an_unknown_send_found_by_its_key_in_history_or_replies_reconciles_as_sent() {
    let peer = Peer::start().await;
    let target = channel(&peer, "found");
    let adapter = peer.plugin.sender.clone();
    let question = peer
        .sim
        .person_writes(&target.id, &peer.person, "question", None);
    for (n, target) in [
        target.clone(),
        target.clone().with_thread_id(Some(question.ts.clone())),
    ]
    .into_iter()
    .enumerate()
    {
        // Other messages of ours around it, with other keys.
        adapter
            .send_unit(&ctx(&target, &format!("before-{n}")), &text("before"))
            .await
            .unwrap();
        peer.sim
            .inject(Fault::on("chat.postMessage", FaultKind::LoseAnswer));
        let c = ctx(&target, &format!("lost-{n}"));
        let error = adapter.send_unit(&c, &text("lost")).await.unwrap_err();
        assert_eq!(error.side_effect, SideEffect::Possible);
        adapter
            .send_unit(&ctx(&target, &format!("after-{n}")), &text("after"))
            .await
            .unwrap();
        let landed = peer
            .sim
            .messages(&target.id)
            .into_iter()
            .find(|m| {
                m.metadata.as_ref().unwrap_or(&json!({}))["event_payload"]["key"]
                    == format!("lost-{n}#0")
            })
            .unwrap();
        let Reconciliation::Sent(part) = adapter
            .reconcile_unknown_send(&c, &text("lost"))
            .await
            .unwrap()
        else {
            panic!("a landed unit is found at once");
        };
        assert_eq!(part.platform_message_id, landed.ts);
        assert_eq!(part.thread_id, target.thread_id);
        let method = if target.thread_id.is_some() {
            "conversations.replies"
        } else {
            "conversations.history"
        };
        let asked = peer
            .sim
            .calls()
            .into_iter()
            .rev()
            .find(|c| c.method == method)
            .unwrap();
        assert_eq!(asked.args["include_all_metadata"], true);
    }
}

#[tokio::test]
async fn an_unknown_send_absent_once_the_platform_settled_reconciles_as_not_sent() {
    // A short request timeout: the settle time is the timeout + 2 s.
    let peer = Peer::with(quiet(), json!({ "request_timeout_ms": 300 })).await;
    let target = channel(&peer, "absent");
    let adapter = peer.plugin.sender.clone();
    // A proxy's error page: the request may have reached Slack, and nothing landed.
    peer.sim
        .inject(Fault::on("chat.postMessage", FaultKind::ServerError(502)));
    let c = ctx(&target, "gone");
    let error = adapter.send_unit(&c, &text("gone")).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    assert_eq!(
        adapter
            .reconcile_unknown_send(&c, &text("gone"))
            .await
            .unwrap(),
        Reconciliation::Unresolved,
        "right after the attempt the request may still be landing"
    );
    let (answer, unresolved) = settled_answer(&adapter, &c, &text("gone")).await;
    assert_eq!(answer, Reconciliation::NotSent);
    assert!(unresolved >= 1);
    assert!(peer.texts(&target.id).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_settles_a_lost_answer_without_a_second_message() {
    let peer = Peer::start().await;
    let target = channel(&peer, "engine");
    let (_dir, messenger, clock) = engine(&peer);
    peer.sim
        .inject(Fault::on("chat.postMessage", FaultKind::LoseAnswer));
    let report = messenger
        .send(
            ChannelMessage::outbound("e-1", "slack", target.clone(), "exactly once"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    clock.advance(5_000);
    messenger.recover().await.unwrap();
    assert_eq!(peer.texts(&target.id), ["exactly once"]);
    let posts = peer
        .sim
        .calls()
        .iter()
        .filter(|c| c.method == "chat.postMessage")
        .count();
    assert_eq!(posts, 1, "found in history: never sent again");
}

#[tokio::test]
async fn a_lost_send_behind_a_page_of_newer_messages_is_found_on_a_later_page() {
    let peer = Peer::start().await;
    let target = channel(&peer, "busy");
    let adapter = peer.plugin.sender.clone();
    peer.sim
        .inject(Fault::on("chat.postMessage", FaultKind::LoseAnswer));
    let c = ctx(&target, "deep");
    adapter.send_unit(&c, &text("deep")).await.unwrap_err();
    for n in 0..250 {
        peer.sim
            .person_writes(&target.id, &peer.person, &format!("chatter {n}"), None);
    }
    let Reconciliation::Sent(part) = adapter
        .reconcile_unknown_send(&c, &text("deep"))
        .await
        .unwrap()
    else {
        panic!("found on the second page");
    };
    assert_eq!(
        part.platform_message_id,
        peer.sim.messages(&target.id)[0].ts
    );
    let pages = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.method == "conversations.history")
        .collect::<Vec<_>>();
    assert_eq!(pages.len(), 2);
    assert!(
        pages[1].args["cursor"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    );
}
