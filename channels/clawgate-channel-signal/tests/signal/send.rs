//! Sends as signal-cli answers them: (account, timestamp) receipts, chunks that never need
//! the long-text attachment, quoted replies, groups with per-recipient results, untrusted
//! identities as a permanent class, rate limits honoured, the account check at start, plain
//! durable finals, and unknown sends parked for the operator, never sent again.

use std::sync::Arc;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_signal::simulator::{Fault, FaultKind, MAX_BODY_BYTES};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::clock::{Clock, ManualClock};
use clawgate_types::{DurableSendIntent, IntentStatus, MessageRelation};
use serde_json::json;

use crate::peer::{Peer, build, number_for, settings_for};

/// An engine over `sender`, on the store in `dir` and a driven clock.
fn engine_in(
    dir: &std::path::Path,
    sender: Arc<dyn ChannelMessageAdapter>,
    clock: Arc<ManualClock>,
) -> (Messenger, Arc<clawgate_store_sqlite::SqliteStore>) {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(store.clone(), vec![sender], policy, clock, "signal-tests");
    (messenger, store)
}

fn reply(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "signal", target.clone(), text)
}

async fn intents(store: &clawgate_store_sqlite::SqliteStore) -> Vec<DurableSendIntent> {
    store
        .list_intents(&IntentFilter {
            limit: 10,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
}

fn sends(peer: &Peer) -> usize {
    peer.sim.calls().iter().filter(|(m, _)| m == "send").count()
}

#[tokio::test]
async fn long_replies_are_chunked_under_2000_bytes_and_quote_the_question_once() {
    let peer = Peer::start().await;
    let account = peer.sim.account();
    let person = number_for("chunks");
    let question = peer
        .sim
        .person_writes(&account, &person, "tell me everything");
    let asked_at = question["envelope"]["timestamp"].as_u64().unwrap();
    let inbound = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(&question)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (messenger, _store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    // Four-byte characters: 500 of them are exactly the 2000-byte limit.
    let text = format!("{} {}", "𝄞".repeat(700), "ok ".repeat(300));
    let message = reply(&MessageTarget::direct(&person), "chunks-1", &text)
        .with_relation(MessageRelation::reply_to(inbound.message.id.clone()));
    let report = messenger
        .send(message, SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let landed = peer.sim.landed_in(&person);
    assert!(landed.len() >= 3, "{} chunks", landed.len());
    for chunk in &landed {
        assert!(
            chunk.body.len() <= MAX_BODY_BYTES,
            "{} bytes",
            chunk.body.len()
        );
        assert_eq!(
            chunk.long_text, None,
            "no chunk needs the long-text attachment"
        );
    }
    assert_eq!(
        landed.iter().map(|l| l.body.as_str()).collect::<String>(),
        text
    );
    assert_eq!(landed[0].quote, Some((asked_at, person.clone())));
    assert!(
        landed[1..].iter().all(|l| l.quote.is_none()),
        "only the first chunk quotes"
    );
    // Receipts are Signal's ids: our account and the timestamp signal-cli chose.
    let ids: Vec<String> = receipt
        .parts
        .iter()
        .map(|p| p.platform_message_id.clone())
        .collect();
    let expected: Vec<String> = landed
        .iter()
        .map(|l| format!("{account}:{}", l.timestamp))
        .collect();
    assert_eq!(ids, expected);
}

#[tokio::test]
async fn a_unit_above_the_declared_length_is_refused_rather_than_cut() {
    let peer = Peer::start().await;
    let person = number_for("long");
    let ctx = SendContext::new(reply(&MessageTarget::direct(&person), "l", ""), "long:1");
    let too_long = RenderedMessageUnit::text(0, "x".repeat(501));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx, &too_long)
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload);
    assert_eq!(error.side_effect, SideEffect::None);
    assert_eq!(sends(&peer), 0);
}

#[tokio::test]
async fn group_sends_succeed_for_the_members_who_can_receive_and_are_not_repeated() {
    let peer = Peer::start().await;
    let (ada, bob) = (number_for("ada"), number_for("bob"));
    peer.sim.create_group("R3JvdXBBQkM=", "Team", &[&ada, &bob]);
    peer.sim.unregister(&bob);
    let group = MessageTarget::group("R3JvdXBBQkM=");
    let ctx = SendContext::new(reply(&group, "g", ""), "group:1");
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "hello team"))
        .await
        .unwrap();
    let landed = peer.sim.landed_in("R3JvdXBBQkM=");
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].delivered_to, vec![ada.clone()]);
    assert_eq!(
        part.platform_message_id,
        format!("{}:{}", peer.sim.account(), landed[0].timestamp)
    );
    // Nobody in the group can take it: a definite refusal, nothing landed.
    peer.sim.unregister(&ada);
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "anyone?"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::NotFound);
    assert_eq!(peer.sim.landed_in("R3JvdXBBQkM=").len(), 1);
    // An unknown group is the daemon's user error, named.
    let nowhere = MessageTarget::group("Tm9Hcm91cA==");
    let ctx = SendContext::new(reply(&nowhere, "n", ""), "group:2");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "hello?"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::NotFound, "{error:?}");
    assert!(
        error.message.contains("Group not found"),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn an_untrusted_identity_fails_once_and_is_not_retried() {
    let peer = Peer::start().await;
    let person = number_for("changed-phone");
    peer.sim.untrust(&person);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    let report = messenger
        .send(
            reply(&MessageTarget::direct(&person), "trust-1", "hello"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    let SendOutcome::Failed { failure, .. } = report.outcome else {
        panic!("an untrusted identity is not retried: {report:?}")
    };
    assert_eq!(failure.kind, DeliveryFailureKind::Permission);
    assert_eq!(failure.platform_code.as_deref(), Some("-4"));
    assert!(failure.message.contains("trust"), "{}", failure.message);
    clock.advance(3_600_000);
    messenger.recover().await.unwrap();
    assert_eq!(sends(&peer), 1, "never sent again");
    assert!(peer.sim.landed_in(&person).is_empty());
}

#[tokio::test]
async fn a_rate_limit_waits_for_retry_after_then_sends_once() {
    let peer = Peer::start().await;
    let person = MessageTarget::direct(number_for("limited"));
    peer.sim.inject(Fault::new(FaultKind::RateLimit {
        retry_after_seconds: 42,
    }));
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    let report = messenger
        .send(
            reply(&person, "limit-1", "patience"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    let intent = intents(&store).await.remove(0);
    let next = intent.next_attempt_at.unwrap();
    assert!(next >= clock.now_ms() + 42_000, "{next}");
    clock.advance(41_000);
    messenger.recover().await.unwrap();
    assert!(
        peer.texts(&person.id).is_empty(),
        "not before retryAfterSeconds"
    );
    clock.advance(2_000);
    messenger.recover().await.unwrap();
    assert_eq!(peer.texts(&person.id), vec!["patience"]);
    assert_eq!(intents(&store).await[0].status, IntentStatus::Sent);
}

#[tokio::test]
async fn a_lost_answer_is_parked_for_the_operator_and_never_sent_again() {
    let peer = Peer::start().await;
    let person = MessageTarget::direct(number_for("lost"));
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    let report = messenger
        .send(
            reply(&person, "lost-1", "exactly once"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    let intent = intents(&store).await.remove(0);
    assert_eq!(intent.status, IntentStatus::UnknownAfterSend);
    assert_eq!(
        intent.next_attempt_at, None,
        "parked at once: Signal cannot tell"
    );
    for _ in 0..3 {
        clock.advance(3_600_000);
        messenger.recover().await.unwrap();
    }
    assert_eq!(sends(&peer), 1);
    assert_eq!(
        peer.texts(&person.id),
        vec!["exactly once"],
        "it did land, once"
    );
    assert_eq!(
        intents(&store).await[0].status,
        IntentStatus::UnknownAfterSend
    );
}

#[tokio::test]
async fn plain_durable_finals_one_message_per_reply_no_preview_no_edit() {
    // The test plan's "simple durable finals" line for Signal.
    let peer = Peer::start().await;
    let caps = peer.plugin.sender.capabilities();
    assert!(
        !caps.can_edit() && !caps.can_delete(),
        "no live previews on Signal"
    );
    assert!(!caps.reconciles_unknown_sends());
    let person = MessageTarget::direct(number_for("finals"));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    for n in 0..3 {
        let report = messenger
            .send(
                reply(&person, &format!("final-{n}"), &format!("answer {n}")),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Sent { .. }),
            "{report:?}"
        );
    }
    let landed = peer.sim.landed_in(&person.id);
    assert_eq!(
        landed.iter().map(|l| l.body.as_str()).collect::<Vec<_>>(),
        vec!["answer 0", "answer 1", "answer 2"]
    );
    assert!(landed.iter().all(|l| l.edit_of.is_none()));
    let mut stamps: Vec<u64> = landed.iter().map(|l| l.timestamp).collect();
    stamps.dedup();
    assert_eq!(
        stamps.len(),
        3,
        "signal-cli never hands out a timestamp twice"
    );
    assert!(
        intents(&store)
            .await
            .iter()
            .all(|i| i.status == IntentStatus::Sent)
    );
    assert_eq!(
        peer.sim
            .calls()
            .iter()
            .filter(|(m, _)| m == "remoteDelete")
            .count(),
        0
    );
}

#[tokio::test]
async fn the_account_is_checked_at_start_and_settings_are_strict() {
    let peer = Peer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = settings_for(&peer.sim);
    wrong["account"] = json!("+15559990000");
    let error = build(wrong, dir.path()).await.unwrap_err().to_string();
    assert!(
        error.contains("account") && error.contains("+15559990000"),
        "{error}"
    );
    let mut typo = settings_for(&peer.sim);
    typo["acount"] = json!("+15550001111");
    let error = build(typo, dir.path()).await.unwrap_err().to_string();
    assert!(error.contains("acount"), "{error}");
    let mut not_a_number = settings_for(&peer.sim);
    not_a_number["account"] = json!("ada");
    assert!(build(not_a_number, dir.path()).await.is_err());
    // An unreachable daemon does not stop the start; sends fail as transient, nothing sent.
    let mut away = settings_for(&peer.sim);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    away["daemon"] = json!(closed.local_addr().unwrap().to_string());
    drop(closed);
    let plugin = build(away, dir.path()).await.unwrap();
    let ctx = SendContext::new(
        reply(&MessageTarget::direct("+4915100000001"), "a", ""),
        "away:1",
    );
    let error = plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "anyone?"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Transient, SideEffect::None)
    );
}
