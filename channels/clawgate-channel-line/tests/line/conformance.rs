//! The channel contract suite against the LINE simulator.
//!
//! Every case but `inbound_events_normalize` runs as the suite wrote it. That one asks for a
//! message written by another bot, and LINE delivers none to a webhook; its other checks run
//! in [`inbound_events_normalize_for_people`], and the bot part is reported as skipped.

use clawgate_conformance::{ConformancePeer, Outcome};

clawgate_conformance::conformance_tests!(@cases line, crate::peer::Peer::start().await;
    send_round_trip, edit_round_trip, delete_round_trip,
    declared_text_limit_and_chunking_work, idempotency_key_dedupes_when_declared,
    failure_classes, unknown_outcome_is_reconcilable_when_declared,
    batch_partial_retry_sends_only_missing_units, recovery_after_restart,
    origin_markers_round_trip,
    live_preview_finalizes_in_place_when_declared,
    live_preview_is_removed_when_abandoned,
    remote_attachments_are_delivered_when_declared,
    polling_source_never_passes_an_unfinished_event,
    a_retried_event_keeps_its_conversations_order,
    pushed_redelivery_is_deduplicated,
    pushed_source_resumes_after_a_dropped_connection);

#[tokio::test]
async fn inbound_events_normalize_for_people() {
    let peer = crate::peer::Peer::start().await;
    let normalizer = peer.plugin().receiver.unwrap();
    let target = peer.target("inbound");
    let human = peer
        .inject_inbound(&target, "hello gateway", false)
        .await
        .unwrap();
    let inbound = normalizer.normalize(&human).unwrap();
    assert_eq!(
        inbound.message.body.as_ref().map(|b| b.text.as_str()),
        Some("hello gateway")
    );
    assert_eq!(inbound.message.target.id, target.id);
    assert_eq!(
        inbound.message.direction,
        clawgate_channel_sdk::types::MessageDirection::Inbound
    );
    assert!(!inbound.is_bot_author);
    assert_eq!(
        normalizer.normalize(&human).unwrap().event_id,
        inbound.event_id
    );
    assert!(
        normalizer
            .normalize(&serde_json::json!({ "unexpected": [1, 2] }))
            .is_err()
    );
    assert!(peer.inject_inbound(&target, "beep", true).await.is_none());
    Outcome::skipped(
        "its bot-author check: LINE delivers no other bot's messages to a webhook (the people's \
         checks ran)",
    )
    .report("line::conformance::inbound_events_normalize");
    peer.sim.stop().await;
}
