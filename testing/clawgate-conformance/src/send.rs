//! The send-side cases: round trips, declared capabilities, failure classes, unknown outcomes,
//! partial batches, recovery, inbound normalization, origin markers, live previews, attachments.

use std::sync::Arc;

use clawgate_channel_sdk::{Reconciliation, SideEffect};
use clawgate_messages::{SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::clock::ManualClock;
use clawgate_types::{DeliveryFailureKind, IntentStatus, MessagePartKind};

use crate::support::{addressed, context, engine, fresh_engine, unit};
use crate::{ConformancePeer, Outcome};

pub async fn send_round_trip(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    let target = peer.target("send");
    let ctx = context(adapter.as_ref(), &target, "send-1");
    let part = adapter
        .send_unit(&ctx, &unit(0, "hello conformance"))
        .await
        .unwrap();
    assert!(
        !part.platform_message_id.is_empty(),
        "a receipt part carries the platform id"
    );
    assert_eq!(part.index, 0, "a receipt part carries the unit index");
    assert_eq!(peer.visible_texts(&target).await, vec!["hello conformance"]);
    Outcome::Passed
}

pub async fn edit_round_trip(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    if !adapter.capabilities().can_edit() {
        return Outcome::skipped("the adapter does not declare live.edit");
    }
    let target = peer.target("edit");
    let ctx = context(adapter.as_ref(), &target, "edit-1");
    let part = adapter.send_unit(&ctx, &unit(0, "draft")).await.unwrap();
    let edited = adapter.edit(&ctx, &part, &unit(0, "final")).await.unwrap();
    assert_eq!(
        edited.platform_message_id, part.platform_message_id,
        "an edit keeps the message"
    );
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["final"],
        "declared edit works"
    );
    Outcome::Passed
}

pub async fn delete_round_trip(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    if !adapter.capabilities().can_delete() {
        return Outcome::skipped("the adapter does not declare live.delete");
    }
    let target = peer.target("delete");
    let ctx = context(adapter.as_ref(), &target, "delete-1");
    let keep = adapter.send_unit(&ctx, &unit(0, "keep")).await.unwrap();
    let ctx2 = context(adapter.as_ref(), &target, "delete-2");
    let gone = adapter.send_unit(&ctx2, &unit(0, "gone")).await.unwrap();
    adapter.delete(&ctx2, &gone).await.unwrap();
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["keep"],
        "declared delete works"
    );
    assert!(!keep.platform_message_id.is_empty());
    Outcome::Passed
}

pub async fn declared_text_limit_and_chunking_work(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    let Some(limit) = adapter.capabilities().text.max_length else {
        return Outcome::skipped("the adapter declares no text.max_length");
    };
    let (_dir, messenger, _clock) = fresh_engine(peer);
    let target = peer.target("limit");
    let exact = "e".repeat(limit as usize);
    let report = messenger
        .send(
            addressed(peer, &target, "exact", &exact),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        report.outcome.receipt().map(|r| r.parts.len()),
        Some(1),
        "text at the declared limit is one message"
    );
    if adapter.capabilities().text.chunking {
        let long = "l".repeat(limit as usize * 2 + 10);
        let report = messenger
            .send(
                addressed(peer, &target, "long", &long),
                SendOptions::default(),
            )
            .await
            .unwrap();
        let receipt = report.outcome.receipt().cloned().unwrap();
        assert_eq!(
            receipt.parts.len(),
            3,
            "declared chunking splits to the limit"
        );
        assert_eq!(
            receipt.platform_message_ids.len(),
            3,
            "the receipt keeps every platform id"
        );
        let visible = peer.visible_texts(&target).await;
        assert_eq!(visible.len(), 4);
        assert_eq!(visible[1..].concat(), long, "chunks rejoin to the text");
    }
    Outcome::Passed
}

pub async fn idempotency_key_dedupes_when_declared(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    if !adapter.capabilities().dedupes_by_key() {
        return Outcome::skipped("the adapter does not declare delivery.idempotencyKey");
    }
    let target = peer.target("idem");
    let ctx = context(adapter.as_ref(), &target, "idem-1");
    let first = adapter.send_unit(&ctx, &unit(0, "once")).await.unwrap();
    let again = adapter.send_unit(&ctx, &unit(0, "once")).await.unwrap();
    assert_eq!(
        first.platform_message_id, again.platform_message_id,
        "same key, same message"
    );
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["once"],
        "declared idempotency keys dedupe"
    );
    Outcome::Passed
}

pub async fn failure_classes(peer: &impl ConformancePeer) -> Outcome {
    use DeliveryFailureKind::*;
    let adapter = peer.plugin().sender;
    let mut checked = 0;
    for kind in [
        Transient,
        RateLimit,
        Auth,
        Permission,
        NotFound,
        InvalidPayload,
        Conflict,
    ] {
        if !peer.inject_failure(kind, 1, 0) {
            continue;
        }
        checked += 1;
        let target = peer.target("failures");
        let ctx = context(adapter.as_ref(), &target, &format!("fail-{kind:?}"));
        let error = adapter
            .send_unit(&ctx, &unit(0, "refused"))
            .await
            .unwrap_err();
        assert_eq!(
            error.kind, kind,
            "platform refusal classified as {kind:?}: {error:?}"
        );
        assert_eq!(
            error.side_effect,
            SideEffect::None,
            "a definite refusal had no side effect: {error:?}"
        );
        if kind == RateLimit && adapter.capabilities().reports_retry_after() {
            assert!(
                error.retry_after_ms.is_some(),
                "declared retry-after is reported"
            );
        }
        assert!(
            peer.visible_texts(&target).await.is_empty(),
            "a refused send shows nothing"
        );
    }
    assert!(
        checked > 0,
        "the peer must be able to inject at least one failure class"
    );
    Outcome::Passed
}

pub async fn unknown_outcome_is_reconcilable_when_declared(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    assert!(
        peer.inject_lost_answer(0),
        "the peer must be able to lose an answer (accept a call and drop its reply)"
    );
    let target = peer.target("unknown");
    let ctx = context(adapter.as_ref(), &target, "unknown-1");
    let error = adapter
        .send_unit(&ctx, &unit(0, "lost answer"))
        .await
        .unwrap_err();
    assert_eq!(
        error.side_effect,
        SideEffect::Possible,
        "a lost answer is an unknown outcome: {error:?}"
    );
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["lost answer"],
        "the peer lost the answer, not the message"
    );
    if !adapter.capabilities().reconciles_unknown_sends() {
        return Outcome::skipped(
            "the adapter does not declare delivery.reconcileUnknownSend (its unknown outcomes \
             stay with an operator; recovery_after_restart checks that)",
        );
    }
    // A landed unit reconciles as sent with the platform's id of that very message.
    let landed = context(adapter.as_ref(), &target, "unknown-landed");
    let part = adapter
        .send_unit(&landed, &unit(0, "landed"))
        .await
        .unwrap();
    match adapter
        .reconcile_unknown_send(&landed, &unit(0, "landed"))
        .await
        .unwrap()
    {
        Reconciliation::Sent(found) => assert_eq!(
            found.platform_message_id, part.platform_message_id,
            "reconciliation finds the message that landed, not another"
        ),
        other => panic!("a landed unit reconciles as sent, got {other:?}"),
    }
    let lost = match adapter
        .reconcile_unknown_send(&ctx, &unit(0, "lost answer"))
        .await
        .unwrap()
    {
        Reconciliation::Sent(found) => found,
        other => panic!("a unit whose answer was lost reconciles as sent, got {other:?}"),
    };
    assert_ne!(
        lost.platform_message_id, part.platform_message_id,
        "each unit reconciles to its own message"
    );
    let never = context(adapter.as_ref(), &target, "unknown-never-sent");
    assert_eq!(
        adapter
            .reconcile_unknown_send(&never, &unit(0, "never"))
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "a unit that never landed reconciles as not sent"
    );
    Outcome::Passed
}

pub async fn batch_partial_retry_sends_only_missing_units(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    let Some(limit) = adapter
        .capabilities()
        .text
        .max_length
        .filter(|_| adapter.capabilities().text.chunking)
    else {
        return Outcome::skipped("the adapter does not declare text chunking with a limit");
    };
    assert!(
        peer.inject_failure(DeliveryFailureKind::Transient, 1, 1),
        "a chunking adapter's peer must refuse one call after another with a transient error"
    );
    let (_dir, messenger, clock) = fresh_engine(peer);
    let target = peer.target("batch");
    let text = format!(
        "{}{}{}",
        "a".repeat(limit as usize),
        "b".repeat(limit as usize),
        "c"
    );
    let report = messenger
        .send(
            addressed(peer, &target, "batch", &text),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    clock.advance(1_000);
    assert_eq!(messenger.recover().await.unwrap().committed, 1);
    let visible = peer.visible_texts(&target).await;
    assert_eq!(
        visible.len(),
        3,
        "each unit visible exactly once: {}",
        visible.len()
    );
    assert_eq!(visible.concat(), text);
    Outcome::Passed
}

pub async fn recovery_after_restart(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    assert!(
        peer.inject_lost_answer(0),
        "the peer must be able to lose an answer: recovery of an unknown outcome is every \
         adapter's contract"
    );
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let target = peer.target("restart");
    {
        let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
        let messenger = engine(peer, store, clock.clone());
        let report = messenger
            .send(
                addressed(peer, &target, "restart", "survives"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    clock.advance(60_000);
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let messenger = engine(peer, store.clone(), clock.clone());
    messenger.recover().await.unwrap();
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["survives"],
        "never sent twice"
    );
    let reconciles = adapter.capabilities().reconciles_unknown_sends();
    let expected = if reconciles {
        IntentStatus::Sent
    } else {
        IntentStatus::UnknownAfterSend
    };
    let all = store
        .list_intents(&IntentFilter {
            limit: 10,
            ..IntentFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|i| i.status).collect::<Vec<_>>(),
        vec![expected]
    );
    Outcome::Passed
}

pub async fn inbound_events_normalize(peer: &impl ConformancePeer) -> Outcome {
    let Some(normalizer) = peer.plugin().receiver else {
        return Outcome::skipped("the channel only sends (no receiver)");
    };
    let target = peer.target("inbound");
    let human = peer
        .inject_inbound(&target, "hello gateway", false)
        .await
        .expect("a receiving channel's peer must be able to write into a conversation");
    let inbound = normalizer.normalize(&human).unwrap();
    assert_eq!(
        inbound.message.body.as_ref().map(|b| b.text.as_str()),
        Some("hello gateway")
    );
    assert_eq!(
        inbound.message.target.id, target.id,
        "the target is the conversation"
    );
    assert_eq!(
        inbound.message.direction,
        clawgate_types::MessageDirection::Inbound
    );
    assert!(!inbound.is_bot_author);
    assert!(
        !inbound.event_id.is_empty(),
        "an event id to dedupe redeliveries"
    );
    let bot = peer.inject_inbound(&target, "beep", true).await.unwrap();
    assert!(
        normalizer.normalize(&bot).unwrap().is_bot_author,
        "bot authors are reported"
    );
    let again = normalizer.normalize(&human).unwrap();
    assert_eq!(
        again.event_id, inbound.event_id,
        "a redelivery has the same event id"
    );
    assert!(
        normalizer
            .normalize(&serde_json::json!({ "unexpected": [1, 2] }))
            .is_err(),
        "malformed events are typed errors"
    );
    Outcome::Passed
}

pub async fn origin_markers_round_trip(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    let Some(origin_adapter) = adapter.origin() else {
        return Outcome::skipped("the adapter declares no origin adapter");
    };
    let (_dir, messenger, _clock) = fresh_engine(peer);
    let target = peer.target("origin");
    let mut failure = addressed(peer, &target, "origin", "Agent failed before reply.");
    let marker = clawgate_types::MessageOrigin::gateway_failure(
        clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
    );
    failure.origin = Some(marker.clone());
    messenger
        .send(failure, SendOptions::default())
        .await
        .unwrap();
    let raw = peer.visible_raw(&target).await;
    assert!(
        !raw.is_empty(),
        "a peer of an adapter with an origin adapter must show the platform's raw events"
    );
    assert_eq!(
        origin_adapter.decode(&raw[0]),
        Some(marker),
        "the marker written on send decodes from the platform"
    );
    Outcome::Passed
}

pub async fn live_preview_finalizes_in_place_when_declared(peer: &impl ConformancePeer) -> Outcome {
    let adapter = peer.plugin().sender;
    if !adapter.capabilities().can_edit() {
        return Outcome::skipped("the adapter does not declare live.edit");
    }
    let (_dir, messenger, clock) = fresh_engine(peer);
    let target = peer.target("live");
    let mut live = messenger
        .begin_live(
            addressed(peer, &target, "live", ""),
            SendOptions::default(),
            clawgate_messages::LiveOptions::default(),
        )
        .await
        .unwrap();
    live.update("draft").await.unwrap();
    clock.advance(1_000);
    live.update("draft, longer").await.unwrap();
    clock.advance(1_000);
    let report = live
        .finalize(addressed(peer, &target, "live", "final text"))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["final text"],
        "one message: the preview became the final"
    );
    Outcome::Passed
}

pub async fn remote_attachments_are_delivered_when_declared(
    peer: &impl ConformancePeer,
) -> Outcome {
    let adapter = peer.plugin().sender;
    if !adapter
        .capabilities()
        .attachments
        .as_ref()
        .is_some_and(|a| a.remote_url)
    {
        return Outcome::skipped("the adapter does not declare attachments.remoteUrl");
    }
    let (_dir, messenger, _clock) = fresh_engine(peer);
    let target = peer.target("attachments");
    let url = peer.attachment_url();
    let url = url.as_str();
    let mut picture = addressed(peer, &target, "attachments", "a picture");
    picture.attachments = vec![
        clawgate_types::MessageAttachment::new(MessagePartKind::Media)
            .with_url(url)
            .with_mime_type("image/png")
            .with_file_name("conformance.png"),
    ];
    let report = messenger
        .send(picture, SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("a declared remote attachment is delivered: {report:?}")
    };
    let parts: Vec<_> = receipt.parts.iter().map(|p| (p.index, p.kind)).collect();
    assert!(
        parts == vec![(0, MessagePartKind::Text), (1, MessagePartKind::Media)]
            || parts == vec![(0, MessagePartKind::Media)],
        "the text and the attachment each land with a receipt part of their kind, or as one \
         media message captioned with the text: {parts:?}"
    );
    assert!(
        receipt
            .parts
            .iter()
            .all(|p| !p.platform_message_id.is_empty()),
        "every part carries a platform id"
    );
    assert_eq!(
        peer.visible_texts(&target)
            .await
            .first()
            .map(String::as_str),
        Some("a picture")
    );
    let raw = peer.visible_raw(&target).await;
    if !raw.is_empty() {
        assert!(
            raw.iter().any(|event| event.to_string().contains(url)),
            "the attachment is visible on the platform: {raw:?}"
        );
    }
    Outcome::Passed
}
