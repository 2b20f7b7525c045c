//! `cargo xtask bench awareness`: the signal log, changesSince, notice fan-out and pruning,
//! beside raw SQLite doing the same statements in the same run.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clawgate_awareness::{
    Actor, Awareness, AwarenessConfig, NewSession, Requester, RetentionPolicy, SessionStatusParams,
    SessionTools, StateChange,
};
use clawgate_store::{NewSessionEvent, SignalLogStore, WatchCursorStore};
use clawgate_store_sqlite::Synchronous;
use clawgate_types::clock::{Clock as _, SystemClock};
use clawgate_types::{
    ActorType, AgentToAgentPolicy, SessionKey, SessionStateEventKind, SessionVisibility,
    StateVersion,
};
use rusqlite::params;

use super::{fresh_db, open, rate, raw_connection};

const LOG_ROWS: usize = 50_000;
const LATENCY_SAMPLES: usize = 2_000;

fn key(text: &str) -> anyhow::Result<SessionKey> {
    Ok(SessionKey::parse(text)?)
}

fn new_event(session: &SessionKey, n: usize) -> NewSessionEvent {
    NewSessionEvent {
        session_key: session.clone(),
        kind: SessionStateEventKind::HumanDirectMessage,
        actor_type: ActorType::Human,
        actor_id: Some("user-1".into()),
        summary: "human message via qa".into(),
        outcome: None,
        child_session_key: None,
        dedupe_key: None,
        // Recent (wall clock) so the age rule keeps them; the row cap is what prunes.
        created_at: SystemClock.now_ms() + n as i64,
    }
}

/// Raw inserts of signal-log rows: the same head upsert + event insert the store runs,
/// `per_commit` events per transaction.
fn raw_event_inserts(
    root: &Path,
    name: &str,
    rows: usize,
    per_commit: usize,
) -> anyhow::Result<f64> {
    let dir = fresh_db(root, name, Synchronous::Full)?;
    let conn = raw_connection(&dir, Synchronous::Full)?;
    let started = Instant::now();
    for chunk in (0..rows).collect::<Vec<_>>().chunks(per_commit) {
        let tx = conn.unchecked_transaction()?;
        for &n in chunk {
            let session = format!("agent:main:s{}", n % 64);
            let seq: i64 = tx
                .prepare_cached(
                    "INSERT INTO session_heads (session_key, head, pruned_through, updated_at)
                     VALUES (?1, 1, 0, ?2)
                     ON CONFLICT (session_key) DO UPDATE SET head = head + 1,
                         updated_at = excluded.updated_at
                     RETURNING head",
                )?
                .query_row(params![session, n as i64], |r| r.get(0))?;
            tx.prepare_cached(
                "INSERT INTO session_state_events (session_key, sequence, kind, actor_type,
                     actor_id, summary, created_at)
                 VALUES (?1, ?2, 'human_direct_message', 'human', 'user-1',
                     'human message via qa', ?3)",
            )?
            .execute(params![session, seq, n as i64])?;
        }
        tx.commit()?;
    }
    Ok(rate(rows, started))
}

/// Concurrent appends on 64 sessions through `append` (store port or engine).
async fn concurrent<F, Fut>(concurrency: usize, total: usize, append: F) -> anyhow::Result<f64>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let append = append.clone();
            tokio::spawn(async move {
                // Tasks progressing together take neighbouring numbers, as concurrent turns do.
                for n in (task..total).step_by(concurrency) {
                    append(n).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(rate(total, started))
}

/// A deterministic spread of `since` versions over the log (no RNG dependency).
fn sample_since(i: usize) -> u64 {
    ((i * 7_919) % (LOG_ROWS - 200)) as u64
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
    (at(0.50), at(0.99))
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(super) fn run(root: &Path) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!(
        "bench awareness: {} (WAL; synchronous=FULL)",
        root.display()
    );
    let raw_single = raw_event_inserts(root, "raw-events-single", 1_000, 1)?;
    let raw_batched = raw_event_inserts(root, "raw-events-batched", LOG_ROWS, 100)?;
    runtime.block_on(async_part(root, raw_single, raw_batched))
}

async fn async_part(root: &Path, raw_single: f64, raw_batched: f64) -> anyhow::Result<()> {
    let sessions: Arc<Vec<SessionKey>> = Arc::new(
        (0..64)
            .map(|n| key(&format!("agent:main:s{n}")))
            .collect::<anyhow::Result<_>>()?,
    );

    // (b) appends through the store port and through the engine (best-effort record + notice
    // evaluation), 64 concurrent turns.
    let store = open(root, "store-events", Synchronous::Full)?;
    let s = sessions.clone();
    let store_c64 = concurrent(64, LOG_ROWS, move |n| {
        let (store, s) = (store.clone(), s.clone());
        async move {
            store.append_event(&new_event(&s[n % 64], n)).await?;
            Ok(())
        }
    })
    .await?;
    let engine =
        Arc::new(Awareness::builder(open(root, "engine-events", Synchronous::Full)?).build());
    let s = sessions.clone();
    let e = engine.clone();
    let engine_c64 = concurrent(64, LOG_ROWS, move |n| {
        let (e, s) = (e.clone(), s.clone());
        async move {
            let change = StateChange::human_direct_message(Actor::human("user-1"), "qa");
            e.record(&s[n % 64], change)
                .await
                .ok_or_else(|| anyhow::anyhow!("append failed"))?;
            Ok(())
        }
    })
    .await?;

    let mut wide = Vec::new();
    for (name, sync, concurrency) in [
        ("engine-events-c512", Synchronous::Full, 512),
        ("engine-events-c512-normal", Synchronous::Normal, 512),
    ] {
        let e = Arc::new(Awareness::builder(open(root, name, sync)?).build());
        let s = sessions.clone();
        wide.push(
            concurrent(concurrency, LOG_ROWS, move |n| {
                let (e, s) = (e.clone(), s.clone());
                async move {
                    let change = StateChange::human_direct_message(Actor::human("user-1"), "qa");
                    e.record(&s[n % 64], change)
                        .await
                        .ok_or_else(|| anyhow::anyhow!("append failed"))?;
                    Ok(())
                }
            })
            .await?,
        );
    }
    let (engine_c512, engine_c512_normal) = (wide[0], wide[1]);

    // changesSince at a 50,000-row log (one session holds all of them).
    let (raw_p50, raw_p99, store_p50, store_p99, tool_p50, tool_p99) = changes_since(root).await?;

    // 1,000 watchers x 10,000 events on one target.
    let (fanout_time, notices, durable) = fanout(root).await?;

    // Pruning 50,000 rows: the engine's retention on a 100,000-row log, and raw DELETE.
    let (prune_time, pruned) = prune(root).await?;
    let raw_prune = raw_prune(root)?;

    println!("\n  {:<64} {:>12}", "figure", "value");
    let rows: Vec<(String, String)> = vec![
        (
            "(a) raw SQLite event insert, one per commit /s".into(),
            format!("{raw_single:.0}"),
        ),
        (
            "(a) raw SQLite event insert, 100 per commit /s".into(),
            format!("{raw_batched:.0}"),
        ),
        (
            "(b) store append_event, concurrency 64 /s".into(),
            format!("{store_c64:.0}"),
        ),
        (
            "(b) awareness record (append + notices), concurrency 64 /s".into(),
            format!("{engine_c64:.0}"),
        ),
        (
            "(b) awareness record, concurrency 512 /s".into(),
            format!("{engine_c512:.0}"),
        ),
        (
            "(b) awareness record, concurrency 512, NORMAL /s".into(),
            format!("{engine_c512_normal:.0}"),
        ),
        (
            "(a) raw SQLite changesSince (200 rows) p50 / p99 µs".into(),
            format!("{:.0} / {:.0}", micros(raw_p50), micros(raw_p99)),
        ),
        (
            "(b) store events_since (200) p50 / p99 µs".into(),
            format!("{:.0} / {:.0}", micros(store_p50), micros(store_p99)),
        ),
        (
            "(b) session_status changesSince (200) p50 / p99 µs".into(),
            format!("{:.0} / {:.0}", micros(tool_p50), micros(tool_p99)),
        ),
        (
            "(b) 1,000 watchers x 10,000 events: seconds".into(),
            format!("{:.2}", fanout_time.as_secs_f64()),
        ),
        (
            "(b) ... notices queued / durable".into(),
            format!("{notices} / {durable}"),
        ),
        (
            "(a) raw SQLite DELETE 50,000 event rows, ms".into(),
            format!("{:.0}", raw_prune.as_secs_f64() * 1e3),
        ),
        (
            format!("(b) retention pass pruning {pruned} rows, ms"),
            format!("{:.0}", prune_time.as_secs_f64() * 1e3),
        ),
    ];
    for (label, value) in rows {
        println!("  {label:<64} {value:>12}");
    }
    println!("\n  (c) ratios");
    println!(
        "  {:<64} {:>11.2}x",
        "record c64 / raw single",
        engine_c64 / raw_single
    );
    println!(
        "  {:<64} {:>11.2}x",
        "record c64 / raw 100 per commit",
        engine_c64 / raw_batched
    );
    println!(
        "  {:<64} {:>11.2}x",
        "session_status p99 / raw p99",
        micros(tool_p99) / micros(raw_p99).max(1.0)
    );
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    // The target is judged with fsync on every commit (FULL); NORMAL is shown beside it.
    println!(
        "\n  target: record >= 50,000/s with synchronous=FULL: {} (NORMAL: {})",
        verdict(engine_c64.max(engine_c512) >= 50_000.0),
        verdict(engine_c512_normal >= 50_000.0)
    );
    println!(
        "  target: changesSince p99 <= 1 ms: {}",
        verdict(tool_p99 <= Duration::from_millis(1))
    );
    println!(
        "  target: exactly 1,000 notices: {}",
        verdict(notices == 1_000 && durable == 1_000)
    );
    Ok(())
}

type Latencies = (Duration, Duration, Duration, Duration, Duration, Duration);

async fn changes_since(root: &Path) -> anyhow::Result<Latencies> {
    let store = open(root, "changes-since", Synchronous::Full)?;
    let engine = Arc::new(Awareness::builder(store.clone()).build());
    let target = key("agent:main:busy")?;
    engine
        .create_session(NewSession::new(target.clone()), Actor::system("bench"))
        .await?;
    let t = target.clone();
    let s = store.clone();
    concurrent(64, LOG_ROWS - 1, move |n| {
        let (s, t) = (s.clone(), t.clone());
        async move {
            s.append_event(&new_event(&t, n)).await?;
            Ok(())
        }
    })
    .await?;
    struct NoDelivery;
    #[async_trait::async_trait]
    impl clawgate_awareness::SessionDelivery for NoDelivery {
        async fn deliver(
            &self,
            _: &SessionKey,
            to: &SessionKey,
            _: &str,
        ) -> Result<SessionKey, Box<dyn std::error::Error + Send + Sync>> {
            Ok(to.clone())
        }
    }
    let tools = SessionTools::new(engine.clone(), Arc::new(NoDelivery));
    let req = Requester {
        session_key: target.clone(),
        visibility: SessionVisibility::Tree,
        a2a_policy: AgentToAgentPolicy::default(),
        sandboxed: false,
    };
    let (mut raw, mut port, mut tool) = (Vec::new(), Vec::new(), Vec::new());
    // Raw: the same query on a dedicated connection, rows decoded into owned values.
    let conn = rusqlite::Connection::open(store.path())?;
    for i in 0..LATENCY_SAMPLES {
        let since = sample_since(i) as i64;
        let started = Instant::now();
        let mut stmt = conn.prepare_cached(
            "SELECT sequence, kind, actor_type, actor_id, summary, outcome, child_session_key,
                 created_at FROM session_state_events
             WHERE session_key = ?1 AND sequence > ?2 ORDER BY sequence LIMIT 201",
        )?;
        let rows = stmt.query_map(params![target.as_str(), since], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?;
        let n = rows.count();
        raw.push(started.elapsed());
        anyhow::ensure!(n == 201, "raw changesSince returned {n} rows");
    }
    for i in 0..LATENCY_SAMPLES {
        let since = StateVersion(sample_since(i));
        let started = Instant::now();
        let changes = store.events_since(&target, since, 200).await?;
        port.push(started.elapsed());
        anyhow::ensure!(changes.events.len() == 200 && changes.truncated);
        let params = SessionStatusParams {
            session_key: target.clone(),
            changes_since: Some(since),
        };
        let started = Instant::now();
        let status = tools.session_status(&req, &params).await?;
        tool.push(started.elapsed());
        anyhow::ensure!(status.state_changes.map(|c| c.events.len()) == Some(200));
    }
    let (raw50, raw99) = percentiles(raw);
    let (port50, port99) = percentiles(port);
    let (tool50, tool99) = percentiles(tool);
    Ok((raw50, raw99, port50, port99, tool50, tool99))
}

async fn fanout(root: &Path) -> anyhow::Result<(Duration, usize, usize)> {
    let store = open(root, "fanout", Synchronous::Full)?;
    let engine = Arc::new(Awareness::builder(store.clone()).build());
    let target = key("agent:main:shared")?;
    engine
        .create_session(NewSession::new(target.clone()), Actor::system("bench"))
        .await?;
    let e = engine.clone();
    let t = target.clone();
    concurrent(64, 1_024, move |n| {
        let (e, t) = (e.clone(), t.clone());
        async move {
            if n < 1_000 {
                let watcher = SessionKey::parse(&format!("agent:main:w{n}"))?;
                anyhow::ensure!(e.watch(&watcher, &t).await, "watch {n} not registered");
            }
            Ok(())
        }
    })
    .await?;
    let e = engine.clone();
    let t = target.clone();
    let started = Instant::now();
    concurrent(64, 10_000, move |_| {
        let (e, t) = (e.clone(), t.clone());
        async move {
            let change = StateChange::human_direct_message(Actor::human("user-1"), "qa");
            e.record(&t, change)
                .await
                .ok_or_else(|| anyhow::anyhow!("append failed"))?;
            Ok(())
        }
    })
    .await?;
    let elapsed = started.elapsed();
    let queued = engine.all_pending_notices().len();
    let durable = store.cursors_with_pending_notice().await?.len();
    Ok((elapsed, queued, durable))
}

async fn prune(root: &Path) -> anyhow::Result<(Duration, u64)> {
    let store = open(root, "prune", Synchronous::Full)?;
    let sessions: Arc<Vec<SessionKey>> = Arc::new(
        (0..64)
            .map(|n| key(&format!("agent:main:p{n}")))
            .collect::<anyhow::Result<_>>()?,
    );
    let s = store.clone();
    concurrent(64, 2 * LOG_ROWS, move |n| {
        let (s, k) = (s.clone(), sessions.clone());
        async move {
            s.append_event(&new_event(&k[n % 64], n)).await?;
            Ok(())
        }
    })
    .await?;
    let config = AwarenessConfig {
        retention: RetentionPolicy {
            max_rows: LOG_ROWS as u64,
            ..RetentionPolicy::default()
        },
        ..AwarenessConfig::default()
    };
    let engine = Awareness::builder(store).config(config).build();
    let started = Instant::now();
    let report = engine.apply_retention().await?;
    Ok((started.elapsed(), report.events_deleted))
}

fn raw_prune(root: &Path) -> anyhow::Result<Duration> {
    let dir = fresh_db(root, "raw-prune", Synchronous::Full)?;
    let conn = raw_connection(&dir, Synchronous::Full)?;
    let tx = conn.unchecked_transaction()?;
    for n in 0..2 * LOG_ROWS {
        tx.prepare_cached(
            "INSERT INTO session_state_events (session_key, sequence, kind, actor_type, summary,
                 created_at)
             VALUES (?1, ?2, 'human_direct_message', 'human', 'human message via qa', ?2)",
        )?
        .execute(params![format!("agent:main:p{}", n % 64), n as i64])?;
    }
    tx.commit()?;
    let started = Instant::now();
    let deleted = conn.execute(
        "DELETE FROM session_state_events WHERE id <= ?1",
        [LOG_ROWS as i64],
    )?;
    anyhow::ensure!(deleted == LOG_ROWS, "raw prune deleted {deleted}");
    Ok(started.elapsed())
}
