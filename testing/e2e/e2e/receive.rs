//! Receive contexts against the QA platform's inbound messages: ack policy ordering, dedupe
//! across a restart, dead letters, and the marker-based echo gate before bot authorization.

use std::sync::{Arc, Mutex};

use clawgate_channel_qa::{InboundRequest, QaAdapter};
use clawgate_channel_sdk::TransportAck;
use clawgate_channel_sdk::{MessageReceiveAdapter, NormalizedInbound};
use clawgate_messages::{AckController, AckState, ReceiveOptions, ReceiveOutcome, Receiver};
use clawgate_store::InboundStatus;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::{GatewayFailureCode, ImmediateAckReason, MessageOrigin, ReceiveAckPolicy};

use crate::harness::Harness;

/// Records the order of acks, nacks and dispatches.
#[derive(Default)]
struct Journal(Mutex<Vec<String>>);

impl Journal {
    fn push(&self, entry: &str) {
        self.0.lock().unwrap().push(entry.to_owned());
    }
    fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl TransportAck for Journal {
    fn ack(&self) {
        self.push("ack");
    }
    fn nack(&self, reason: &str) {
        self.push(&format!("nack {reason}"));
    }
}

/// The QA normalizer with a chosen ack policy.
struct WithPolicy(QaAdapter, ReceiveAckPolicy);

impl MessageReceiveAdapter for WithPolicy {
    fn normalize(
        &self,
        raw: &serde_json::Value,
    ) -> Result<NormalizedInbound, clawgate_channel_sdk::ReceiveError> {
        self.0.normalize(raw)
    }
    fn ack_policy(&self, _: &NormalizedInbound) -> ReceiveAckPolicy {
        self.1
    }
}

fn receiver(
    h: &Harness,
    store: Arc<SqliteStore>,
    policy: ReceiveAckPolicy,
    options: ReceiveOptions,
) -> Receiver {
    Receiver::new(
        store,
        Arc::new(h.adapter()),
        Arc::new(WithPolicy(h.adapter(), policy)),
        h.clock.clone(),
        options,
    )
}

fn inbound(
    h: &Harness,
    conversation: &str,
    text: &str,
    bot: bool,
    origin: Option<MessageOrigin>,
) -> serde_json::Value {
    let message = h
        .platform
        .inject_inbound(
            conversation,
            InboundRequest {
                text: text.into(),
                author_id: if bot {
                    "other-bot".into()
                } else {
                    "alice".into()
                },
                author_is_bot: bot,
                thread_id: None,
                reply_to_id: None,
                metadata: origin.map(|o| serde_json::json!({ "clawgateOrigin": o })),
            },
        )
        .unwrap();
    serde_json::to_value(message).unwrap()
}

async fn run(
    receiver: &Receiver,
    raw: &serde_json::Value,
    journal: &Arc<Journal>,
    result: Result<(), String>,
) -> (ReceiveOutcome, AckState) {
    let ack = AckController::new(journal.clone());
    let j = journal.clone();
    let outcome = receiver
        .receive(raw, &ack, |_| async move {
            j.push("dispatch");
            result
        })
        .await
        .unwrap();
    (outcome, ack.state())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_ack_policy_acks_at_its_point() {
    let h = Harness::new().await;
    let cases = [
        (
            ReceiveAckPolicy::Immediate {
                reason: ImmediateAckReason::WebhookTimeout,
            },
            vec!["ack", "dispatch"],
        ),
        (ReceiveAckPolicy::AfterRecord, vec!["ack", "dispatch"]),
        (ReceiveAckPolicy::AfterDurableSend, vec!["dispatch", "ack"]),
        (ReceiveAckPolicy::Manual, vec!["dispatch"]),
    ];
    for (n, (policy, expected)) in cases.into_iter().enumerate() {
        let receiver = receiver(&h, h.store.clone(), policy, ReceiveOptions::default());
        let raw = inbound(&h, "room-1", &format!("hello {n}"), false, None);
        let journal = Arc::new(Journal::default());
        let (outcome, _) = run(&receiver, &raw, &journal, Ok(())).await;
        assert!(
            matches!(outcome, ReceiveOutcome::Handled { .. }),
            "{policy:?}: {outcome:?}"
        );
        assert_eq!(journal.entries(), expected, "{policy:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_are_idempotent_and_a_nack_after_an_ack_does_nothing() {
    let journal = Arc::new(Journal::default());
    let ack = AckController::new(journal.clone());
    ack.ack();
    ack.ack();
    ack.nack("late failure");
    assert_eq!(journal.entries(), vec!["ack"]);
    assert_eq!(ack.state(), AckState::Acked);
    let journal = Arc::new(Journal::default());
    let nack = AckController::new(journal.clone());
    nack.nack("first");
    nack.nack("second");
    nack.ack();
    assert_eq!(
        journal.entries(),
        vec!["nack first"],
        "the first error is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_is_recognised_across_a_restart_and_unfinished_work_is_replayed_once() {
    let h = Harness::new().await;
    let dir = tempfile::tempdir().unwrap();
    let open = || Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let done = inbound(&h, "room-1", "finished before the crash", false, None);
    let unfinished = inbound(&h, "room-1", "accepted, then the crash", false, None);
    {
        let store = open();
        let r = receiver(
            &h,
            store,
            ReceiveAckPolicy::AfterRecord,
            ReceiveOptions::default(),
        );
        let journal = Arc::new(Journal::default());
        assert!(matches!(
            run(&r, &done, &journal, Ok(())).await.0,
            ReceiveOutcome::Handled { .. }
        ));
        // The turn fails (as a crash would end it): recorded, not finished.
        assert!(matches!(
            run(&r, &unfinished, &journal, Err("crashed".into()))
                .await
                .0,
            ReceiveOutcome::Failed { .. }
        ));
    }
    let r = receiver(
        &h,
        open(),
        ReceiveAckPolicy::AfterRecord,
        ReceiveOptions::default(),
    );
    let journal = Arc::new(Journal::default());
    let (outcome, state) = run(&r, &done, &journal, Ok(())).await;
    assert_eq!(
        outcome,
        ReceiveOutcome::Duplicate {
            status: InboundStatus::Completed
        }
    );
    assert_eq!(
        (state, journal.entries()),
        (AckState::Acked, vec!["ack".to_owned()]),
        "acked, not dispatched"
    );
    let (outcome, _) = run(&r, &unfinished, &journal, Ok(())).await;
    assert!(
        matches!(outcome, ReceiveOutcome::Handled { .. }),
        "the unfinished event is processed after the restart"
    );
    let (outcome, _) = run(&r, &unfinished, &journal, Ok(())).await;
    assert_eq!(
        outcome,
        ReceiveOutcome::Duplicate {
            status: InboundStatus::Completed
        },
        "and only once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_event_is_dead_lettered_after_its_attempts() {
    let h = Harness::new().await;
    let options = ReceiveOptions {
        max_attempts: 3,
        ..ReceiveOptions::default()
    };
    let r = receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterDurableSend,
        options,
    );
    let raw = inbound(&h, "room-1", "poison", false, None);
    for attempt in 1..=3 {
        let journal = Arc::new(Journal::default());
        let (outcome, state) = run(&r, &raw, &journal, Err(format!("boom {attempt}"))).await;
        let ReceiveOutcome::Failed {
            attempts,
            dead_lettered,
            ..
        } = outcome
        else {
            panic!("{outcome:?}")
        };
        assert_eq!((attempts, dead_lettered), (attempt, attempt == 3));
        // Nacked (redeliver) while attempts remain; acked once dead-lettered, so it stops.
        let expected = if attempt == 3 {
            AckState::Acked
        } else {
            AckState::Nacked(format!("boom {attempt}"))
        };
        assert_eq!(state, expected);
    }
    let journal = Arc::new(Journal::default());
    let (outcome, _) = run(&r, &raw, &journal, Ok(())).await;
    assert_eq!(
        outcome,
        ReceiveOutcome::Duplicate {
            status: InboundStatus::DeadLettered
        },
        "not retried forever"
    );
    let other = inbound(&h, "room-1", "next in the lane", false, None);
    assert!(
        matches!(
            run(&r, &other, &journal, Ok(())).await.0,
            ReceiveOutcome::Handled { .. }
        ),
        "the lane is not blocked"
    );
}

/// (case, conversation, bot author, origin marker, options, expected)
type EchoCase = (
    &'static str,
    &'static str,
    bool,
    Option<MessageOrigin>,
    ReceiveOptions,
    &'static str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn marked_gateway_failure_echoes_are_dropped_before_bot_authorization() {
    let h = Harness::new().await;
    let failure = Some(MessageOrigin::gateway_failure(
        GatewayFailureCode::AgentFailedBeforeReply,
    ));
    let text = "Agent failed before reply.";
    let allow = ReceiveOptions {
        allow_bots: true,
        ..ReceiveOptions::default()
    };
    let deny = ReceiveOptions {
        allow_bots: false,
        ..ReceiveOptions::default()
    };
    let cases: Vec<EchoCase> = vec![
        (
            "marked bot echo in a room, bots allowed",
            "room-1",
            true,
            failure.clone(),
            allow.clone(),
            "dropped",
        ),
        (
            "marked bot echo in a room, bots denied",
            "room-1",
            true,
            failure.clone(),
            deny.clone(),
            "dropped",
        ),
        (
            "same text, unmarked bot, bots allowed",
            "room-1",
            true,
            None,
            allow.clone(),
            "handled",
        ),
        (
            "same text, unmarked bot, bots denied",
            "room-1",
            true,
            None,
            deny.clone(),
            "unauthorized",
        ),
        (
            "marked, but a direct chat",
            "dm-alice",
            true,
            failure.clone(),
            allow.clone(),
            "handled",
        ),
        (
            "marked, but written by a human",
            "room-1",
            false,
            failure.clone(),
            deny.clone(),
            "handled",
        ),
    ];
    for (case, conversation, bot, origin, options, expected) in cases {
        let r = receiver(&h, h.store.clone(), ReceiveAckPolicy::AfterRecord, options);
        let raw = inbound(&h, conversation, text, bot, origin);
        let journal = Arc::new(Journal::default());
        let (outcome, state) = run(&r, &raw, &journal, Ok(())).await;
        let got = match outcome {
            ReceiveOutcome::DroppedEcho => "dropped",
            ReceiveOutcome::Handled { .. } => "handled",
            ReceiveOutcome::Unauthorized => "unauthorized",
            other => panic!("{case}: {other:?}"),
        };
        assert_eq!(got, expected, "{case}");
        assert_eq!(
            state,
            AckState::Acked,
            "{case}: the transport is acked either way"
        );
        assert_eq!(
            journal.entries().contains(&"dispatch".to_owned()),
            expected == "handled",
            "{case}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_payloads_are_a_typed_error_not_a_panic() {
    let h = Harness::new().await;
    let r = receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterRecord,
        ReceiveOptions::default(),
    );
    let journal = Arc::new(Journal::default());
    let (outcome, _) = run(
        &r,
        &serde_json::json!({ "id": 7, "text": [] }),
        &journal,
        Ok(()),
    )
    .await;
    assert!(matches!(outcome, ReceiveOutcome::Invalid(_)), "{outcome:?}");
    assert!(!journal.entries().contains(&"dispatch".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_pair_over_its_limit_is_cut_off_when_bots_are_allowed() {
    let h = Harness::new().await;
    let limits = clawgate_messages::BotLoopLimits {
        max_messages: 2,
        window_ms: 60_000,
        cooldown_ms: 60_000,
        ..clawgate_messages::BotLoopLimits::default()
    };
    let options = ReceiveOptions {
        allow_bots: true,
        bot_loop: limits,
        ..ReceiveOptions::default()
    };
    let r = receiver(&h, h.store.clone(), ReceiveAckPolicy::AfterRecord, options);
    let journal = Arc::new(Journal::default());
    let mut outcomes = Vec::new();
    for n in 0..3 {
        let raw = inbound(&h, "room-1", &format!("bot says {n}"), true, None);
        outcomes.push(run(&r, &raw, &journal, Ok(())).await.0);
    }
    assert!(matches!(outcomes[0], ReceiveOutcome::Handled { .. }));
    assert!(matches!(outcomes[1], ReceiveOutcome::Handled { .. }));
    assert_eq!(
        outcomes[2],
        ReceiveOutcome::LoopGuarded,
        "the third in the window is cut off"
    );
    let human = inbound(&h, "room-1", "a person still gets through", false, None);
    assert!(matches!(
        run(&r, &human, &journal, Ok(())).await.0,
        ReceiveOutcome::Handled { .. }
    ));
}

/// The Telegram case end to end: updates are long-polled from the QA platform with the durable
/// watermark as offset; an update accepted but unfinished when the process dies is fetched
/// again after the restart and processed once, and finished ones are not processed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polled_updates_accepted_but_unfinished_are_recovered_after_a_restart() {
    use clawgate_messages::PollingWatermark;
    use clawgate_store::WatermarkKey;

    let h = Harness::new().await;
    for n in 1..=5 {
        inbound(&h, "room-1", &format!("update {n}"), false, None);
    }
    let dir = tempfile::tempdir().unwrap();
    let key = WatermarkKey {
        channel: "qa".into(),
        account_id: "bot".into(),
        source: "updates".into(),
    };
    let dispatched = Arc::new(Mutex::new(Vec::<String>::new()));
    // One life of the poller: processes what it fetches; `fail` makes that text's turn fail.
    let life = |fail: Option<&'static str>| {
        let (h, key, dispatched) = (&h, key.clone(), dispatched.clone());
        let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
        async move {
            let r = receiver(
                h,
                store.clone(),
                ReceiveAckPolicy::AfterRecord,
                ReceiveOptions::default(),
            );
            let mut watermark = PollingWatermark::open(store, h.clock.clone(), key)
                .await
                .unwrap();
            let updates = h
                .adapter()
                .get_updates(watermark.next_offset(), 0)
                .await
                .unwrap();
            for update in updates {
                if !watermark.accept(update.update_id) {
                    continue;
                }
                let raw = serde_json::to_value(&update.message).unwrap();
                let d = dispatched.clone();
                let journal = Arc::new(Journal::default());
                let ack = AckController::new(journal);
                let outcome = r
                    .receive(&raw, &ack, |m| async move {
                        let text = m.message.body.unwrap().text;
                        if Some(text.as_str()) == fail {
                            return Err("the turn died".to_owned());
                        }
                        d.lock().unwrap().push(text);
                        Ok(())
                    })
                    .await
                    .unwrap();
                if matches!(
                    outcome,
                    ReceiveOutcome::Handled { .. } | ReceiveOutcome::Duplicate { .. }
                ) {
                    watermark.finish(update.update_id).await.unwrap();
                }
            }
            watermark.safe()
        }
    };
    // First life: update 2's turn dies; 1, 3, 4, 5 finish. The watermark stops at 1.
    assert_eq!(
        life(Some("update 2")).await,
        1,
        "the watermark never passes the unfinished update"
    );
    // Restart: from offset 2 the platform sends 2..5 again; 2 is processed, 3..5 are duplicates.
    assert_eq!(life(None).await, 5, "drained");
    let got = dispatched.lock().unwrap().clone();
    assert_eq!(
        got,
        vec!["update 1", "update 3", "update 4", "update 5", "update 2"],
        "each update handled exactly once"
    );
}

/// Webhook delivery: a non-2xx answer makes the platform deliver again, and the redelivery is
/// processed — once — by the same receive context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_answered_with_an_error_is_redelivered_and_handled_once() {
    use axum::http::StatusCode;
    let h = Harness::new().await;
    let r = Arc::new(receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterDurableSend,
        ReceiveOptions::default(),
    ));
    let turns = Arc::new(Mutex::new(0u32));
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let done_tx = Arc::new(Mutex::new(Some(done_tx)));
    let (r2, t2, d2) = (r.clone(), turns.clone(), done_tx.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |axum::Json(update): axum::Json<clawgate_channel_qa::Update>| {
                let (r, turns, done) = (r2.clone(), t2.clone(), d2.clone());
                async move {
                    let raw = serde_json::to_value(&update.message).unwrap();
                    let journal = Arc::new(Journal::default());
                    let ack = AckController::new(journal);
                    let outcome = r
                        .receive(&raw, &ack, |_| async {
                            let mut n = turns.lock().unwrap();
                            *n += 1;
                            if *n == 1 {
                                Err("the first turn fails".to_owned())
                            } else {
                                Ok(())
                            }
                        })
                        .await
                        .unwrap();
                    match (outcome, ack.state()) {
                        (ReceiveOutcome::Handled { .. }, AckState::Acked) => {
                            if let Some(tx) = done.lock().unwrap().take() {
                                let _ = tx.send(());
                            }
                            StatusCode::OK
                        }
                        _ => StatusCode::INTERNAL_SERVER_ERROR,
                    }
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    h.platform.set_webhook(Some(hook));
    inbound(&h, "room-1", "deliver me", false, None);
    tokio::time::timeout(std::time::Duration::from_secs(10), done_rx)
        .await
        .expect("handled within the deadline")
        .unwrap();
    assert_eq!(
        h.platform.webhook_attempts(1),
        2,
        "one redelivery after the 500"
    );
    assert_eq!(
        *turns.lock().unwrap(),
        2,
        "the failed turn ran again on redelivery, and then not again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_dies_with_the_process_every_time_is_dead_lettered_after_its_starts() {
    let h = Harness::new().await;
    let options = ReceiveOptions {
        max_attempts: 3,
        ..ReceiveOptions::default()
    };
    let raw = inbound(&h, "room-1", "poison that crashes the gateway", false, None);
    let dispatched = Arc::new(std::sync::atomic::AtomicU32::new(0));
    for start in 1..=3 {
        // Each attempt's process dies mid-dispatch: the receive context is dropped while the
        // turn runs, so nothing after the dispatch (no finish) ever happens.
        let r = receiver(
            &h,
            h.store.clone(),
            ReceiveAckPolicy::AfterDurableSend,
            options.clone(),
        );
        let ack = AckController::new(Arc::new(Journal::default()));
        let count = dispatched.clone();
        let turn = r.receive(&raw, &ack, |_| async move {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::pending::<Result<(), String>>().await
        });
        let died = tokio::time::timeout(std::time::Duration::from_millis(300), turn).await;
        assert!(died.is_err(), "attempt {start} never finished");
        let record = clawgate_store::InboundStore::list_unfinished_inbound(&*h.store, 10)
            .await
            .unwrap();
        assert_eq!(
            record.iter().map(|r| r.attempts).collect::<Vec<_>>(),
            vec![start],
            "the attempt was counted when it started"
        );
    }
    let r = receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterDurableSend,
        options,
    );
    let journal = Arc::new(Journal::default());
    let (outcome, state) = run(&r, &raw, &journal, Ok(())).await;
    let ReceiveOutcome::Failed {
        attempts,
        dead_lettered,
        error,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert!(dead_lettered, "dead-lettered after 3 starts: {error}");
    assert_eq!(attempts, 3);
    assert!(error.contains("never finished"), "{error}");
    assert_eq!(
        state,
        AckState::Acked,
        "the platform may stop redelivering it"
    );
    assert_eq!(
        journal.entries(),
        vec!["ack"],
        "not dispatched a fourth time"
    );
    assert_eq!(dispatched.load(std::sync::atomic::Ordering::SeqCst), 3);
    let journal = Arc::new(Journal::default());
    assert_eq!(
        run(&r, &raw, &journal, Ok(())).await.0,
        ReceiveOutcome::Duplicate {
            status: InboundStatus::DeadLettered
        },
        "and stays dead-lettered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_died_after_finishing_its_work_is_settled_not_dead_lettered() {
    let h = Harness::new().await;
    let options = ReceiveOptions {
        max_attempts: 2,
        ..ReceiveOptions::default()
    };
    let raw = inbound(&h, "room-1", "answered, then the gateway died", false, None);
    for _ in 0..2 {
        let r = receiver(
            &h,
            h.store.clone(),
            ReceiveAckPolicy::AfterDurableSend,
            options.clone(),
        );
        let ack = AckController::new(Arc::new(Journal::default()));
        let turn = r.receive(&raw, &ack, |_| std::future::pending::<Result<(), String>>());
        let died = tokio::time::timeout(std::time::Duration::from_millis(300), turn).await;
        assert!(died.is_err(), "the attempt never finished");
    }
    let r = receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterDurableSend,
        options,
    );
    let journal = Arc::new(Journal::default());
    let ack = AckController::new(journal.clone());
    let (j, settled) = (journal.clone(), journal.clone());
    let outcome = r
        .receive_or_settle(
            &raw,
            &ack,
            |_| async move {
                j.push("dispatch");
                Ok::<(), String>(())
            },
            // The reply of a dead attempt is found delivered.
            |_| async move {
                settled.push("settle");
                Ok(())
            },
        )
        .await
        .unwrap();
    let ReceiveOutcome::Handled { record } = outcome else {
        panic!("settled work completes the event: {outcome:?}")
    };
    assert_eq!(record.status, InboundStatus::Completed);
    assert_eq!(
        journal.entries(),
        vec!["settle", "ack"],
        "settled, never dispatched again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_interrupted_by_a_stop_is_given_back() {
    let h = Harness::new().await;
    let options = ReceiveOptions {
        max_attempts: 2,
        ..ReceiveOptions::default()
    };
    let r = receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterDurableSend,
        options,
    );
    let raw = inbound(&h, "room-1", "long turn, stopped twice", false, None);
    // Two clean stops under the turn: neither is the message's failure.
    for _ in 0..2 {
        let ack = AckController::new(Arc::new(Journal::default()));
        let outcome = r
            .receive(&raw, &ack, |_| async {
                Err::<(), _>(clawgate_messages::DispatchError::interrupted(
                    "the gateway is stopping",
                ))
            })
            .await
            .unwrap();
        assert_eq!(
            outcome,
            ReceiveOutcome::Failed {
                error: "the gateway is stopping".into(),
                attempts: 0,
                dead_lettered: false,
            },
            "the attempt was given back"
        );
    }
    let journal = Arc::new(Journal::default());
    let (outcome, _) = run(&r, &raw, &journal, Ok(())).await;
    assert!(
        matches!(outcome, ReceiveOutcome::Handled { .. }),
        "still dispatched, not dead-lettered: {outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_dead_lettered_at_once_and_not_taken_up_again() {
    let h = Harness::new().await;
    let r = receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterDurableSend,
        ReceiveOptions::default(),
    );
    let raw = inbound(&h, "room-1", "unanswerable", false, None);
    let journal = Arc::new(Journal::default());
    let ack = AckController::new(journal.clone());
    let outcome = r
        .receive(&raw, &ack, |_| async {
            Err(clawgate_messages::DispatchError::permanent(
                "the reply was refused for good",
            ))
        })
        .await
        .unwrap();
    assert_eq!(
        outcome,
        ReceiveOutcome::Failed {
            error: "the reply was refused for good".into(),
            attempts: 1,
            dead_lettered: true,
        },
        "one attempt of the five allowed"
    );
    assert_eq!(ack.state(), AckState::Acked, "the platform may stop");
    // A redelivery is not dispatched again.
    let (outcome, state) = run(&r, &raw, &journal, Ok(())).await;
    assert_eq!(
        outcome,
        ReceiveOutcome::Duplicate {
            status: InboundStatus::DeadLettered
        }
    );
    assert_eq!(state, AckState::Acked);
    assert_eq!(
        journal
            .entries()
            .iter()
            .filter(|e| *e == "dispatch")
            .count(),
        0,
        "never dispatched after the permanent failure"
    );
}

/// A redelivery that arrives while the event's attempt runs is not dispatched a second time,
/// and whichever of "the attempt completes" and "the copy arrives" happens first, the event
/// is dispatched once and completed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_racing_a_running_attempt_and_its_completion_dispatch_it_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let h = Harness::new().await;
    let r = Arc::new(receiver(
        &h,
        h.store.clone(),
        ReceiveAckPolicy::AfterRecord,
        ReceiveOptions::default(),
    ));
    for round in 0..20 {
        let raw = inbound(&h, "room-1", &format!("message {round}"), false, None);
        let dispatches = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let (r, raw, dispatches) = (r.clone(), raw.clone(), dispatches.clone());
            tokio::spawn(async move {
                let ack = AckController::new(Arc::new(Journal::default()));
                r.receive(&raw, &ack, |_| async move {
                    dispatches.fetch_add(1, Ordering::SeqCst);
                    let _ = released.await;
                    Ok::<(), String>(())
                })
                .await
                .unwrap()
            })
        };
        // The attempt runs: a copy delivered now is not dispatched.
        while dispatches.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let journal = Arc::new(Journal::default());
        let (outcome, state) = run(&r, &raw, &journal, Ok(())).await;
        assert_eq!(outcome, ReceiveOutcome::InFlight, "round {round}");
        assert_eq!(state, AckState::Acked, "recorded, so acked (AfterRecord)");
        // Copies race the completion: delivered one after another while the attempt
        // finishes on the other worker thread, and once more after it finished.
        release.send(()).unwrap();
        let copy = || async {
            let ack = AckController::new(Arc::new(Journal::default()));
            let dispatches = dispatches.clone();
            r.receive(&raw, &ack, |_| async move {
                dispatches.fetch_add(1, Ordering::SeqCst);
                Ok::<(), String>(())
            })
            .await
            .unwrap()
        };
        let mut outcomes = Vec::new();
        while !first.is_finished() {
            outcomes.push(copy().await);
        }
        outcomes.push(copy().await);
        let first = first.await.unwrap();
        let ReceiveOutcome::Handled { record } = first else {
            panic!("{first:?}")
        };
        for outcome in outcomes {
            assert!(
                matches!(
                    outcome,
                    ReceiveOutcome::InFlight
                        | ReceiveOutcome::Duplicate {
                            status: InboundStatus::Completed
                        }
                ),
                "round {round}: {outcome:?}"
            );
        }
        assert_eq!(dispatches.load(Ordering::SeqCst), 1, "round {round}");
        let key = clawgate_store::InboundKey {
            channel: record.channel,
            account_id: record.account_id,
            event_id: record.event_id,
        };
        let record = clawgate_store::InboundStore::load_inbound(&*h.store, &key)
            .await
            .unwrap()
            .expect("recorded");
        assert_eq!(
            (record.status, record.attempts),
            (InboundStatus::Completed, 1),
            "round {round}: completed once, one attempt counted"
        );
    }
}
