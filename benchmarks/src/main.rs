//! `clawgate-bench <suite>` (run as `cargo xtask bench <suite>`): throughput figures reported
//! beside a raw SQLite baseline measured in the same run on the same machine, so the numbers are
//! comparable as ratios. Benchmarks print; they never assert timings.
//!
//! The suites live in their own package so that xtask, which every `cargo xtask tidy` builds,
//! does not depend on what only they use.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clawgate_store::IntentStore;
use clawgate_store::testing::sample_intent;
use clawgate_store_sqlite::{SqliteOptions, SqliteStore, Synchronous};
use clawgate_types::{DurableSendIntent, IntentStatus, MessageReceipt, to_json};
use rusqlite::params;

use crate::postgres::Backend;
use crate::release::project_root;

mod acpx;
mod awareness;
mod gateway;
mod instant;
mod matrix;
mod postgres;
mod receive;
mod release;
mod scale;
mod send;
mod telegram;

/// The benches measure memory as a gateway would see it: with the allocator our binaries use.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suite {
    Store,
    Send,
    Receive,
    Awareness,
    Acpx,
    Gateway,
    Scale,
    Telegram,
    Matrix,
}

impl Suite {
    const ALL: [Suite; 9] = [
        Suite::Store,
        Suite::Send,
        Suite::Receive,
        Suite::Awareness,
        Suite::Acpx,
        Suite::Gateway,
        Suite::Scale,
        Suite::Telegram,
        Suite::Matrix,
    ];

    fn parse(name: &str) -> Option<Suite> {
        match name {
            "store" => Some(Suite::Store),
            "send" => Some(Suite::Send),
            "receive" => Some(Suite::Receive),
            "awareness" => Some(Suite::Awareness),
            "acpx" => Some(Suite::Acpx),
            "gateway" => Some(Suite::Gateway),
            "scale" => Some(Suite::Scale),
            "telegram" => Some(Suite::Telegram),
            "matrix" => Some(Suite::Matrix),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Suite::Store => "store",
            Suite::Send => "send",
            Suite::Receive => "receive",
            Suite::Awareness => "awareness",
            Suite::Acpx => "acpx",
            Suite::Gateway => "gateway",
            Suite::Scale => "scale",
            Suite::Telegram => "telegram",
            Suite::Matrix => "matrix",
        }
    }

    /// `store` and `send` also run on PostgreSQL (`--backend`).
    fn takes_backend(self) -> bool {
        matches!(self, Suite::Store | Suite::Send)
    }

    fn summary(self) -> &'static str {
        match self {
            Suite::Store => {
                "store throughput beside a raw SQLite baseline from the same run                  [--backend sqlite|postgres|both]"
            }
            Suite::Send => {
                "durable sends/s and recovery of 100,000 intents beside raw SQLite; on PostgreSQL                  at concurrency 64 and 512, one and two gateways, beside pgbench                  [--backend sqlite|postgres|both]"
            }
            Suite::Receive => "inbound events/s (normalize, dedupe, record, ack) beside raw SQLite",
            Suite::Awareness => {
                "signal log, changesSince, notice fan-out, pruning beside raw SQLite"
            }
            Suite::Acpx => {
                "lease verifications/s on live processes, time to reap 100 orphan trees \
                 (CLAWGATE_BENCH_ORPHANS=N reaps N)"
            }
            Suite::Gateway => {
                "the clawgate binary: idle RSS, inbound → committed final p50/p99 vs the agent alone"
            }
            Suite::Scale => {
                "10,000 conversations × 3 messages at max_live = 64 beside 100: messages/s, \
                 p50/p99, peak RSS of gateway and agents, RSS per idle conversation \
                 (CLAWGATE_BENCH_CONVERSATIONS=N sizes the big run)"
            }
            Suite::Matrix => {
                "a Matrix account on a real Synapse: inbound → final p50/p99, messages/s over 10 \
                 rooms"
            }
            Suite::Telegram => {
                "a Telegram bot on the Bot API simulator: inbound → final p50/p99, messages/s over \
                 100 chats"
            }
        }
    }
}

fn usage() -> String {
    let mut text = String::from(
        "usage: cargo xtask bench <suite>\n   or: cargo run --release -p clawgate-benchmarks -- <suite>\n\nsuites:\n",
    );
    for suite in Suite::ALL {
        text.push_str(&format!("  {:<10} {}\n", suite.name(), suite.summary()));
    }
    text.push_str(&format!(
        "\n`--backend` defaults to `both` when {} names a PostgreSQL server (a superuser URL); \
         `cargo xtask bench` sets it to a throwaway cluster it starts and stops (fsync on) \
         unless `--backend sqlite` is given or the variable is already set.\n",
        postgres::URL_VAR
    ));
    text.push_str("\n`<suite> --help` or `help` prints this text.\n");
    text
}

/// What the command line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Invocation {
    /// A suite, and the backend asked for (`None`: decided by what this machine has).
    Run(Suite, Option<Backend>),
    Help,
}

/// A command line naming no suite we know, or passing options a suite does not take.
#[derive(Debug, Clone, PartialEq, Eq)]
enum UsageError {
    MissingSuite,
    UnknownSuite(String),
    UnexpectedArgument { suite: Suite, argument: String },
    UnknownBackend(String),
    MissingBackend,
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UsageError::MissingSuite => write!(f, "no benchmark suite given"),
            UsageError::UnknownSuite(name) => write!(f, "unknown benchmark suite `{name}`"),
            UsageError::UnexpectedArgument { suite, argument } => write!(
                f,
                "`{}` does not take the argument `{argument}`",
                suite.name()
            ),
            UsageError::UnknownBackend(name) => write!(
                f,
                "unknown backend `{name}`: `--backend` takes sqlite, postgres or both"
            ),
            UsageError::MissingBackend => {
                write!(f, "`--backend` needs a value: sqlite, postgres or both")
            }
        }
    }
}

impl std::error::Error for UsageError {}

fn parse(args: &[String]) -> Result<Invocation, UsageError> {
    let is_help = |arg: &str| matches!(arg, "help" | "--help" | "-h");
    let (first, rest) = args.split_first().ok_or(UsageError::MissingSuite)?;
    if is_help(first) {
        return Ok(Invocation::Help);
    }
    let suite = Suite::parse(first).ok_or_else(|| UsageError::UnknownSuite(first.clone()))?;
    let backend = |value: &str| {
        Backend::parse(value).ok_or_else(|| UsageError::UnknownBackend(value.to_owned()))
    };
    match rest {
        [] => Ok(Invocation::Run(suite, None)),
        [flag] if flag != "help" && is_help(flag) => Ok(Invocation::Help),
        [flag, value] if suite.takes_backend() && flag == "--backend" => {
            Ok(Invocation::Run(suite, Some(backend(value)?)))
        }
        [flag] if suite.takes_backend() && flag == "--backend" => Err(UsageError::MissingBackend),
        [flag] if suite.takes_backend() && flag.starts_with("--backend=") => Ok(Invocation::Run(
            suite,
            Some(backend(&flag["--backend=".len()..])?),
        )),
        [argument, ..] => Err(UsageError::UnexpectedArgument {
            suite,
            argument: argument.clone(),
        }),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(postgres::WORKER_ARG) {
        return match postgres::worker(&args[1..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error (second gateway): {error:#}");
                ExitCode::FAILURE
            }
        };
    }
    let (suite, backend) = match parse(&args) {
        Ok(Invocation::Run(suite, backend)) => (suite, backend),
        Ok(Invocation::Help) => {
            print!("{}", usage());
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("error: {error}\n\n{}", usage());
            return ExitCode::from(2);
        }
    };
    match run(suite, backend) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(suite: Suite, backend: Option<Backend>) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        anyhow::bail!(
            "clawgate-bench was built without optimizations and its figures would mean nothing: \
             run `cargo xtask bench {0}` (or `cargo run --release -p clawgate-benchmarks -- {0}`)",
            suite.name()
        );
    }
    // On the project's disk (not a tmpfs): fsync costs are the point.
    let base = project_root().join("target").join("bench");
    std::fs::create_dir_all(&base).with_context(|| format!("create {}", base.display()))?;
    let scratch = tempfile::tempdir_in(&base)?;
    let backend = match backend {
        Some(backend) => backend,
        None if suite.takes_backend() => Backend::default_for_machine(),
        None => Backend::Sqlite,
    };
    match suite {
        Suite::Store => store(scratch.path(), backend),
        Suite::Send => send::run(scratch.path(), backend),
        Suite::Receive => receive::run(scratch.path()),
        Suite::Awareness => awareness::run(scratch.path()),
        Suite::Acpx => acpx::run(scratch.path()),
        Suite::Gateway => gateway::run(scratch.path()),
        Suite::Scale => scale::run(scratch.path()),
        Suite::Telegram => telegram::run(scratch.path()),
        Suite::Matrix => matrix::run(scratch.path()),
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
    let conn = rusqlite::Connection::open(dir.join(clawgate_store_sqlite::STATE_DB_FILE))?;
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
async fn lifecycle(store: &dyn IntentStore, n: u64) -> anyhow::Result<()> {
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
    Ok(())
}

/// [`lifecycle`] at a concurrency, per second.
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
                    lifecycle(&*store, (i * concurrency + task) as u64).await?;
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

fn store(root: &Path, backend: Backend) -> anyhow::Result<()> {
    backend.run(|| store_sqlite(root), |sqlite| store_postgres(root, sqlite))
}

/// The SQLite figures of `bench store`; returns (append c64, send bookkeeping c64) for the
/// side-by-side table.
fn store_sqlite(root: &Path) -> anyhow::Result<(f64, f64)> {
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
    Ok((c64, life64))
}

/// The PostgreSQL figures of `bench store`: appends and send bookkeeping through
/// `PostgresStore` at concurrency 64 and 512, one and two gateways, beside pgbench.
fn store_postgres(root: &Path, sqlite: Option<(f64, f64)>) -> anyhow::Result<()> {
    use postgres::Work;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let server = postgres::Server::start()?;
    let result = runtime.block_on(async {
        let facts = postgres::Facts::read(server.url()).await?;
        println!("\nbench store on PostgreSQL: {}", server.describe());
        print_durability(&facts);
        let baseline = postgres::pgbench(server.url(), root).await?;
        let mut rows = Vec::new();
        for (work, label, sqlite_c64) in [
            (Work::Append, "intent append", sqlite.map(|s| s.0)),
            (
                Work::Lifecycle,
                "send bookkeeping (3 writes)",
                sqlite.map(|s| s.1),
            ),
        ] {
            let mut figures = Vec::new();
            for gateways in [1, 2] {
                for concurrency in [64, 512] {
                    figures.push(postgres::measure(&server, work, gateways, concurrency).await?);
                }
            }
            rows.push((label, sqlite_c64, figures));
        }
        server.clean_up().await?;
        anyhow::Ok((baseline, rows))
    });
    drop(server);
    let (baseline, rows) = result?;
    println!();
    for (notify, tps) in [(false, baseline.insert), (true, baseline.insert_notify)] {
        println!(
            "  {:<75} {:>12}",
            postgres::pgbench_label(notify),
            format!("{tps:.0}")
        );
    }
    println!(
        "\n  {:<34} {:>10} {:>16} {:>16} {:>16} {:>16}",
        "per second (ratio to pgbench)",
        "SQLite c64",
        "PG 1gw c64",
        "PG 1gw c512",
        "PG 2gw c64",
        "PG 2gw c512"
    );
    let cell = |value: f64| format!("{value:.0} ({})", postgres::ratio(value, baseline.insert));
    for (label, sqlite_c64, figures) in &rows {
        let sqlite_c64 = sqlite_c64.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
        print!("  {label:<34} {sqlite_c64:>10}");
        for figure in figures {
            print!(" {:>16}", cell(*figure));
        }
        println!();
    }
    Ok(())
}

/// The server's version and durability settings, and a warning when commits are not durable.
fn print_durability(facts: &postgres::Facts) {
    println!("  {}", facts.line());
    if facts.durable() {
        println!("  durable: every commit waits for fsync of the WAL (fsync on, not fsync=off)");
    } else {
        println!(
            "  WARNING: this server does not fsync every commit (fsync or synchronous_commit \
             off): the PostgreSQL figures below are NOT durable sends"
        );
    }
    println!(
        "  each PostgreSQL figure: one {} s phase on a fresh schema, pool of {} per gateway; \
         two gateways = this process and a second one, half the tasks each",
        postgres::PHASE.as_secs(),
        postgres::POOL_SIZE
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Invocation, UsageError> {
        let args: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        parse(&args)
    }

    #[test]
    fn command_lines() {
        let cases: &[(&str, Result<Invocation, UsageError>)] = &[
            ("store", Ok(Invocation::Run(Suite::Store, None))),
            ("send", Ok(Invocation::Run(Suite::Send, None))),
            ("gateway", Ok(Invocation::Run(Suite::Gateway, None))),
            (
                "send --backend both",
                Ok(Invocation::Run(Suite::Send, Some(Backend::Both))),
            ),
            (
                "store --backend=postgres",
                Ok(Invocation::Run(Suite::Store, Some(Backend::Postgres))),
            ),
            (
                "send --backend sqlite",
                Ok(Invocation::Run(Suite::Send, Some(Backend::Sqlite))),
            ),
            (
                "send --backend oracle",
                Err(UsageError::UnknownBackend("oracle".into())),
            ),
            ("store --backend", Err(UsageError::MissingBackend)),
            (
                "receive --backend both",
                Err(UsageError::UnexpectedArgument {
                    suite: Suite::Receive,
                    argument: "--backend".into(),
                }),
            ),
            ("send --help", Ok(Invocation::Help)),
            ("acpx -h", Ok(Invocation::Help)),
            ("help", Ok(Invocation::Help)),
            ("--help", Ok(Invocation::Help)),
            ("", Err(UsageError::MissingSuite)),
            ("warp", Err(UsageError::UnknownSuite("warp".into()))),
            (
                "send help",
                Err(UsageError::UnexpectedArgument {
                    suite: Suite::Send,
                    argument: "help".into(),
                }),
            ),
            (
                "send --fast",
                Err(UsageError::UnexpectedArgument {
                    suite: Suite::Send,
                    argument: "--fast".into(),
                }),
            ),
            (
                "send --help --fast",
                Err(UsageError::UnexpectedArgument {
                    suite: Suite::Send,
                    argument: "--help".into(),
                }),
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(&parse_str(line), expected, "command line {line:?}");
        }
    }

    #[test]
    fn every_suite_parses_back_from_its_name_and_is_in_the_usage() {
        let text = usage();
        for suite in Suite::ALL {
            assert_eq!(Suite::parse(suite.name()), Some(suite));
            assert!(
                text.contains(&format!("\n  {:<10} ", suite.name())),
                "usage lists {}",
                suite.name()
            );
        }
    }
}
