//! `cargo xtask bench acpx`: lease verification against live processes, and the time the
//! startup reaper takes to end 100 orphan trees (wrapper + adapter + grandchild each).
//!
//! Real processes only: the release wrapper binary, `sh` adapters with a `sleep` grandchild,
//! verification through the live `/proc`. Linux only (elsewhere verification fails closed and
//! there is nothing to measure).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clawgate_acpx::evidence::command_hash;
use clawgate_acpx::{
    CloseOutcome, ControllerConfig, LifecycleController, ProcessTable, Verdict, system_table,
    verify_owned_tree,
};
use clawgate_store::LeaseStore;
use clawgate_store_sqlite::{SqliteOptions, SqliteStore};
use clawgate_types::{AcpxProcessLease, LeaseId, LeaseState, SessionKey};

const ADAPTER: &[&str] = &["sh", "-c", "sleep 600 & exec sleep 601"];

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    if !cfg!(target_os = "linux") {
        bail!("bench acpx needs Linux /proc (elsewhere verification always says cannot tell)");
    }
    let wrapper = crate::release::binary("clawgate-acpx-wrapper", "clawgate-acpx-wrapper")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(root, &wrapper))
}

struct Tree {
    lease: AcpxProcessLease,
    wrapper: Child,
}

/// Starts one wrapper tree as the controller would and records its lease.
async fn start_tree(
    controller: &LifecycleController,
    store: &SqliteStore,
    table: &dyn ProcessTable,
    wrapper: &Path,
    n: usize,
) -> anyhow::Result<Tree> {
    let lease_id = LeaseId::parse(format!("bench-lease-{n}"))?;
    let adapter: Vec<String> = ADAPTER.iter().map(|s| s.to_string()).collect();
    let argv = controller.wrapper_argv(&lease_id, &adapter);
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", wrapper.display()))?;
    let pid = child.id();
    let stat = table
        .open(pid)?
        .context("wrapper vanished")?
        .stat()?
        .context("wrapper vanished")?;
    // The adapter's group id is its pid; wait for the wrapper to have started it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let group = loop {
        let children: Vec<u32> = table
            .list()?
            .into_iter()
            .filter(|s| s.ppid == pid)
            .map(|s| s.pgid)
            .collect();
        if let Some(group) = children.first() {
            break *group;
        }
        if Instant::now() > deadline {
            bail!("wrapper {pid} did not start its adapter");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let lease = AcpxProcessLease {
        lease_id,
        gateway_instance_id: controller.instance_id().clone(),
        session_key: SessionKey::parse(&format!("agent:bench:acp:{n}"))?,
        wrapper_root: wrapper
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default()
            .display()
            .to_string(),
        wrapper_path: wrapper.display().to_string(),
        root_pid: Some(pid),
        root_start_time: Some(stat.start_time),
        boot_id: Some(table.boot_id()?),
        process_group_id: Some(group),
        command_hash: command_hash(&argv),
        started_at: 1,
        state: LeaseState::Open,
        ended_at: None,
        survivors: Vec::new(),
        stderr_tail: Vec::new(),
    };
    store.insert_lease(&lease).await?;
    Ok(Tree {
        lease,
        wrapper: child,
    })
}

async fn bench(root: &Path, wrapper: &Path) -> anyhow::Result<()> {
    let dir = root.join("acpx");
    std::fs::create_dir_all(&dir)?;
    let store = Arc::new(SqliteStore::open_state_dir(&dir, SqliteOptions::default())?);
    let table = system_table();
    let mut config = ControllerConfig::new(wrapper.to_path_buf());
    // Long wrapper grace: the controller, not the wrapper's own fallback, ends the trees.
    config.wrapper_grace = Duration::from_secs(600);
    let controller = LifecycleController::new(store.clone(), table.clone(), config).await?;
    let processes_before = table.list()?.len();

    // (a) verifications per second against 20 live trees.
    let mut trees = Vec::new();
    for n in 0..20 {
        trees.push(start_tree(&controller, &store, table.as_ref(), wrapper, n).await?);
    }
    for tree in &trees {
        wait_for_grandchild(table.as_ref(), &tree.lease).await?;
    }
    let started = Instant::now();
    let mut verified = 0usize;
    while started.elapsed() < Duration::from_secs(2) {
        for tree in &trees {
            match verify_owned_tree(table.as_ref(), &tree.lease, controller.instance_id()) {
                Verdict::Owned(owned) if owned.descendants.len() == 2 => verified += 1,
                other => bail!("tree {} did not verify: {other:?}", tree.lease.lease_id),
            }
        }
    }
    let per_second = verified as f64 / started.elapsed().as_secs_f64();
    let processes = table.list()?.len();
    // End (a)'s trees the way the gateway would: verified, through the reaper.
    controller.reap_startup_orphans(2).await?;
    for mut tree in trees {
        tree.wrapper.wait()?;
    }

    // (b) the startup reaper ending 100 orphan trees (300 processes).
    let mut orphans = Vec::new();
    for n in 100..(100 + orphan_count()) {
        orphans.push(start_tree(&controller, &store, table.as_ref(), wrapper, n).await?);
    }
    for tree in &orphans {
        wait_for_grandchild(table.as_ref(), &tree.lease).await?;
    }
    let started = Instant::now();
    let report = controller.reap_startup_orphans(3).await?;
    let reap_time = started.elapsed();
    let closed = report
        .outcomes
        .iter()
        .filter(|(_, o)| matches!(o, CloseOutcome::Closed(_)))
        .count();
    for mut tree in orphans {
        tree.wrapper.wait()?;
    }
    println!(
        "bench acpx: {} live processes on the machine during (a)",
        processes
    );
    println!("\n  {:<62} {:>12}", "figure", "value");
    println!(
        "  {:<62} {:>12.0}",
        "(a) verify_owned_tree per second (20 live 3-process trees)", per_second
    );
    println!(
        "  {:<62} {:>10.0}ms",
        "(b) reap 100 orphan trees (300 processes), sequential",
        reap_time.as_secs_f64() * 1e3
    );
    println!("  {:<62} {:>12}", "(b) trees closed by the reap", closed);
    let killed: usize = report
        .outcomes
        .iter()
        .map(|(_, o)| match o {
            CloseOutcome::Closed(t) => t.killed.len(),
            _ => 0,
        })
        .sum();
    println!(
        "  {:<62} {:>12}",
        "(b) processes that needed KILL after the grace", killed
    );
    println!(
        "  {:<62} {:>12}",
        "processes left vs. before the bench",
        table.list()?.len() as i64 - processes_before as i64
    );
    Ok(())
}

fn orphan_count() -> usize {
    std::env::var("CLAWGATE_BENCH_ORPHANS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

async fn wait_for_grandchild(
    table: &dyn ProcessTable,
    lease: &AcpxProcessLease,
) -> anyhow::Result<()> {
    let group = lease.process_group_id.context("no group")?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while table
        .list()?
        .iter()
        .filter(|s| s.pgid == group && !s.zombie)
        .count()
        < 2
    {
        if Instant::now() > deadline {
            bail!("adapter group {group} did not start its grandchild");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}
