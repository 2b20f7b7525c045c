//! `cargo xtask bench scale`: many conversations on one gateway, with bounded agent processes.
//!
//! The real `clawgate` release binary on a QA platform in this process, the bundled agent,
//! `max_live = 64` and a short idle close. Each conversation sends 3 messages, one round at a
//! time (every conversation's first message at once, then the seconds, then the thirds). Two
//! runs, the same way: 100 conversations (the baseline) and `CLAWGATE_BENCH_CONVERSATIONS`
//! (default 10,000). Reported per run: messages/s, inbound → committed final p50/p99, peak RSS
//! of the gateway and of all agent processes, agent processes alive at the peak (never above
//! the cap), and the gateway's RSS once every session was closed for idleness (2 s after, and
//! again once the runtime's idle threads exited); then the ratios
//! the targets are stated in (throughput of the big run over the baseline's; RSS growth per
//! idle conversation).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clawgate_channel_qa::{InboundRequest, QaPlatform, QaPlatformConfig};

use crate::gateway::{Gateway, ms, percentiles};

const MAX_LIVE: usize = 64;
const MESSAGES_PER_CONVERSATION: usize = 3;
const BASELINE_CONVERSATIONS: usize = 100;
const IDLE_CLOSE_SECS: u64 = 3;
/// Beyond the gateway's keep-alive of an idle blocking thread (1 s), and the runtime's
/// default (10 s) should a build not set it.
const IDLE_THREADS_EXIT: Duration = Duration::from_secs(12);

/// What one run measured.
struct Figures {
    conversations: usize,
    messages: usize,
    seconds: f64,
    p50: Duration,
    p99: Duration,
    gateway_peak_kib: u64,
    agents_peak_kib: u64,
    agents_peak: usize,
    /// Two seconds after the last agent process ended.
    gateway_just_idle_kib: u64,
    /// Once the runtime's idle blocking threads have exited (tokio keeps one 10 s).
    gateway_idle_kib: u64,
    gateway_idle_threads: usize,
}

impl Figures {
    fn rate(&self) -> f64 {
        self.messages as f64 / self.seconds
    }
}

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let binary = crate::release::binary("clawgate", "clawgate")?;
    let big = std::env::var("CLAWGATE_BENCH_CONVERSATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "bench scale: release binary, bundled agent (--chunk-ms 0), max_live = {MAX_LIVE}, \
         {MESSAGES_PER_CONVERSATION} messages per conversation in rounds"
    );
    let small = runtime.block_on(one_run(root, "baseline", &binary, BASELINE_CONVERSATIONS))?;
    let large = runtime.block_on(one_run(root, "large", &binary, big))?;
    println!(
        "| figure | {} conversations | {} conversations |",
        small.conversations, large.conversations
    );
    println!("| --- | --- | --- |");
    let row = |name: &str, f: &dyn Fn(&Figures) -> String| {
        println!("| {name} | {} | {} |", f(&small), f(&large));
    };
    row("messages", &|f| f.messages.to_string());
    row("messages/s", &|f| format!("{:.0}", f.rate()));
    row("inbound → committed final, p50 / p99", &|f| {
        format!("{} / {}", ms(f.p50), ms(f.p99))
    });
    row("gateway RSS, peak", &|f| mib(f.gateway_peak_kib));
    row(
        "all agent processes' RSS, peak",
        &|f| mib(f.agents_peak_kib),
    );
    row("agent processes alive at the peak (cap 64)", &|f| {
        f.agents_peak.to_string()
    });
    row(
        "gateway RSS 2 s after every session was closed for idleness",
        &|f| mib(f.gateway_just_idle_kib),
    );
    row(
        "gateway RSS once its idle threads exited (12 s later), threads then",
        &|f| format!("{}, {}", mib(f.gateway_idle_kib), f.gateway_idle_threads),
    );
    let growth = (large.gateway_idle_kib as f64 - small.gateway_idle_kib as f64)
        / (large.conversations as f64 - small.conversations as f64).max(1.0);
    println!(
        "| throughput at {} conversations ÷ at {} (target ≥ 0.80) | {:.2} |",
        large.conversations,
        small.conversations,
        large.rate() / small.rate().max(1e-9)
    );
    println!("| gateway RSS growth per idle conversation (target ≤ 2 KiB) | {growth:.2} KiB |");
    Ok(())
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// One run in its own state directory under `root` (`name`: the baseline and the large run
/// may have the same size).
async fn one_run(
    root: &Path,
    name: &str,
    binary: &Path,
    conversations: usize,
) -> anyhow::Result<Figures> {
    let platform = QaPlatform::start(QaPlatformConfig {
        token: "bench-token".into(),
        ..QaPlatformConfig::default()
    })
    .await?;
    let dir = root.join(format!("scale-{name}-{conversations}"));
    std::fs::create_dir_all(&dir)?;
    let state = dir.join("state");
    let config = dir.join("clawgate.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[[agents]]\nid = \"main\"\n\
             command = [{binary:?}, \"demo-agent\", \"--chunk-ms\", \"0\"]\n\
             max_live = {MAX_LIVE}\nidle_close_secs = {IDLE_CLOSE_SECS}\nbusy_notice_secs = 100000\n\n\
             [[channels]]\nkind = \"qa\"\nmax_turn_attempts = 50\n[channels.settings]\n\
             base_url = \"{}\"\ntoken_env = \"BENCH_QA_TOKEN\"\n",
            platform.base_url()
        ),
    )?;
    let gateway = Gateway::start(binary, &state, &config, &[("CLAWGATE_LOG", "warn")])?;
    let pid = gateway.0.id();

    // Peaks, sampled beside the run.
    let sampling = Arc::new(AtomicBool::new(true));
    let gateway_peak = Arc::new(AtomicU64::new(0));
    let agents_peak_kib = Arc::new(AtomicU64::new(0));
    let agents_peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (sampling, gateway_peak, agents_peak_kib, agents_peak) = (
            sampling.clone(),
            gateway_peak.clone(),
            agents_peak_kib.clone(),
            agents_peak.clone(),
        );
        std::thread::spawn(move || {
            while sampling.load(Ordering::SeqCst) {
                if let Some(kib) = crate::proc_status_kib(&pid.to_string(), "VmRSS:") {
                    gateway_peak.fetch_max(kib, Ordering::SeqCst);
                }
                let (count, kib) = agent_trees(pid);
                agents_peak.fetch_max(count as u64, Ordering::SeqCst);
                agents_peak_kib.fetch_max(kib, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )?;
    // Reply key → when its message was injected (unix ms).
    let mut injected: HashMap<String, i64> = HashMap::new();
    let started = Instant::now();
    for round in 0..MESSAGES_PER_CONVERSATION {
        for c in 0..conversations {
            let at = unix_ms();
            let message = platform
                .inject_inbound(
                    &format!("conv-{c}"),
                    InboundRequest {
                        text: format!("round {round} of conversation {c}"),
                        author_id: format!("person-{c}"),
                        author_is_bot: false,
                        thread_id: None,
                        reply_to_id: None,
                        metadata: None,
                    },
                )
                .map_err(anyhow::Error::msg)?;
            injected.insert(format!("qa:reply:{}:0", message.id), at);
        }
        let expected = (round + 1) * conversations;
        let round_deadline = Instant::now() + Duration::from_secs(1_800);
        loop {
            let sent = crate::gateway::sent_count(&db)?;
            if sent >= expected {
                break;
            }
            if Instant::now() > round_deadline {
                bail!("round {round}: {sent} of {expected} finals committed after 30 minutes");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut latencies = Vec::with_capacity(injected.len());
    {
        let mut rows = db.prepare(
            "SELECT idempotency_key, updated_at FROM send_intents WHERE status = 'sent'",
        )?;
        let committed = rows.query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })?;
        for row in committed {
            let (key, at) = row?;
            if let Some(sent) = injected.get(&key) {
                latencies.push(Duration::from_millis(u64::try_from(at - sent).unwrap_or(0)));
            }
        }
    }
    if latencies.len() != injected.len() {
        bail!(
            "{} committed replies for {} messages",
            latencies.len(),
            injected.len()
        );
    }
    // Every session closed for idleness: what the gateway keeps per conversation it has seen.
    let idle_deadline = Instant::now() + Duration::from_secs(120);
    while agent_trees(pid).0 > 0 {
        if Instant::now() > idle_deadline {
            bail!("agent processes still alive two minutes after the last message");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = || crate::proc_status_kib(&pid.to_string(), "VmRSS:").context("gateway VmRSS");
    let gateway_just_idle_kib = rss()?;
    // The threads a burst started (blocking reads, child reaping) linger for the runtime's
    // keep-alive, each with its stack and its allocator heap: what is kept per conversation
    // is measured after they are gone.
    tokio::time::sleep(IDLE_THREADS_EXIT).await;
    let gateway_idle_kib = rss()?;
    let gateway_idle_threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(Iterator::count)
        .unwrap_or(0);
    sampling.store(false, Ordering::SeqCst);
    let _ = sampler.join();
    drop(gateway);
    platform.stop().await;
    let (p50, p99) = percentiles(&mut latencies);
    Ok(Figures {
        conversations,
        messages: injected.len(),
        seconds,
        p50,
        p99,
        gateway_peak_kib: gateway_peak.load(Ordering::SeqCst),
        agents_peak_kib: agents_peak_kib.load(Ordering::SeqCst),
        agents_peak: usize::try_from(agents_peak.load(Ordering::SeqCst)).unwrap_or(0),
        gateway_just_idle_kib,
        gateway_idle_kib,
        gateway_idle_threads,
    })
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The agent trees of the gateway `gateway` (its children, the wrappers, with everything under
/// them): how many, and their RSS together.
fn agent_trees(gateway: u32) -> (usize, u64) {
    let Ok(table) = clawgate_acpx::system_table().list() else {
        return (0, 0);
    };
    let mut below: HashMap<u32, Vec<u32>> = HashMap::new();
    for process in table.iter().filter(|p| !p.zombie) {
        below.entry(process.ppid).or_default().push(process.pid);
    }
    let wrappers = below.get(&gateway).cloned().unwrap_or_default();
    let mut kib = 0;
    let mut stack = wrappers.clone();
    while let Some(pid) = stack.pop() {
        kib += crate::proc_status_kib(&pid.to_string(), "VmRSS:").unwrap_or(0);
        if let Some(children) = below.get(&pid) {
            stack.extend(children);
        }
    }
    (wrappers.len(), kib)
}
