//! PostgreSQL beside SQLite for `bench store` and `bench send`: the server
//! (`CLAWGATE_BENCH_PG_URL`; `cargo xtask bench` starts a throwaway cluster with fsync on and
//! sets it, with the same cluster start-up the tests use), the settings
//! that decide durability, `pgbench`'s simple insert rate on the same server as the baseline, and
//! a second gateway run as a second process of this binary.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clawgate_store::IntentStore;
use clawgate_store_postgres::{PostgresOptions, PostgresStore};
use clawgate_types::GatewayInstanceId;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A superuser URL of the server to measure.
pub(crate) const URL_VAR: &str = "CLAWGATE_BENCH_PG_URL";
/// How the second gateway process gets the URL: the environment, never its command line.
const WORKER_URL_VAR: &str = "CLAWGATE_BENCH_WORKER_PG_URL";
/// The hidden first argument that makes this binary a second gateway (not a suite).
pub(crate) const WORKER_ARG: &str = "__pg-gateway";

/// Connections per gateway: the gateway's own default (`state.postgres_pool_size`).
pub(crate) const POOL_SIZE: usize = 16;
/// How long each PostgreSQL figure is measured; the machine is small and shared.
pub(crate) const PHASE: Duration = Duration::from_secs(6);
/// pgbench's clients and duration for the baseline.
pub(crate) const PGBENCH_CLIENTS: usize = 64;
const PGBENCH_SECONDS: u64 = 6;
/// The scratch database pgbench initialises (dropped again at the end).
const PGBENCH_DB: &str = "clawgate_bench_pgbench";

/// Debian keeps each major version's server binaries (pgbench among them) here.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";

/// Which stores a run measures (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
    Both,
}

impl Backend {
    pub(crate) fn parse(name: &str) -> Option<Backend> {
        match name {
            "sqlite" => Some(Backend::Sqlite),
            "postgres" | "postgresql" => Some(Backend::Postgres),
            "both" => Some(Backend::Both),
            _ => None,
        }
    }

    pub(crate) fn sqlite(self) -> bool {
        matches!(self, Backend::Sqlite | Backend::Both)
    }

    pub(crate) fn postgres(self) -> bool {
        matches!(self, Backend::Postgres | Backend::Both)
    }

    /// Runs a suite's SQLite part when asked, then its PostgreSQL part with the SQLite figures
    /// (for the side-by-side table) when asked.
    pub(crate) fn run<T>(
        self,
        sqlite: impl FnOnce() -> anyhow::Result<T>,
        postgres: impl FnOnce(Option<T>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let figures = if self.sqlite() { Some(sqlite()?) } else { None };
        if self.postgres() {
            postgres(figures)?;
        }
        Ok(())
    }

    /// Without `--backend`: both when a server is given, else SQLite alone, saying why.
    pub(crate) fn default_for_machine() -> Backend {
        if std::env::var_os(URL_VAR).is_some() {
            Backend::Both
        } else {
            println!(
                "note: PostgreSQL left out: {URL_VAR} is unset (`cargo xtask bench` sets it to a \
                 throwaway cluster when Debian's postgresql is installed)"
            );
            Backend::Sqlite
        }
    }
}

/// What went wrong reaching or measuring PostgreSQL, and what to do about it.
#[derive(Debug)]
pub(crate) enum PgBenchError {
    /// No URL of a server to measure.
    ServerUnavailable,
    /// pgbench is not installed.
    PgbenchNotInstalled,
    /// pgbench ran but printed no `tps = …` line.
    UnreadableReport(String),
}

impl std::fmt::Display for PgBenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PgBenchError::ServerUnavailable => write!(
                f,
                "no PostgreSQL server to measure: set {URL_VAR} to a superuser URL, or run the \
                 suite through `cargo xtask bench`, which starts a throwaway cluster (or pass \
                 `--backend sqlite`)"
            ),
            PgBenchError::PgbenchNotInstalled => write!(
                f,
                "pgbench is missing from {DEBIAN_ROOT}/<version>/bin: install postgresql-contrib \
                 (Debian's postgresql package ships it) for the baseline"
            ),
            PgBenchError::UnreadableReport(output) => {
                write!(f, "pgbench printed no `tps = …` line:\n{output}")
            }
        }
    }
}

impl std::error::Error for PgBenchError {}

/// The newest installed server's `bin` directory holding `program`.
fn find_bin(program: &str) -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_ROOT)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join(program).exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Runs a command, its output shown only when it fails.
fn quiet(command: &mut Command) -> anyhow::Result<std::process::Output> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start {:?}", command.get_program()))?;
    if !output.status.success() {
        bail!(
            "{:?} failed ({}):\n{}{}",
            command.get_program(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

/// The URL with its password hidden: what the output may show.
pub(crate) fn redacted(url: &str) -> String {
    let instance = GatewayInstanceId::parse("bench").unwrap_or_else(|_| unreachable!());
    PostgresOptions::new(url, instance).redacted_url()
}

/// The server a run measures.
pub(crate) struct Server {
    url: String,
    /// Schemas and databases made by this run, dropped at the end.
    schemas: std::sync::Mutex<Vec<String>>,
}

impl Server {
    /// The server `CLAWGATE_BENCH_PG_URL` names.
    pub(crate) fn start() -> anyhow::Result<Server> {
        match std::env::var(URL_VAR) {
            Ok(url) if !url.trim().is_empty() => Ok(Server {
                url,
                schemas: std::sync::Mutex::default(),
            }),
            _ => Err(PgBenchError::ServerUnavailable.into()),
        }
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Where the figures come from, without the password.
    pub(crate) fn describe(&self) -> String {
        format!("{URL_VAR} ({})", redacted(&self.url))
    }

    /// A schema name no earlier run used; dropped at the end.
    pub(crate) fn fresh_schema(&self, label: &str) -> String {
        let mut schemas = self
            .schemas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() % 1_000_000_000);
        let name = format!("bench_{label}_{}_{nanos}", std::process::id());
        schemas.push(name.clone());
        name
    }

    /// Drops what this run made (the server may be one that outlives it).
    pub(crate) async fn clean_up(&self) -> anyhow::Result<()> {
        let client = connect(&self.url).await?;
        let schemas = std::mem::take(
            &mut *self
                .schemas
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for schema in schemas {
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await?;
        }
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {PGBENCH_DB}"))
            .await?;
        Ok(())
    }
}

async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redacted(url)))?;
    tokio::spawn(connection);
    Ok(client)
}

async fn show(client: &tokio_postgres::Client, setting: &str) -> anyhow::Result<String> {
    let row = client.query_one(&format!("SHOW {setting}"), &[]).await?;
    Ok(row.try_get(0)?)
}

/// The server version and the settings that decide what a commit costs.
pub(crate) struct Facts {
    pub(crate) version: String,
    pub(crate) fsync: String,
    pub(crate) synchronous_commit: String,
    pub(crate) full_page_writes: String,
    pub(crate) wal_sync_method: String,
}

impl Facts {
    pub(crate) async fn read(url: &str) -> anyhow::Result<Facts> {
        let client = connect(url).await?;
        Ok(Facts {
            version: show(&client, "server_version").await?,
            fsync: show(&client, "fsync").await?,
            synchronous_commit: show(&client, "synchronous_commit").await?,
            full_page_writes: show(&client, "full_page_writes").await?,
            wal_sync_method: show(&client, "wal_sync_method").await?,
        })
    }

    pub(crate) fn durable(&self) -> bool {
        self.fsync == "on" && self.synchronous_commit != "off"
    }

    pub(crate) fn line(&self) -> String {
        format!(
            "PostgreSQL {}: fsync={}, synchronous_commit={}, full_page_writes={}, \
             wal_sync_method={}",
            self.version,
            self.fsync,
            self.synchronous_commit,
            self.full_page_writes,
            self.wal_sync_method
        )
    }
}

/// `value` as a multiple of `baseline` (`0.42x`), `n/a` when there is no baseline to divide by.
pub(crate) fn ratio(value: f64, baseline: f64) -> String {
    if baseline.is_finite() && baseline > 0.0 && value.is_finite() {
        format!("{:.2}x", value / baseline)
    } else {
        "n/a".to_owned()
    }
}

/// The `tps = …` figure of pgbench's report.
pub(crate) fn parse_tps(output: &str) -> Option<f64> {
    output.lines().find_map(|line| {
        line.trim()
            .strip_prefix("tps = ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// pgbench's libpq environment for a database of the server: the password goes through the
/// environment, not the command line.
fn pgbench_command(bin: &Path, url: &str, dbname: &str) -> anyhow::Result<Command> {
    let config: tokio_postgres::Config = url.parse().with_context(|| {
        format!(
            "the PostgreSQL URL {} is not a connection string",
            redacted(url)
        )
    })?;
    let mut command = Command::new(bin.join("pgbench"));
    if let Some(tokio_postgres::config::Host::Tcp(host)) = config.get_hosts().first() {
        command.env("PGHOST", host);
    }
    if let Some(port) = config.get_ports().first() {
        command.env("PGPORT", port.to_string());
    }
    if let Some(user) = config.get_user() {
        command.env("PGUSER", user);
    }
    if let Some(password) = config.get_password() {
        command.env("PGPASSWORD", String::from_utf8_lossy(password).as_ref());
    }
    command.env("PGDATABASE", dbname);
    Ok(command)
}

/// pgbench's figures on the same server, transactions per second.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Baseline {
    /// One simple `INSERT` per transaction: the baseline every ratio is against.
    pub(crate) insert: f64,
    /// The same `INSERT` plus one `pg_notify` per transaction, as the store's change-feed
    /// triggers do: NOTIFY takes a database-wide lock at commit, so it shows what serialized
    /// commits cost on this server.
    pub(crate) insert_notify: f64,
}

const INSERT_SQL: &str = "\\set aid random(1, 100000)\n\
    INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) \
    VALUES (1, 1, :aid, 0, CURRENT_TIMESTAMP);\n";

const INSERT_NOTIFY_SQL: &str = "\\set aid random(1, 100000)\nBEGIN;\n\
    INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) \
    VALUES (1, 1, :aid, 0, CURRENT_TIMESTAMP);\n\
    SELECT pg_notify('clawgate_bench', 'pgbench');\nCOMMIT;\n";

/// pgbench on the same server: `-i -s 1` on a scratch database, then each script from
/// [`PGBENCH_CLIENTS`] clients for [`PGBENCH_SECONDS`].
pub(crate) async fn pgbench(url: &str, scratch: &Path) -> anyhow::Result<Baseline> {
    let bin = find_bin("pgbench").ok_or(PgBenchError::PgbenchNotInstalled)?;
    let client = connect(url).await?;
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {PGBENCH_DB}"))
        .await?;
    client
        .batch_execute(&format!("CREATE DATABASE {PGBENCH_DB}"))
        .await?;
    let mut init = pgbench_command(&bin, url, PGBENCH_DB)?;
    init.args(["-i", "-s", "1", "-q"]);
    quiet(&mut init).context("pgbench -i -s 1")?;
    let mut tps = Vec::new();
    for (name, text) in [
        ("insert.sql", INSERT_SQL),
        ("insert-notify.sql", INSERT_NOTIFY_SQL),
    ] {
        let script = scratch.join(name);
        std::fs::write(&script, text)
            .with_context(|| format!("cannot write {}", script.display()))?;
        let mut run = pgbench_command(&bin, url, PGBENCH_DB)?;
        run.arg("-n")
            .arg("-f")
            .arg(&script)
            .args(["-c", &PGBENCH_CLIENTS.to_string(), "-j", "2", "-T"])
            .arg(PGBENCH_SECONDS.to_string());
        let output = tokio::task::spawn_blocking(move || quiet(&mut run)).await??;
        let report = String::from_utf8_lossy(&output.stdout);
        tps.push(
            parse_tps(&report)
                .ok_or_else(|| PgBenchError::UnreadableReport(report.into_owned()))?,
        );
    }
    Ok(Baseline {
        insert: tps[0],
        insert_notify: tps[1],
    })
}

pub(crate) fn pgbench_label(notify: bool) -> String {
    let what = if notify {
        "INSERT + pg_notify"
    } else {
        "one INSERT"
    };
    format!("pgbench, {what} per transaction, {PGBENCH_CLIENTS} clients, {PGBENCH_SECONDS} s (tps)")
}

/// Opens one gateway's store on `schema` (created and migrated by the first open).
pub(crate) async fn open_store(
    url: &str,
    schema: &str,
    instance: &str,
) -> anyhow::Result<Arc<PostgresStore>> {
    let instance = GatewayInstanceId::parse(instance)?;
    let mut options = PostgresOptions::new(url, instance);
    options.pool_size = POOL_SIZE;
    options.schema = Some(schema.to_owned());
    let store = PostgresStore::open(options)
        .await
        .with_context(|| format!("open the PostgreSQL store on schema {schema}"))?;
    Ok(Arc::new(store))
}

/// What a gateway does in a measured phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Work {
    /// Durable sends through the engine (`bench send`).
    Send,
    /// `insert_intent` calls (`bench store`).
    Append,
    /// The bookkeeping of one send through the store: insert, sending, receipt (`bench store`).
    Lifecycle,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::Send => "send",
            Work::Append => "append",
            Work::Lifecycle => "lifecycle",
        }
    }

    fn parse(name: &str) -> Option<Work> {
        [Work::Send, Work::Append, Work::Lifecycle]
            .into_iter()
            .find(|work| work.name() == name)
    }
}

/// `concurrency` tasks each repeating one unit of `work` until `duration` is up; units done.
/// `gateway` keeps the two processes' intent ids apart.
pub(crate) async fn drive(
    store: Arc<PostgresStore>,
    work: Work,
    gateway: u64,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<u64> {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let messenger = crate::instant::bench_messenger(store.clone());
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let (store, messenger, done) = (store.clone(), messenger.clone(), done.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let n = (gateway << 40) | ((task as u64) << 24) | i;
                    match work {
                        Work::Send => crate::instant::one_send(&messenger, n).await?,
                        Work::Append => {
                            let intent = clawgate_store::testing::sample_intent(n, 0);
                            store.insert_intent(&intent, None).await?;
                        }
                        Work::Lifecycle => crate::lifecycle(&*store, n).await?,
                    }
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed))
}

/// One measured phase on a fresh schema: `gateways` (1 or 2) gateways, `concurrency` tasks in
/// all; units per second over the wall time of the whole phase. The second gateway is a second
/// process of this binary, with its own pool, competing for the same tables.
pub(crate) async fn measure(
    server: &Server,
    work: Work,
    gateways: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let schema = server.fresh_schema(&format!("{}_c{concurrency}_g{gateways}", work.name()));
    let store = open_store(server.url(), &schema, "bench-a").await?;
    if gateways == 1 {
        let started = Instant::now();
        let done = drive(store, work, 0, concurrency, PHASE).await?;
        return Ok(done as f64 / started.elapsed().as_secs_f64());
    }
    let half = concurrency / 2;
    let exe = std::env::current_exe().context("cannot find this bench's own binary")?;
    let mut child = tokio::process::Command::new(exe)
        .args([WORKER_ARG, work.name(), &schema, &half.to_string()])
        .arg(PHASE.as_millis().to_string())
        .env(WORKER_URL_VAR, server.url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the second gateway process")?;
    let mut stdin = child.stdin.take().context("second gateway's stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("second gateway's stdout")?).lines();
    match lines.next_line().await? {
        Some(line) if line == "ready" => {}
        other => bail!("the second gateway did not start (it said {other:?}; see its stderr)"),
    }
    stdin.write_all(b"go\n").await?;
    stdin.flush().await?;
    let started = Instant::now();
    let (mine, theirs) = tokio::join!(
        drive(store, work, 0, concurrency - half, PHASE),
        lines.next_line()
    );
    let elapsed = started.elapsed();
    let theirs: u64 = match theirs? {
        Some(line) => line
            .strip_prefix("done ")
            .and_then(|count| count.parse().ok())
            .with_context(|| format!("the second gateway answered {line:?}"))?,
        None => bail!("the second gateway ended without a count (see its stderr)"),
    };
    let status = child.wait().await?;
    anyhow::ensure!(status.success(), "the second gateway exited with {status}");
    Ok((mine? + theirs) as f64 / elapsed.as_secs_f64())
}

/// The second gateway process: `__pg-gateway <work> <schema> <concurrency> <millis>`, the URL
/// in the environment. Says `ready` once its pool is open, starts on a line on stdin, ends by
/// printing `done <units>`.
pub(crate) fn worker(args: &[String]) -> anyhow::Result<()> {
    let [work, schema, concurrency, millis] = args else {
        bail!("usage: {WORKER_ARG} <send|append|lifecycle> <schema> <concurrency> <millis>");
    };
    let work = Work::parse(work).with_context(|| format!("unknown work `{work}`"))?;
    let concurrency: usize = concurrency.parse().context("concurrency")?;
    let duration = Duration::from_millis(millis.parse().context("millis")?);
    let url = std::env::var(WORKER_URL_VAR).with_context(|| {
        format!("{WORKER_URL_VAR} is unset: this process is started by the bench")
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let store = runtime.block_on(open_store(&url, schema, "bench-b"))?;
    // Plain blocking stdio: the handshake happens outside the measured phase.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    let mut go = String::new();
    std::io::stdin().read_line(&mut go)?;
    let done = runtime.block_on(drive(store, work, 1, concurrency, duration))?;
    writeln!(stdout, "done {done}")?;
    stdout.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_parse_by_name() {
        assert_eq!(Backend::parse("sqlite"), Some(Backend::Sqlite));
        assert_eq!(Backend::parse("postgres"), Some(Backend::Postgres));
        assert_eq!(Backend::parse("both"), Some(Backend::Both));
        assert_eq!(Backend::parse("mysql"), None);
        assert!(Backend::Both.sqlite() && Backend::Both.postgres());
        assert!(!Backend::Sqlite.postgres() && !Backend::Postgres.sqlite());
    }

    #[test]
    fn ratios_are_formatted_against_the_baseline() {
        assert_eq!(ratio(500.0, 1000.0), "0.50x");
        assert_eq!(ratio(2469.0, 1234.5), "2.00x");
        assert_eq!(ratio(1.0, 0.0), "n/a");
        assert_eq!(ratio(1.0, f64::NAN), "n/a");
        assert_eq!(ratio(f64::NAN, 10.0), "n/a");
    }

    #[test]
    fn pgbench_tps_is_read_from_its_report() {
        let report = "transaction type: insert.sql\nnumber of clients: 64\n\
                      latency average = 12.3 ms\n\
                      initial connection time = 40.1 ms\n\
                      tps = 5201.342109 (without initial connection time)\n";
        assert_eq!(parse_tps(report), Some(5201.342109));
        assert_eq!(parse_tps("number of clients: 64\n"), None);
    }

    #[test]
    fn work_names_round_trip() {
        for work in [Work::Send, Work::Append, Work::Lifecycle] {
            assert_eq!(Work::parse(work.name()), Some(work));
        }
        assert_eq!(Work::parse("read"), None);
    }

    #[test]
    fn the_password_is_never_shown() {
        let shown = redacted("postgres://admin:hunter2@db:5432/postgres");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
