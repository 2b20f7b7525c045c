//! `cargo xtask bench gateway`: the real `clawgate` release binary on its embedded defaults
//! (FULL durability), with the bundled agent.
//!
//! * idle RSS of the gateway (and of one agent tree) after start-up;
//! * end-to-end latency of 1,000 messages, one at a time: inbound event injected on the QA
//!   platform → reply intent `sent` in the state database (the receipt committed);
//! * baseline, same run: the same 1,000 prompt turns sent straight to the bundled agent over
//!   ACP — the agent's own share, so the ratio is the gateway's cost around it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clawgate_channel_qa::{InboundRequest, QaPlatform, QaPlatformConfig};

const MESSAGES: usize = 1_000;
/// The bundled agent streams each word after this delay (the gateway default is 40 ms; 0
/// measures the gateway, not a pretend model's typing speed).
const CHUNK_MS: &str = "0";

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let binary = crate::release::binary("clawgate", "clawgate")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(root, &binary))
}

/// A running gateway, stopped cleanly when dropped.
pub(crate) struct Gateway(pub(crate) Child);

impl Gateway {
    /// `clawgate up` on `state` with `config` (its QA platform token in `BENCH_QA_TOKEN`) and
    /// `env`, once it has published `gateway.json`.
    pub(crate) fn start(
        binary: &Path,
        state: &Path,
        config: &Path,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Gateway> {
        let child = Command::new(binary)
            .arg("--state-dir")
            .arg(state)
            .arg("--config")
            .arg(config)
            .arg("up")
            .env("BENCH_QA_TOKEN", "bench-token")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start clawgate")?;
        let gateway = Gateway(child);
        wait_for(Duration::from_secs(30), "gateway.json", || {
            state.join("gateway.json").exists()
        })?;
        Ok(gateway)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        // SIGINT: a clean shutdown closes the agent session and its lease.
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

async fn bench(root: &Path, binary: &Path) -> anyhow::Result<()> {
    println!(
        "bench gateway: release binary, embedded SQLite (FULL), bundled agent (--chunk-ms {CHUNK_MS})"
    );
    let baseline = agent_baseline(binary, MESSAGES).await?;

    let platform = QaPlatform::start(QaPlatformConfig {
        token: "bench-token".into(),
        ..QaPlatformConfig::default()
    })
    .await?;
    let state = root.join("gateway-state");
    let config = root.join("clawgate.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[[agents]]\nid = \"main\"\n\
             command = [{binary:?}, \"demo-agent\", \"--chunk-ms\", \"{CHUNK_MS}\"]\n\n\
             [[channels]]\nkind = \"qa\"\n[channels.settings]\nbase_url = \"{}\"\n\
             token_env = \"BENCH_QA_TOKEN\"\n",
            platform.base_url()
        ),
    )?;
    let gateway = Gateway::start(binary, &state, &config, &[])?;
    let pid = gateway.0.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = rss_kib(pid)?;

    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )?;
    let mut latencies = Vec::with_capacity(MESSAGES);
    let started = Instant::now();
    for n in 0..MESSAGES {
        let t0 = Instant::now();
        let message = platform
            .inject_inbound(
                "dm-bench",
                InboundRequest {
                    text: format!("message number {n}"),
                    author_id: "bench-user".into(),
                    author_is_bot: false,
                    thread_id: None,
                    reply_to_id: None,
                    metadata: None,
                },
            )
            .map_err(anyhow::Error::msg)?;
        let key = format!("qa:reply:{}:0", message.id);
        loop {
            let status: Option<String> = db
                .query_row(
                    "SELECT status FROM send_intents WHERE idempotency_key = ?1",
                    [&key],
                    |row| row.get(0),
                )
                .ok();
            if status.as_deref() == Some("sent") {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("message {n}: no committed reply after 30 s (status {status:?})");
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        latencies.push(t0.elapsed());
    }
    let total = started.elapsed();
    let after = rss_kib(pid)?;
    let agent = agent_rss_kib(pid);
    let replies = platform
        .messages("dm-bench")
        .into_iter()
        .filter(|m| m.author_is_bot)
        .count();
    if replies != MESSAGES {
        bail!("{replies} replies on the platform for {MESSAGES} messages");
    }
    drop(gateway);

    let (p50, p99) = percentiles(&mut latencies);
    let (base50, base99) = {
        let mut b = baseline;
        percentiles(&mut b)
    };
    println!("| figure | result |");
    println!("| --- | --- |");
    println!(
        "| gateway RSS, idle after start-up | {:.1} MiB |",
        idle as f64 / 1024.0
    );
    println!(
        "| gateway RSS after {MESSAGES} messages | {:.1} MiB |",
        after as f64 / 1024.0
    );
    if let Some(agent) = agent {
        println!(
            "| one agent tree (wrapper + bundled agent) | {:.1} MiB |",
            agent as f64 / 1024.0
        );
    }
    println!(
        "| inbound → committed final, p50 / p99 ({MESSAGES} messages, one at a time) | {} / {} |",
        ms(p50),
        ms(p99)
    );
    println!(
        "| baseline: the same prompt turns straight to the agent, p50 / p99 | {} / {} |",
        ms(base50),
        ms(base99)
    );
    println!(
        "| gateway cost around the agent (p50 latency ÷ baseline p50) | {:.1}× |",
        p50.as_secs_f64() / base50.as_secs_f64().max(1e-9)
    );
    println!(
        "| throughput, one conversation | {:.0} messages/s |",
        MESSAGES as f64 / total.as_secs_f64()
    );
    Ok(())
}

/// The bundled agent alone: spawn it, `session/new`, then the same prompts one at a time.
pub(crate) async fn agent_baseline(
    binary: &Path,
    messages: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut child = tokio::process::Command::new(binary)
        .args(["demo-agent", "--chunk-ms", CHUNK_MS])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("start the bundled agent")?;
    let stdin = child.stdin.take().context("agent stdin")?;
    let stdout = child.stdout.take().context("agent stdout")?;
    let client = clawgate_acpx::AcpClient::connect(stdin, stdout).await?;
    let session = client.new_session(Path::new("/")).await?;
    let mut latencies = Vec::with_capacity(messages);
    for n in 0..messages {
        let t0 = Instant::now();
        client
            .prompt(&session, &format!("message number {n}"), |_| {})
            .await?;
        latencies.push(t0.elapsed());
    }
    client.shutdown();
    Ok(latencies)
}

/// How many intents of a state database are `sent` (the channel benches count committed
/// finals with it).
pub(crate) fn sent_count(db: &rusqlite::Connection) -> anyhow::Result<usize> {
    let n: i64 = db.query_row(
        "SELECT count(*) FROM send_intents WHERE status = 'sent'",
        [],
        |row| row.get(0),
    )?;
    Ok(usize::try_from(n).unwrap_or(0))
}

pub(crate) fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99))
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1_000.0)
}

fn wait_for(timeout: Duration, what: &str, mut ready: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    super::proc_status_kib(&pid.to_string(), "VmRSS:").context("VmRSS missing")
}

/// RSS of the gateway's children (the wrapper and the agent under it), found through the
/// process table the lifecycle controller reads.
fn agent_rss_kib(gateway: u32) -> Option<u64> {
    let table = clawgate_acpx::system_table().list().ok()?;
    let children = |parent: u32| {
        table
            .iter()
            .filter(move |p| p.ppid == parent && !p.zombie)
            .map(|p| p.pid)
    };
    let members: Vec<u32> = children(gateway)
        .flat_map(|wrapper| std::iter::once(wrapper).chain(children(wrapper)))
        .collect();
    let sizes: Vec<u64> = members
        .iter()
        .filter_map(|&pid| rss_kib(pid).ok())
        .collect();
    (!sizes.is_empty()).then(|| sizes.iter().sum())
}
