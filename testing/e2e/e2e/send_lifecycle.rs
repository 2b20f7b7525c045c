//! The send and recovery lines of the test plan, against the real QA platform over HTTP and a
//! real SQLite state file.

use std::sync::Arc;

use clawgate_channel_qa::Fault;
use clawgate_messages::{
    Boundary, LifecycleProbe, MessagesError, Messenger, RetryPolicy, SendOptions, SendOutcome,
};
use clawgate_store::IntentStore;
use clawgate_store_sqlite::SqliteOptions;
use clawgate_types::{
    FailureReason, GatewayFailureCode, IntentId, IntentStatus, MessageDurabilityPolicy,
    MessageOrigin,
};

use crate::harness::{Counting, CrashAt, Harness, START, message, quiet_simulated_crashes};

fn opts() -> SendOptions {
    SendOptions::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_send_returns_receipt_and_lands_once() {
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = h.messenger(adapter.clone());
    let report = messenger
        .send(message("m1", "hello"), opts())
        .await
        .unwrap();
    assert!(report.durable);
    let SendOutcome::Sent { receipt } = &report.outcome else {
        panic!("{report:?}")
    };
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 1);
    assert_eq!(
        receipt.primary_platform_message_id.as_deref(),
        Some(landed[0].id.as_str())
    );
    assert_eq!(receipt.platform_message_ids, vec![landed[0].id.clone()]);
    let stored = h
        .store
        .load_intent(report.intent_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.status, IntentStatus::Sent);
    assert_eq!(
        stored.receipt.as_ref(),
        Some(receipt),
        "the committed receipt is the returned one"
    );
    assert_eq!(
        adapter.hooks(),
        (1, 1),
        "post-send hooks ran once, after the commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_part_receipt_keeps_every_platform_id_and_a_primary() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let text = "word ".repeat(1_900); // 9,500 characters over a 4,000 limit: three parts.
    let report = messenger
        .send(message("long", &text), opts())
        .await
        .unwrap();
    let receipt = report.outcome.receipt().unwrap().clone();
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 3);
    assert_eq!(
        receipt.platform_message_ids,
        landed.iter().map(|m| m.id.clone()).collect::<Vec<_>>()
    );
    assert_eq!(
        receipt.primary_platform_message_id.as_deref(),
        Some(landed[0].id.as_str())
    );
    assert_eq!(
        landed.iter().map(|m| m.text.as_str()).collect::<String>(),
        text,
        "chunks rejoin to the text"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_key_reuse_never_sends_twice() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let keyed = SendOptions {
        idempotency_key: Some("reply-to-update-7".into()),
        ..opts()
    };
    let first = messenger
        .send(message("a", "once"), keyed.clone())
        .await
        .unwrap();
    let second = messenger.send(message("b", "once"), keyed).await.unwrap();
    assert_eq!(second.intent_id, first.intent_id);
    match second.outcome {
        SendOutcome::AlreadySent { receipt } => assert_eq!(Some(&receipt), first.outcome.receipt()),
        other => panic!("a reused key must not send again: {other:?}"),
    }
    assert_eq!(h.platform.landed_with_text("once"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_failure_retries_later_and_lands_once() {
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = h.messenger(adapter.clone());
    h.platform.inject(Fault::status(1, 503, "unavailable"));
    let report = messenger
        .send(message("t", "after a blip"), opts())
        .await
        .unwrap();
    let SendOutcome::RetryScheduled {
        next_attempt_at,
        failure,
        ..
    } = report.outcome
    else {
        panic!("{report:?}")
    };
    assert_eq!(failure.kind, clawgate_types::DeliveryFailureKind::Transient);
    assert_eq!(
        next_attempt_at,
        crate::harness::START + 1_000,
        "first backoff step"
    );
    assert_eq!(
        messenger.recover().await.unwrap().examined,
        0,
        "not due yet"
    );
    h.clock.advance(1_000);
    let recovered = messenger.recover().await.unwrap();
    assert_eq!((recovered.examined, recovered.committed), (1, 1));
    assert_eq!(h.platform.landed_with_text("after a blip"), 1);
    assert_eq!(
        adapter.hooks(),
        (1, 1),
        "hooks run on the recovery path too, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_honours_retry_after() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    h.platform.inject(Fault::rate_limited(1, 30));
    let report = messenger
        .send(message("r", "slow down"), opts())
        .await
        .unwrap();
    let SendOutcome::RetryScheduled {
        next_attempt_at,
        failure,
        ..
    } = report.outcome
    else {
        panic!("{report:?}")
    };
    assert_eq!(failure.kind, clawgate_types::DeliveryFailureKind::RateLimit);
    assert_eq!(failure.retry_after_ms, Some(30_000));
    assert_eq!(
        next_attempt_at,
        crate::harness::START + 30_000,
        "the platform's Retry-After wins"
    );
    h.clock.advance(29_999);
    assert_eq!(messenger.recover().await.unwrap().examined, 0);
    h.clock.advance(1);
    assert_eq!(messenger.recover().await.unwrap().committed, 1);
    assert_eq!(h.platform.landed_with_text("slow down"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_at_the_attempt_budget() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    h.platform.inject(Fault::status(100, 500, "boom"));
    let report = messenger
        .send(message("x", "doomed"), opts())
        .await
        .unwrap();
    let id = report.intent_id.unwrap();
    for _ in 0..20 {
        h.clock.advance(10 * 60_000);
        messenger.recover().await.unwrap();
    }
    let intent = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(intent.status, IntentStatus::Failed);
    assert_eq!(intent.attempt, 8, "the default budget");
    assert_eq!(
        intent.failure.unwrap().reason,
        Some(FailureReason::MaxAttemptsExceeded)
    );
    assert_eq!(h.platform.landed_with_text("doomed"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failure_waits_for_configuration() {
    let h = Harness::new().await;
    let bad = clawgate_channel_qa::QaAdapter::new(&h.platform.base_url(), "wrong-token");
    let messenger = h.messenger(Arc::new(bad));
    let report = messenger
        .send(message("a", "secret"), opts())
        .await
        .unwrap();
    let SendOutcome::Failed { failure, .. } = report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(failure.kind, clawgate_types::DeliveryFailureKind::Auth);
    assert_eq!(failure.reason, Some(FailureReason::AwaitingConfiguration));
    h.clock.advance(3_600_000);
    assert_eq!(
        messenger.recover().await.unwrap().examined,
        0,
        "parked: no blind retries"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_payload_retries_once_with_the_fallback_rendering() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    h.platform.inject(Fault::status(1, 400, "bad_markup"));
    let report = messenger
        .send(message("f", "**bold**"), opts())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    h.platform.inject(Fault::status(2, 400, "bad_markup"));
    let report = messenger
        .send(message("g", "still bad"), opts())
        .await
        .unwrap();
    let SendOutcome::Failed { failure, .. } = report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(
        failure.reason,
        Some(FailureReason::Permanent),
        "only one fallback"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_outcome_is_reconciled_before_any_replay() {
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = h.messenger(adapter.clone());
    h.platform.inject(Fault::drop_after_accept(1));
    let report = messenger
        .send(message("u", "did it land?"), opts())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    let id = report.intent_id.unwrap();
    assert_eq!(
        h.store.load_intent(&id).await.unwrap().unwrap().status,
        IntentStatus::UnknownAfterSend
    );
    assert_eq!(adapter.hooks(), (0, 0), "no hooks before a commit");
    h.clock.advance(500);
    let recovered = messenger.recover().await.unwrap();
    assert_eq!(
        (
            recovered.reconciled_sent,
            recovered.committed,
            recovered.reconciled_not_sent
        ),
        (1, 1, 0)
    );
    assert_eq!(
        h.platform.landed_with_text("did it land?"),
        1,
        "reconciled, not resent"
    );
    let intent = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(intent.status, IntentStatus::Sent);
    assert_eq!(
        intent.receipt.unwrap().platform_message_ids,
        vec![h.platform.messages("room-1")[0].id.clone()]
    );
    assert_eq!(adapter.hooks(), (1, 1));
}

/// A platform that keeps answering "cannot tell" about a lost answer is asked again until the
/// reconciliation window has passed since the outcome became unknown; then the intent is
/// parked for an operator (never resent), so the conversation's later replies stop waiting
/// behind it. A platform that cannot be reached is asked on, however long it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_platform_cannot_tell_is_parked_after_the_reconciliation_window() {
    const WINDOW: i64 = 60_000;
    for unreachable in [false, true] {
        let h = Harness::new().await;
        let adapter = Counting::new(h.adapter());
        let policy = clawgate_messages::RetryPolicy {
            reconcile_delay_ms: 500,
            reconcile_window_ms: WINDOW,
            ..clawgate_messages::RetryPolicy::default()
        };
        let messenger = clawgate_messages::Messenger::new(
            h.store.clone(),
            vec![adapter.clone()],
            policy,
            h.clock.clone(),
            "test",
        );
        adapter.answer_reconciliations(if unreachable {
            Err(clawgate_channel_sdk::SendError::after_io(
                clawgate_types::DeliveryFailureKind::Transient,
                "connection refused",
            ))
        } else {
            Ok(clawgate_channel_sdk::Reconciliation::Unresolved)
        });
        h.platform.inject(Fault::drop_after_accept(1));
        let report = messenger
            .send(message("t", "cannot tell"), opts())
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
        let id = report.intent_id.unwrap();
        let due = |intent: &clawgate_types::DurableSendIntent| {
            (intent.status, intent.next_attempt_at.is_some())
        };
        // Asked again and again inside the window: still due, never resent.
        for _ in 0..3 {
            h.clock.advance(WINDOW / 4);
            messenger.recover().await.unwrap();
            let intent = h.store.load_intent(&id).await.unwrap().unwrap();
            assert_eq!(
                due(&intent),
                (IntentStatus::UnknownAfterSend, true),
                "unreachable: {unreachable}"
            );
        }
        h.clock.advance(WINDOW / 4);
        messenger.recover().await.unwrap();
        let intent = h.store.load_intent(&id).await.unwrap().unwrap();
        assert_eq!(
            due(&intent),
            (IntentStatus::UnknownAfterSend, unreachable),
            "after the window: parked when the platform answered, still asked when it could \
             not be reached (unreachable: {unreachable})"
        );
        assert_eq!(
            intent.failure.as_ref().map(|failure| failure.at),
            Some(START),
            "the failure keeps when the outcome became unknown"
        );
        assert_eq!(
            h.platform.landed_with_text("cannot tell"),
            1,
            "landed once (the answer was lost), never resent"
        );
        assert_eq!(adapter.hooks(), (0, 0), "never committed");
    }
}

/// An unknown outcome whose reconciliations stay unresolved (the platform unreachable, or
/// "cannot tell" inside the window) is asked about again after a doubling delay, each
/// reconciliation counted on the intent; the last one the budget allows is asked like any other
/// and then the intent fails (`max_attempts_exceeded`, never resent) — it does not wait out the
/// time-to-live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_reconciliations_back_off_and_fail_at_their_budget() {
    for unreachable in [true, false] {
        let h = Harness::new().await;
        let adapter = Counting::new(h.adapter());
        let policy = clawgate_messages::RetryPolicy {
            reconcile_delay_ms: 1_000,
            max_reconciliations: 4,
            ..clawgate_messages::RetryPolicy::default()
        };
        let messenger = clawgate_messages::Messenger::new(
            h.store.clone(),
            vec![adapter.clone()],
            policy,
            h.clock.clone(),
            "test",
        );
        adapter.answer_reconciliations(if unreachable {
            Err(clawgate_channel_sdk::SendError::after_io(
                clawgate_types::DeliveryFailureKind::Transient,
                "connection refused",
            ))
        } else {
            Ok(clawgate_channel_sdk::Reconciliation::Unresolved)
        });
        h.platform.inject(Fault::drop_after_accept(1));
        let report = messenger
            .send(message("b", "asked four times"), opts())
            .await
            .unwrap();
        let id = report.intent_id.unwrap();
        let load = || async { h.store.load_intent(&id).await.unwrap().unwrap() };
        let first = load().await;
        assert_eq!(
            (first.reconciliations, first.next_attempt_at),
            (0, Some(START + 1_000)),
            "unreachable: {unreachable}"
        );
        // Before it is due, nothing is asked.
        h.clock.advance(999);
        messenger.recover().await.unwrap();
        assert_eq!(load().await.reconciliations, 0);
        // Asked three times: each time counted, the next one 1 s, 2 s, 4 s later.
        let mut due = START + 1_000;
        for (asked, delay) in [(1, 1_000), (2, 2_000), (3, 4_000)] {
            h.clock.set(due);
            messenger.recover().await.unwrap();
            let intent = load().await;
            assert_eq!(
                (intent.status, intent.reconciliations),
                (IntentStatus::UnknownAfterSend, asked),
                "unreachable: {unreachable}"
            );
            assert_eq!(intent.next_attempt_at, Some(due + delay), "backs off");
            due += delay;
        }
        // The fourth is the last: still unresolved, the intent fails; nothing is resent.
        h.clock.set(due);
        messenger.recover().await.unwrap();
        let intent = load().await;
        assert_eq!(
            (
                intent.status,
                intent.reconciliations,
                intent.next_attempt_at
            ),
            (IntentStatus::Failed, 4, None),
            "unreachable: {unreachable}"
        );
        let failure = intent.failure.expect("failure");
        assert_eq!(
            failure.reason,
            Some(clawgate_types::FailureReason::MaxAttemptsExceeded)
        );
        assert!(
            failure
                .message
                .contains("still unknown after 4 reconciliations"),
            "{}",
            failure.message
        );
        h.clock.advance(60 * 60_000);
        messenger.recover().await.unwrap();
        assert_eq!(load().await.status, IntentStatus::Failed, "not asked again");
        assert_eq!(
            h.platform.landed_with_text("asked four times"),
            1,
            "landed once (the answer was lost), never resent"
        );
        assert_eq!(adapter.hooks(), (0, 0), "never committed");
    }
}

/// An adapter that knows the platform can never tell (`Undecidable`) gets its send parked at
/// the first reconciliation, without waiting out the window; never resent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_platform_can_never_tell_is_parked_at_once() {
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = h.messenger(adapter.clone());
    adapter.answer_reconciliations(Ok(clawgate_channel_sdk::Reconciliation::Undecidable));
    h.platform.inject(Fault::drop_after_accept(1));
    let report = messenger
        .send(message("n", "never known"), opts())
        .await
        .unwrap();
    let id = report.intent_id.unwrap();
    assert!(
        h.store
            .load_intent(&id)
            .await
            .unwrap()
            .unwrap()
            .next_attempt_at
            .is_some(),
        "a lost answer is first asked about"
    );
    h.clock.advance(500);
    messenger.recover().await.unwrap();
    let intent = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(
        (intent.status, intent.next_attempt_at),
        (IntentStatus::UnknownAfterSend, None),
        "parked at the first answer"
    );
    assert_eq!(
        h.platform.landed_with_text("never known"),
        1,
        "never resent"
    );
}

/// A receipt recorded but not committed (`committing`, as earlier builds stored it between two
/// writes) is committed by recovery as it stands: no platform I/O, hooks once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_receipt_is_committed_by_recovery_without_platform_io() {
    let h = Harness::new().await;
    let adapter = Counting::new(h.plain_adapter());
    let context = h
        .messenger(adapter.clone())
        .begin(message("c", "already landed"), opts())
        .await
        .unwrap();
    let mut intent = context.intent().clone();
    // The process that sent it died holding it; its claim lapses.
    let (holder, _) = h.store.claim_holders().await.unwrap().remove(0);
    h.store.release_claims_held_by(&holder).await.unwrap();
    let receipt = clawgate_types::MessageReceipt::from_parts(
        vec![clawgate_store::testing::part(0, "landed-before-the-crash")],
        START,
    );
    for (from, to) in [
        (IntentStatus::Pending, IntentStatus::Sending),
        (IntentStatus::Sending, IntentStatus::Committing),
    ] {
        intent.status = to;
        intent.receipt = (to == IntentStatus::Committing).then(|| receipt.clone());
        h.store.save_intent(&intent, from, None).await.unwrap();
    }
    let recovered = h.messenger(adapter.clone()).recover().await.unwrap();
    assert_eq!(recovered.committed, 1);
    let stored = h.store.load_intent(&intent.id).await.unwrap().unwrap();
    assert_eq!(stored.status, IntentStatus::Sent);
    assert_eq!(
        stored.receipt.as_ref(),
        Some(&receipt),
        "the recorded receipt is the one committed"
    );
    assert!(h.platform.log().is_empty(), "nothing was sent again");
    assert_eq!(
        adapter.hooks(),
        (1, 1),
        "post-send hooks ran once, after the commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_outcome_without_reconciliation_is_never_replayed() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.plain_adapter()));
    h.platform.inject(Fault::drop_after_accept(1));
    let report = messenger
        .send(message("u", "maybe twice?"), opts())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    for _ in 0..5 {
        h.clock.advance(60_000);
        messenger.recover().await.unwrap();
    }
    assert_eq!(
        h.platform.landed_with_text("maybe twice?"),
        1,
        "never replayed blindly"
    );
    let unknown = h.intents_with(IntentStatus::UnknownAfterSend).await;
    assert_eq!(
        unknown.len(),
        1,
        "left visible to operators as unknown_after_send"
    );
}

fn three_units() -> String {
    format!(
        "{}{}{}",
        "a".repeat(4_000),
        "b".repeat(4_000),
        "c".repeat(10)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_retry_sends_only_units_without_receipts() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    // Unit 0 lands, unit 1 is refused (nothing happened), unit 2 is never tried.
    h.platform
        .inject(Fault::status(1, 503, "unavailable").after(1));
    let report = messenger
        .send(message("b", &three_units()), opts())
        .await
        .unwrap();
    let SendOutcome::RetryScheduled { delivered, .. } = &report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(
        delivered
            .as_ref()
            .unwrap()
            .delivered_indices()
            .collect::<Vec<_>>(),
        vec![0]
    );
    let stored = h
        .store
        .load_intent(report.intent_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.partial_receipt.unwrap().parts.len(),
        1,
        "the delivered unit is recorded durably"
    );
    h.clock.advance(1_000);
    assert_eq!(messenger.recover().await.unwrap().committed, 1);
    let intent = h
        .store
        .load_intent(report.intent_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(intent.receipt.unwrap().parts.len(), 3);
    for unit in 0..3 {
        assert_eq!(
            h.platform.landed_count(&format!("qa:b#{unit}")),
            1,
            "unit {unit} landed once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_unit_in_a_batch_is_reconciled_and_only_missing_units_resent() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    // Unit 0 lands; unit 1 lands but its answer is lost; unit 2 is never tried.
    h.platform.inject(Fault::drop_after_accept(1).after(1));
    let report = messenger
        .send(message("p", &three_units()), opts())
        .await
        .unwrap();
    let SendOutcome::Unknown { delivered, .. } = &report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(delivered.as_ref().unwrap().parts.len(), 1);
    h.clock.advance(500);
    let recovered = messenger.recover().await.unwrap();
    assert_eq!(
        (
            recovered.reconciled_sent,
            recovered.reconciled_not_sent,
            recovered.committed
        ),
        (1, 1, 1),
        "unit 1 found on the platform, unit 2 proved missing and sent"
    );
    for unit in 0..3 {
        assert_eq!(
            h.platform.landed_count(&format!("qa:p#{unit}")),
            1,
            "unit {unit} landed once"
        );
    }
    let intent = h
        .store
        .load_intent(report.intent_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    let ids: Vec<String> = h
        .platform
        .messages("room-1")
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(
        intent.receipt.unwrap().platform_message_ids,
        ids,
        "every platform id, in unit order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_effort_parts_reports_the_delivered_prefix() {
    let h = Harness::new().await;
    let adapter = Counting::best_effort_parts(h.adapter());
    let messenger = h.messenger(adapter);
    h.platform
        .inject(Fault::status(1, 503, "unavailable").after(1));
    let report = messenger
        .send(message("be", &three_units()), opts())
        .await
        .unwrap();
    let SendOutcome::Partial { delivered, failure } = &report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(delivered.parts.len(), 1, "the delivered prefix");
    assert_eq!(failure.kind, clawgate_types::DeliveryFailureKind::Transient);
    let intent = h
        .store
        .load_intent(report.intent_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        intent.status,
        IntentStatus::Sent,
        "best-effort parts commit what landed"
    );
    h.clock.advance(60_000);
    assert_eq!(
        messenger.recover().await.unwrap().examined,
        0,
        "and do not retry the rest"
    );
    assert_eq!(h.platform.messages("room-1").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_durability_fails_closed_and_best_effort_proceeds() {
    let h = Harness::with_options(SqliteOptions {
        max_page_count: Some(40),
        ..SqliteOptions::default()
    })
    .await;
    // Fill the database to its cap with unrelated intents.
    let mut n = 0;
    while h
        .store
        .insert_intent(&clawgate_store::testing::sample_intent(n, 0), None)
        .await
        .is_ok()
    {
        n += 1;
    }
    let messenger = h.messenger(Arc::new(h.adapter()));
    let big = "y".repeat(3_000);
    match messenger.send(message("req", &big), opts()).await {
        Err(MessagesError::DurabilityUnavailable(e)) => {
            assert!(e.to_string().contains("full"), "{e}")
        }
        other => panic!("required durability must fail closed: {other:?}"),
    }
    assert_eq!(
        h.platform.landed_with_text(&big),
        0,
        "nothing sent without the intent"
    );
    let best = SendOptions {
        durability: MessageDurabilityPolicy::BestEffort,
        ..opts()
    };
    let report = messenger.send(message("be", &big), best).await.unwrap();
    assert!(!report.durable, "best effort says it was not durable");
    assert!(matches!(report.outcome, SendOutcome::Sent { .. }));
    let direct = SendOptions {
        durability: MessageDurabilityPolicy::Disabled,
        ..opts()
    };
    let report = messenger
        .send(message("d", "direct"), direct)
        .await
        .unwrap();
    assert_eq!((report.durable, report.intent_id.is_none()), (false, true));
    assert_eq!(h.platform.landed_with_text(&big), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_intents_expire_instead_of_sending_late() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    h.platform.inject(Fault::status(1, 503, "unavailable"));
    let ttl = SendOptions {
        time_to_live_ms: Some(60_000),
        ..opts()
    };
    let report = messenger
        .send(message("old", "too late"), ttl)
        .await
        .unwrap();
    assert!(matches!(report.outcome, SendOutcome::RetryScheduled { .. }));
    h.clock.advance(7 * 24 * 3_600_000);
    let recovered = messenger.recover().await.unwrap();
    assert_eq!((recovered.failed, recovered.expired), (1, 1));
    let intent = h
        .store
        .load_intent(&report.intent_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        intent.failure.unwrap().reason,
        Some(FailureReason::Expired),
        "visible to operators"
    );
    assert_eq!(h.platform.landed_with_text("too late"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_survives_chunking_and_recovery() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut failure_notice = message("o", &"Agent failed before reply. ".repeat(200));
    failure_notice.origin = Some(MessageOrigin::gateway_failure(
        GatewayFailureCode::AgentFailedBeforeReply,
    ));
    h.platform.inject(Fault::status(1, 503, "unavailable"));
    messenger.send(failure_notice, opts()).await.unwrap();
    h.clock.advance(1_000);
    assert_eq!(messenger.recover().await.unwrap().committed, 1);
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 2, "chunked");
    for m in landed {
        let origin: MessageOrigin =
            serde_json::from_value(m.metadata.unwrap()["clawgateOrigin"].clone()).unwrap();
        assert_eq!(
            origin,
            MessageOrigin::gateway_failure(GatewayFailureCode::AgentFailedBeforeReply)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_recovery_workers_never_send_an_intent_twice() {
    let h = Harness::new().await;
    let a = h.messenger(Arc::new(h.adapter()));
    let b = h.messenger(Arc::new(h.adapter()));
    h.platform.inject(Fault::status(30, 503, "unavailable"));
    for n in 0..30 {
        let report = a
            .send(message(&format!("n{n}"), &format!("queued {n}")), opts())
            .await
            .unwrap();
        assert!(matches!(report.outcome, SendOutcome::RetryScheduled { .. }));
    }
    h.clock.advance(1_000);
    let (ra, rb) = tokio::join!(a.recover(), b.recover());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.committed + rb.committed, 30, "{ra:?} {rb:?}");
    for n in 0..30 {
        assert_eq!(
            h.platform.landed_with_text(&format!("queued {n}")),
            1,
            "message {n}"
        );
    }
}

/// Stops a send dead once its intent is recorded, as a crash would.
struct DiesOnceRecorded;

impl LifecycleProbe for DiesOnceRecorded {
    fn reached(&self, boundary: Boundary, _intent: &IntentId) {
        if boundary == Boundary::IntentRecorded {
            panic!("simulated crash once the intent is recorded");
        }
    }
}

/// With an adapter that reconciles unknown outcomes, `send` records the intent with its first
/// attempt started (`sending`): one write fewer, and a crash before the platform call is
/// reconciled (not sent, so sent once). Without reconciliation the intent is recorded `pending`,
/// the only status that may be sent again blindly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconciling_adapter_starts_the_first_attempt_in_the_intent_write() {
    for reconciling in [true, false] {
        let h = Harness::new().await;
        let adapter = Arc::new(if reconciling {
            h.adapter()
        } else {
            h.plain_adapter()
        });
        let messenger = h.messenger(adapter);
        let dying = messenger.clone().with_probe(Arc::new(DiesOnceRecorded));
        let crashed =
            tokio::spawn(async move { dying.send(message("c", "after the crash"), opts()).await })
                .await;
        assert!(crashed.is_err(), "the send died at the boundary");
        let recorded = h.intents().await;
        let expected = if reconciling {
            (IntentStatus::Sending, 1)
        } else {
            (IntentStatus::Pending, 0)
        };
        assert_eq!(
            (recorded[0].status, recorded[0].attempt),
            expected,
            "reconciling: {reconciling}"
        );
        assert_eq!(h.platform.landed_with_text("after the crash"), 0);

        // The worker's claim expires; recovery finishes the send exactly once.
        h.clock.advance(3 * 60_000);
        let report = messenger.recover().await.unwrap();
        assert_eq!(
            (report.committed, report.reconciled_not_sent),
            (1, u64::from(reconciling)),
            "reconciling: {reconciling}: {report:?}"
        );
        assert_eq!(h.platform.landed_with_text("after the crash"), 1);
    }
}

/// Two recovery passes of one engine share its claim token, so a claim cannot keep them apart:
/// each unknown outcome is still reconciled and committed by one of them, hooks once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_passes_of_one_engine_take_each_intent_once() {
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = h.messenger(adapter.clone());
    h.platform.inject(Fault::drop_after_accept(20));
    for n in 0..20 {
        let report = messenger
            .send(message(&format!("u{n}"), &format!("unknown {n}")), opts())
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    h.clock.advance(1_000);
    let (first, second) = tokio::join!(messenger.recover(), messenger.recover());
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(
        (
            first.committed + second.committed,
            first.reconciled_sent + second.reconciled_sent,
            first.examined + second.examined,
        ),
        (20, 20, 20),
        "{first:?} {second:?}"
    );
    assert_eq!(adapter.hooks(), (20, 20), "hooks once per intent");
    for n in 0..20 {
        assert_eq!(
            h.platform.landed_with_text(&format!("unknown {n}")),
            1,
            "message {n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_land_in_the_thread_of_an_inbound_message() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    // A person writes into the room, through the platform's HTTP injection endpoint.
    let injected: clawgate_channel_qa::MessageAnswer = reqwest::Client::new()
        .post(format!(
            "{}/control/conversations/room-1/inbound",
            h.platform.base_url()
        ))
        .bearer_auth(h.platform.token())
        .json(&serde_json::json!({ "text": "question?", "authorId": "alice", "threadId": "t-1" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            injected.message.author_id.as_deref(),
            injected.message.author_is_bot
        ),
        (Some("alice"), false)
    );
    let mut reply = message("r", "answer.");
    reply.relation = Some(
        clawgate_types::MessageRelation::reply_to_inbound(injected.message.id.clone())
            .with_thread_id(Some("t-1")),
    );
    let report = messenger.send(reply, opts()).await.unwrap();
    let receipt = report.outcome.receipt().unwrap().clone();
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 2);
    assert_eq!(
        landed[1].reply_to_id.as_deref(),
        Some(injected.message.id.as_str())
    );
    assert_eq!(landed[1].thread_id.as_deref(), Some("t-1"));
    assert!(landed[1].author_is_bot, "the gateway writes as its bot");
    assert_eq!(
        receipt.reply_to_id.as_deref(),
        Some(injected.message.id.as_str()),
        "the receipt keeps the reply target"
    );
    assert_eq!(receipt.thread_id.as_deref(), Some("t-1"));

    let mut orphan = message("o", "to nowhere");
    orphan.relation = Some(clawgate_types::MessageRelation::reply_to("m-404"));
    let report = messenger.send(orphan, opts()).await.unwrap();
    let SendOutcome::Failed { failure, .. } = report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(failure.kind, clawgate_types::DeliveryFailureKind::NotFound);
    assert_eq!(failure.reason, Some(FailureReason::Permanent));
    assert_eq!(h.platform.messages("room-1").len(), 2, "nothing landed");
}

/// Sends `text` and "crashes" once every unit landed, before anything about it is recorded:
/// the intent is left `sending` under the dead send's claim, which expires.
async fn crashed_mid_send(h: &Harness, messenger: &Messenger, text: &str) -> IntentId {
    quiet_simulated_crashes();
    let engine = messenger
        .clone()
        .with_probe(Arc::new(CrashAt(Boundary::PlatformAccepted)));
    let msg = message("crashed", text);
    let _ = tokio::spawn(async move { engine.send(msg, opts()).await }).await;
    let intent = h.intents().await.pop().expect("the intent was recorded");
    assert_eq!(intent.status, IntentStatus::Sending);
    h.clock.advance(RetryPolicy::default().claim_ttl_ms + 1);
    intent.id
}

/// Recovery asks about a crashed send while it is still `sending`, under its claim, and writes
/// it once with the answer: a write of `unknown_after_send` first (no reconciliation scheduled,
/// claim released) would make it look parked for an operator until that answer — a turn
/// waiting on it would end its message, and a crash there would park it for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_send_is_reconciled_while_still_sending_then_written_once() {
    let h = Harness::new().await;
    let adapter = Counting::observing(h.adapter(), h.store.clone());
    adapter.answer_reconciliations(Ok(clawgate_channel_sdk::Reconciliation::Unresolved));
    let messenger = h.messenger(adapter.clone());
    let id = crashed_mid_send(&h, &messenger, "landed before the crash").await;

    messenger.recover().await.unwrap();
    let seen: Vec<_> = adapter
        .intents_at_reconcile
        .lock()
        .unwrap()
        .iter()
        .map(|i| i.as_ref().map(|i| (i.status, i.next_attempt_at)))
        .collect();
    assert_eq!(
        seen,
        vec![Some((IntentStatus::Sending, None))],
        "asked while still `sending`, not shown parked"
    );
    let intent = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(
        (intent.status, intent.reconciliations),
        (IntentStatus::UnknownAfterSend, 1),
        "the answer written once, the question counted"
    );
    assert!(
        intent.next_attempt_at.is_some(),
        "asked again later, not parked: {intent:?}"
    );
    assert_eq!(h.platform.landed_with_text("landed before the crash"), 1);
}

/// A crashed send after an earlier unknown outcome was settled starts a new episode: its
/// reconciliation count and window start at the crash, not at the earlier episode (which would
/// park it at once, the window long past).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_resend_counts_its_reconciliations_from_the_crash() {
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = h.messenger(adapter.clone());
    // Episode one: the answer is lost, then the platform says it did not land (a reconciling
    // adapter would find it; this answer stands for a message removed meanwhile).
    h.platform.inject(Fault::drop_after_accept(1));
    let report = messenger
        .send(message("e", "two episodes"), opts())
        .await
        .unwrap();
    let id = report.intent_id.unwrap();
    adapter.answer_reconciliations(Ok(clawgate_channel_sdk::Reconciliation::NotSent));
    // The resend the answer leads to crashes after it landed.
    quiet_simulated_crashes();
    let crashing = messenger
        .clone()
        .with_probe(Arc::new(CrashAt(Boundary::PlatformAccepted)));
    h.clock
        .advance(RetryPolicy::default().reconcile_window_ms + 1);
    let _ = tokio::spawn(async move { crashing.recover().await }).await;
    let crashed = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(
        (crashed.status, crashed.reconciliations),
        (IntentStatus::Sending, 1)
    );

    // Episode two, long after the first one's window.
    adapter.answer_reconciliations(Ok(clawgate_channel_sdk::Reconciliation::Unresolved));
    h.clock.advance(RetryPolicy::default().claim_ttl_ms + 1);
    let now = START
        + RetryPolicy::default().reconcile_window_ms
        + 1
        + RetryPolicy::default().claim_ttl_ms
        + 1;
    messenger.recover().await.unwrap();
    let intent = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(
        (intent.status, intent.reconciliations),
        (IntentStatus::UnknownAfterSend, 1),
        "counted from the crash"
    );
    assert_eq!(
        intent.failure.as_ref().map(|f| f.at),
        Some(now),
        "unknown since the crash's reconciliation"
    );
    assert!(
        intent.next_attempt_at.is_some(),
        "inside its own window: asked again, not parked"
    );
}
