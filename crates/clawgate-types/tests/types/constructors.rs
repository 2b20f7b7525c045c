//! The constructors and `with_*` setters build exactly what the wire expects: the same bytes as
//! the pinned snapshots, and no keys for what was not set.

use clawgate_types::{
    BatchAtomicity, ChannelMessage, DeliveryCapabilities, DeliveryFailureKind, ImmediateAckReason,
    LiveCancelReason, LiveCapabilities, LiveMessageUpdate, LiveMode, MessageActor,
    MessageAttachment, MessageCapabilities, MessageDirection, MessagePartKind, MessageQuote,
    MessageReceipt, MessageReceiptPart, MessageRelation, MessageTarget, RenderedMessageBatch,
    RenderedMessageUnit, SystemReason, TargetKind, TextCapabilities, from_json,
};
use serde_json::json;

use crate::helpers::{wire_round_trip, wire_value};

/// The JSON body of a pinned wire snapshot (what follows insta's header).
fn snapshot_body(snapshot: &str) -> &str {
    let body = snapshot
        .splitn(3, "---\n")
        .nth(2)
        .expect("an insta snapshot has a header between two `---` lines");
    body.trim()
}

#[test]
fn a_receipt_part_built_with_the_constructor_serializes_like_the_snapshot() {
    let part = MessageReceiptPart::new("1700000000.0003", MessagePartKind::Text, 0)
        .with_thread_id("1700000000.0001")
        .with_reply_to_id("1700000000.0002")
        .with_edit_token("edit-0")
        .with_delete_token("del-0")
        .with_url("https://chat.example/p/0003")
        .with_raw(json!({ "ok": true }));
    let snapshot = snapshot_body(include_str!(
        "snapshots/types__wire_snapshots__message_receipt_part.snap"
    ));
    // Byte for byte, key order included (insta writes serde_json's pretty form).
    assert_eq!(serde_json::to_string_pretty(&part).unwrap(), snapshot);
    assert_eq!(from_json::<MessageReceiptPart>(snapshot).unwrap(), part);
}

#[test]
fn a_text_unit_built_with_the_constructor_serializes_like_the_snapshot() {
    let unit = RenderedMessageUnit::text(3, "chunk 3");
    let snapshot = snapshot_body(include_str!(
        "snapshots/types__wire_snapshots__rendered_message_unit.snap"
    ));
    assert_eq!(serde_json::to_string_pretty(&unit).unwrap(), snapshot);
}

#[test]
fn a_bare_receipt_part_has_only_its_required_keys() {
    let part = MessageReceiptPart::new("m-1", MessagePartKind::Media, 4);
    assert_eq!(
        wire_value(&part),
        json!({ "platformMessageId": "m-1", "kind": "media", "index": 4 })
    );
}

#[test]
fn outbound_and_inbound_messages_carry_direction_target_and_text_only() {
    let outbound = ChannelMessage::outbound("out-1", "qa", MessageTarget::group("room-1"), "hi");
    assert_eq!(
        wire_value(&outbound),
        json!({
            "id": "out-1",
            "channel": "qa",
            "direction": "outbound",
            "target": { "kind": "group", "id": "room-1" },
            "body": { "text": "hi" },
        })
    );
    let inbound = ChannelMessage::inbound("m-7", "qa", MessageTarget::direct("dm-ada"))
        .with_sender(MessageActor::new("ada").with_display_name("Ada"))
        .with_text("hello");
    assert_eq!(
        wire_value(&inbound),
        json!({
            "id": "m-7",
            "channel": "qa",
            "direction": "inbound",
            "target": { "kind": "direct", "id": "dm-ada" },
            "sender": { "id": "ada", "displayName": "Ada", "isBot": false },
            "body": { "text": "hello" },
        })
    );
    assert_eq!(inbound.direction, MessageDirection::Inbound);
    assert_eq!(wire_round_trip(&inbound), inbound);
}

#[test]
fn message_setters_fill_every_field() {
    let message = ChannelMessage::outbound("out-2", "qa", MessageTarget::group("room-1"), "x")
        .with_account_id("bot")
        .with_attachment(MessageAttachment::new(MessagePartKind::Voice).with_size_bytes(9))
        .with_attachment(MessageAttachment::new(MessagePartKind::Card))
        .with_relation(MessageRelation::system(SystemReason::Cron))
        .with_timestamp(5)
        .with_raw(json!([1]));
    assert_eq!(message.account_id.as_deref(), Some("bot"));
    assert_eq!(
        message
            .attachments
            .iter()
            .map(|a| a.kind)
            .collect::<Vec<_>>(),
        vec![MessagePartKind::Voice, MessagePartKind::Card],
        "with_attachment appends, in order"
    );
    assert_eq!(
        wire_value(&message.relation),
        json!({ "kind": "system", "reason": "cron" })
    );
    assert_eq!(
        (message.timestamp, message.raw),
        (Some(5), Some(json!([1])))
    );
}

#[test]
fn target_constructors_set_the_kind_and_thread_setter_can_clear() {
    #[rustfmt::skip]
    let cases = [
        ("direct",  MessageTarget::direct("a"),  TargetKind::Direct),
        ("group",   MessageTarget::group("a"),   TargetKind::Group),
        ("channel", MessageTarget::channel("a"), TargetKind::Channel),
        ("thread",  MessageTarget::thread("a"),  TargetKind::Thread),
    ];
    for (name, target, kind) in cases {
        assert_eq!(target.kind, kind, "{name}");
        assert_eq!(
            wire_value(&target),
            json!({ "kind": name, "id": "a" }),
            "{name}"
        );
    }
    let threaded = MessageTarget::group("c1").with_thread_id(Some("t-1"));
    assert_eq!(threaded.thread_id.as_deref(), Some("t-1"));
    assert_eq!(threaded.with_thread_id(None::<String>).thread_id, None);
}

#[test]
fn reply_relations_name_what_they_answer() {
    assert_eq!(
        wire_value(&MessageRelation::reply_to_inbound("m-1").with_thread_id(Some("t"))),
        json!({ "kind": "reply", "inboundMessageId": "m-1", "replyToId": "m-1", "threadId": "t" })
    );
    assert_eq!(
        wire_value(&MessageRelation::reply_to("p-9").with_quote(MessageQuote::new("q?"))),
        json!({ "kind": "reply", "replyToId": "p-9", "quote": { "text": "q?" } })
    );
    assert_eq!(
        wire_value(&MessageRelation::reply()),
        json!({ "kind": "reply" })
    );
    assert_eq!(
        wire_value(&MessageRelation::broadcast(None)),
        json!({ "kind": "broadcast" })
    );
}

// The check is a debug assertion: release builds keep the relation unchanged.
#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "only a reply relation carries a thread id")]
fn a_thread_on_a_non_reply_relation_is_refused() {
    let _ = MessageRelation::followup(None, None).with_thread_id(Some("t"));
}

#[test]
fn receipts_from_constructed_parts_keep_the_setters_values() {
    let receipt = MessageReceipt::from_parts(
        vec![
            MessageReceiptPart::new("m0", MessagePartKind::Text, 0).with_thread_id("t"),
            MessageReceiptPart::new("m1", MessagePartKind::Text, 1),
        ],
        10,
    )
    .with_primary_platform_message_id("m1")
    .with_edit_token("e");
    assert_eq!(
        wire_value(&receipt),
        json!({
            "primaryPlatformMessageId": "m1",
            "platformMessageIds": ["m0", "m1"],
            "parts": [
                { "platformMessageId": "m0", "kind": "text", "index": 0, "threadId": "t" },
                { "platformMessageId": "m1", "kind": "text", "index": 1 },
            ],
            "threadId": "t",
            "editToken": "e",
            "sentAt": 10,
        })
    );
}

#[test]
fn units_and_batches_from_constructors() {
    let batch = RenderedMessageBatch::new(
        vec![
            RenderedMessageUnit::text(0, "a"),
            RenderedMessageUnit::new(1, MessagePartKind::Media, json!({ "url": "u" }))
                .with_required(false),
        ],
        BatchAtomicity::BestEffortParts,
        "k",
    );
    assert_eq!(
        wire_value(&batch),
        json!({
            "units": [
                { "index": 0, "kind": "text", "payload": { "text": "a" }, "required": true },
                { "index": 1, "kind": "media", "payload": { "url": "u" }, "required": false },
            ],
            "atomicity": "best_effort_parts",
            "idempotencyKey": "k",
        })
    );
}

#[test]
fn capabilities_start_from_nothing_and_setters_add_only_what_is_declared() {
    assert_eq!(
        wire_value(&MessageCapabilities::default()),
        json!({ "text": { "chunking": false } })
    );
    let declared = MessageCapabilities::default()
        .with_text(TextCapabilities::default().with_max_length(100))
        .with_live(LiveCapabilities::default().with_edit(true))
        .with_delivery(DeliveryCapabilities::default().with_retry_after(true));
    assert_eq!(
        wire_value(&declared),
        json!({
            "text": { "maxLength": 100, "chunking": false },
            "live": { "edit": true, "delete": false, "nativeStream": false, "progress": false },
            "delivery": {
                "idempotencyKey": false,
                "retryAfter": true,
                "receiptRequired": false,
                "reconcileUnknownSend": false,
                "duplicatesAcceptable": false,
            },
        })
    );
}

#[test]
fn live_update_constructors_match_the_variants() {
    assert_eq!(
        LiveMessageUpdate::partial("so far"),
        LiveMessageUpdate::Partial {
            text: "so far".into()
        }
    );
    assert_eq!(
        wire_value(&LiveMessageUpdate::block(2, "b")),
        json!({ "mode": "block", "index": 2, "text": "b" })
    );
    assert_eq!(
        wire_value(&LiveMessageUpdate::progress("indexing", Some(0.5))),
        json!({ "mode": "progress", "label": "indexing", "fraction": 0.5 })
    );
    assert_eq!(
        wire_value(&LiveMessageUpdate::native(json!({ "chunk": 1 }))),
        json!({ "mode": "native", "payload": { "chunk": 1 } })
    );
}

/// Every `KNOWN` value has its own wire spelling and survives a round trip.
#[test]
fn known_variant_lists_are_distinct_and_round_trip() {
    fn check<T>(name: &str, known: &[T])
    where
        T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let spellings: std::collections::BTreeSet<String> =
            known.iter().map(|v| wire_value(v).to_string()).collect();
        assert_eq!(spellings.len(), known.len(), "{name}: duplicate spellings");
        for value in known {
            assert_eq!(&wire_round_trip(value), value, "{name}");
        }
    }
    check("TargetKind", TargetKind::KNOWN);
    check("SystemReason", SystemReason::KNOWN);
    check("MessagePartKind", MessagePartKind::KNOWN);
    check("DeliveryFailureKind", DeliveryFailureKind::KNOWN);
    check("ImmediateAckReason", ImmediateAckReason::KNOWN);
    check("LiveMode", LiveMode::KNOWN);
    check("LiveCancelReason", LiveCancelReason::KNOWN);
    assert_eq!(DeliveryFailureKind::KNOWN.len(), 9);
}
