//! The channel adapter contract suite (layer 3).
//!
//! An adapter author implements [`ConformancePeer`] for their adapter and its platform (the
//! peer injects failures and shows what is visible on the platform), then generates one test per
//! case with [`adapter_conformance_tests!`]. Cases skip what the adapter does not declare (an
//! adapter without `live.edit` is not asked to edit) and panic with a message naming the broken
//! contract otherwise.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // A test suite: failures panic loudly.

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageReceiveAdapter, Reconciliation, SendContext, SideEffect,
};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore, SqliteStore};
use clawgate_types::clock::ManualClock;
use clawgate_types::{
    ChannelMessage, DeliveryFailureKind, IntentStatus, MessageBody, MessageDirection,
    MessagePartKind, MessageTarget, RenderedMessageUnit,
};

/// An adapter and the platform it talks to, as the suite needs them.
#[async_trait]
pub trait ConformancePeer: Send + Sync {
    /// The adapter under test.
    fn adapter(&self) -> Arc<dyn ChannelMessageAdapter>;

    /// A fresh conversation the case may use alone.
    fn target(&self, case: &str) -> MessageTarget;

    /// Makes the platform refuse `count` calls, after `after` calls went through, with an error
    /// the adapter should classify as `kind`. `false` when the platform cannot produce that class.
    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool;

    /// Makes the platform accept the next call (after `after` calls went through) but lose the
    /// answer. `false` when it cannot.
    fn inject_lost_answer(&self, after: u32) -> bool;

    /// Texts visible in the conversation, oldest first.
    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String>;

    /// The channel's inbound normalizer, when the adapter receives.
    fn normalizer(&self) -> Option<Arc<dyn MessageReceiveAdapter>> {
        None
    }

    /// Makes someone on the platform write `text` into `target` and returns the raw platform
    /// event the gateway would receive. `None` when the peer cannot.
    async fn inject_inbound(
        &self,
        _target: &MessageTarget,
        _text: &str,
        _bot: bool,
    ) -> Option<serde_json::Value> {
        None
    }

    /// The raw platform events of the messages visible in `target` (to check that metadata the
    /// adapter wrote, such as origin markers, comes back). Empty when the peer cannot.
    async fn visible_raw(&self, _target: &MessageTarget) -> Vec<serde_json::Value> {
        Vec::new()
    }
}

/// The cases, in the order the macro generates them.
pub const CASES: &[&str] = &[
    "send_round_trip",
    "edit_round_trip",
    "delete_round_trip",
    "declared_text_limit_and_chunking_work",
    "idempotency_key_dedupes_when_declared",
    "failure_classes",
    "unknown_outcome_is_reconcilable_when_declared",
    "batch_partial_retry_sends_only_missing_units",
    "recovery_after_restart",
    "inbound_events_normalize",
    "origin_markers_round_trip",
    "live_preview_finalizes_in_place_when_declared",
    "remote_attachments_are_delivered_when_declared",
];

/// One generated `#[tokio::test]` per case; `$peer` is an async expression building a fresh peer.
#[macro_export]
macro_rules! adapter_conformance_tests {
    ($peer:expr) => {
        $crate::adapter_conformance_tests!(@cases $peer;
            send_round_trip, edit_round_trip, delete_round_trip,
            declared_text_limit_and_chunking_work, idempotency_key_dedupes_when_declared,
            failure_classes, unknown_outcome_is_reconcilable_when_declared,
            batch_partial_retry_sends_only_missing_units, recovery_after_restart,
            inbound_events_normalize, origin_markers_round_trip,
            live_preview_finalizes_in_place_when_declared,
            remote_attachments_are_delivered_when_declared);
    };
    (@cases $peer:expr; $($case:ident),+) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let peer = $peer;
                    $crate::$case(&peer).await;
                }
            )+
        }
    };
}

fn message(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage {
        id: id.into(),
        channel: String::new(),
        account_id: None,
        direction: MessageDirection::Outbound,
        target: target.clone(),
        sender: None,
        body: Some(MessageBody {
            text: text.into(),
            format: None,
        }),
        attachments: vec![],
        relation: None,
        origin: None,
        timestamp: None,
        raw: None,
    }
}

fn context(adapter: &dyn ChannelMessageAdapter, target: &MessageTarget, id: &str) -> SendContext {
    let mut msg = message(target, id, "");
    adapter.channel().clone_into(&mut msg.channel);
    SendContext {
        intent_id: None,
        channel: adapter.channel().to_owned(),
        account_id: None,
        message: msg,
        idempotency_key: format!("conformance:{id}"),
        attempt: 1,
        previous_receipt: None,
    }
}

fn unit(index: u32, text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit {
        index,
        kind: MessagePartKind::Text,
        payload: serde_json::json!({ "text": text }),
        required: true,
    }
}

fn engine(
    peer: &dyn ConformancePeer,
    store: Arc<SqliteStore>,
    clock: Arc<ManualClock>,
) -> Messenger {
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    Messenger::new(store, vec![peer.adapter()], policy, clock, "conformance")
}

/// An engine on a fresh state directory (kept alive by the returned guard) and a driven clock.
fn fresh_engine(peer: &dyn ConformancePeer) -> (tempfile::TempDir, Messenger, Arc<ManualClock>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store::testing::open_store(dir.path()));
    let clock = Arc::new(ManualClock::new(1_000));
    let messenger = engine(peer, store, clock.clone());
    (dir, messenger, clock)
}

fn addressed(
    peer: &dyn ConformancePeer,
    target: &MessageTarget,
    id: &str,
    text: &str,
) -> ChannelMessage {
    let mut msg = message(target, id, text);
    peer.adapter().channel().clone_into(&mut msg.channel);
    msg
}

pub async fn send_round_trip(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
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
}

pub async fn edit_round_trip(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    if !adapter.capabilities().live.as_ref().is_some_and(|l| l.edit) {
        return;
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
}

pub async fn delete_round_trip(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    if !adapter
        .capabilities()
        .live
        .as_ref()
        .is_some_and(|l| l.delete)
    {
        return;
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
    let _ = keep;
}

pub async fn declared_text_limit_and_chunking_work(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    let Some(limit) = adapter.capabilities().text.max_length else {
        return;
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
}

pub async fn idempotency_key_dedupes_when_declared(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    if !adapter
        .capabilities()
        .delivery
        .as_ref()
        .is_some_and(|d| d.idempotency_key)
    {
        return;
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
}

pub async fn failure_classes(peer: &impl ConformancePeer) {
    use DeliveryFailureKind::*;
    let adapter = peer.adapter();
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
        if kind == RateLimit
            && adapter
                .capabilities()
                .delivery
                .as_ref()
                .is_some_and(|d| d.retry_after)
        {
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
}

pub async fn unknown_outcome_is_reconcilable_when_declared(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    if !peer.inject_lost_answer(0) {
        return;
    }
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
    if !adapter
        .capabilities()
        .delivery
        .as_ref()
        .is_some_and(|d| d.reconcile_unknown_send)
    {
        return;
    }
    match adapter
        .reconcile_unknown_send(&ctx, &unit(0, "lost answer"))
        .await
        .unwrap()
    {
        Reconciliation::Sent(part) => assert!(!part.platform_message_id.is_empty()),
        other => panic!("a landed unit reconciles as sent, got {other:?}"),
    }
    let never = context(adapter.as_ref(), &target, "unknown-never-sent");
    assert_eq!(
        adapter
            .reconcile_unknown_send(&never, &unit(0, "never"))
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "a unit that never landed reconciles as not sent"
    );
}

pub async fn batch_partial_retry_sends_only_missing_units(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    let Some(limit) = adapter
        .capabilities()
        .text
        .max_length
        .filter(|_| adapter.capabilities().text.chunking)
    else {
        return;
    };
    if !peer.inject_failure(DeliveryFailureKind::Transient, 1, 1) {
        return;
    }
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
}

pub async fn recovery_after_restart(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    if !peer.inject_lost_answer(0) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let target = peer.target("restart");
    {
        let store = Arc::new(clawgate_store::testing::open_store(dir.path()));
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
    let store = Arc::new(clawgate_store::testing::open_store(dir.path()));
    let messenger = engine(peer, store.clone(), clock.clone());
    messenger.recover().await.unwrap();
    assert_eq!(
        peer.visible_texts(&target).await,
        vec!["survives"],
        "never sent twice"
    );
    let reconciles = adapter
        .capabilities()
        .delivery
        .as_ref()
        .is_some_and(|d| d.reconcile_unknown_send);
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
}

pub async fn inbound_events_normalize(peer: &impl ConformancePeer) {
    let Some(normalizer) = peer.normalizer() else {
        return;
    };
    let target = peer.target("inbound");
    let Some(human) = peer.inject_inbound(&target, "hello gateway", false).await else {
        return;
    };
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
}

pub async fn origin_markers_round_trip(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    let Some(origin_adapter) = adapter.origin() else {
        return;
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
    if raw.is_empty() {
        return;
    }
    assert_eq!(
        origin_adapter.decode(&raw[0]),
        Some(marker),
        "the marker written on send decodes from the platform"
    );
}

pub async fn live_preview_finalizes_in_place_when_declared(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    if !adapter.capabilities().live.as_ref().is_some_and(|l| l.edit) {
        return;
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
}

pub async fn remote_attachments_are_delivered_when_declared(peer: &impl ConformancePeer) {
    let adapter = peer.adapter();
    if !adapter
        .capabilities()
        .attachments
        .as_ref()
        .is_some_and(|a| a.remote_url)
    {
        return;
    }
    let (_dir, messenger, _clock) = fresh_engine(peer);
    let target = peer.target("attachments");
    let url = "https://files.example/conformance.png";
    let mut picture = addressed(peer, &target, "attachments", "a picture");
    picture.attachments = vec![clawgate_types::MessageAttachment {
        kind: MessagePartKind::Media,
        url: Some(url.into()),
        mime_type: Some("image/png".into()),
        file_name: Some("conformance.png".into()),
        size_bytes: None,
    }];
    let report = messenger
        .send(picture, SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("a declared remote attachment is delivered: {report:?}")
    };
    let parts: Vec<_> = receipt.parts.iter().map(|p| (p.index, p.kind)).collect();
    assert_eq!(
        parts,
        vec![(0, MessagePartKind::Text), (1, MessagePartKind::Media)],
        "the text and the attachment each land with a receipt part of their kind"
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
}
