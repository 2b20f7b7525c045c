//! The commit, then the hooks: post-send hooks see the receipt committed; a commit that fails
//! after the platform accepted leaves the send to reconciliation (never a blind resend); a
//! best-effort batch that delivered nothing stays retryable instead of committing an empty
//! receipt.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_qa::Fault;
use clawgate_messages::{Boundary, LifecycleProbe, MessagesError, SendOptions, SendOutcome};
use clawgate_store::IntentStore as _;
use clawgate_store_sqlite::SqliteOptions;
use clawgate_types::{IntentId, IntentStatus};

use crate::harness::{Counting, Harness, message};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_send_hooks_run_after_the_receipt_is_committed() {
    let h = Harness::new().await;
    let adapter = Counting::observing(h.adapter(), h.store.clone());
    let messenger = h.messenger(adapter.clone());
    for n in 0..3 {
        let report = messenger
            .send(
                message(&format!("h{n}"), &format!("hook {n}")),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Sent { .. }),
            "{report:?}"
        );
    }
    let seen = adapter.statuses_at_hook.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![Some(IntentStatus::Sent); 3],
        "each hook saw its send committed"
    );
}

/// At "the platform accepted", another connection takes the database's write lock, so the
/// commit that follows fails.
struct LockAtAcceptance {
    db: std::path::PathBuf,
    holder: Mutex<Option<rusqlite::Connection>>,
}

impl LifecycleProbe for LockAtAcceptance {
    fn reached(&self, boundary: Boundary, _intent: &IntentId) {
        if boundary == Boundary::PlatformAccepted {
            let conn = rusqlite::Connection::open(&self.db).unwrap();
            conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
            *self.holder.lock().unwrap() = Some(conn);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_fails_after_the_platform_accepted_is_reconciled_never_resent() {
    for reconciling in [true, false] {
        let h = Harness::with_options(SqliteOptions {
            busy_timeout: Duration::from_millis(200),
            ..SqliteOptions::default()
        })
        .await;
        let inner = if reconciling {
            h.adapter()
        } else {
            h.plain_adapter()
        };
        let adapter = Counting::new(inner);
        let probe = Arc::new(LockAtAcceptance {
            db: h._dir.path().join(clawgate_store_sqlite::STATE_DB_FILE),
            holder: Mutex::new(None),
        });
        let messenger = h.messenger(adapter.clone()).with_probe(probe.clone());
        let result = messenger
            .send(
                message("c", "landed, not committed"),
                SendOptions::default(),
            )
            .await;
        assert!(
            matches!(result, Err(MessagesError::Store(_))),
            "the failed commit is reported: {result:?}"
        );
        assert_eq!(adapter.hooks(), (0, 0), "no hook without a commit");
        // The database is writable again.
        drop(probe.holder.lock().unwrap().take());
        let intent = h.intents().await.remove(0);
        assert_eq!(
            intent.status,
            IntentStatus::Sending,
            "left as it was before the commit: the outcome is unknown to the store"
        );
        // Another engine (a restart): the first one's claim lapses.
        let messenger = h.messenger(adapter.clone());
        h.clock.advance(5 * 60_000);
        messenger.recover().await.unwrap();
        let after = h.store.load_intent(&intent.id).await.unwrap().unwrap();
        if reconciling {
            assert_eq!(
                after.status,
                IntentStatus::Sent,
                "reconciled: it had landed"
            );
            assert_eq!(adapter.hooks(), (1, 1), "hooks once, after that commit");
        } else {
            assert_eq!(
                (after.status, after.next_attempt_at),
                (IntentStatus::UnknownAfterSend, None),
                "no way to ask the platform: parked for an operator, not resent"
            );
        }
        h.clock.advance(60 * 60_000);
        messenger.recover().await.unwrap();
        assert_eq!(
            h.platform.landed_with_text("landed, not committed"),
            1,
            "reconciling: {reconciling}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_best_effort_batch_that_delivered_nothing_stays_retryable() {
    let h = Harness::new().await;
    let adapter = Counting::best_effort_parts(h.adapter());
    let messenger = h.messenger(adapter.clone());
    // The very first unit fails.
    h.platform.inject(Fault::status(1, 503, "unavailable"));
    // Three units on the QA platform (4,000 characters each at most).
    let text = format!(
        "{}{}{}",
        "a".repeat(4_000),
        "b".repeat(4_000),
        "c".repeat(10)
    );
    let report = messenger
        .send(message("z", &text), SendOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "nothing delivered is not a partial success: {report:?}"
    );
    let id = report.intent_id.unwrap();
    let intent = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(intent.status, IntentStatus::Pending);
    assert!(intent.receipt.is_none(), "no empty receipt committed");
    assert_eq!(adapter.hooks(), (0, 0));
    h.clock.advance(60_000);
    assert_eq!(messenger.recover().await.unwrap().committed, 1);
    let sent = h.store.load_intent(&id).await.unwrap().unwrap();
    assert_eq!(sent.status, IntentStatus::Sent);
    assert!(
        sent.receipt.map(|r| r.parts.len()).unwrap_or(0) > 1,
        "every unit delivered on the retry"
    );
}
