//! `cargo xtask bench telegram`: the real `clawgate` release binary with a Telegram bot on the
//! Bot API simulator (loopback HTTP, long polling, FULL durability), the bundled agent.
//!
//! * inbound → committed final, one message at a time (a person writes in the simulator; the
//!   reply's intent is `sent` in the state database): p50 / p99;
//! * throughput over 100 chats: 500 messages written at once, until every final is committed;
//! * baseline, same run: the same prompt turns sent straight to the bundled agent over ACP.
//!
//! The simulator's flood control is off: the figures are the gateway's, not Telegram's limits
//! (≈ 1 message/s per chat, 30/s per bot, which a real bot would meet first).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clawgate_channel_telegram::simulator::{
    BotApiSimulator, SimUser, SimulatorConfig, WriteOptions,
};

use crate::gateway::Gateway;

const ONE_AT_A_TIME: usize = 300;
const CHATS: usize = 100;
const ROUNDS: usize = 5;

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let binary = crate::release::binary("clawgate", "clawgate")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(root, &binary))
}

fn is_sent(db: &rusqlite::Connection, key: &str) -> bool {
    db.query_row(
        "SELECT status FROM send_intents WHERE idempotency_key = ?1",
        [key],
        |row| row.get::<_, String>(0),
    )
    .is_ok_and(|status| status == "sent")
}

async fn bench(root: &Path, binary: &Path) -> anyhow::Result<()> {
    println!(
        "bench telegram: release binary, Bot API simulator on loopback (long polling, no flood \
         control), embedded SQLite (FULL), bundled agent (--chunk-ms 0)"
    );
    let baseline = crate::gateway::agent_baseline(binary, ONE_AT_A_TIME).await?;
    let sim = BotApiSimulator::start(SimulatorConfig {
        rate_limits: false,
        ..SimulatorConfig::default()
    })
    .await?;
    let state = root.join("telegram-state");
    let config = root.join("clawgate-telegram.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[[agents]]\nid = \"main\"\n\
             command = [{binary:?}, \"demo-agent\", \"--chunk-ms\", \"0\"]\n\n\
             [[channels]]\nkind = \"telegram\"\n[channels.settings]\n\
             token_env = \"BENCH_TG_TOKEN\"\napi_base = \"{}\"\npoll_timeout_s = 10\ntyping = false\n",
            sim.base_url()
        ),
    )?;
    let child = Command::new(binary)
        .arg("--state-dir")
        .arg(&state)
        .arg("--config")
        .arg(&config)
        .arg("up")
        .env("BENCH_TG_TOKEN", sim.token())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start clawgate")?;
    let gateway = Gateway(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !state.join("gateway.json").exists() {
        if Instant::now() > deadline {
            bail!("the gateway did not start within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )?;
    let person = SimUser::person(100, "Bench");

    // One at a time, one chat.
    let chat = sim.supergroup("bench", false);
    let mut latencies = Vec::with_capacity(ONE_AT_A_TIME);
    for n in 0..ONE_AT_A_TIME {
        let t0 = Instant::now();
        let update = sim.user_writes(
            chat,
            &person,
            &format!("message number {n}"),
            WriteOptions::default(),
        );
        let id = update["message"]["message_id"]
            .as_i64()
            .context("message id")?;
        let key = format!("telegram:reply:{chat}:{id}:0");
        while !is_sent(&db, &key) {
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("message {n}: no committed reply after 30 s");
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        latencies.push(t0.elapsed());
    }

    // Many chats at once.
    let chats: Vec<i64> = (0..CHATS)
        .map(|n| sim.supergroup(&format!("bench {n}"), false))
        .collect();
    let before = crate::gateway::sent_count(&db)?;
    let started = Instant::now();
    for round in 0..ROUNDS {
        for chat in &chats {
            sim.user_writes(
                *chat,
                &person,
                &format!("round {round} in {chat}"),
                WriteOptions::default(),
            );
        }
    }
    let total = CHATS * ROUNDS;
    while crate::gateway::sent_count(&db)? < before + total {
        if started.elapsed() > Duration::from_secs(600) {
            bail!(
                "{} of {total} finals after 600 s",
                crate::gateway::sent_count(&db)? - before
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let landed: usize = chats
        .iter()
        .map(|c| sim.messages(*c).iter().filter(|m| m.from_bot_self).count())
        .sum();
    if landed != total {
        bail!("{landed} bot messages visible for {total} messages");
    }
    drop(gateway);

    let (p50, p99) = crate::gateway::percentiles(&mut latencies);
    let (base50, _) = {
        let mut b = baseline;
        crate::gateway::percentiles(&mut b)
    };
    println!("| figure | result |");
    println!("| --- | --- |");
    println!(
        "| inbound → committed final through the Bot API, p50 / p99 ({ONE_AT_A_TIME} messages, one at a time) | {} / {} |",
        crate::gateway::ms(p50),
        crate::gateway::ms(p99)
    );
    println!(
        "| baseline: the same prompt turns straight to the agent, p50 | {} |",
        crate::gateway::ms(base50)
    );
    println!(
        "| gateway + Bot API cost around the agent (p50 ÷ baseline p50) | {:.1}× |",
        p50.as_secs_f64() / base50.as_secs_f64().max(1e-9)
    );
    println!(
        "| throughput, {CHATS} chats × {ROUNDS} messages written at once | {:.0} messages/s ({:.1} s) |",
        total as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    Ok(())
}
