//! `cargo xtask bench <suite>`: throughput figures reported beside a raw SQLite baseline measured
//! in the same run on the same machine, so the numbers are comparable as ratios. Benchmarks
//! print; they never assert timings.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clawgate_store::testing::sample_intent;
use clawgate_store::{IntentStore, SqliteOptions, SqliteStore, Synchronous};
use clawgate_types::{DurableSendIntent, IntentStatus, MessageReceipt, to_json};
use rusqlite::params;

use crate::cmd::project_root;

mod acpx;
mod awareness;
mod gateway;
mod receive;
mod send;

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Suite {
    Store,
    Send,
    Receive,
    Awareness,
    Acpx,
    Gateway,
}

impl Suite {
    pub(crate) fn parse(name: &str) -> Option<Suite> {
        match name {
            "store" => Some(Suite::Store),
            "send" => Some(Suite::Send),
            "receive" => Some(Suite::Receive),
            "awareness" => Some(Suite::Awareness),
            "acpx" => Some(Suite::Acpx),
            "gateway" => Some(Suite::Gateway),
            _ => None,
        }
    }
}

impl Suite {
    fn name(self) -> &'static str {
        match self {
            Suite::Store => "store",
            Suite::Send => "send",
            Suite::Receive => "receive",
            Suite::Awareness => "awareness",
            Suite::Acpx => "acpx",
            Suite::Gateway => "gateway",
        }
    }
}

pub(crate) fn run(suite: Suite) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        // Figures from unoptimized code mean nothing: rerun this command from a release build.
        return crate::cmd::run(&mut crate::cmd::cargo([
            "run",
            "--release",
            "--quiet",
            "--package",
            "xtask",
            "--",
            "bench",
            suite.name(),
        ]));
    }
    // On the project's disk (not a tmpfs): fsync costs are the point.
    let base = project_root().join("target").join("bench");
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let scratch = tempfile::tempdir_in(&base)?;
    match suite {
        Suite::Store => store(scratch.path()),
        Suite::Send => send::run(scratch.path()),
        Suite::Receive => receive::run(scratch.path()),
        Suite::Awareness => awareness::run(scratch.path()),
        Suite::Acpx => acpx::run(scratch.path()),
        Suite::Gateway => gateway::run(scratch.path()),
    }
}

/// A `kB` field of `/proc/<pid>/status` (`pid` may be `self`), e.g. `VmRSS:`.
fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
}

fn rate(count: usize, started: Instant) -> f64 {
    count as f64 / started.elapsed().as_secs_f64()
}

fn fresh_db(root: &Path, name: &str, sync: Synchronous) -> anyhow::Result<PathBuf> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    // Same schema and indexes as the store writes to.
    drop(SqliteStore::open_state_dir(&dir, options(sync))?);
    Ok(dir)
}

fn options(sync: Synchronous) -> SqliteOptions {
    SqliteOptions {
        synchronous: sync,
        ..SqliteOptions::default()
    }
}

fn raw_connection(dir: &Path, sync: Synchronous) -> anyhow::Result<rusqlite::Connection> {
    let conn = rusqlite::Connection::open(dir.join(clawgate_store::sqlite::STATE_DB_FILE))?;
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
    let sync = match sync {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    Ok(conn)
}

/// Raw inserts of the same rows the store writes (payload pre-encoded: the baseline pays no
/// serialization), `per_commit` rows per transaction.
fn raw_inserts(
    root: &Path,
    name: &str,
    sync: Synchronous,
    rows: usize,
    per_commit: usize,
) -> anyhow::Result<f64> {
    raw_inserts_with(root, name, sync, rows, per_commit, false)
}

fn raw_inserts_with(
    root: &Path,
    name: &str,
    sync: Synchronous,
    rows: usize,
    per_commit: usize,
    savepoints: bool,
) -> anyhow::Result<f64> {
    let dir = fresh_db(root, name, sync)?;
    let conn = raw_connection(&dir, sync)?;
    let payloads: Vec<(String, String)> = (0..rows)
        .map(|n| {
            let intent = sample_intent(n as u64, n as i64);
            Ok((intent.id.to_string(), to_json(&intent)?))
        })
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    for chunk in payloads.chunks(per_commit) {
        let tx = conn.unchecked_transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO send_intents (id, idempotency_key, channel, account_id, status, attempt,
                     created_at, updated_at, format_version, payload)
                 VALUES (?1, ?1, 'qa', 'bot', 'pending', 0, 1, 1, 1, ?2)",
            )?;
            for (id, payload) in chunk {
                // What the store's per-write isolation costs, measured without the store.
                if savepoints {
                    tx.prepare_cached("SAVEPOINT w")?.execute([])?;
                }
                stmt.execute(params![id, payload])?;
                if savepoints {
                    tx.prepare_cached("RELEASE w")?.execute([])?;
                }
            }
        }
        tx.commit()?;
    }
    Ok(rate(rows, started))
}

/// Concurrent `insert_intent` calls through the store's writer.
async fn store_appends(
    store: Arc<SqliteStore>,
    concurrency: usize,
    total: usize,
) -> anyhow::Result<f64> {
    let per_task = total / concurrency;
    // Built before the clock starts, as the baseline's rows are. Ids are dealt round-robin:
    // tasks progressing together insert neighbouring ids, as time-ordered (UUID v7) ids made at
    // send time are, and as the baseline inserts them.
    let work: Vec<Vec<DurableSendIntent>> = (0..concurrency)
        .map(|task| {
            (0..per_task)
                .map(|i| {
                    let n = (i * concurrency + task) as u64;
                    sample_intent(n, n as i64)
                })
                .collect()
        })
        .collect();
    let started = Instant::now();
    let tasks: Vec<_> = work
        .into_iter()
        .map(|intents| {
            let store = store.clone();
            tokio::spawn(async move {
                for intent in &intents {
                    store.insert_intent(intent, None).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(rate(per_task * concurrency, started))
}

/// The whole durable send bookkeeping of one message: insert, sending, receipt committed.
async fn store_lifecycles(
    store: Arc<SqliteStore>,
    concurrency: usize,
    total: usize,
) -> anyhow::Result<f64> {
    let per_task = total / concurrency;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let n = (i * concurrency + task) as u64;
                    let mut intent = sample_intent(n, n as i64);
                    store.insert_intent(&intent, None).await?;
                    intent.status = IntentStatus::Sending;
                    store
                        .save_intent(&intent, IntentStatus::Pending, None)
                        .await?;
                    // The receipt recorded and committed in one write, as the engine does.
                    intent.status = IntentStatus::Sent;
                    intent.receipt = Some(MessageReceipt::from_parts(vec![], n as i64));
                    store
                        .save_intent(&intent, IntentStatus::Sending, None)
                        .await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(rate(per_task * concurrency, started))
}

fn open(root: &Path, name: &str, sync: Synchronous) -> anyhow::Result<Arc<SqliteStore>> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    Ok(Arc::new(SqliteStore::open_state_dir(&dir, options(sync))?))
}

fn store(root: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "bench store: {} (WAL; synchronous=FULL unless noted)",
        root.display()
    );
    let single = raw_inserts(root, "raw-single", Synchronous::Full, 1_000, 1)?;
    let batched = raw_inserts(root, "raw-batched", Synchronous::Full, 20_000, 100)?;
    let single_normal = raw_inserts(root, "raw-single-normal", Synchronous::Normal, 5_000, 1)?;
    let b64 = raw_inserts_with(root, "raw-64", Synchronous::Full, 40_000, 64, false)?;
    let b64sp = raw_inserts_with(root, "raw-64sp", Synchronous::Full, 40_000, 64, true)?;
    let (c1, c64, c64_normal, life64) = runtime.block_on(async {
        let c1 = store_appends(open(root, "store-c1", Synchronous::Full)?, 1, 1_000).await?;
        let c64 = store_appends(open(root, "store-c64", Synchronous::Full)?, 64, 40_000).await?;
        let c64_normal = store_appends(
            open(root, "store-c64-normal", Synchronous::Normal)?,
            64,
            40_000,
        )
        .await?;
        let life64 =
            store_lifecycles(open(root, "store-life64", Synchronous::Full)?, 64, 10_000).await?;
        anyhow::Ok((c1, c64, c64_normal, life64))
    })?;
    let figures: [(&str, f64); 9] = [
        ("(a) raw SQLite, one row per commit", single),
        ("(a) raw SQLite, 100 rows per commit", batched),
        ("(a) raw SQLite, 64 rows per commit", b64),
        (
            "(a) raw SQLite, 64 rows per commit, savepoint per row",
            b64sp,
        ),
        ("(a) raw SQLite, one row per commit, NORMAL", single_normal),
        ("(b) store intent append, concurrency 1", c1),
        ("(b) store intent append, concurrency 64", c64),
        (
            "(b) store intent append, concurrency 64, NORMAL",
            c64_normal,
        ),
        (
            "(b) store send bookkeeping (3 writes), concurrency 64",
            life64,
        ),
    ];
    println!("\n  {:<58} {:>12}", "figure", "per second");
    for (label, per_second) in figures {
        println!("  {label:<58} {per_second:>12.0}");
    }
    let ratios: [(&str, f64); 5] = [
        ("append c1 / raw single", c1 / single),
        ("append c64 / raw single", c64 / single),
        ("append c64 / raw batched (100 per commit)", c64 / batched),
        (
            "append c64 / raw 64 per commit with savepoints",
            c64 / b64sp,
        ),
        (
            "append c64 NORMAL / raw single NORMAL",
            c64_normal / single_normal,
        ),
    ];
    println!("\n  (c) ratios");
    for (label, ratio) in ratios {
        println!("  {label:<58} {ratio:>11.2}x");
    }
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "\n  target: append c64 >= 0.5x raw batched: {}",
        verdict(c64 >= 0.5 * batched)
    );
    println!(
        "  target: append c64 >= 10x raw single commits: {}",
        verdict(c64 >= 10.0 * single)
    );
    Ok(())
}
