//! The send evidence in the gateway's store: another gateway on the same store settles the
//! lost send the first left, two accounts on one store keep their evidence apart, and the book
//! file an earlier release kept is imported once.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_whatsapp::simulator::{Fault, FaultKind};
use clawgate_channel_whatsapp::{BOOK_FILE, STATUS_BOOK};
use clawgate_messages::{SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::IntentStatus;
use clawgate_types::clock::ManualClock;

use crate::peer::Peer;
use crate::send::{engine_in, reply, statuses};

#[tokio::test]
async fn a_second_gateway_settles_the_lost_send_the_first_left_from_the_shared_evidence() {
    // Gateway A sends; gateway B, on the same store and started before A sent anything, takes
    // the account over after A is gone.
    let peer = Peer::start().await;
    let person = peer.person("handover");
    let b = peer.build_again("default", LegacyFiles::none()).await;
    let clock = Arc::new(ManualClock::new(1_000));
    // Statuses wait while no gateway listens.
    peer.sim.set_webhook_url(None);
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    {
        let (a, _store) = engine_in(peer.state_dir(), peer.plugin.sender.clone(), clock.clone());
        let report = a
            .send(
                reply(&person, "handover-1", "exactly once"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    // B finds A's attempt: unknown, never sent again.
    clock.advance(60_000);
    let (messenger, store) = engine_in(peer.state_dir(), b.sender.clone(), clock.clone());
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::UnknownAfterSend]);
    assert_eq!(peer.sim.sent(&person.id).len(), 1, "not sent twice");
    // The held statuses reach the listener and the store; B's next pass settles the send.
    peer.sim.set_webhook_url(Some(&peer.webhook_url));
    assert!(peer.sim.statuses_settled(Duration::from_secs(20)).await);
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
    assert_eq!(receipt.parts[0].platform_message_id, landed[0].wamid);
}

#[tokio::test]
async fn two_accounts_on_one_store_keep_their_evidence_apart() {
    // An earlier release kept every WhatsApp account's evidence in one whatsapp-statuses.jsonl:
    // after a restart one account settled a send of the other's as its own.
    let peer = Peer::start().await;
    let second = peer.build_again("second", LegacyFiles::none()).await;
    let person = peer.person("apart");
    let ctx = SendContext::new(reply(&person, "same-key", ""), "same-key");
    let unit = RenderedMessageUnit::text(0, "hello");
    let part = peer.plugin.sender.send_unit(&ctx, &unit).await.unwrap();
    assert_eq!(
        second
            .sender
            .reconcile_unknown_send(&ctx, &unit)
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    // Both restarted on the shared store.
    for (account, expected) in [
        ("default", Reconciliation::Sent(Box::new(part.clone()))),
        ("second", Reconciliation::NotSent),
    ] {
        let again = peer.build_again(account, LegacyFiles::none()).await;
        assert_eq!(
            again
                .sender
                .reconcile_unknown_send(&ctx, &unit)
                .await
                .unwrap(),
            expected,
            "{account}"
        );
    }
}

#[tokio::test]
async fn the_status_book_of_an_earlier_release_is_imported_once() {
    let peer = Peer::start().await;
    let person = peer.person("imported");
    let old = tempfile::tempdir().unwrap();
    // As the earlier release wrote it: a line per change, the last of a key wins.
    let file = concat!(
        r#"{"key":"old-sent#0","attempted":true,"wamid":null,"accepted":false,"failed_codes":[]}"#,
        "\n",
        r#"{"key":"old-sent#0","attempted":true,"wamid":"wamid.OLD","accepted":true,"failed_codes":[]}"#,
        "\n",
        r#"{"key":"old-tried#0","attempted":true,"wamid":null,"accepted":false,"failed_codes":[]}"#,
        "\n",
    );
    std::fs::write(old.path().join(BOOK_FILE), file).unwrap();
    let plugin = peer
        .build_again("default", LegacyFiles::in_dir(old.path()))
        .await;
    assert!(!old.path().join(BOOK_FILE).exists());
    assert!(old.path().join(format!("{BOOK_FILE}.imported")).is_file());
    let unit = RenderedMessageUnit::text(0, "x");
    let settle = |key: &str| {
        let ctx = SendContext::new(reply(&person, key, ""), key);
        let sender = plugin.sender.clone();
        let unit = unit.clone();
        async move { sender.reconcile_unknown_send(&ctx, &unit).await.unwrap() }
    };
    match settle("old-sent").await {
        Reconciliation::Sent(part) => assert_eq!(part.platform_message_id, "wamid.OLD"),
        other => panic!("{other:?}"),
    }
    assert_eq!(settle("old-tried").await, Reconciliation::Unresolved);
    assert_eq!(settle("never").await, Reconciliation::NotSent);
    // A crash before the rename leaves the file in place: imported again, adding nothing.
    let records = || async {
        clawgate_conformance::channel_state(peer.state_dir(), "whatsapp", "default")
            .book(STATUS_BOOK)
            .since::<serde_json::Value>(0)
            .await
            .unwrap()
            .len()
    };
    let before = records().await;
    assert_eq!(before, 3);
    std::fs::write(old.path().join(BOOK_FILE), file).unwrap();
    peer.build_again("default", LegacyFiles::in_dir(old.path()))
        .await;
    assert_eq!(records().await, before);
}
