//! Random interleavings of sends, platform faults, crashes at lifecycle boundaries and recovery
//! passes, against the real QA platform: no final is lost, none lands twice, and every receipt
//! names exactly the platform messages that landed — within the retry budget: more refusals in
//! a row than `max_attempts` allows fail a send by design, so a sequence holds fewer.

use std::sync::Arc;

use clawgate_channel_qa::Fault;
use clawgate_messages::{Boundary, RetryPolicy, SendOptions};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::IntentStatus;
use proptest::prelude::*;

use crate::harness::{CrashAt, Harness, message, quiet_simulated_crashes};

#[derive(Debug, Clone)]
enum Op {
    /// Send message `n` with this many units, optionally "crashing" at a boundary.
    Send { units: usize, crash: Option<u8> },
    /// The platform refuses the next call (503), or accepts it and loses the answer.
    Fault { lose_answer: bool },
    /// Time passes, then a recovery pass runs.
    Recover { advance_ms: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..=3, proptest::option::weighted(0.4, 0u8..3)).prop_map(|(units, crash)| Op::Send { units, crash }),
        2 => any::<bool>().prop_map(|lose_answer| Op::Fault { lose_answer }),
        2 => (0i64..3_000).prop_map(|advance_ms| Op::Recover { advance_ms }),
    ]
}

/// Whether the refusals of a sequence stay inside the retry budget even if they all fall on one
/// send that also spent an attempt on a crash.
fn within_retry_budget(ops: &[Op]) -> bool {
    let refusals = ops
        .iter()
        .filter(|op| matches!(op, Op::Fault { lose_answer: false }))
        .count();
    refusals + 1 < RetryPolicy::default().max_attempts as usize
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..14)
        .prop_filter("more refusals than the retry budget", |ops| {
            within_retry_budget(ops)
        })
}

fn boundary(code: u8) -> Boundary {
    match code {
        0 => Boundary::IntentRecorded,
        1 => Boundary::UnitDelivered { index: 0 },
        _ => Boundary::PlatformAccepted,
    }
}

fn text(n: usize, units: usize) -> String {
    // Units of exactly 4,000 characters (the QA limit), distinct per message, the last one short.
    let mut text = String::new();
    for u in 0..units - 1 {
        let unit: String = format!("{n:04}-{u}-")
            .repeat(600)
            .chars()
            .take(4_000)
            .collect();
        text.push_str(&unit);
    }
    text.push_str(&format!("message {n} end"));
    text
}

async fn run(ops: Vec<Op>, idempotent: bool) {
    quiet_simulated_crashes();
    let h = Harness::new().await;
    let adapter = Arc::new(if idempotent {
        h.adapter()
    } else {
        h.plain_adapter()
    });
    let messenger = h.messenger(adapter.clone());
    let mut sent = Vec::new();
    for op in ops {
        match op {
            Op::Send { units, crash } => {
                let n = sent.len();
                let msg = message(&format!("m{n}"), &text(n, units));
                sent.push(units);
                let engine = match crash {
                    Some(code) => messenger
                        .clone()
                        .with_probe(Arc::new(CrashAt(boundary(code)))),
                    None => messenger.clone(),
                };
                // A panic in the task is the simulated crash; whatever was committed stays.
                let _ = tokio::spawn(async move { engine.send(msg, SendOptions::default()).await })
                    .await;
            }
            Op::Fault { lose_answer } => {
                h.platform.inject(if lose_answer {
                    Fault::drop_after_accept(1)
                } else {
                    Fault::status(1, 503, "unavailable")
                });
            }
            Op::Recover { advance_ms } => {
                h.clock.advance(advance_ms);
                messenger.recover().await.unwrap();
            }
        }
    }
    // Let every claim of a "crashed" send expire, and every retry come due.
    for _ in 0..40 {
        h.clock.advance(10 * 60_000);
        messenger.recover().await.unwrap();
    }
    let intents = h
        .store
        .list_intents(&IntentFilter {
            limit: 1_000,
            ..IntentFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(intents.len(), sent.len(), "one intent per send");
    let log = h.platform.log();
    for intent in intents {
        let n: usize = intent.message.id[1..].parse().unwrap();
        // What landed for this message, unit by unit, by text (the plain adapter sends no keys).
        let units: Vec<String> = clawgate_channel_sdk::chunk_text(&text(n, sent[n]), 4_000);
        let landed: Vec<Vec<String>> = units
            .iter()
            .map(|u| {
                log.iter()
                    .filter(|e| e.event == clawgate_channel_qa::LogEvent::Sent && &e.text == u)
                    .map(|e| e.message_id.clone())
                    .collect()
            })
            .collect();
        for (index, ids) in landed.iter().enumerate() {
            assert!(
                ids.len() <= 1,
                "message {n} unit {index} landed {} times",
                ids.len()
            );
        }
        match intent.status {
            IntentStatus::Sent => {
                let receipt = intent.receipt.as_ref().unwrap();
                let all: Vec<String> = landed.iter().flatten().cloned().collect();
                assert_eq!(receipt.parts.len(), sent[n], "a receipt part per unit");
                assert_eq!(
                    receipt.platform_message_ids, all,
                    "the receipt names exactly what landed"
                );
            }
            // Only an adapter that cannot reconcile may leave an unknown outcome behind.
            IntentStatus::UnknownAfterSend if !idempotent => {}
            other => panic!("message {n} ended {other}: a final was lost"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn interleavings_never_lose_or_double_a_final(ops in ops()) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(run(ops, true));
    }

    #[test]
    fn interleavings_without_reconciliation_never_replay_blindly(ops in ops()) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(run(ops, false));
    }
}
