//! Receipt and batch helpers, when a live preview goes stale, and how streamed media is
//! recognised.

use std::collections::{BTreeMap, BTreeSet};

use clawgate_types::{
    LiveMessageState, LiveMode, MessageAttachment, MessagePartKind, MessageReceipt,
    MessageReceiptPart, UnixMillis,
};
use proptest::prelude::*;

use crate::fixtures::{self, receipt_part};
use crate::helpers::wire_round_trip;

fn ids(receipt: &MessageReceipt) -> Vec<&str> {
    receipt
        .platform_message_ids
        .iter()
        .map(String::as_str)
        .collect()
}

fn indices(receipt: &MessageReceipt) -> Vec<u32> {
    receipt.delivered_indices().collect()
}

#[test]
fn from_parts_orders_ids_and_picks_the_first_as_primary() {
    let first = receipt_part(0, "m0")
        .with_thread_id("t1")
        .with_reply_to_id("r1");
    let second = receipt_part(1, "m1")
        .with_thread_id("t2")
        .with_reply_to_id("r2");
    let receipt = MessageReceipt::from_parts(vec![first.clone(), second.clone()], 500);
    assert_eq!(receipt.primary_platform_message_id.as_deref(), Some("m0"));
    assert_eq!(ids(&receipt), ["m0", "m1"]);
    assert_eq!(receipt.parts, [first, second]);
    assert_eq!(receipt.thread_id.as_deref(), Some("t1"));
    assert_eq!(receipt.reply_to_id.as_deref(), Some("r1"));
    assert_eq!(receipt.sent_at, 500);
    assert_eq!(
        (
            receipt.edit_token,
            receipt.delete_token,
            receipt.url,
            receipt.raw
        ),
        (None, None, None, None)
    );

    // Part order, not index order, decides the primary.
    let reversed =
        MessageReceipt::from_parts(vec![receipt_part(5, "late"), receipt_part(2, "early")], 1);
    assert_eq!(
        reversed.primary_platform_message_id.as_deref(),
        Some("late")
    );
    assert_eq!(indices(&reversed), [5, 2]);

    let empty = MessageReceipt::from_parts(vec![], 9);
    assert_eq!(empty.primary_platform_message_id, None);
    assert!(empty.platform_message_ids.is_empty());
    assert_eq!(empty.thread_id, None);
    assert_eq!(indices(&empty), Vec::<u32>::new());
}

#[test]
fn merge_keeps_existing_parts_and_orders_by_index() {
    let mut receipt =
        MessageReceipt::from_parts(vec![receipt_part(2, "a2"), receipt_part(0, "a0")], 100);
    let other = MessageReceipt::from_parts(vec![receipt_part(2, "b2"), receipt_part(1, "b1")], 200);
    receipt.merge(other);
    assert_eq!(indices(&receipt), [0, 1, 2]);
    assert_eq!(
        ids(&receipt),
        ["a0", "b1", "a2"],
        "index 2 keeps its first receipt"
    );
    assert_eq!(receipt.primary_platform_message_id.as_deref(), Some("a0"));
    assert_eq!(receipt.sent_at, 200);

    // An earlier retry receipt does not move `sentAt` back.
    receipt.merge(MessageReceipt::from_parts(vec![receipt_part(3, "c3")], 50));
    assert_eq!(receipt.sent_at, 200);
    assert_eq!(ids(&receipt), ["a0", "b1", "a2", "c3"]);
}

#[test]
fn merge_recomputes_the_primary_from_the_lowest_index() {
    let mut receipt = MessageReceipt::from_parts(vec![receipt_part(1, "second")], 10);
    assert_eq!(
        receipt.primary_platform_message_id.as_deref(),
        Some("second")
    );
    receipt.merge(MessageReceipt::from_parts(
        vec![receipt_part(0, "first")],
        20,
    ));
    assert_eq!(
        receipt.primary_platform_message_id.as_deref(),
        Some("first")
    );
    assert_eq!(ids(&receipt), ["first", "second"]);

    let mut empty = MessageReceipt::from_parts(vec![], 0);
    empty.merge(MessageReceipt::from_parts(
        vec![receipt_part(4, "d"), receipt_part(3, "c")],
        7,
    ));
    assert_eq!(ids(&empty), ["c", "d"]);
    assert_eq!(empty.primary_platform_message_id.as_deref(), Some("c"));
    assert_eq!(empty.sent_at, 7);
}

fn distinct_parts() -> impl Strategy<Value = Vec<MessageReceiptPart>> {
    proptest::collection::btree_map(0u32..8, "[a-z]{1,3}", 0..6).prop_map(|parts| {
        parts
            .into_iter()
            .map(|(index, id)| receipt_part(index, &id))
            .collect()
    })
}

proptest! {
    #[test]
    fn merge_is_a_union_that_prefers_existing_parts(
        mine in distinct_parts(),
        theirs in distinct_parts(),
        (sent_mine, sent_theirs) in (any::<i64>(), any::<i64>()),
    ) {
        let mut receipt = MessageReceipt::from_parts(mine.clone(), sent_mine);
        receipt.merge(MessageReceipt::from_parts(theirs.clone(), sent_theirs));

        let mut expected: BTreeMap<u32, &MessageReceiptPart> = theirs.iter().map(|p| (p.index, p)).collect();
        expected.extend(mine.iter().map(|p| (p.index, p)));
        let expected: Vec<MessageReceiptPart> = expected.into_values().cloned().collect();
        prop_assert_eq!(&receipt.parts, &expected);
        let expected_ids: Vec<String> = expected.iter().map(|p| p.platform_message_id.clone()).collect();
        prop_assert_eq!(&receipt.platform_message_ids, &expected_ids);
        prop_assert_eq!(receipt.primary_platform_message_id.as_ref(), expected_ids.first());
        prop_assert_eq!(receipt.sent_at, sent_mine.max(sent_theirs));
    }

    #[test]
    fn missing_units_are_exactly_the_undelivered_ones(
        mut batch in crate::strategies::batch(),
        unit_indices in proptest::collection::vec(0u32..6, 0..6),
        delivered in proptest::collection::vec(0u32..6, 0..6),
    ) {
        // Small indices on both sides, so delivered and undelivered units both occur.
        batch.units = unit_indices.into_iter().map(fixtures::batch_unit).collect();
        let missing: Vec<_> = batch.missing_units(&delivered).cloned().collect();
        let expected: Vec<_> =
            batch.units.iter().filter(|u| !delivered.contains(&u.index)).cloned().collect();
        prop_assert_eq!(missing, expected);
    }

    #[test]
    fn unit_keys_identify_batch_and_unit(
        // A tiny alphabet with digits and `#`, so near-collisions such as ("k1", 2) against
        // ("k", 12) come up often.
        (key_a, index_a) in ("[k1#]{0,3}", 0u32..13),
        (key_b, index_b) in ("[k1#]{0,3}", 0u32..13),
    ) {
        let batch = |key: &str| {
            let mut batch = fixtures::batch();
            key.clone_into(&mut batch.idempotency_key);
            batch
        };
        let a = batch(&key_a).unit_idempotency_key(index_a);
        let b = batch(&key_b).unit_idempotency_key(index_b);
        prop_assert_eq!(a == b, (key_a, index_a) == (key_b, index_b));
    }
}

#[test]
fn missing_units_after_a_partial_delivery() {
    let mut batch = fixtures::batch();
    batch.units = (0..4).map(fixtures::batch_unit).collect();
    let missing = |delivered: &[u32]| -> Vec<u32> {
        batch.missing_units(delivered).map(|u| u.index).collect()
    };
    assert_eq!(missing(&[]), [0, 1, 2, 3]);
    assert_eq!(missing(&[0, 2]), [1, 3]);
    assert_eq!(missing(&[3, 2, 1, 0]), Vec::<u32>::new());
    assert_eq!(missing(&[9]), [0, 1, 2, 3], "unknown indices are ignored");

    // Driven by a receipt's delivered indices, as recovery does.
    let receipt = MessageReceipt::from_parts(vec![receipt_part(1, "m1"), receipt_part(0, "m0")], 0);
    let delivered: Vec<u32> = receipt.delivered_indices().collect();
    assert_eq!(missing(&delivered), [2, 3]);
}

#[test]
fn an_intent_misses_the_units_its_partial_receipt_does_not_cover() {
    let mut intent = fixtures::durable_send_intent();
    let indices = |intent: &clawgate_types::DurableSendIntent| -> Vec<u32> {
        intent.missing_units().map(|u| u.index).collect()
    };
    intent.batch = None;
    intent.partial_receipt = None;
    assert_eq!(indices(&intent), Vec::<u32>::new(), "nothing rendered yet");

    let mut batch = fixtures::batch();
    batch.units = (0..4).map(fixtures::batch_unit).collect();
    intent.batch = Some(batch);
    assert_eq!(indices(&intent), [0, 1, 2, 3], "no receipt: every unit");

    intent.partial_receipt = Some(MessageReceipt::from_parts(
        vec![receipt_part(2, "m2"), receipt_part(0, "m0")],
        0,
    ));
    assert_eq!(indices(&intent), [1, 3]);

    intent.partial_receipt = Some(MessageReceipt::from_parts(
        (0..4).map(|i| receipt_part(i, &format!("m{i}"))).collect(),
        0,
    ));
    assert_eq!(indices(&intent), Vec::<u32>::new(), "all delivered");
}

#[test]
fn unit_idempotency_keys_are_distinct_and_stable() {
    let mut batch = fixtures::batch();
    batch.units = (0..5).map(fixtures::batch_unit).collect();
    let keys: Vec<String> = batch
        .units
        .iter()
        .map(|u| batch.unit_idempotency_key(u.index))
        .collect();
    assert_eq!(
        keys.iter().collect::<BTreeSet<_>>().len(),
        keys.len(),
        "{keys:?}"
    );
    assert_eq!(keys[0], "slack:out-10#0");
    assert_eq!(keys[4], "slack:out-10#4");
    // Stable across a restart: the stored batch produces the same keys.
    let restored = wire_round_trip(&batch);
    let again: Vec<String> = restored
        .units
        .iter()
        .map(|u| restored.unit_idempotency_key(u.index))
        .collect();
    assert_eq!(again, keys);
    // Distinct from another batch's keys.
    let mut other = batch;
    other.idempotency_key = "slack:out-11".into();
    assert_ne!(other.unit_idempotency_key(0), keys[0]);
}

fn live(visible_since: Option<UnixMillis>, stale_after_ms: Option<u64>) -> LiveMessageState {
    let mut state = LiveMessageState::empty(LiveMode::Partial).with_can_finalize_in_place(true);
    (state.visible_since, state.stale_after_ms) = (visible_since, stale_after_ms);
    state
}

/// (name, visible_since, stale_after_ms, now, is_stale)
type StaleCase = (
    &'static str,
    Option<UnixMillis>,
    Option<u64>,
    UnixMillis,
    bool,
);

#[test]
fn stale_boundaries() {
    #[rustfmt::skip]
    let cases: [StaleCase; 15] = [
        ("never shown",                None,           Some(500),              i64::MAX, false),
        ("no limit",                   Some(1_000),    None,                   i64::MAX, false),
        ("neither",                    None,           None,                   0,        false),
        ("just before the limit",      Some(1_000),    Some(500),              1_499,    false),
        ("exactly at the limit",       Some(1_000),    Some(500),              1_500,    false),
        ("just past the limit",        Some(1_000),    Some(500),              1_501,    true),
        ("zero limit, same instant",   Some(1_000),    Some(0),                1_000,    false),
        ("zero limit, one ms later",   Some(1_000),    Some(0),                1_001,    true),
        ("clock went backwards",       Some(1_000),    Some(0),                0,        false),
        ("clock runs back past i64",   Some(i64::MAX), Some(0),                i64::MIN, false),
        ("limit beyond i64",           Some(i64::MIN), Some(u64::MAX),         i64::MAX, false),
        ("age saturates at i64::MAX",  Some(i64::MIN), Some(i64::MAX as u64),  i64::MAX, false),
        // The age overflows i64: it saturates (stays huge, so stale) rather than wrapping.
        ("age overflows i64",          Some(-10),      Some(1_000),            i64::MAX, true),
        ("huge age, huge limit",       Some(0),        Some(i64::MAX as u64 - 1), i64::MAX, true),
        ("negative timestamps",        Some(-2_000),   Some(500),              -1_000,   true),
    ];
    for (name, since, limit, now, stale) in cases {
        assert_eq!(live(since, limit).is_stale(now), stale, "{name}");
    }
    let fixture = fixtures::live_state();
    let since = fixture.visible_since.unwrap();
    assert!(!fixture.is_stale(since + 600_000));
    assert!(fixture.is_stale(since + 600_001));
}

fn attachment(url: Option<&str>, file_name: Option<&str>) -> MessageAttachment {
    let mut attachment = MessageAttachment::new(MessagePartKind::Media).with_mime_type("image/png");
    attachment.url = url.map(str::to_owned);
    attachment.file_name = file_name.map(str::to_owned);
    attachment
}

/// (name, url, file name, identity)
type IdentityCase = (
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
);

#[test]
fn streamed_media_is_recognised_by_url_else_file_name() {
    #[rustfmt::skip]
    let cases: [IdentityCase; 6] = [
        ("url wins",               Some("https://x/a.png"), Some("a.png"), Some("https://x/a.png")),
        ("url only",               Some("https://x/a.png"), None,          Some("https://x/a.png")),
        ("file name only",         None,                    Some("a.png"), Some("a.png")),
        ("empty url, file name",   Some(""),                Some("a.png"), Some("a.png")),
        ("neither",                None,                    None,          None),
        ("both empty",             Some(""),                Some(""),      None),
    ];
    for (name, url, file_name, identity) in cases {
        let a = attachment(url, file_name);
        assert_eq!(LiveMessageState::media_identity(&a), identity, "{name}");
    }
    let mut state = live(None, None);
    state
        .streamed_media
        .insert("https://x/a.png".into(), receipt_part(0, "m-2"));
    state
        .streamed_media
        .insert("b.png".into(), receipt_part(1, "m-3"));
    assert!(state.has_streamed(&attachment(Some("https://x/a.png"), Some("other.png"))));
    assert!(state.has_streamed(&attachment(None, Some("b.png"))));
    assert!(
        !state.has_streamed(&attachment(Some("https://x/b.png"), Some("b.png"))),
        "a URL identifies the attachment; its file name is not compared"
    );
    assert!(!state.has_streamed(&attachment(Some("https://x/c.png"), None)));
    assert!(
        !state.has_streamed(&attachment(None, None)),
        "no identity, never streamed"
    );
}

#[test]
fn a_live_state_stored_before_streamed_media_still_decodes() {
    let old = serde_json::json!({
        "mode": "partial",
        "receipt": {
            "platformMessageIds": ["preview-1"],
            "parts": [{ "platformMessageId": "preview-1", "kind": "text", "index": 0 }],
            "sentAt": 1
        },
        "canFinalizeInPlace": true
    });
    let state: LiveMessageState = clawgate_types::from_json_value(old).unwrap();
    assert!(state.streamed_media.is_empty());
    let again = serde_json::to_value(&state).unwrap();
    assert!(
        again.get("streamedMedia").is_none(),
        "nothing streamed, nothing written: {again}"
    );
}
