//! The reply journal in the gateway's store: another gateway on the same store parks the lost
//! reply the first started instead of sending it again, and the journal file an earlier
//! release kept is imported once.

use clawgate_channel_line::simulator::Fault;
use clawgate_channel_line::simulator::{FaultKind, PUSH_PATH, REPLY_PATH};
use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::SendOutcome;
use clawgate_types::IntentStatus;
use serde_json::json;

use crate::peer::{Peer, build_with};
use crate::send::{asked, engine, reply, statuses};

#[tokio::test]
async fn a_second_gateway_parks_the_lost_reply_the_first_started() {
    let peer = Peer::start().await;
    let (target, key, _) = asked(&peer, "handover");
    // Gateway B, on the same store, started before gateway A replied.
    let b = peer.rebuilt(&json!({})).await.sender;
    peer.sim
        .inject(Fault::on(REPLY_PATH, FaultKind::LoseAnswer));
    let intents = tempfile::tempdir().unwrap();
    let (a, _, _) = engine(intents.path(), peer.plugin.sender.clone());
    let (message, options) = reply(&target, &key, "answer");
    let report = a.send(message, options).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    drop(a);
    // A is gone; B takes the account over and finds A's started reply in the store.
    let (messenger, store, clock) = engine(intents.path(), b);
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    assert_eq!(
        peer.texts(&target.id),
        ["answer"],
        "landed once, never repeated"
    );
    assert_eq!(statuses(&store).await, [IntentStatus::UnknownAfterSend]);
    assert!(
        peer.sim.calls().iter().all(|c| c.path != PUSH_PATH),
        "no push"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn the_reply_journal_of_an_earlier_release_is_imported_once() {
    let peer = Peer::start().await;
    let (target, key, _) = asked(&peer, "imported");
    let adapter = peer.plugin.sender.clone();
    let (message, _) = reply(&target, &key, "answer");
    let batch = adapter
        .render()
        .unwrap()
        .render(&message, adapter.capabilities(), &key)
        .unwrap();
    let mut ctx = SendContext::new(message, key.clone());
    ctx.intent_id = Some(clawgate_types::IntentId::parse(clawgate_store::ids::new_id()).unwrap());
    let unit = &batch.units[0];
    // An earlier release started this reply (and one refused in the end) before it stopped.
    let old = tempfile::tempdir().unwrap();
    let file = format!("{0}\nother#0\n!other#0\n", ctx.unit_key(unit));
    std::fs::write(old.path().join("line.reply-journal"), &file).unwrap();
    let (settings, token) = (json!({}), peer.sim.access_token());
    let build = || {
        build_with(
            &peer.sim,
            peer.state_dir(),
            clawgate_conformance::ports::reserve_loopback_port(),
            &settings,
            &token,
            "default",
            LegacyFiles::in_dir(old.path()),
        )
    };
    let upgraded = build().await.unwrap().sender;
    assert!(!old.path().join("line.reply-journal").exists());
    assert!(old.path().join("line.reply-journal.imported").is_file());
    assert_eq!(
        upgraded.reconcile_unknown_send(&ctx, unit).await.unwrap(),
        Reconciliation::Undecidable,
        "a reply the earlier release started may have landed"
    );
    // A crash before the rename leaves the file in place: imported again, adding nothing.
    let records = || async {
        clawgate_conformance::channel_state(peer.state_dir(), "line", "default")
            .book("reply-journal")
            .since::<serde_json::Value>(0)
            .await
            .unwrap()
            .len()
    };
    assert_eq!(records().await, 1);
    std::fs::write(old.path().join("line.reply-journal"), &file).unwrap();
    build().await.unwrap();
    assert_eq!(records().await, 1);
    assert!(peer.texts(&target.id).is_empty(), "nothing was sent");
    peer.sim.stop().await;
}
