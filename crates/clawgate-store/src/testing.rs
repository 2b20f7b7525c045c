//! The backend-neutral store conformance suite.
//!
//! Every backend runs every case through [`store_conformance_tests!`](crate::store_conformance_tests):
//!
//! ```text
//! clawgate_store::store_conformance_tests!(open = |dir: &std::path::Path| my_backend(dir), persistent = true);
//! ```
//!
//! `open` gets a fresh temporary directory per case and must return a store on it. Cases that
//! reopen the same directory (durability across a restart) run only when `persistent = true`.
//! Each case panics with a message naming the broken behaviour.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::collections::BTreeSet;

use clawgate_types::{
    AcpxProcessLease, ActorType, BatchAtomicity, ChannelMessage, DurableSendIntent,
    GatewayInstanceId, IntentId, IntentStatus, LeaseId, LeaseState, LeaseSurvivor, MessageBody,
    MessageOrigin, MessagePartKind, MessageReceipt, MessageReceiptPart, MessageTarget,
    RenderedMessageBatch, RenderedMessageUnit, RunOutcome, SessionKey, SessionStateEventKind,
    StateVersion,
};

use crate::{
    ChannelScope, Claim, ClaimToken, InboundKey, InboundStatus, InsertIntentOutcome, IntentCursor,
    IntentFilter, NewSessionEvent, RecordInboundOutcome, SessionRow, Store, StoreError,
    ValueExpectation, ValueSwap, WatchCursor, WatchSource, WatermarkKey,
};

/// Generates one `#[tokio::test]` per conformance case.
#[macro_export]
macro_rules! store_conformance_tests {
    (open = $open:expr, persistent = true) => {
        // Cases that need the data to outlive the store, or a second connection to the file.
        $crate::store_conformance_tests!(@every $open;
            reopen_keeps_committed_state,
            intent_ordered_insert_is_visible_and_kept_by_the_next_write,
            external_changes_are_announced);
    };
    (open = $open:expr, persistent = false) => {
        $crate::store_conformance_tests!(@every $open;);
    };
    (@every $open:expr; $($extra:ident),* $(,)?) => {
        $crate::store_conformance_tests!(@cases $open;
            intent_insert_and_load, intent_duplicate_key_returns_existing,
            intents_found_by_key_prefix,
            intent_save_checks_status_and_transitions, intent_commit_receipt_is_atomic,
            intent_partial_receipts_merge, intent_claims_are_exclusive,
            intent_claim_is_kept_while_the_holder_works,
            intent_claim_due_respects_schedule_and_order, intent_listing_pages_every_row_once,
            intent_finished_ones_are_pruned_once_old,
            intent_due_listing_claims_nothing_and_the_first_save_takes_the_claim,
            concurrent_writes_all_commit, failing_write_does_not_fail_neighbours,
            inbound_dedupe_attempts_and_pruning, inbound_accepted_before_its_first_attempt,
            watermark_never_moves_back,
            signal_append_advances_head_and_dedupes, signal_events_since_is_bounded,
            signal_prune_keeps_heads_and_exact_gap, cursors_and_session_lifecycle,
            sessions_registry_round_trip, leases_round_trip_and_compare_and_set,
            concurrent_lease_saves_are_not_lost,
            instance_id_is_stable, notices_open_once_and_consume_reopens_once,
            global_sessions_of_two_agents_are_independent,
            deleting_a_watched_session_leaves_each_watcher_one_deletion_notice,
            account_leases_have_one_holder_and_change_hands_only_when_expired,
            channel_records_are_appended_once_and_read_in_order,
            channel_state_of_one_account_is_invisible_to_every_other,
            channel_records_are_pruned_by_age_and_by_count,
            channel_values_are_compare_and_set_under_concurrent_writers,
            concurrent_channel_appends_are_numbered_once_each
            $(, $extra)*);
    };
    (@cases $open:expr; $($case:ident),+ $(,)?) => {
        mod conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let dir = $crate::testing::tempdir();
                    $crate::testing::$case(dir.path(), &$open).await;
                }
            )+
        }
    };
}

/// A fresh temporary directory for one case.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory for the conformance case")
}

fn intent_id(n: u64) -> IntentId {
    IntentId::parse(format!("intent-{n:06}")).unwrap()
}

/// A realistic outbound reply with an origin marker and a two-unit batch.
pub fn sample_intent(n: u64, created_at: i64) -> DurableSendIntent {
    let message = ChannelMessage::outbound(
        format!("msg-{n}"),
        "qa",
        MessageTarget::group("room-1").with_thread_id(Some("thread-9")),
        "",
    )
    .with_account_id("bot")
    .with_body(MessageBody::new(format!("reply {n}")).with_format("markdown"))
    .with_origin(MessageOrigin::gateway_failure(
        clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
    ))
    .with_timestamp(created_at);
    let mut intent = DurableSendIntent::new(intent_id(n), format!("key-{n}"), message, created_at);
    intent.batch = Some(RenderedMessageBatch::new(
        (0..2)
            .map(|i| RenderedMessageUnit::text(i, format!("part {i}")))
            .collect(),
        BatchAtomicity::AllOrRetryRemaining,
        format!("key-{n}"),
    ));
    intent
}

/// A text unit's receipt part with platform id `id`.
pub fn part(index: u32, id: &str) -> MessageReceiptPart {
    MessageReceiptPart::new(id, MessagePartKind::Text, index)
}

fn claim(token: &str, now: i64) -> Claim {
    Claim {
        token: ClaimToken(token.into()),
        now,
        ttl_ms: 1_000,
    }
}

fn key(text: &str) -> SessionKey {
    SessionKey::parse(text).unwrap()
}

fn event(session: &str, kind: SessionStateEventKind, at: i64) -> NewSessionEvent {
    NewSessionEvent {
        session_key: key(session),
        kind,
        actor_type: ActorType::Human,
        actor_id: Some("user-1".into()),
        summary: "human message via qa".into(),
        outcome: None,
        child_session_key: None,
        dedupe_key: None,
        created_at: at,
    }
}

/// Moves an intent to a new status through the store, as an engine would.
async fn step<S: Store>(store: &S, intent: &mut DurableSendIntent, to: IntentStatus, now: i64) {
    let from = intent.status;
    intent.status = to;
    intent.updated_at = now;
    store
        .save_intent(intent, from, None)
        .await
        .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
}

pub async fn intent_insert_and_load<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let intent = sample_intent(1, 1_000);
    assert_eq!(
        store.insert_intent(&intent, None).await.unwrap(),
        InsertIntentOutcome::Inserted
    );
    assert_eq!(
        store.load_intent(&intent.id).await.unwrap(),
        Some(intent.clone()),
        "load by id"
    );
    assert_eq!(
        store.find_intent_by_key("key-1").await.unwrap(),
        Some(intent),
        "find by key"
    );
    assert_eq!(
        store.load_intent(&intent_id(2)).await.unwrap(),
        None,
        "unknown id"
    );
}

pub async fn intents_found_by_key_prefix<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let keys = [
        "qa:reply:e1:0",
        "qa:reply:e1:1",
        "qa:reply:e1:10",
        "qa:reply:e10:0",
        "qa:reply:e1",
        "qa:reply:e2:0",
        "qa:reply:e%:0",
    ];
    for (n, key) in keys.iter().enumerate() {
        let mut intent = sample_intent(n as u64 + 1, 1_000);
        (*key).clone_into(&mut intent.idempotency_key);
        store.insert_intent(&intent, None).await.unwrap();
    }
    let found = |prefix: &'static str, limit| {
        let store = &store;
        async move {
            store
                .find_intents_by_key_prefix(prefix, limit)
                .await
                .unwrap()
                .into_iter()
                .map(|i| i.idempotency_key)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        found("qa:reply:e1:", 10).await,
        ["qa:reply:e1:0", "qa:reply:e1:1", "qa:reply:e1:10"],
        "one reply's generations, in key order, not another event's"
    );
    assert_eq!(found("qa:reply:e1:", 2).await.len(), 2, "the limit holds");
    assert_eq!(
        found("qa:reply:e%:", 10).await,
        ["qa:reply:e%:0"],
        "no wildcards"
    );
    assert!(found("qa:reply:e3:", 10).await.is_empty());
}

pub async fn intent_duplicate_key_returns_existing<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let first = sample_intent(1, 1_000);
    store.insert_intent(&first, None).await.unwrap();
    let mut again = sample_intent(2, 2_000);
    again.idempotency_key = first.idempotency_key.clone();
    match store.insert_intent(&again, None).await.unwrap() {
        InsertIntentOutcome::Duplicate(existing) => assert_eq!(*existing, first),
        other => panic!("a reused idempotency key must return the existing intent, got {other:?}"),
    }
    assert_eq!(
        store.load_intent(&again.id).await.unwrap(),
        None,
        "the duplicate was not stored"
    );
}

/// Retention removes finished intents (`sent`, `cancelled`) last updated before the cutoff,
/// oldest first and no more than asked; nothing open or waiting for an operator goes, and a
/// removed intent's key may be used again.
pub async fn intent_finished_ones_are_pruned_once_old<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    use IntentStatus::*;
    let store = open(dir);
    // (n, created, path of statuses, last update): every status an intent can rest in.
    let cases: [(u64, i64, &[IntentStatus], i64); 8] = [
        (1, 1_000, &[Sending, Sent], 1_100),
        (2, 2_000, &[Cancelled], 2_100),
        (3, 3_000, &[Sending, UnknownAfterSend], 3_100),
        (4, 4_000, &[Failed], 4_100),
        (5, 5_000, &[], 5_000),
        (6, 6_000, &[Sending], 6_100),
        // Finished, but updated after the cutoff: a retry that ended late.
        (7, 7_000, &[Failed, Pending, Sending, Sent], 20_000),
        // Created and finished after the cutoff.
        (8, 15_000, &[Sending, Sent], 15_100),
    ];
    for (n, created, path, updated) in cases {
        let mut intent = sample_intent(n, created);
        store.insert_intent(&intent, None).await.unwrap();
        for (i, to) in path.iter().enumerate() {
            let at = if i + 1 == path.len() {
                updated
            } else {
                created + 1
            };
            step(&store, &mut intent, *to, at).await;
        }
    }
    let cutoff = 10_000;
    assert_eq!(
        store.prune_finished_intents(cutoff, 1).await.unwrap(),
        1,
        "no more than the limit"
    );
    assert_eq!(
        store.load_intent(&intent_id(1)).await.unwrap(),
        None,
        "the oldest finished intent goes first"
    );
    assert!(store.load_intent(&intent_id(2)).await.unwrap().is_some());
    assert_eq!(store.prune_finished_intents(cutoff, 100).await.unwrap(), 1);
    assert_eq!(
        store.prune_finished_intents(cutoff, 100).await.unwrap(),
        0,
        "nothing else is old and finished"
    );
    let left: Vec<u64> = store
        .list_intents(&IntentFilter {
            limit: 100,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .iter()
        .map(|i| {
            (1..=8)
                .find(|n| intent_id(*n) == i.id)
                .expect("a known intent")
        })
        .collect();
    assert_eq!(left, vec![3, 4, 5, 6, 7, 8]);
    // The key of a removed intent is free again.
    assert_eq!(
        store
            .insert_intent(&sample_intent(1, 30_000), None)
            .await
            .unwrap(),
        InsertIntentOutcome::Inserted
    );
}

pub async fn intent_save_checks_status_and_transitions<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let mut intent = sample_intent(1, 1_000);
    store.insert_intent(&intent, None).await.unwrap();
    // The table forbids pending -> sent: nothing was sent, so nothing can be committed.
    let mut skip = intent.clone();
    skip.status = IntentStatus::Sent;
    match store.save_intent(&skip, IntentStatus::Pending, None).await {
        Err(StoreError::IllegalTransition { .. }) => {}
        other => panic!("expected an illegal transition, got {other:?}"),
    }
    step(&store, &mut intent, IntentStatus::Sending, 1_001).await;
    // A stale writer that still believes the intent is pending loses.
    let mut stale = intent.clone();
    stale.status = IntentStatus::Cancelled;
    match store.save_intent(&stale, IntentStatus::Pending, None).await {
        Err(StoreError::IntentStatusConflict {
            actual: IntentStatus::Sending,
            ..
        }) => {}
        other => panic!("expected a status conflict, got {other:?}"),
    }
    step(&store, &mut intent, IntentStatus::UnknownAfterSend, 1_002).await;
    let loaded = store.load_intent(&intent.id).await.unwrap().unwrap();
    assert_eq!(loaded.status, IntentStatus::UnknownAfterSend);
    assert_eq!(
        loaded, intent,
        "every field written by save_intent reads back"
    );
}

pub async fn intent_commit_receipt_is_atomic<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let mut intent = sample_intent(1, 1_000);
    store.insert_intent(&intent, None).await.unwrap();
    step(&store, &mut intent, IntentStatus::Sending, 1_001).await;
    store
        .record_partial_receipt(
            &intent.id,
            &MessageReceipt::from_parts(vec![part(0, "p-0")], 1_001),
            1_001,
        )
        .await
        .unwrap();
    intent = store.load_intent(&intent.id).await.unwrap().unwrap();
    step(&store, &mut intent, IntentStatus::Committing, 1_002).await;
    let receipt = MessageReceipt::from_parts(vec![part(0, "p-0"), part(1, "p-1")], 1_002);
    let committed = store
        .commit_receipt(&intent.id, &receipt, 1_003)
        .await
        .unwrap();
    assert_eq!(committed.status, IntentStatus::Sent);
    assert_eq!(committed.receipt.as_ref(), Some(&receipt));
    assert_eq!(
        committed.partial_receipt, None,
        "the partial receipt is folded into the final"
    );
    assert_eq!(
        store.load_intent(&intent.id).await.unwrap(),
        Some(committed)
    );
    match store.commit_receipt(&intent.id, &receipt, 1_004).await {
        Err(StoreError::IllegalTransition { .. }) => {}
        other => panic!("a second commit must be refused, got {other:?}"),
    }
    // The send path: the platform just answered, the raw receipt and its commit are one write.
    let mut direct = sample_intent(2, 1_000);
    store
        .insert_intent(&direct, Some(&claim("w", 1_000)))
        .await
        .unwrap();
    direct.status = IntentStatus::Sending;
    store
        .save_intent(&direct, IntentStatus::Pending, Some(&claim("w", 1_000)))
        .await
        .unwrap();
    let receipt = MessageReceipt::from_parts(vec![part(0, "p-2")], 1_005);
    let committed = store
        .commit_receipt(&direct.id, &receipt, 1_005)
        .await
        .unwrap();
    assert_eq!(committed.status, IntentStatus::Sent);
    assert_eq!(committed.receipt.as_ref(), Some(&receipt));
    assert_eq!(
        store.claim_holders().await.unwrap(),
        Vec::new(),
        "the commit releases the sender's claim"
    );
    // Pending means nothing was sent: there is no receipt to commit.
    let waiting = sample_intent(3, 1_000);
    store.insert_intent(&waiting, None).await.unwrap();
    match store.commit_receipt(&waiting.id, &receipt, 1_006).await {
        Err(StoreError::IllegalTransition { .. }) => {}
        other => panic!("a pending intent has nothing to commit, got {other:?}"),
    }
    let due = store
        .claim_due_intents(&claim("w", 10_000), 10)
        .await
        .unwrap();
    assert_eq!(
        due.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![waiting.id],
        "a committed intent is never due again"
    );
}

pub async fn intent_partial_receipts_merge<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let mut intent = sample_intent(1, 1_000);
    store.insert_intent(&intent, None).await.unwrap();
    match store
        .record_partial_receipt(
            &intent.id,
            &MessageReceipt::from_parts(vec![part(0, "a")], 1),
            1,
        )
        .await
    {
        Err(StoreError::IntentStatusConflict { .. }) => {}
        other => panic!("partial receipts belong to sending intents, got {other:?}"),
    }
    step(&store, &mut intent, IntentStatus::Sending, 1_001).await;
    store
        .record_partial_receipt(
            &intent.id,
            &MessageReceipt::from_parts(vec![part(1, "b")], 2),
            2,
        )
        .await
        .unwrap();
    let merged = store
        .record_partial_receipt(
            &intent.id,
            &MessageReceipt::from_parts(vec![part(0, "a")], 3),
            3,
        )
        .await
        .unwrap();
    let partial = merged.partial_receipt.unwrap();
    assert_eq!(
        partial.platform_message_ids,
        vec!["a".to_string(), "b".to_string()]
    );
    assert_eq!(partial.primary_platform_message_id.as_deref(), Some("a"));
    let delivered: Vec<u32> = partial.delivered_indices().collect();
    let batch = merged.batch.unwrap();
    assert_eq!(
        batch.missing_units(&delivered).count(),
        0,
        "both units have receipts"
    );
}

/// A holder saving `pending` with nothing scheduled (a live stream between previews) keeps its
/// claim, so a recovery pass never takes an intent that is still being worked on; a retry
/// scheduled for later lets it go.
pub async fn intent_claim_is_kept_while_the_holder_works<S: Store + 'static>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let mut intent = sample_intent(0, 1_000);
    let holder = claim("holder", 1_000);
    store.insert_intent(&intent, Some(&holder)).await.unwrap();
    intent.updated_at = 1_100;
    store
        .save_intent(
            &intent,
            IntentStatus::Pending,
            Some(&claim("holder", 1_100)),
        )
        .await
        .unwrap();
    assert!(
        store
            .claim_due_intents(&claim("recovery", 1_200), 10)
            .await
            .unwrap()
            .is_empty(),
        "the holder still works on it"
    );
    intent.next_attempt_at = Some(1_300);
    store
        .save_intent(
            &intent,
            IntentStatus::Pending,
            Some(&claim("holder", 1_100)),
        )
        .await
        .unwrap();
    let due = store
        .claim_due_intents(&claim("recovery", 1_400), 10)
        .await
        .unwrap();
    assert_eq!(due.len(), 1, "rescheduled: any worker may take it when due");
}

pub async fn intent_claims_are_exclusive<S: Store + 'static>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = std::sync::Arc::new(open(dir));
    for n in 0..40 {
        store
            .insert_intent(&sample_intent(n, 1_000 + n as i64), None)
            .await
            .unwrap();
    }
    let mut handles = Vec::new();
    for worker in 0..4 {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            loop {
                let got = store
                    .claim_due_intents(&claim(&format!("w{worker}"), 5_000), 3)
                    .await
                    .unwrap();
                if got.is_empty() {
                    break mine;
                }
                mine.extend(got.into_iter().map(|i| i.id));
            }
        }));
    }
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for handle in handles {
        let ids = handle.await.unwrap();
        total += ids.len();
        seen.extend(ids);
    }
    assert_eq!(
        total, 40,
        "every intent claimed exactly once across workers"
    );
    assert_eq!(seen.len(), 40);
    let id = intent_id(0);
    assert_eq!(
        store
            .claim_intent(&id, &claim("intruder", 5_500))
            .await
            .unwrap(),
        None,
        "claim held"
    );
    store
        .release_intent_claim(&id, &ClaimToken("intruder".into()))
        .await
        .unwrap();
    assert_eq!(
        store
            .claim_intent(&id, &claim("intruder", 5_500))
            .await
            .unwrap(),
        None,
        "only the holder releases"
    );
    assert!(
        store
            .claim_intent(&id, &claim("late", 6_001))
            .await
            .unwrap()
            .is_some(),
        "expired claims can be taken"
    );
    let mut taken = store.load_intent(&id).await.unwrap().unwrap();
    taken.status = IntentStatus::Sending;
    taken.updated_at = 6_002;
    match store
        .save_intent(&taken, IntentStatus::Pending, Some(&claim("w0", 6_002)))
        .await
    {
        Err(StoreError::ClaimHeld { holder, .. }) => assert_eq!(holder, "late"),
        other => panic!("a save under someone else's live claim must fail, got {other:?}"),
    }
    store
        .save_intent(&taken, IntentStatus::Pending, Some(&claim("late", 6_002)))
        .await
        .unwrap();
    let holders = store.claim_holders().await.unwrap();
    assert!(
        holders.iter().any(|(t, n)| t.as_str() == "late" && *n == 1),
        "{holders:?}"
    );
    assert_eq!(
        store
            .release_claims_held_by(&ClaimToken("late".into()))
            .await
            .unwrap(),
        1
    );
    assert!(
        store
            .claim_holders()
            .await
            .unwrap()
            .iter()
            .all(|(t, _)| t.as_str() != "late")
    );
    assert!(
        store
            .claim_intent(&id, &claim("next", 6_003))
            .await
            .unwrap()
            .is_some(),
        "released claims can be taken"
    );
    match store.claim_intent(&intent_id(999), &claim("x", 1)).await {
        Err(StoreError::NotFound { .. }) => {}
        other => panic!("claiming an unknown intent is NotFound, got {other:?}"),
    }
}

pub async fn intent_claim_due_respects_schedule_and_order<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let mut later = sample_intent(1, 3_000);
    later.next_attempt_at = Some(9_000);
    store.insert_intent(&later, None).await.unwrap();
    store
        .insert_intent(&sample_intent(2, 2_000), None)
        .await
        .unwrap();
    store
        .insert_intent(&sample_intent(3, 1_000), None)
        .await
        .unwrap();
    let mut parked = sample_intent(5, 400);
    store.insert_intent(&parked, None).await.unwrap();
    step(&store, &mut parked, IntentStatus::Sending, 401).await;
    step(&store, &mut parked, IntentStatus::UnknownAfterSend, 402).await;
    let mut done = sample_intent(4, 500);
    store.insert_intent(&done, None).await.unwrap();
    step(&store, &mut done, IntentStatus::Cancelled, 600).await;
    let long = Claim {
        ttl_ms: 10_000,
        ..claim("w", 5_000)
    };
    let due: Vec<IntentId> = store
        .claim_due_intents(&long, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(
        due,
        vec![intent_id(3), intent_id(2)],
        "oldest first; not-yet-due, parked unknown and terminal skipped"
    );
    let due: Vec<IntentId> = store
        .claim_due_intents(&claim("v", 9_000), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(
        due,
        vec![intent_id(1)],
        "due once its time has come (others still claimed by w)"
    );
}

/// The ids `due_intents` lists at `now`, after `after`.
async fn due_ids<S: Store>(
    store: &S,
    now: i64,
    after: Option<&IntentCursor>,
    limit: u32,
) -> Vec<IntentId> {
    let due = store.due_intents(now, after, limit).await.unwrap();
    due.into_iter().map(|i| i.id).collect()
}

/// A worker's copy of `intent` with its next attempt started at `at` (not yet saved).
fn attempt_started(intent: &DurableSendIntent, at: i64) -> DurableSendIntent {
    let mut started = intent.clone();
    started.status = IntentStatus::Sending;
    started.attempt += 1;
    started.updated_at = at;
    started
}

/// `due_intents` lists what `claim_due_intents` would claim, page by page, without claiming
/// anything; of two workers that both found an intent there, the first guarded save takes it
/// (and its claim) and the second is refused, also when its copy predates another attempt.
pub async fn intent_due_listing_claims_nothing_and_the_first_save_takes_the_claim<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    for n in 0..5 {
        store
            .insert_intent(&sample_intent(n, 1_000 + n as i64), None)
            .await
            .unwrap();
    }
    let mut later = sample_intent(5, 900);
    later.next_attempt_at = Some(9_000);
    store.insert_intent(&later, None).await.unwrap();
    let busy = sample_intent(6, 950);
    store
        .insert_intent(&busy, Some(&claim("live-sender", 4_900)))
        .await
        .unwrap();
    let mut parked = sample_intent(7, 800);
    store.insert_intent(&parked, None).await.unwrap();
    step(&store, &mut parked, IntentStatus::Sending, 801).await;
    step(&store, &mut parked, IntentStatus::UnknownAfterSend, 802).await;

    let first = store.due_intents(5_000, None, 3).await.unwrap();
    let first_ids: Vec<IntentId> = first.iter().map(|i| i.id.clone()).collect();
    assert_eq!(
        first_ids,
        vec![intent_id(0), intent_id(1), intent_id(2)],
        "oldest first; not yet due, claimed by a live holder and parked left out"
    );
    let after = first.last().map(IntentCursor::of);
    assert_eq!(
        due_ids(&store, 5_000, after.as_ref(), 10).await,
        vec![intent_id(3), intent_id(4)],
        "the next page"
    );
    assert_eq!(
        store.claim_holders().await.unwrap(),
        vec![(ClaimToken("live-sender".into()), 1)],
        "listing claims nothing"
    );

    // Two workers found intent 0; the first save into `sending` is the lock.
    let found = attempt_started(&first[0], 5_001);
    store
        .save_intent(&found, IntentStatus::Pending, Some(&claim("a", 5_001)))
        .await
        .unwrap();
    match store
        .save_intent(&found, IntentStatus::Pending, Some(&claim("b", 5_001)))
        .await
    {
        Err(StoreError::IntentStatusConflict { actual, .. }) => {
            assert_eq!(actual, IntentStatus::Sending);
        }
        other => panic!("the second worker must lose the race, got {other:?}"),
    }
    assert_eq!(
        store
            .claim_intent(&intent_id(0), &claim("c", 5_500))
            .await
            .unwrap(),
        None,
        "the save took the claim"
    );
    let loaded = store.load_intent(&intent_id(0)).await.unwrap().unwrap();
    assert_eq!((loaded.status, loaded.attempt), (IntentStatus::Sending, 1));
    // A live holder's intent cannot be taken by a save either.
    match store
        .save_intent(
            &attempt_started(&busy, 5_002),
            IntentStatus::Pending,
            Some(&claim("b", 5_002)),
        )
        .await
    {
        Err(StoreError::ClaimHeld { holder, .. }) => assert_eq!(holder, "live-sender"),
        other => panic!("a live holder's claim must hold, got {other:?}"),
    }
    assert_eq!(
        due_ids(&store, 5_002, None, 10).await,
        vec![intent_id(1), intent_id(2), intent_id(3), intent_id(4)],
        "the taken intent is no longer listed"
    );

    // Worker a takes intent 1, its attempt fails and is rescheduled: pending again, unclaimed.
    // Worker b still holds the copy it read before; starting an attempt from it is refused.
    let mut taken = attempt_started(&first[1], 5_003);
    store
        .save_intent(&taken, IntentStatus::Pending, Some(&claim("a", 5_003)))
        .await
        .unwrap();
    taken.status = IntentStatus::Pending;
    taken.next_attempt_at = Some(5_010);
    taken.updated_at = 5_004;
    store
        .save_intent(&taken, IntentStatus::Sending, Some(&claim("a", 5_004)))
        .await
        .unwrap();
    match store
        .save_intent(
            &attempt_started(&first[1], 5_020),
            IntentStatus::Pending,
            Some(&claim("b", 5_020)),
        )
        .await
    {
        Err(StoreError::StaleIntent {
            attempt,
            stored_attempt,
            ..
        }) => assert_eq!((attempt, stored_attempt), (1, 1)),
        other => panic!("a copy read before another worker's attempt is stale, got {other:?}"),
    }
    // A fresh read starts the next attempt.
    let fresh = store.due_intents(5_020, None, 1).await.unwrap().remove(0);
    assert_eq!((fresh.id.clone(), fresh.attempt), (intent_id(1), 1));
    store
        .save_intent(
            &attempt_started(&fresh, 5_021),
            IntentStatus::Pending,
            Some(&claim("b", 5_021)),
        )
        .await
        .unwrap();
}

pub async fn intent_listing_pages_every_row_once<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    for n in 0..25 {
        // Equal timestamps in pairs: the id breaks ties.
        store
            .insert_intent(&sample_intent(n, 1_000 + (n / 2) as i64), None)
            .await
            .unwrap();
    }
    let mut failed = store.load_intent(&intent_id(7)).await.unwrap().unwrap();
    step(&store, &mut failed, IntentStatus::Failed, 2_000).await;
    let mut all = Vec::new();
    let mut filter = IntentFilter {
        limit: 10,
        ..IntentFilter::default()
    };
    loop {
        let page = store.list_intents(&filter).await.unwrap();
        let Some(last) = page.last() else { break };
        filter.after = Some(IntentCursor::of(last));
        all.extend(page.into_iter().map(|i| i.id));
    }
    let expected: Vec<IntentId> = (0..25).map(intent_id).collect();
    assert_eq!(
        all, expected,
        "keyset pages return every intent once, oldest first"
    );
    let failed_only = store
        .list_intents(&IntentFilter {
            statuses: vec![IntentStatus::Failed],
            limit: 100,
            ..IntentFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(failed_only.len(), 1);
    assert_eq!(
        store.count_intents_by_status().await.unwrap(),
        vec![(IntentStatus::Pending, 24), (IntentStatus::Failed, 1)]
    );
}

pub async fn concurrent_writes_all_commit<S: Store + 'static>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = std::sync::Arc::new(open(dir));
    let tasks: Vec<_> = (0..200)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move { store.insert_intent(&sample_intent(n, 1_000), None).await })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), InsertIntentOutcome::Inserted);
    }
    let counts = store.count_intents_by_status().await.unwrap();
    assert_eq!(
        counts,
        vec![(IntentStatus::Pending, 200)],
        "every acknowledged write is visible"
    );
}

pub async fn failing_write_does_not_fail_neighbours<S: Store + 'static>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = std::sync::Arc::new(open(dir));
    store
        .insert_intent(&sample_intent(0, 1_000), None)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..100u64)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut intent = sample_intent(n + 1, 1_000);
                if n % 3 == 0 {
                    // Same id as an existing row under another key: this write must fail alone.
                    intent.id = intent_id(0);
                }
                (n, store.insert_intent(&intent, None).await)
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        let (n, result) = task.await.unwrap();
        if n % 3 == 0 {
            assert!(
                matches!(result, Err(StoreError::InvalidInput(_))),
                "write {n}: {result:?}"
            );
        } else {
            assert_eq!(result.unwrap(), InsertIntentOutcome::Inserted, "write {n}");
            ok += 1;
        }
    }
    let stored: u64 = store
        .count_intents_by_status()
        .await
        .unwrap()
        .iter()
        .map(|(_, c)| c)
        .sum();
    assert_eq!(stored, 1 + ok, "neighbours of the failed writes committed");
}

pub async fn inbound_accepted_before_its_first_attempt<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let k = |id: &str| InboundKey {
        channel: "irc".into(),
        account_id: "bot".into(),
        event_id: id.into(),
    };
    let payload = serde_json::json!({ "text": "hi" });
    assert!(store.accept_inbound(&k("a1"), &payload, 100).await.unwrap());
    assert!(
        !store
            .accept_inbound(&k("a1"), &serde_json::json!({ "text": "other" }), 110)
            .await
            .unwrap(),
        "accepted once"
    );
    let accepted = store.load_inbound(&k("a1")).await.unwrap().unwrap();
    assert_eq!(
        (accepted.status, accepted.attempts, accepted.payload.clone()),
        (InboundStatus::Received, 0, payload.clone()),
        "durable, unfinished, no attempt counted, the first payload kept"
    );
    // What a restart works on again.
    let unfinished = store.list_unfinished_inbound(10).await.unwrap();
    assert_eq!(
        unfinished
            .iter()
            .map(|r| (r.event_id.as_str(), r.attempts))
            .collect::<Vec<_>>(),
        vec![("a1", 0)]
    );
    match store.record_inbound(&k("a1"), &payload, 120).await.unwrap() {
        RecordInboundOutcome::Duplicate(record) => assert_eq!(
            (record.status, record.attempts),
            (InboundStatus::Received, 1),
            "its receive counts the first attempt"
        ),
        other => panic!("an accepted event is recorded already, got {other:?}"),
    }
    store
        .finish_inbound(&k("a1"), InboundStatus::Completed, None, 130)
        .await
        .unwrap();
    assert!(!store.accept_inbound(&k("a1"), &payload, 140).await.unwrap());
    assert_eq!(
        store.load_inbound(&k("a1")).await.unwrap().unwrap().status,
        InboundStatus::Completed,
        "a redelivery of a finished event leaves it finished"
    );
}

pub async fn inbound_dedupe_attempts_and_pruning<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let k = |id: &str| InboundKey {
        channel: "qa".into(),
        account_id: "bot".into(),
        event_id: id.into(),
    };
    let payload = serde_json::json!({ "text": "hi" });
    assert!(matches!(
        store.record_inbound(&k("e1"), &payload, 100).await.unwrap(),
        RecordInboundOutcome::New(_)
    ));
    match store
        .record_inbound(&k("e1"), &serde_json::json!({ "text": "other" }), 200)
        .await
        .unwrap()
    {
        RecordInboundOutcome::Duplicate(record) => {
            assert_eq!(record.payload, payload, "the first record is kept");
            assert_eq!(
                record.attempts, 2,
                "an unfinished event's redelivery starts (and counts) another attempt"
            );
        }
        other => panic!("a redelivery is a duplicate, got {other:?}"),
    }
    store.record_inbound(&k("e2"), &payload, 150).await.unwrap();
    let first = store
        .finish_inbound(&k("e1"), InboundStatus::Received, Some("first error"), 302)
        .await
        .unwrap();
    assert_eq!(first, 2, "finishing an attempt does not count it again");
    // A third attempt starts (the process might die in it: it is counted already), then fails.
    store.record_inbound(&k("e1"), &payload, 303).await.unwrap();
    let second = store
        .finish_inbound(
            &k("e1"),
            InboundStatus::DeadLettered,
            Some("second error"),
            304,
        )
        .await
        .unwrap();
    assert_eq!(second, 3, "each started attempt is counted once");
    match store.record_inbound(&k("e1"), &payload, 305).await.unwrap() {
        RecordInboundOutcome::Duplicate(record) => assert_eq!(
            (record.status, record.attempts),
            (InboundStatus::DeadLettered, 3),
            "a finished record is not counted again"
        ),
        other => panic!("a finished event is a duplicate, got {other:?}"),
    }
    let e1 = store.load_inbound(&k("e1")).await.unwrap().unwrap();
    assert_eq!(
        (e1.status, e1.attempts, e1.last_error.as_deref()),
        (InboundStatus::DeadLettered, 3, Some("first error"))
    );
    let unfinished = store.list_unfinished_inbound(10).await.unwrap();
    assert_eq!(
        unfinished
            .iter()
            .map(|r| r.event_id.as_str())
            .collect::<Vec<_>>(),
        vec!["e2"]
    );
    // An attempt interrupted by a clean stop is given back; the next start counts again.
    assert_eq!(
        store
            .interrupt_inbound(&k("e2"), "the gateway stopped", 350)
            .await
            .unwrap(),
        0,
        "an interrupted attempt is not counted"
    );
    let e2 = store.load_inbound(&k("e2")).await.unwrap().unwrap();
    assert_eq!(
        (e2.status, e2.attempts, e2.last_error.as_deref()),
        (InboundStatus::Received, 0, Some("the gateway stopped"))
    );
    match store.record_inbound(&k("e2"), &payload, 360).await.unwrap() {
        RecordInboundOutcome::Duplicate(record) => assert_eq!(record.attempts, 1),
        other => panic!("{other:?}"),
    }
    store
        .finish_inbound(&k("e2"), InboundStatus::Completed, None, 400)
        .await
        .unwrap();
    assert_eq!(
        store
            .interrupt_inbound(&k("e2"), "too late", 410)
            .await
            .unwrap(),
        1,
        "a finished record is left as it is"
    );
    assert_eq!(
        store
            .list_inbound(Some(InboundStatus::Completed), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store.prune_completed_inbound(400, 100).await.unwrap(),
        0,
        "inside the window"
    );
    // Two more, received later: pruning takes the oldest first, no more than asked.
    for (event, at) in [("e3", 160), ("e4", 170)] {
        store.record_inbound(&k(event), &payload, at).await.unwrap();
        store
            .finish_inbound(&k(event), InboundStatus::Completed, None, 400)
            .await
            .unwrap();
    }
    assert_eq!(store.prune_completed_inbound(401, 2).await.unwrap(), 2);
    assert!(store.load_inbound(&k("e2")).await.unwrap().is_none());
    assert!(store.load_inbound(&k("e3")).await.unwrap().is_none());
    assert!(store.load_inbound(&k("e4")).await.unwrap().is_some());
    assert_eq!(store.prune_completed_inbound(401, 2).await.unwrap(), 1);
    assert!(store.load_inbound(&k("e4")).await.unwrap().is_none());
    assert!(
        store.load_inbound(&k("e1")).await.unwrap().is_some(),
        "dead letters are kept for operators"
    );
    assert!(matches!(
        store
            .finish_inbound(&k("nope"), InboundStatus::Completed, None, 1)
            .await,
        Err(StoreError::NotFound { .. })
    ));
}

pub async fn watermark_never_moves_back<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let key = WatermarkKey {
        channel: "qa".into(),
        account_id: "bot".into(),
        source: "poll".into(),
    };
    assert_eq!(store.load_watermark(&key).await.unwrap(), None);
    assert_eq!(
        store
            .advance_watermark(&key, 10, Some("batch-10"), 1)
            .await
            .unwrap(),
        10
    );
    assert_eq!(
        store
            .advance_watermark(&key, 7, Some("batch-7"), 2)
            .await
            .unwrap(),
        10,
        "never backwards"
    );
    assert_eq!(
        store.load_watermark(&key).await.unwrap(),
        Some((10, Some("batch-10".to_owned()))),
        "a lower position does not move the checkpoint either"
    );
    assert_eq!(
        store.advance_watermark(&key, 12, None, 3).await.unwrap(),
        12
    );
    assert_eq!(store.load_watermark(&key).await.unwrap(), Some((12, None)));
}

pub async fn signal_append_advances_head_and_dedupes<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let a = "agent:main:subagent:child";
    let first = store
        .append_event(&event(a, SessionStateEventKind::HumanDirectMessage, 10))
        .await
        .unwrap();
    assert_eq!((first.event.sequence, first.duplicate), (1, false));
    let mut failed = event(a, SessionStateEventKind::RunFailed, 11);
    failed.outcome = Some(RunOutcome::Timeout);
    failed.dedupe_key = Some("run-7".into());
    let second = store.append_event(&failed).await.unwrap();
    assert_eq!(second.event.sequence, 2);
    let again = store.append_event(&failed).await.unwrap();
    assert!(
        again.duplicate,
        "a repeated dedupe key returns the existing row"
    );
    assert_eq!(again.event, second.event);
    store
        .append_event(&event(
            "agent:other:main",
            SessionStateEventKind::GoalChanged,
            12,
        ))
        .await
        .unwrap();
    assert_eq!(
        store.session_head(&key(a)).await.unwrap().state_version,
        StateVersion(2),
        "heads are per session"
    );
    let changes = store
        .events_since(&key(a), StateVersion(0), 200)
        .await
        .unwrap();
    assert_eq!(changes.events.len(), 2);
    assert_eq!(
        changes.events[1].outcome,
        Some(RunOutcome::Timeout),
        "the run outcome is kept"
    );
    assert!(
        store
            .append_event(&NewSessionEvent {
                summary: "two\nlines".into(),
                ..event(a, SessionStateEventKind::Compacted, 13)
            })
            .await
            .is_err(),
        "summaries are one line"
    );
}

pub async fn signal_events_since_is_bounded<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let a = "agent:main:main";
    for n in 0..250 {
        store
            .append_event(&event(a, SessionStateEventKind::GoalChanged, n))
            .await
            .unwrap();
    }
    let changes = store
        .events_since(&key(a), StateVersion(10), 200)
        .await
        .unwrap();
    assert_eq!(changes.state_version, StateVersion(250));
    assert_eq!(changes.events.len(), 200);
    assert_eq!(
        changes.events[0].sequence, 11,
        "strictly after the version asked for"
    );
    assert!(changes.truncated);
    assert!(!changes.history_gap);
    let tail = store
        .events_since(&key(a), StateVersion(240), 200)
        .await
        .unwrap();
    assert_eq!((tail.events.len(), tail.truncated), (10, false));
    let none = store
        .events_since(&key("agent:main:unknown"), StateVersion(0), 200)
        .await
        .unwrap();
    assert_eq!(
        (none.state_version, none.events.len(), none.history_gap),
        (StateVersion(0), 0, false)
    );
}

pub async fn signal_prune_keeps_heads_and_exact_gap<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let (a, b) = ("agent:main:a", "agent:main:b");
    for n in 0..10 {
        store
            .append_event(&event(a, SessionStateEventKind::GoalChanged, 100 + n))
            .await
            .unwrap();
    }
    for n in 0..5 {
        store
            .append_event(&event(b, SessionStateEventKind::GoalChanged, 200 + n))
            .await
            .unwrap();
    }
    // Age: a's events at 100..=103 go (sequences 1..=4).
    let report = store.prune_signal_log(104, 1_000).await.unwrap();
    assert_eq!(report.events_deleted, 4);
    let head = store.session_head(&key(a)).await.unwrap();
    assert_eq!(
        (head.state_version, head.pruned_through),
        (StateVersion(10), 4)
    );
    assert!(
        store
            .events_since(&key(a), StateVersion(3), 200)
            .await
            .unwrap()
            .history_gap,
        "3 < pruned 4"
    );
    let exact = store
        .events_since(&key(a), StateVersion(4), 200)
        .await
        .unwrap();
    assert!(!exact.history_gap, "nothing after 4 was pruned");
    assert_eq!(exact.events.first().map(|e| e.sequence), Some(5));
    // Row cap: keep the newest 4 rows overall: a loses 5..=10, b loses 1..=1.
    let report = store.prune_signal_log(0, 4).await.unwrap();
    assert_eq!(report.events_deleted, 7);
    assert_eq!(
        store.session_head(&key(a)).await.unwrap().pruned_through,
        10
    );
    assert_eq!(store.session_head(&key(b)).await.unwrap().pruned_through, 1);
    assert_eq!(
        store.session_head(&key(a)).await.unwrap().state_version,
        StateVersion(10),
        "heads stay monotonic"
    );
    let next = store
        .append_event(&event(a, SessionStateEventKind::GoalChanged, 300))
        .await
        .unwrap();
    assert_eq!(next.event.sequence, 11, "sequences continue after pruning");
}

pub async fn cursors_and_session_lifecycle<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let parent = key("agent:main:main");
    let child = key("agent:main:subagent:child");
    let other = key("agent:main:other");
    let cursor = |watcher: &SessionKey, target: &SessionKey, at: i64| WatchCursor {
        watcher_key: watcher.clone(),
        target_key: target.clone(),
        acked_version: StateVersion(3),
        notified_version: None,
        material_version: StateVersion(3),
        target_deleted_by: None,
        source: WatchSource::Spawn,
        created_at: at,
        updated_at: at,
    };
    let created = store
        .ensure_cursor(&cursor(&parent, &child, 10))
        .await
        .unwrap();
    let mut moved = cursor(&parent, &child, 10);
    moved.acked_version = StateVersion(99);
    assert_eq!(
        store.ensure_cursor(&moved).await.unwrap(),
        created,
        "ensure never moves an existing cursor"
    );
    let mut pending = created.clone();
    pending.notified_version = Some(StateVersion(5));
    pending.material_version = StateVersion(7);
    pending.updated_at = 20;
    store.save_cursor(&pending).await.unwrap();
    assert_eq!(
        store.load_cursor(&parent, &child).await.unwrap(),
        Some(pending.clone())
    );
    assert_eq!(
        store.cursors_with_pending_notice().await.unwrap(),
        vec![pending]
    );
    store
        .ensure_cursor(&cursor(&other, &child, 11))
        .await
        .unwrap();
    store
        .ensure_cursor(&cursor(&child, &other, 12))
        .await
        .unwrap();
    assert_eq!(store.cursors_on_target(&child).await.unwrap().len(), 2);
    assert!(
        store
            .ensure_cursor(&cursor(&SessionKey::global(), &child, 1))
            .await
            .is_err(),
        "global scope cannot watch"
    );

    for k in [&parent, &child, &other] {
        store.upsert_session(&session_row(k, 1)).await.unwrap();
    }
    store.reset_session(&child, 30).await.unwrap();
    assert!(
        store.cursors_of_watcher(&child).await.unwrap().is_empty(),
        "reset drops the watcher's cursors"
    );
    assert_eq!(
        store.cursors_on_target(&child).await.unwrap().len(),
        2,
        "cursors on the reset session stay"
    );
    let notified = store
        .delete_session(&child, parent.as_str(), 40)
        .await
        .unwrap();
    assert_eq!(
        notified.iter().map(|c| &c.watcher_key).collect::<Vec<_>>(),
        vec![&other],
        "the deleter's own watch ends silently; the other watcher keeps a deletion notice"
    );
    assert!(store.consume_deletion_notice(&other, &child).await.unwrap());
    assert!(
        store.cursors_on_target(&child).await.unwrap().is_empty(),
        "a consumed deletion notice ends the watch"
    );
    let report = store.prune_signal_log(1_000, 1_000).await.unwrap();
    assert_eq!(report.cursors_deleted, 0, "no cursor was left to expire");
    store
        .ensure_cursor(&cursor(&parent, &other, 50))
        .await
        .unwrap();
    assert_eq!(
        store
            .prune_signal_log(51, 1_000)
            .await
            .unwrap()
            .cursors_deleted,
        1,
        "cursors expire with retention"
    );
}

/// A registry row for `k` (its agent from the key), created and updated at `at`.
pub fn session_row(k: &SessionKey, at: i64) -> SessionRow {
    SessionRow {
        session_key: k.clone(),
        agent_id: k.agent_id().unwrap_or("main").to_owned(),
        owner_session_key: None,
        spawned_by: None,
        parent_session_key: None,
        label: None,
        acp_owner: None,
        lease_id: None,
        acp_session_id: None,
        created_at: at,
        updated_at: at,
        reset_at: None,
        deleted_at: None,
    }
}

pub async fn sessions_registry_round_trip<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let parent = key("agent:main:main");
    let child = key("agent:coder:acp:1");
    let mut row = session_row(&child, 5);
    row.owner_session_key = Some(parent.clone());
    row.spawned_by = Some(parent.clone());
    row.lease_id = Some(LeaseId::parse("lease-1").unwrap());
    store.upsert_session(&row).await.unwrap();
    store
        .upsert_session(&session_row(&parent, 4))
        .await
        .unwrap();
    assert_eq!(store.load_session(&child).await.unwrap(), Some(row.clone()));
    row.label = Some("coder".into());
    store.upsert_session(&row).await.unwrap();
    assert_eq!(
        store
            .load_session(&child)
            .await
            .unwrap()
            .unwrap()
            .label
            .as_deref(),
        Some("coder")
    );
    store.delete_session(&child, "operator", 9).await.unwrap();
    let listed: Vec<SessionKey> = store
        .list_sessions()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.session_key)
        .collect();
    assert_eq!(listed, vec![parent], "deleted rows are not listed");
    assert_eq!(
        store
            .load_session(&child)
            .await
            .unwrap()
            .unwrap()
            .deleted_at,
        Some(9)
    );
    assert!(matches!(
        store.reset_session(&key("agent:x:y"), 1).await,
        Err(StoreError::NotFound { .. })
    ));
}

fn lease(id: &str, instance: &str, started_at: i64) -> AcpxProcessLease {
    AcpxProcessLease {
        lease_id: LeaseId::parse(id).unwrap(),
        gateway_instance_id: GatewayInstanceId::parse(instance).unwrap(),
        session_key: key("agent:coder:acp:1"),
        wrapper_root: "/opt/clawgate/wrappers".into(),
        wrapper_path: "/opt/clawgate/wrappers/clawgate-acpx-wrapper".into(),
        root_pid: None,
        root_start_time: None,
        boot_id: None,
        process_group_id: None,
        command_hash: "sha256:abc".into(),
        started_at,
        state: LeaseState::Open,
        ended_at: None,
        survivors: Vec::new(),
        stderr_tail: Vec::new(),
    }
}

pub async fn leases_round_trip_and_compare_and_set<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let mut mine = lease("lease-1", "gw-a", 10);
    store.insert_lease(&mine).await.unwrap();
    store
        .insert_lease(&lease("lease-2", "gw-b", 11))
        .await
        .unwrap();
    store
        .insert_lease(&lease("lease-3", "gw-a", 12))
        .await
        .unwrap();
    assert!(
        store.insert_lease(&mine).await.is_err(),
        "a lease id is written once"
    );
    mine.root_pid = Some(4242);
    mine.process_group_id = Some(4242);
    store.save_lease(&mine, LeaseState::Open).await.unwrap();
    assert_eq!(
        store.load_lease(&mine.lease_id).await.unwrap(),
        Some(mine.clone())
    );
    // A process handed to another session: its lease names that session from then on.
    mine.session_key = SessionKey::parse("agent:main:qa:handed").unwrap();
    store.save_lease(&mine, LeaseState::Open).await.unwrap();
    assert_eq!(
        store.load_lease(&mine.lease_id).await.unwrap(),
        Some(mine.clone()),
        "the lease is re-keyed to the session it serves"
    );
    let gw_a = GatewayInstanceId::parse("gw-a").unwrap();
    let open_a: Vec<String> = store
        .list_leases(Some(&gw_a), &[LeaseState::Open])
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.lease_id.to_string())
        .collect();
    assert_eq!(
        open_a,
        vec!["lease-1", "lease-3"],
        "only this instance's open leases"
    );
    // Processes that outlived KILL keep the lease `closing`, listed with their identities.
    mine.state = LeaseState::Closing;
    mine.survivors = vec![
        LeaseSurvivor {
            pid: 4243,
            start_time: 77,
        },
        LeaseSurvivor {
            pid: 4250,
            start_time: u64::MAX,
        },
    ];
    store.save_lease(&mine, LeaseState::Open).await.unwrap();
    let closing: Vec<AcpxProcessLease> = store
        .list_leases(Some(&gw_a), &[LeaseState::Closing])
        .await
        .unwrap();
    assert_eq!(
        closing,
        vec![mine.clone()],
        "survivors are stored with the lease"
    );
    mine.state = LeaseState::Closed;
    mine.ended_at = Some(100);
    mine.survivors.clear();
    store.save_lease(&mine, LeaseState::Closing).await.unwrap();
    assert_eq!(
        store.load_lease(&mine.lease_id).await.unwrap(),
        Some(mine.clone()),
        "a cleared survivor list is stored as cleared"
    );
    match store.save_lease(&mine, LeaseState::Open).await {
        Err(StoreError::LeaseStateConflict {
            actual: LeaseState::Closed,
            ..
        }) => {}
        other => panic!("a stale lease update must conflict, got {other:?}"),
    }
    assert_eq!(
        store.prune_finished_leases(100).await.unwrap(),
        0,
        "inside retention"
    );
    assert_eq!(store.prune_finished_leases(101).await.unwrap(), 1);
    assert_eq!(
        store.list_leases(None, &[]).await.unwrap().len(),
        2,
        "open leases are never pruned"
    );
}

/// Concurrent saves of many leases all commit; concurrent saves of one lease from the same
/// state are compare-and-set: exactly one wins and is what is stored, the others are told of
/// the conflict (none is silently overwritten).
pub async fn concurrent_lease_saves_are_not_lost<S: Store + 'static>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = std::sync::Arc::new(open(dir));
    for n in 0..40 {
        store
            .insert_lease(&lease(&format!("many-{n}"), "gw-a", n))
            .await
            .unwrap();
    }
    let tasks: Vec<_> = (0..40)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut l = lease(&format!("many-{n}"), "gw-a", n);
                l.state = LeaseState::Closing;
                l.root_pid = Some(1_000 + u32::try_from(n).unwrap());
                store.save_lease(&l, LeaseState::Open).await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    for n in 0..40 {
        let stored = store
            .load_lease(&LeaseId::parse(format!("many-{n}")).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (stored.state, stored.root_pid),
            (LeaseState::Closing, Some(1_000 + u32::try_from(n).unwrap())),
            "lease many-{n}: its own save is stored"
        );
    }

    store
        .insert_lease(&lease("contended", "gw-a", 1))
        .await
        .unwrap();
    let tasks: Vec<_> = (0..20u32)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut l = lease("contended", "gw-a", 1);
                l.state = LeaseState::Closing;
                l.root_pid = Some(5_000 + n);
                (n, store.save_lease(&l, LeaseState::Open).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (n, Ok(())) => winners.push(n),
            (_, Err(StoreError::LeaseStateConflict { .. })) => {}
            (n, Err(other)) => panic!("save {n}: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "one compare-and-set wins: {winners:?}");
    let stored = store
        .load_lease(&LeaseId::parse("contended").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.root_pid,
        Some(5_000 + winners[0]),
        "the winner's save"
    );
}

pub async fn instance_id_is_stable<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let first = store.gateway_instance_id().await.unwrap();
    assert_eq!(store.gateway_instance_id().await.unwrap(), first);
}

pub async fn account_leases_have_one_holder_and_change_hands_only_when_expired<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    use crate::AccountClaim;
    let store = open(dir);
    let a = GatewayInstanceId::parse("gw-a").unwrap();
    let b = GatewayInstanceId::parse("gw-b").unwrap();
    let account = "telegram/default";
    let AccountClaim::Granted(first) = store
        .acquire_account(account, &a, 1_000, 500)
        .await
        .unwrap()
    else {
        panic!("a free account is granted");
    };
    assert_eq!((first.holder.clone(), first.until), (a.clone(), 1_500));
    // Another gateway is refused while the lease is live, and told who holds it.
    match store
        .acquire_account(account, &b, 1_499, 500)
        .await
        .unwrap()
    {
        AccountClaim::HeldBy(lease) => {
            assert_eq!((lease.holder, lease.epoch), (a.clone(), first.epoch))
        }
        other => panic!("a live lease is not taken over: {other:?}"),
    }
    // The holder renews: same epoch, later deadline.
    let AccountClaim::Granted(renewed) = store
        .acquire_account(account, &a, 1_400, 500)
        .await
        .unwrap()
    else {
        panic!("the holder renews its own lease");
    };
    assert_eq!((renewed.epoch, renewed.until), (first.epoch, 1_900));
    // Past the deadline another gateway takes it, under a higher epoch.
    let AccountClaim::Granted(taken) = store
        .acquire_account(account, &b, 1_900, 500)
        .await
        .unwrap()
    else {
        panic!("an expired lease is taken over");
    };
    assert_eq!(taken.holder, b);
    assert!(
        taken.epoch > first.epoch,
        "a change of hands raises the epoch"
    );
    // The old holder's renewal is refused now, and its release changes nothing.
    assert!(matches!(
        store
            .acquire_account(account, &a, 1_950, 500)
            .await
            .unwrap(),
        AccountClaim::HeldBy(_)
    ));
    store
        .release_account(account, &a, first.epoch, 1_950)
        .await
        .unwrap();
    assert_eq!(store.account_leases().await.unwrap(), vec![taken.clone()]);
    // The holder's release frees it at once.
    store
        .release_account(account, &b, taken.epoch, 2_000)
        .await
        .unwrap();
    assert!(matches!(
        store.acquire_account(account, &a, 2_000, 500).await.unwrap(),
        AccountClaim::Granted(lease) if lease.epoch > taken.epoch
    ));
    // Accounts are independent.
    assert!(matches!(
        store
            .acquire_account("telegram/other", &b, 2_000, 500)
            .await
            .unwrap(),
        AccountClaim::Granted(_)
    ));
}

pub async fn reopen_keeps_committed_state<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let (instance, intent) = {
        let store = open(dir);
        let mut intent = sample_intent(1, 1_000);
        store.insert_intent(&intent, None).await.unwrap();
        step(&store, &mut intent, IntentStatus::Sending, 1_001).await;
        store
            .append_event(&event(
                "agent:main:main",
                SessionStateEventKind::GoalChanged,
                5,
            ))
            .await
            .unwrap();
        store
            .insert_lease(&lease("lease-9", "gw-a", 1))
            .await
            .unwrap();
        let zalo = ChannelScope::new("zalo", "oa-1");
        store
            .append_channel_record(
                &zalo,
                "sends",
                "attempt/u1",
                &serde_json::json!({"n": 1}),
                7,
            )
            .await
            .unwrap();
        store
            .swap_channel_value(
                &zalo,
                "tokens",
                ValueExpectation::Absent,
                &serde_json::json!({"refresh": "r1"}),
                8,
            )
            .await
            .unwrap();
        (store.gateway_instance_id().await.unwrap(), intent)
    };
    let store = open(dir);
    let zalo = ChannelScope::new("zalo", "oa-1");
    assert_eq!(
        store
            .find_channel_record(&zalo, "sends", "attempt/u1")
            .await
            .unwrap()
            .map(|r| r.value),
        Some(serde_json::json!({"n": 1})),
        "a channel record reported appended survives a restart"
    );
    assert_eq!(
        store
            .load_channel_value(&zalo, "tokens")
            .await
            .unwrap()
            .map(|v| (v.value, v.version)),
        Some((serde_json::json!({"refresh": "r1"}), 1)),
        "a channel value reported written survives a restart"
    );
    assert_eq!(
        store.gateway_instance_id().await.unwrap(),
        instance,
        "the instance id survives restarts"
    );
    assert_eq!(
        store.load_intent(&intent.id).await.unwrap(),
        Some(intent),
        "the in-flight intent survives"
    );
    assert_eq!(
        store
            .session_head(&key("agent:main:main"))
            .await
            .unwrap()
            .state_version,
        StateVersion(1)
    );
    assert!(
        store
            .load_lease(&LeaseId::parse("lease-9").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

/// An ordered insert answers before it need be durable, but it is already the store's state:
/// reads and idempotency see it, the next write may move it on, and both survive a restart.
pub async fn intent_ordered_insert_is_visible_and_kept_by_the_next_write<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let mut intent = sample_intent(1, 1_000);
    {
        let store = open(dir);
        assert_eq!(
            store.insert_intent_ordered(&intent, None).await.unwrap(),
            InsertIntentOutcome::Inserted
        );
        assert_eq!(
            store.load_intent(&intent.id).await.unwrap(),
            Some(intent.clone()),
            "readable once answered"
        );
        let mut again = sample_intent(2, 2_000);
        again.idempotency_key = intent.idempotency_key.clone();
        match store.insert_intent_ordered(&again, None).await.unwrap() {
            InsertIntentOutcome::Duplicate(existing) => assert_eq!(*existing, intent),
            other => panic!("the ordered insert holds its idempotency key, got {other:?}"),
        }
        step(&store, &mut intent, IntentStatus::Sending, 1_001).await;
    }
    let store = open(dir);
    assert_eq!(
        store.load_intent(&intent.id).await.unwrap(),
        Some(intent),
        "the insert and the write after it survive a restart"
    );
    assert_eq!(
        store.load_intent(&intent_id(2)).await.unwrap(),
        None,
        "the duplicate was not stored"
    );
}

pub async fn notices_open_once_and_consume_reopens_once<S: Store + crate::NoticeCursorStore>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let target = key("agent:main:subagent:child");
    let (parent, peer) = (key("agent:main:main"), key("agent:ops:main"));
    for watcher in [&parent, &peer] {
        store
            .ensure_cursor(&WatchCursor {
                watcher_key: watcher.clone(),
                target_key: target.clone(),
                acked_version: StateVersion(0),
                notified_version: None,
                material_version: StateVersion(0),
                target_deleted_by: None,
                source: WatchSource::Spawn,
                created_at: 1,
                updated_at: 1,
            })
            .await
            .unwrap();
    }
    let log_only = store
        .append_event_opening_notices(&event(target.as_str(), SessionStateEventKind::Compacted, 2))
        .await
        .unwrap();
    assert!(log_only.opened.is_empty(), "log-only kinds open no notice");
    let mut by_peer = event(target.as_str(), SessionStateEventKind::GoalChanged, 3);
    by_peer.actor_type = ActorType::Agent;
    by_peer.actor_id = Some(peer.as_str().to_owned());
    let first = store.append_event_opening_notices(&by_peer).await.unwrap();
    assert_eq!(
        first
            .opened
            .iter()
            .map(|c| (c.watcher_key.clone(), c.notified_version))
            .collect::<Vec<_>>(),
        vec![(parent.clone(), Some(StateVersion(2)))],
        "the actor's own cursor opens nothing; the other freezes at the event"
    );
    let second = store
        .append_event_opening_notices(&event(
            target.as_str(),
            SessionStateEventKind::HumanDirectMessage,
            4,
        ))
        .await
        .unwrap();
    assert_eq!(
        second
            .opened
            .iter()
            .map(|c| c.watcher_key.clone())
            .collect::<Vec<_>>(),
        vec![peer.clone()],
        "a pending notice is not opened twice"
    );
    let stale = store
        .consume_notice(&parent, &target, StateVersion(7), 5)
        .await
        .unwrap();
    assert!(
        !stale.acked,
        "a notice the caller did not see is not consumed"
    );
    let consumed = store
        .consume_notice(&parent, &target, StateVersion(0), 5)
        .await
        .unwrap();
    assert!(
        consumed.acked && consumed.reopened,
        "interleaved work reopens"
    );
    let cursor = consumed.cursor.unwrap();
    assert_eq!(
        (cursor.acked_version, cursor.notified_version),
        (StateVersion(2), Some(StateVersion(3)))
    );
    let last = store
        .consume_notice(&parent, &target, StateVersion(2), 6)
        .await
        .unwrap();
    assert!(last.acked && !last.reopened, "exactly one reopen");
    assert_eq!(
        store.cursors_with_pending_notice().await.unwrap().len(),
        1,
        "only the peer's notice is still pending"
    );
    let missing = store
        .consume_notice(&key("agent:main:nobody"), &target, StateVersion(0), 7)
        .await
        .unwrap();
    assert_eq!(missing.cursor, None);
}

pub async fn external_changes_are_announced<S: Store + crate::ChangeFeed>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let watching = open(dir);
    let mut changes = watching
        .external_changes(std::time::Duration::from_millis(5))
        .unwrap();
    let before = *changes.borrow_and_update();
    // A second handle has its own connections: the commits of "another process".
    let other = open(dir);
    other
        .append_event(&event(
            "agent:main:main",
            SessionStateEventKind::GoalChanged,
            1,
        ))
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(30), changes.changed())
        .await
        .expect("the feed announces another connection's commit within the deadline")
        .unwrap();
    assert_ne!(*changes.borrow(), before);
}

/// Under `session.scope = "global"` every agent's session is called `global`; each agent's is
/// its own: row, head, log, `changesSince` and cursors never mix.
pub async fn global_sessions_of_two_agents_are_independent<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let a = SessionKey::global_of("alpha").unwrap();
    let b = SessionKey::global_of("beta").unwrap();
    let watcher = key("agent:ops:main");
    for (k, agent) in [(&a, "alpha"), (&b, "beta")] {
        let mut row = session_row(k, 1);
        row.agent_id = agent.into();
        store.upsert_session(&row).await.unwrap();
    }
    // A child owned by alpha's global session keeps naming alpha's, not a bare `global`.
    let child = key("agent:alpha:subagent:1");
    let mut child_row = session_row(&child, 2);
    child_row.owner_session_key = Some(a.clone());
    child_row.spawned_by = Some(a.clone());
    store.upsert_session(&child_row).await.unwrap();
    assert_eq!(store.load_session(&child).await.unwrap(), Some(child_row));

    let at = |k: &SessionKey, n: i64| NewSessionEvent {
        session_key: k.clone(),
        ..event("global", SessionStateEventKind::HumanDirectMessage, n)
    };
    for n in 0..3 {
        store.append_event(&at(&a, 10 + n)).await.unwrap();
    }
    let first_b = store.append_event(&at(&b, 20)).await.unwrap();
    assert_eq!(first_b.event.sequence, 1, "beta's log starts at 1");
    assert_eq!(
        store.session_head(&a).await.unwrap().state_version,
        StateVersion(3)
    );
    assert_eq!(
        store.session_head(&b).await.unwrap().state_version,
        StateVersion(1)
    );
    assert_eq!(
        store
            .session_head(&SessionKey::global())
            .await
            .unwrap()
            .state_version,
        StateVersion(0),
        "a bare `global` is neither agent's"
    );
    let since_a = store.events_since(&a, StateVersion(0), 10).await.unwrap();
    let since_b = store.events_since(&b, StateVersion(0), 10).await.unwrap();
    assert_eq!(since_a.events.len(), 3);
    assert_eq!(since_b.events.len(), 1);
    assert_eq!(since_b.events[0].created_at, Some(20));

    let loaded = store.load_session(&b).await.unwrap().unwrap();
    assert_eq!(
        (loaded.session_key, loaded.agent_id.as_str()),
        (b.clone(), "beta")
    );
    let listed: Vec<SessionKey> = store
        .list_sessions()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.session_key)
        .collect();
    assert!(listed.contains(&a) && listed.contains(&b), "{listed:?}");

    let cursor = WatchCursor {
        watcher_key: watcher.clone(),
        target_key: a.clone(),
        acked_version: StateVersion(3),
        notified_version: None,
        material_version: StateVersion(3),
        target_deleted_by: None,
        source: WatchSource::Explicit,
        created_at: 30,
        updated_at: 30,
    };
    store.ensure_cursor(&cursor).await.unwrap();
    assert_eq!(
        store.cursors_on_target(&a).await.unwrap(),
        vec![cursor.clone()]
    );
    assert!(store.cursors_on_target(&b).await.unwrap().is_empty());
    let opened = store
        .append_event_opening_notices(&at(&b, 31))
        .await
        .unwrap();
    assert!(opened.opened.is_empty(), "beta's change is not alpha's");

    store.delete_session(&a, "operator", 40).await.unwrap();
    assert!(
        store
            .load_session(&b)
            .await
            .unwrap()
            .unwrap()
            .deleted_at
            .is_none()
    );
    assert!(store.cursors_on_target(&b).await.unwrap().is_empty());
}

/// Deleting a watched session leaves each of its watchers one deletion notice (none for the
/// deleter): pending through every read, untouched by later events and by change-notice acks,
/// consumed once, and then the watch is gone.
pub async fn deleting_a_watched_session_leaves_each_watcher_one_deletion_notice<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let target = key("agent:main:subagent:child");
    let (parent, peer, deleter) = (
        key("agent:main:main"),
        key("agent:ops:main"),
        key("agent:main:janitor"),
    );
    store
        .upsert_session(&session_row(&target, 1))
        .await
        .unwrap();
    for watcher in [&parent, &peer, &deleter] {
        store
            .ensure_cursor(&WatchCursor {
                watcher_key: watcher.clone(),
                target_key: target.clone(),
                acked_version: StateVersion(0),
                notified_version: None,
                material_version: StateVersion(0),
                target_deleted_by: None,
                source: WatchSource::Spawn,
                created_at: 1,
                updated_at: 1,
            })
            .await
            .unwrap();
    }
    // The parent has a change notice pending when the target goes.
    let change = event(
        target.as_str(),
        SessionStateEventKind::HumanDirectMessage,
        5,
    );
    let opened = store.append_event_opening_notices(&change).await.unwrap();
    assert_eq!(opened.opened.len(), 3);
    for watcher in [&peer, &deleter] {
        store
            .consume_notice(watcher, &target, StateVersion(0), 6)
            .await
            .unwrap();
    }

    let notified = store
        .delete_session(&target, deleter.as_str(), 10)
        .await
        .unwrap();
    let watchers: Vec<&SessionKey> = notified.iter().map(|c| &c.watcher_key).collect();
    assert_eq!(watchers, vec![&parent, &peer], "no notice for the deleter");
    for cursor in &notified {
        assert_eq!(cursor.target_deleted_by.as_deref(), Some(deleter.as_str()));
        assert!(cursor.notified_version.is_some(), "pending");
    }
    assert_eq!(store.load_cursor(&deleter, &target).await.unwrap(), None);
    assert_eq!(
        store.cursors_with_pending_notice().await.unwrap(),
        notified,
        "what a rebuild after a restart finds"
    );

    // Later events on the dead key open nothing; an ack of the earlier change notice does not
    // swallow the deletion notice.
    let late = event(target.as_str(), SessionStateEventKind::GoalChanged, 11);
    assert!(
        store
            .append_event_opening_notices(&late)
            .await
            .unwrap()
            .opened
            .is_empty()
    );
    let ack = store
        .consume_notice(&parent, &target, StateVersion(0), 12)
        .await
        .unwrap();
    assert!(!ack.acked && !ack.reopened);
    assert_eq!(store.cursors_with_pending_notice().await.unwrap(), notified);

    assert!(
        store
            .consume_deletion_notice(&parent, &target)
            .await
            .unwrap()
    );
    assert!(
        !store
            .consume_deletion_notice(&parent, &target)
            .await
            .unwrap(),
        "consumed once"
    );
    assert_eq!(store.load_cursor(&parent, &target).await.unwrap(), None);
    assert!(
        !store
            .consume_deletion_notice(&key("agent:x:y"), &target)
            .await
            .unwrap(),
        "no cursor, nothing consumed"
    );
    assert_eq!(
        store.cursors_with_pending_notice().await.unwrap(),
        vec![notified[1].clone()],
        "the peer's notice is still pending"
    );
}

fn record_value(n: u64) -> serde_json::Value {
    serde_json::json!({"n": n, "text": format!("record {n}")})
}

/// A key is appended once (a repeat returns the stored record unchanged, `new: false`); records
/// are found by key and read back in append order after any position.
pub async fn channel_records_are_appended_once_and_read_in_order<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let scope = ChannelScope::new("zalo", "oa-1");
    let mut seqs = Vec::new();
    for n in 1..=5u64 {
        let appended = store
            .append_channel_record(
                &scope,
                "sends",
                &format!("k{n}"),
                &record_value(n),
                100 + i64::try_from(n).unwrap(),
            )
            .await
            .unwrap();
        assert!(appended.new, "k{n} is new");
        assert_eq!(appended.record.key, format!("k{n}"));
        assert_eq!(appended.record.value, record_value(n));
        seqs.push(appended.record.seq);
    }
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "appends are numbered in order: {seqs:?}"
    );
    let again = store
        .append_channel_record(&scope, "sends", "k3", &serde_json::json!("other"), 999)
        .await
        .unwrap();
    assert!(!again.new, "a repeated key is not appended again");
    assert_eq!(
        (
            again.record.seq,
            again.record.value.clone(),
            again.record.recorded_at
        ),
        (seqs[2], record_value(3), 103),
        "a repeated key returns the stored record unchanged"
    );
    let found = store
        .find_channel_record(&scope, "sends", "k4")
        .await
        .unwrap()
        .expect("k4 is found by its key");
    assert_eq!(
        (found.seq, found.value, found.recorded_at),
        (seqs[3], record_value(4), 104)
    );
    assert!(
        store
            .find_channel_record(&scope, "sends", "k9")
            .await
            .unwrap()
            .is_none(),
        "a key never appended is not found"
    );
    let all = store
        .channel_records_since(&scope, "sends", 0, 100)
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["k1", "k2", "k3", "k4", "k5"],
        "every record once, in append order"
    );
    let after = store
        .channel_records_since(&scope, "sends", seqs[1], 2)
        .await
        .unwrap();
    assert_eq!(
        after.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
        ["k3", "k4"],
        "records after a position, at most the limit"
    );
    assert!(
        store
            .channel_records_since(&scope, "sends", seqs[4], 10)
            .await
            .unwrap()
            .is_empty(),
        "nothing after the newest"
    );
}

/// Two accounts of one kind, two kinds with one account name, and two books of one account
/// never see each other's records or values.
pub async fn channel_state_of_one_account_is_invisible_to_every_other<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let a = ChannelScope::new("matrix", "one");
    let b = ChannelScope::new("matrix", "two");
    let c = ChannelScope::new("teams", "one");
    for (scope, text) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        let appended = store
            .append_channel_record(scope, "journal", "same-key", &serde_json::json!(text), 1)
            .await
            .unwrap();
        assert!(
            appended.new,
            "{scope}: the same key in another scope is a new record"
        );
        store
            .swap_channel_value(
                scope,
                "since",
                ValueExpectation::Absent,
                &serde_json::json!(text),
                1,
            )
            .await
            .unwrap();
    }
    store
        .append_channel_record(&a, "other-book", "same-key", &serde_json::json!("a2"), 1)
        .await
        .unwrap();
    for (scope, text) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        let records = store
            .channel_records_since(scope, "journal", 0, 10)
            .await
            .unwrap();
        assert_eq!(
            records.iter().map(|r| r.value.clone()).collect::<Vec<_>>(),
            [serde_json::json!(text)],
            "{scope} reads only its own book"
        );
        assert_eq!(
            store
                .load_channel_value(scope, "since")
                .await
                .unwrap()
                .map(|v| v.value),
            Some(serde_json::json!(text)),
            "{scope} reads only its own value"
        );
    }
    store
        .prune_channel_records(&b, "journal", i64::MAX, 0)
        .await
        .unwrap();
    assert!(store.delete_channel_value(&b, "since").await.unwrap());
    assert_eq!(
        store
            .channel_records_since(&a, "journal", 0, 10)
            .await
            .unwrap()
            .len(),
        1,
        "pruning one account's book leaves another's"
    );
    assert!(
        store
            .load_channel_value(&a, "since")
            .await
            .unwrap()
            .is_some(),
        "deleting one account's value leaves another's"
    );
    assert_eq!(
        store
            .find_channel_record(&a, "other-book", "same-key")
            .await
            .unwrap()
            .map(|r| r.value),
        Some(serde_json::json!("a2")),
        "another book of the account is its own"
    );
}

/// Pruning removes records older than the cut-off and, of the rest, all but the newest N;
/// numbering goes on after the last number ever given, so a reader's position stays valid.
pub async fn channel_records_are_pruned_by_age_and_by_count<S: Store>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = open(dir);
    let scope = ChannelScope::new("qq", "bot");
    let mut last = 0;
    for n in 1..=10u64 {
        last = store
            .append_channel_record(
                &scope,
                "active",
                &format!("k{n}"),
                &record_value(n),
                i64::try_from(n).unwrap() * 10,
            )
            .await
            .unwrap()
            .record
            .seq;
    }
    // Older than 35: k1, k2, k3 go.
    let removed = store
        .prune_channel_records(&scope, "active", 35, u64::MAX)
        .await
        .unwrap();
    assert_eq!(removed, 3, "the records recorded before the cut-off");
    let keys =
        |records: Vec<crate::ChannelRecord>| records.into_iter().map(|r| r.key).collect::<Vec<_>>();
    assert_eq!(
        keys(
            store
                .channel_records_since(&scope, "active", 0, 100)
                .await
                .unwrap()
        ),
        ["k4", "k5", "k6", "k7", "k8", "k9", "k10"]
    );
    // Keep the newest 4.
    let removed = store
        .prune_channel_records(&scope, "active", 0, 4)
        .await
        .unwrap();
    assert_eq!(removed, 3, "all but the newest four");
    assert_eq!(
        keys(
            store
                .channel_records_since(&scope, "active", 0, 100)
                .await
                .unwrap()
        ),
        ["k7", "k8", "k9", "k10"]
    );
    assert_eq!(
        store
            .prune_channel_records(&scope, "active", 0, 4)
            .await
            .unwrap(),
        0,
        "nothing more to prune"
    );
    let next = store
        .append_channel_record(&scope, "active", "k11", &record_value(11), 200)
        .await
        .unwrap()
        .record
        .seq;
    assert!(
        next > last,
        "numbering goes on after pruning: {next} after {last}"
    );
}

/// A named value is written only when the stored one meets the expectation; of several writers
/// expecting the same version (or its absence) at once, exactly one wins and is what is stored.
pub async fn channel_values_are_compare_and_set_under_concurrent_writers<S: Store + 'static>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = std::sync::Arc::new(open(dir));
    let scope = ChannelScope::new("zalo", "oa-1");
    assert!(
        store
            .load_channel_value(&scope, "tokens")
            .await
            .unwrap()
            .is_none()
    );
    let racers = |expected: ValueExpectation| {
        (0..12u32)
            .map(|n| {
                let store = store.clone();
                let scope = scope.clone();
                tokio::spawn(async move {
                    let value = serde_json::json!({"writer": n});
                    (
                        n,
                        store
                            .swap_channel_value(&scope, "tokens", expected, &value, i64::from(n))
                            .await
                            .unwrap(),
                    )
                })
            })
            .collect::<Vec<_>>()
    };
    let mut winners = Vec::new();
    for task in racers(ValueExpectation::Absent) {
        match task.await.unwrap() {
            (n, ValueSwap::Written(v)) => {
                assert_eq!(v.version, 1, "a first write is version 1");
                winners.push(n);
            }
            (_, ValueSwap::Conflict(stored)) => {
                assert!(stored.is_some(), "a loser is shown the stored value");
            }
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "one writer creates the value: {winners:?}"
    );
    let stored = store
        .load_channel_value(&scope, "tokens")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (stored.value.clone(), stored.version),
        (serde_json::json!({"writer": winners[0]}), 1),
        "the winner's value is stored"
    );

    let mut winners = Vec::new();
    for task in racers(ValueExpectation::Version(1)) {
        match task.await.unwrap() {
            (n, ValueSwap::Written(v)) => {
                assert_eq!(v.version, 2);
                winners.push(n);
            }
            (_, ValueSwap::Conflict(stored)) => {
                assert_eq!(
                    stored.map(|s| s.version),
                    Some(2),
                    "a loser sees the winner's version"
                );
            }
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "one writer of version 1 wins: {winners:?}"
    );
    assert_eq!(
        store
            .load_channel_value(&scope, "tokens")
            .await
            .unwrap()
            .map(|v| v.value),
        Some(serde_json::json!({"writer": winners[0]}))
    );

    assert!(
        matches!(
            store
                .swap_channel_value(&scope, "tokens", ValueExpectation::Version(1), &serde_json::json!("stale"), 50)
                .await
                .unwrap(),
            ValueSwap::Conflict(Some(ref v)) if v.version == 2
        ),
        "a stale version is refused"
    );
    assert!(
        matches!(
            store
                .swap_channel_value(
                    &scope,
                    "tokens",
                    ValueExpectation::Absent,
                    &serde_json::json!("again"),
                    50
                )
                .await
                .unwrap(),
            ValueSwap::Conflict(Some(_))
        ),
        "Absent is refused once a value exists"
    );
    assert!(
        matches!(
            store
                .swap_channel_value(
                    &scope,
                    "missing",
                    ValueExpectation::Version(1),
                    &serde_json::json!(1),
                    50
                )
                .await
                .unwrap(),
            ValueSwap::Conflict(None)
        ),
        "a version of a value never written is refused"
    );
    let any = store
        .swap_channel_value(
            &scope,
            "tokens",
            ValueExpectation::Any,
            &serde_json::json!("any"),
            60,
        )
        .await
        .unwrap();
    assert!(
        matches!(any, ValueSwap::Written(ref v) if v.version == 3 && v.updated_at == 60),
        "Any writes over whatever is there: {any:?}"
    );
    assert!(store.delete_channel_value(&scope, "tokens").await.unwrap());
    assert!(
        !store.delete_channel_value(&scope, "tokens").await.unwrap(),
        "nothing left to delete"
    );
    assert!(
        store
            .load_channel_value(&scope, "tokens")
            .await
            .unwrap()
            .is_none()
    );
}

/// Appends racing on one book each get their own number, every number is used once, and of
/// several appends of one key exactly one is new.
pub async fn concurrent_channel_appends_are_numbered_once_each<S: Store + 'static>(
    dir: &std::path::Path,
    open: &impl Fn(&std::path::Path) -> S,
) {
    let store = std::sync::Arc::new(open(dir));
    let scope = ChannelScope::new("line", "main");
    let tasks: Vec<_> = (0..30u64)
        .map(|n| {
            let store = store.clone();
            let scope = scope.clone();
            tokio::spawn(async move {
                // Every third task appends the shared key; the rest a key of their own.
                let key = if n % 3 == 0 {
                    "shared".to_owned()
                } else {
                    format!("own-{n}")
                };
                store
                    .append_channel_record(&scope, "replies", &key, &record_value(n), 1)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut new_shared = 0;
    for task in tasks {
        let appended = task.await.unwrap();
        if appended.record.key == "shared" && appended.new {
            new_shared += 1;
        }
    }
    assert_eq!(new_shared, 1, "one append of the shared key is new");
    let records = store
        .channel_records_since(&scope, "replies", 0, 100)
        .await
        .unwrap();
    assert_eq!(
        records.len(),
        21,
        "20 own keys and the shared one, each once"
    );
    let seqs: BTreeSet<i64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs.len(), 21, "no number given twice");
    assert!(
        records.windows(2).all(|w| w[0].seq < w[1].seq),
        "read back in number order"
    );
}
