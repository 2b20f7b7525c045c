//! `cargo xtask bench send`: durable sends through an in-process adapter and recovery of a large
//! backlog, beside the raw SQLite baseline of the same run; with `--backend postgres|both`, the
//! same sends on PostgreSQL (one and two gateways) beside pgbench on the same server.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use clawgate_messages::SendOptions;
use clawgate_store::IntentStore;
use clawgate_store::testing::sample_intent;
use clawgate_store_sqlite::{SqliteStore, Synchronous};

use super::{open, raw_inserts};
use crate::instant::{InstantPlatform, messenger};
use crate::postgres::{self, Backend, Work};

/// How the benchmark's messages are keyed (the idempotency key is `<channel>:<message id>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Time-ordered ids minted at send time (UUID v7), as a gateway mints outbound message ids:
    /// neighbouring sends land next to each other in the key index.
    TimeOrdered,
    /// `bench-<task>-<n>`: every concurrent task writes to its own region of the key index, the
    /// worst case for the pages one group commit touches.
    PerTask,
}

/// Durable sends (intent; sending; receipt recorded and committed) at a concurrency, per second.
async fn sends(
    store: Arc<SqliteStore>,
    platform: InstantPlatform,
    concurrency: usize,
    total: usize,
    keys: Keys,
) -> anyhow::Result<f64> {
    let (messenger, _) = messenger(store, platform);
    let per_task = total / concurrency;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let messenger = messenger.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let mut message = sample_intent((i * concurrency + task) as u64, 0).message;
                    message.id = match keys {
                        Keys::TimeOrdered => clawgate_store::ids::new_id(),
                        Keys::PerTask => format!("bench-{task}-{i}"),
                    };
                    let report = messenger.send(message, SendOptions::default()).await?;
                    anyhow::ensure!(
                        report.outcome.receipt().is_some(),
                        "send failed: {report:?}"
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

fn status_kib(field: &str) -> u64 {
    super::proc_status_kib("self", field).unwrap_or(0)
}

/// Queues `backlog` pending single-unit intents, then times one recovery pass over them and
/// the peak memory it added.
async fn recovery(store: Arc<SqliteStore>, backlog: usize) -> anyhow::Result<(f64, u64, u64)> {
    let writers: Vec<_> = (0..64)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                for n in (task..backlog).step_by(64) {
                    let mut intent = sample_intent(n as u64, n as i64);
                    if let Some(batch) = intent.batch.as_mut() {
                        batch.units.truncate(1);
                    }
                    store.insert_intent(&intent, None).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for writer in writers {
        writer.await??;
    }
    let (messenger, platform) = messenger(store, InstantPlatform::plain());
    let rss_before = status_kib("VmRSS:");
    // Resets the peak-RSS mark, so VmHWM below is the peak during recovery.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let started = Instant::now();
    let report = messenger.recover().await?;
    let rate = report.committed as f64 / started.elapsed().as_secs_f64();
    anyhow::ensure!(
        report.committed == backlog as u64,
        "recovered {} of {backlog}",
        report.committed
    );
    anyhow::ensure!(
        platform.sent.load(Ordering::Relaxed) == backlog as u64,
        "each intent sent once"
    );
    let peak = status_kib("VmHWM:");
    Ok((rate, rss_before, peak.saturating_sub(rss_before)))
}

/// How many times each figure is measured. This machine's speed drifts between runs, so the
/// median is reported, with the range beside it, and the targets are judged on the median.
const RUNS: usize = 3;

/// One figure measured [`RUNS`] times.
struct Sampled(Vec<f64>);

impl Sampled {
    fn median(&self) -> f64 {
        let mut runs = self.0.clone();
        runs.sort_by(f64::total_cmp);
        runs.get(runs.len() / 2).copied().unwrap_or(f64::NAN)
    }

    fn range(&self) -> String {
        let min = self.0.iter().copied().fold(f64::INFINITY, f64::min);
        let max = self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{min:.0}-{max:.0}")
    }
}

/// Measures a figure [`RUNS`] times; each run gets its number, to name a fresh database.
async fn sampled<F, Fut>(mut measure: F) -> anyhow::Result<Sampled>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<f64>>,
{
    let mut runs = Vec::with_capacity(RUNS);
    for run in 0..RUNS {
        runs.push(measure(run).await?);
    }
    Ok(Sampled(runs))
}

pub(super) fn run(root: &Path, backend: Backend) -> anyhow::Result<()> {
    backend.run(|| run_sqlite(root), |sqlite| run_postgres(root, sqlite))
}

/// Today's SQLite figures; returns the medians at concurrency 64 and 512 for the side-by-side
/// table.
fn run_sqlite(root: &Path) -> anyhow::Result<(f64, f64)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "bench send: {} (WAL, synchronous=FULL; median of {RUNS} runs, range beside it)",
        root.display()
    );
    let raw = |name: &str, rows, per_commit| -> anyhow::Result<Sampled> {
        (0..RUNS)
            .map(|run| {
                let name = format!("{name}-{run}");
                raw_inserts(root, &name, Synchronous::Full, rows, per_commit)
            })
            .collect::<anyhow::Result<_>>()
            .map(Sampled)
    };
    let single = raw("raw-single", 1_000, 1)?;
    let batched = raw("raw-batched", 20_000, 100)?;
    let (c1, c64, c512, c64_per_task, c64_reconciling, (recovered, rss_kib, growth_kib)) = runtime
        .block_on(async {
            use InstantPlatform as P;
            let full =
                |name: &str, run: usize| open(root, &format!("{name}-{run}"), Synchronous::Full);
            let figure = |name: &'static str, platform: fn() -> P, concurrency, total, keys| {
                sampled(move |run| async move {
                    let store = full(name, run)?;
                    sends(store, platform(), concurrency, total, keys).await
                })
            };
            let c1 = figure("send-c1", P::plain, 1, 1_000, Keys::TimeOrdered).await?;
            let c64 = figure("send-c64", P::plain, 64, 40_000, Keys::TimeOrdered).await?;
            let c512 = figure("send-c512", P::plain, 512, 40_960, Keys::TimeOrdered).await?;
            let c64_per_task = figure("send-c64-keys", P::plain, 64, 40_000, Keys::PerTask).await?;
            let c64_reconciling = figure(
                "send-c64-reconciling",
                P::reconciling,
                64,
                40_000,
                Keys::TimeOrdered,
            )
            .await?;
            // The worst run's memory is the one held against the target.
            let (mut rates, mut rss, mut growth) = (Vec::with_capacity(RUNS), 0, 0);
            for run in 0..RUNS {
                let (rate, before, grew) = recovery(full("recovery", run)?, 100_000).await?;
                rates.push(rate);
                rss = rss.max(before);
                growth = growth.max(grew);
            }
            let recovered = (Sampled(rates), rss, growth);
            anyhow::Ok((c1, c64, c512, c64_per_task, c64_reconciling, recovered))
        })?;
    println!("\n  {:<62} {:>12} {:>13}", "figure", "median", "range");
    let rows: [(&str, &Sampled); 8] = [
        ("(a) raw SQLite, one row per commit (rows/s)", &single),
        ("(a) raw SQLite, 100 rows per commit (rows/s)", &batched),
        ("durable sends/s, concurrency 1 (3 writes each)", &c1),
        ("durable sends/s, concurrency 64 (3 writes each)", &c64),
        ("durable sends/s, concurrency 512 (3 writes each)", &c512),
        (
            "durable sends/s, concurrency 64, keys scattered per task",
            &c64_per_task,
        ),
        (
            "durable sends/s, concurrency 64, reconciling adapter (2 writes)",
            &c64_reconciling,
        ),
        (
            "recovery of 100,000 pending intents (intents/s)",
            &recovered,
        ),
    ];
    for (label, figure) in rows {
        println!(
            "  {label:<62} {:>12.0} {:>13}",
            figure.median(),
            figure.range()
        );
    }
    println!(
        "  {:<62} {:>12.1}",
        "RSS before recovery, largest run (MiB)",
        rss_kib as f64 / 1024.0
    );
    println!(
        "  {:<62} {:>12.1}",
        "peak RSS growth during recovery, largest run (MiB)",
        growth_kib as f64 / 1024.0
    );
    let (single, batched) = (single.median(), batched.median());
    let (c64, c512, recovered) = (c64.median(), c512.median(), recovered.median());
    println!("\n  (c) ratios of medians");
    println!(
        "  {:<62} {:>11.2}x",
        "sends c64 / raw single commits",
        c64 / single
    );
    println!(
        "  {:<62} {:>11.2}x",
        "sends c64 x 3 writes / raw batched rows",
        c64 * 3.0 / batched
    );
    println!(
        "  {:<62} {:>11.2}x",
        "recovery / raw batched rows",
        recovered / batched
    );
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "\n  target: >= 20,000 sends/s at concurrency 64 (3 writes each): {}",
        verdict(c64 >= 20_000.0)
    );
    println!(
        "  target: recovery >= 20,000 intents/s: {}",
        verdict(recovered >= 20_000.0)
    );
    println!(
        "  target: recovery RSS growth < 100 MB: {}",
        verdict(growth_kib < 100 * 1024)
    );
    Ok((c64, c512))
}

/// Durable sends on PostgreSQL at concurrency 64 and 512, one and two gateways, beside pgbench's
/// simple insert rate on the same server (and SQLite's medians when measured in this run).
fn run_postgres(root: &Path, sqlite: Option<(f64, f64)>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Stopped when dropped, also when a phase fails.
    let server = postgres::Server::start()?;
    let result = runtime.block_on(async {
        let facts = postgres::Facts::read(server.url()).await?;
        println!("\nbench send on PostgreSQL: {}", server.describe());
        super::print_durability(&facts);
        let baseline = postgres::pgbench(server.url(), root).await?;
        let mut figures = [[0.0; 2]; 2];
        for (g, gateways) in [1, 2].into_iter().enumerate() {
            for (c, concurrency) in [64, 512].into_iter().enumerate() {
                figures[g][c] =
                    postgres::measure(&server, Work::Send, gateways, concurrency).await?;
            }
        }
        server.clean_up().await?;
        anyhow::Ok((facts, baseline, figures))
    });
    drop(server);
    let (facts, baseline, [one, two]) = result?;
    let cell = |value: f64| {
        format!(
            "{value:.0} ({} pgbench)",
            postgres::ratio(value, baseline.insert)
        )
    };
    println!(
        "\n  {:<44} {:>22} {:>22}",
        "durable sends/s (3 writes each)", "concurrency 64", "concurrency 512"
    );
    if let Some((c64, c512)) = sqlite {
        println!(
            "  {:<44} {:>22} {:>22}",
            "SQLite, one gateway (median of 3)",
            format!("{c64:.0}"),
            format!("{c512:.0}")
        );
    }
    for (label, [c64, c512]) in [
        ("PostgreSQL, one gateway", one),
        ("PostgreSQL, two gateways (two processes)", two),
    ] {
        println!("  {label:<44} {:>22} {:>22}", cell(c64), cell(c512));
    }
    for (notify, tps) in [(false, baseline.insert), (true, baseline.insert_notify)] {
        println!(
            "  {:<67} {:>22}",
            postgres::pgbench_label(notify),
            format!("{tps:.0}")
        );
    }
    let sqlite = sqlite.map_or_else(String::new, |(c64, c512)| {
        format!("SQLite {c64:.0} / {c512:.0}; ")
    });
    println!(
        "\nsummary: durable sends/s at c64 / c512: {sqlite}PostgreSQL {} one gateway {:.0} / {:.0} \
         ({} / {} of pgbench), two gateways {:.0} / {:.0} ({} / {}); pgbench {:.0} tps ({:.0} with a \
         pg_notify per transaction); fsync={}, synchronous_commit={}",
        facts.version,
        one[0],
        one[1],
        postgres::ratio(one[0], baseline.insert),
        postgres::ratio(one[1], baseline.insert),
        two[0],
        two[1],
        postgres::ratio(two[0], baseline.insert),
        postgres::ratio(two[1], baseline.insert),
        baseline.insert,
        baseline.insert_notify,
        facts.fsync,
        facts.synchronous_commit
    );
    Ok(())
}
