//! Sends as the OA API answers them: `message_id` receipts, 2000-character chunks, failures
//! inside HTTP 200 bodies classified by code (never taken for a send), the 7-day window as a
//! permanent class (never a retry loop), plain durable finals, and unknown sends settled from
//! their `oa_send_text` echoes after a restart, or left unknown, never repeated.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo::simulator::{Fault, FaultKind};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::IntentStatus;
use clawgate_types::clock::ManualClock;

use crate::peer::Peer;

/// An engine over `sender`, on the store in `dir` and a driven clock.
pub(crate) fn engine_in(
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
    let messenger = Messenger::new(store.clone(), vec![sender], policy, clock, "zalo-tests");
    (messenger, store)
}

pub(crate) fn reply(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "zalo", target.clone(), text)
}

async fn statuses(store: &clawgate_store_sqlite::SqliteStore) -> Vec<IntentStatus> {
    store
        .list_intents(&IntentFilter {
            limit: 10,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.status)
        .collect()
}

#[tokio::test]
async fn long_replies_are_chunked_at_2000_and_receipts_are_zalo_message_ids() {
    let peer = Peer::start().await;
    let person = peer.person("chunks");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock);
    let text = format!("{} {}", "a".repeat(1_900), "b".repeat(1_500));
    let report = messenger
        .send(reply(&person, "chunks-1", &text), SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let landed = peer.sim.sent(&person.id);
    assert_eq!(landed.len(), 2);
    assert!(landed.iter().all(|m| m.text.chars().count() <= 2_000));
    assert_eq!(
        landed.iter().map(|m| m.text.clone()).collect::<String>(),
        text
    );
    let ids: Vec<_> = receipt
        .parts
        .iter()
        .map(|p| p.platform_message_id.clone())
        .collect();
    assert_eq!(
        ids,
        landed.iter().map(|m| m.msg_id.clone()).collect::<Vec<_>>()
    );
    // Every call carried the access token in its own header, never as a Bearer token.
    let sends: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/v3.0/oa/message/cs")
        .collect();
    assert_eq!(sends.len(), 2);
    assert!(sends.iter().all(|c| c.status == 200 && c.error == 0));
    assert_eq!(sends[0].body["recipient"]["user_id"], person.id.as_str());
}

#[tokio::test]
async fn an_error_in_a_200_body_is_a_failure_classified_by_code_never_a_send() {
    // The test plan's "200 with error: -216-style bodies are failures", one row per code.
    let cases: [(&str, Fault, DeliveryFailureKind); 4] = [
        (
            "rate limit",
            Fault::code(-32),
            DeliveryFailureKind::RateLimit,
        ),
        (
            "bad parameters",
            Fault::code(-201),
            DeliveryFailureKind::InvalidPayload,
        ),
        (
            "not a follower",
            Fault::code(-213),
            DeliveryFailureKind::Permission,
        ),
        // -216 twice: the adapter refreshes the token and tries once more.
        (
            "token",
            Fault::code(-216).times(2),
            DeliveryFailureKind::Auth,
        ),
    ];
    let peer = Peer::start().await;
    let sender = peer.plugin.sender.clone();
    for (case, fault, kind) in cases {
        let person = peer.person(case);
        peer.sim.inject(fault.to(&person.id));
        let ctx = SendContext::new(reply(&person, case, ""), case);
        let error = sender
            .send_unit(&ctx, &RenderedMessageUnit::text(0, "x"))
            .await
            .unwrap_err();
        assert_eq!(error.kind, kind, "{case}: {error:?}");
        assert_eq!(error.side_effect, SideEffect::None, "{case}");
        assert!(
            error.message.contains("answered error"),
            "{case}: {}",
            error.message
        );
        assert!(peer.sim.sent(&person.id).is_empty(), "{case}");
    }
    // Every refusal came as HTTP 200.
    assert!(peer.sim.calls().iter().all(|c| c.status == 200));
}

#[tokio::test]
async fn outside_the_7_day_window_a_send_fails_once_and_is_not_retried() {
    let peer = Peer::start().await;
    let person = peer.person("window");
    peer.sim.close_window(&person.id);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    let report = messenger
        .send(
            reply(&person, "window-1", "too late"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    let SendOutcome::Failed { failure, .. } = report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(failure.kind, DeliveryFailureKind::Permission);
    assert_eq!(failure.platform_code.as_deref(), Some("-230"));
    assert!(failure.message.contains("7 days"), "{}", failure.message);
    clock.advance(3_600_000);
    messenger.recover().await.unwrap();
    let calls = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/v3.0/oa/message/cs")
        .count();
    assert_eq!(calls, 1, "a closed window is not retried");
    assert_eq!(statuses(&store).await, vec![IntentStatus::Failed]);
    // Once the person writes again, the next reply goes out.
    peer.sim.person_writes(&person.id, "I'm back");
    let report = messenger
        .send(
            reply(&person, "window-2", "welcome back"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
}

#[tokio::test]
async fn finals_are_plain_durable_sends_without_previews_or_edits() {
    let peer = Peer::start().await;
    let capabilities = peer.plugin.sender.capabilities().clone();
    assert!(
        capabilities.live.is_none(),
        "no live previews: Zalo has no edit"
    );
    assert!(!capabilities.can_edit() && !capabilities.can_delete());
    let delivery = capabilities.delivery.unwrap();
    assert!(!delivery.idempotency_key && delivery.reconcile_unknown_send);
    let person = peer.person("plain");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    peer.sim.inject(Fault::new(FaultKind::Unavailable));
    {
        let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
        let report = messenger
            .send(
                reply(&person, "plain-1", "one final"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
            "{report:?}"
        );
    }
    // A restart sends it from the stored intent alone, once.
    clock.advance(60_000);
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock);
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent]);
    assert_eq!(peer.texts(&person.id), vec!["one final".to_owned()]);
}

#[tokio::test]
async fn an_unknown_send_is_settled_by_its_echo_after_a_restart() {
    let peer = Peer::start().await;
    let person = peer.person("settle");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    // Echoes wait while the webhook URL is unset (the gateway is down).
    peer.sim.set_webhook_url(None);
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    {
        let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
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
    }
    // Restarted, before the echo arrived: still unknown, never resent.
    clock.advance(60_000);
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::UnknownAfterSend]);
    assert_eq!(peer.sim.sent(&person.id).len(), 1);
    // Zalo posts the held echo once the listener is back; the next pass settles it.
    peer.sim.set_webhook_url(Some(&peer.webhook_url));
    assert!(peer.sim.echoes_settled(Duration::from_secs(20)).await);
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent]);
    let landed = peer.sim.sent(&person.id);
    assert_eq!(landed.len(), 1, "sent exactly once");
    let intent = store
        .list_intents(&IntentFilter {
            limit: 1,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .remove(0);
    let receipt = intent.receipt.or(intent.partial_receipt).unwrap();
    assert_eq!(receipt.parts[0].platform_message_id, landed[0].msg_id);
}

#[tokio::test]
async fn identical_texts_lost_to_the_same_person_each_settle_to_their_own_echo() {
    let peer = Peer::start().await;
    let person = peer.person("twins");
    let sender = peer.plugin.sender.clone();
    let unit = RenderedMessageUnit::text(0, "ok");
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer).times(2));
    let first = SendContext::new(reply(&person, "twin-1", ""), "twin-1");
    let second = SendContext::new(reply(&person, "twin-2", ""), "twin-2");
    for ctx in [&first, &second] {
        let error = sender.send_unit(ctx, &unit).await.unwrap_err();
        assert_eq!(error.side_effect, SideEffect::Possible);
    }
    assert!(peer.sim.echoes_settled(Duration::from_secs(20)).await);
    let landed = peer.sim.sent(&person.id);
    let mut settled = Vec::new();
    for ctx in [&first, &second] {
        let Reconciliation::Sent(part) = sender.reconcile_unknown_send(ctx, &unit).await.unwrap()
        else {
            panic!("each has an echo")
        };
        settled.push(part.platform_message_id);
    }
    assert_ne!(settled[0], settled[1], "one echo per send");
    let mut expected: Vec<_> = landed.iter().map(|m| m.msg_id.clone()).collect();
    expected.sort();
    settled.sort();
    assert_eq!(settled, expected);
    // Asked again, each keeps its own.
    let Reconciliation::Sent(again) = sender.reconcile_unknown_send(&first, &unit).await.unwrap()
    else {
        panic!()
    };
    assert!(settled.contains(&again.platform_message_id));
}

#[tokio::test]
async fn a_key_never_attempted_is_not_sent_and_an_attempt_without_an_echo_stays_unresolved() {
    let peer = Peer::start().await;
    let person = peer.person("evidence");
    let sender = peer.plugin.sender.clone();
    let never = SendContext::new(reply(&person, "never", ""), "never");
    let unit = RenderedMessageUnit::text(0, "x");
    assert_eq!(
        sender.reconcile_unknown_send(&never, &unit).await.unwrap(),
        Reconciliation::NotSent
    );
    // A proxy's 502: the request may or may not have reached Zalo, and no echo comes.
    peer.sim.inject(Fault::new(FaultKind::ServerError(502)));
    let tried = SendContext::new(reply(&person, "tried", ""), "tried");
    let error = sender.send_unit(&tried, &unit).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    assert!(peer.sim.deliveries_settled(Duration::from_secs(20)).await);
    assert_eq!(
        sender.reconcile_unknown_send(&tried, &unit).await.unwrap(),
        Reconciliation::Unresolved
    );
    // An echo of the same text to someone else settles nothing.
    let other = peer.person("evidence-other");
    let to_other = SendContext::new(reply(&other, "other", ""), "other");
    sender.send_unit(&to_other, &unit).await.unwrap();
    assert!(peer.sim.echoes_settled(Duration::from_secs(20)).await);
    assert_eq!(
        sender.reconcile_unknown_send(&tried, &unit).await.unwrap(),
        Reconciliation::Unresolved
    );
    assert!(peer.sim.sent(&person.id).is_empty());
}

#[tokio::test]
async fn another_gateway_on_the_same_store_settles_a_lost_send_instead_of_sending_it_again() {
    let peer = Peer::start().await;
    // A second gateway sharing the store, running since before the send: it made no attempt
    // itself and its webhook listener gets no echo (the first one's does).
    let other = peer.second_gateway().await;
    let person = peer.person("shared");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    {
        let (messenger, _store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
        let report = messenger
            .send(
                reply(&person, "shared-1", "exactly once, anywhere"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    assert!(peer.sim.echoes_settled(Duration::from_secs(20)).await);
    // The first gateway is gone; the other takes the account over and recovers the send.
    clock.advance(60_000);
    let (messenger, store) = engine_in(dir.path(), other.sender.clone(), clock);
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent]);
    let landed = peer.sim.sent(&person.id);
    assert_eq!(landed.len(), 1, "sent exactly once");
    let intent = store
        .list_intents(&IntentFilter {
            limit: 1,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .remove(0);
    let receipt = intent.receipt.or(intent.partial_receipt).unwrap();
    assert_eq!(receipt.parts[0].platform_message_id, landed[0].msg_id);
}
