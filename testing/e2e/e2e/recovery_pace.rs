//! Recovery of a backlog (many due replies after an outage) is paced: a channel that answers
//! "rate limited" gets its other due intents in a later pass instead of a storm of requests,
//! and a pass stops taking intents at its time budget; what it left stays due and the next
//! pass delivers it, each reply once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clawgate_channel_qa::Fault;
use clawgate_messages::{Messenger, RecoveryPace, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::IntentStatus;

use crate::harness::{Counting, Harness, message};

/// `count` replies, each refused once (retry after 1 s): a backlog due one second from now.
async fn backlog(h: &Harness, messenger: &Messenger, count: usize) {
    h.platform.inject(Fault::rate_limited(count as u32, 1));
    for n in 0..count {
        let report = messenger
            .send(
                message(&format!("b{n}"), &format!("backlog {n}")),
                SendOptions {
                    idempotency_key: Some(format!("backlog-{n}")),
                    ..SendOptions::default()
                },
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
            "{report:?}"
        );
    }
    h.clock.advance(1_000);
}

/// How many intents are `pending`.
async fn pending(h: &Harness) -> usize {
    use clawgate_store::IntentStore as _;
    h.store
        .list_intents(&clawgate_store::IntentFilter {
            statuses: vec![IntentStatus::Pending],
            limit: 1_000,
            ..clawgate_store::IntentFilter::default()
        })
        .await
        .unwrap()
        .len()
}

fn messenger(h: &Harness, adapter: Arc<Counting<clawgate_channel_qa::QaAdapter>>) -> Messenger {
    Messenger::new(
        h.store.clone(),
        vec![adapter],
        RetryPolicy::default(),
        h.clock.clone(),
        "test",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_channel_meets_one_wave_of_429s_not_one_per_due_reply() {
    const BACKLOG: usize = 60;
    const PER_CHANNEL: usize = 4;
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = messenger(&h, adapter.clone());
    backlog(&h, &messenger, BACKLOG).await;
    // Five go through, then the platform asks to slow down for a while.
    h.platform.inject(Fault::rate_limited(10_000, 30).after(5));
    let before = adapter.send_calls.load(Ordering::SeqCst);
    let report = messenger
        .recover_paced(&RecoveryPace {
            per_channel: PER_CHANNEL,
            time_budget: None,
        })
        .await
        .unwrap();
    let calls = adapter.send_calls.load(Ordering::SeqCst) - before;
    assert_eq!(report.committed, 5, "{report:?}");
    assert!(report.rate_limited >= 1, "{report:?}");
    // At most the sends in flight when the first 429 came back meet one as well.
    assert!(
        calls <= 5 + PER_CHANNEL,
        "{calls} platform calls for a backlog of {BACKLOG}: {report:?}"
    );
    assert_eq!(
        report.committed + report.rescheduled + report.deferred,
        BACKLOG as u64,
        "every due reply sent, rescheduled or left for the next pass: {report:?}"
    );
    let waiting = pending(&h).await;
    assert_eq!(waiting, BACKLOG - 5, "the rest stays due, nothing failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_stops_at_its_time_budget_and_the_next_one_delivers_the_rest_once() {
    const BACKLOG: usize = 30;
    let h = Harness::new().await;
    let adapter = Counting::new(h.adapter());
    let messenger = messenger(&h, adapter.clone());
    backlog(&h, &messenger, BACKLOG).await;
    // A slow platform: each send takes 400 ms to answer.
    h.platform
        .inject(Fault::delay_after_accept(BACKLOG as u32, 400));
    let report = messenger
        .recover_paced(&RecoveryPace {
            per_channel: 2,
            time_budget: Some(Duration::from_secs(1)),
        })
        .await
        .unwrap();
    assert!(report.deferred >= 1, "{report:?}");
    assert_eq!(
        report.committed + report.deferred,
        BACKLOG as u64,
        "{report:?}"
    );
    let left = pending(&h).await as u64;
    assert_eq!(left, report.deferred, "what was left is still due");
    let rest = messenger.recover().await.unwrap();
    assert_eq!(rest.committed, report.deferred, "{rest:?}");
    for n in 0..BACKLOG {
        assert_eq!(
            h.platform.landed_with_text(&format!("backlog {n}")),
            1,
            "reply {n} landed once"
        );
    }
}
