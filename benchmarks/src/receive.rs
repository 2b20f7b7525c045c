//! `cargo xtask bench receive`: inbound events through normalize → echo gate → dedupe/record →
//! ack (after record) → dispatch → finish, beside the raw SQLite baseline of the same run.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use clawgate_channel_qa::{PlatformMessage, QaAdapter};
use clawgate_channel_sdk::TransportAck;
use clawgate_messages::{AckController, ReceiveOptions, ReceiveOutcome, Receiver};
use clawgate_store_sqlite::{SqliteStore, Synchronous};
use clawgate_types::clock::SystemClock;

use super::{open, raw_inserts};

struct NoAck;

impl TransportAck for NoAck {
    fn ack(&self) {}
    fn nack(&self, _: &str) {}
}

fn event(n: usize) -> serde_json::Value {
    let message = PlatformMessage {
        id: format!("m-{n}"),
        conversation_id: "room-1".into(),
        thread_id: None,
        reply_to_id: None,
        text: format!("inbound message number {n}"),
        attachments: Vec::new(),
        metadata: None,
        idempotency_key: None,
        edits: 0,
        seq: n as u64,
        author_id: Some("alice".into()),
        author_is_bot: false,
    };
    serde_json::to_value(message).unwrap_or_default()
}

async fn events(store: Arc<SqliteStore>, concurrency: usize, total: usize) -> anyhow::Result<f64> {
    // The adapter is only a normalizer here: no platform is called.
    let adapter = Arc::new(QaAdapter::new("http://127.0.0.1:9", "unused"));
    let receiver = Arc::new(Receiver::new(
        store,
        adapter.clone(),
        adapter,
        Arc::new(SystemClock),
        ReceiveOptions::default(),
    ));
    let per_task = total / concurrency;
    let work: Vec<Vec<serde_json::Value>> = (0..concurrency)
        .map(|t| (0..per_task).map(|i| event(i * concurrency + t)).collect())
        .collect();
    let started = Instant::now();
    let tasks: Vec<_> = work
        .into_iter()
        .map(|events| {
            let receiver = receiver.clone();
            tokio::spawn(async move {
                for raw in &events {
                    let ack = AckController::new(Arc::new(NoAck));
                    let outcome = receiver
                        .receive(raw, &ack, |_| async { Ok::<(), String>(()) })
                        .await?;
                    anyhow::ensure!(
                        matches!(outcome, ReceiveOutcome::Handled { .. }),
                        "{outcome:?}"
                    );
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok((per_task * concurrency) as f64 / started.elapsed().as_secs_f64())
}

pub(super) fn run(root: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!("bench receive: {} (WAL, synchronous=FULL)", root.display());
    let single = raw_inserts(root, "raw-single", Synchronous::Full, 1_000, 1)?;
    let batched = raw_inserts(root, "raw-batched", Synchronous::Full, 20_000, 100)?;
    let (c1, c64, c64_normal) = runtime.block_on(async {
        let c1 = events(open(root, "receive-c1", Synchronous::Full)?, 1, 1_000).await?;
        let c64 = events(open(root, "receive-c64", Synchronous::Full)?, 64, 20_000).await?;
        let normal = events(
            open(root, "receive-c64-normal", Synchronous::Normal)?,
            64,
            20_000,
        )
        .await?;
        anyhow::Ok((c1, c64, normal))
    })?;
    println!("\n  {:<64} {:>12}", "figure", "per second");
    let rows: [(&str, f64); 5] = [
        ("(a) raw SQLite, one row per commit", single),
        ("(a) raw SQLite, 100 rows per commit", batched),
        ("(b) inbound events (2 writes each), concurrency 1", c1),
        ("(b) inbound events, concurrency 64", c64),
        ("(b) inbound events, concurrency 64, NORMAL", c64_normal),
    ];
    for (label, value) in rows {
        println!("  {label:<64} {value:>12.0}");
    }
    println!("\n  (c) ratios");
    println!(
        "  {:<64} {:>11.2}x",
        "events c64 / raw single commits",
        c64 / single
    );
    println!(
        "  {:<64} {:>11.2}x",
        "events c64 x 2 writes / raw batched rows",
        c64 * 2.0 / batched
    );
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "\n  target: >= 20,000 events/s with synchronous=FULL: {} (NORMAL: {})",
        verdict(c64 >= 20_000.0),
        verdict(c64_normal >= 20_000.0)
    );
    Ok(())
}
