//! `cargo xtask bench matrix`: the real `clawgate` release binary with a Matrix account on a
//! real Synapse (the venv `cargo xtask setup` installs; loopback, `/sync` long polling, FULL
//! durability), the bundled agent.
//!
//! * inbound → committed final, one message at a time (a person sends in the room; the
//!   reply's intent is `sent` in the state database): p50 / p99;
//! * throughput over 10 rooms: 50 messages sent at once, until every final is committed;
//! * baseline, same run: the same prompt turns sent straight to the bundled agent over ACP.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clawgate_channel_matrix::testing::{MessageLimit, Synapse, User, enc};
use serde_json::json;

use crate::gateway::Gateway;

const ONE_AT_A_TIME: usize = 100;
const ROOMS: usize = 10;
const ROUNDS: usize = 5;

pub(crate) fn run(root: &Path) -> anyhow::Result<()> {
    let binary = crate::release::binary("clawgate", "clawgate")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(root, &binary))
}

/// A room the person opens with the gateway's account invited.
async fn room(synapse: &Synapse, person: &User, bot: &User) -> anyhow::Result<String> {
    let created = synapse
        .call(
            person,
            reqwest::Method::POST,
            "createRoom",
            Some(json!({ "preset": "private_chat", "invite": [bot.user_id] })),
        )
        .await;
    Ok(created["room_id"].as_str().context("room id")?.to_owned())
}

async fn say(synapse: &Synapse, person: &User, room: &str, txn: &str, text: &str) -> String {
    let sent = synapse
        .call(
            person,
            reqwest::Method::PUT,
            &format!("rooms/{}/send/m.room.message/{txn}", enc(room)),
            Some(json!({ "msgtype": "m.text", "body": text })),
        )
        .await;
    sent["event_id"].as_str().unwrap_or_default().to_owned()
}

async fn bench(root: &Path, binary: &Path) -> anyhow::Result<()> {
    println!(
        "bench matrix: release binary, Synapse {} on loopback (/sync long polling), embedded \
         SQLite (FULL), bundled agent (--chunk-ms 0)",
        clawgate_channel_matrix::testing::SYNAPSE_VERSION
    );
    let baseline = crate::gateway::agent_baseline(binary, ONE_AT_A_TIME).await?;
    let synapse = Synapse::start_with(MessageLimit::RAISED).await;
    let bot = synapse.register("clawbench").await;
    let person = synapse.register("person").await;
    let first = room(&synapse, &person, &bot).await?;
    let state = root.join("matrix-state");
    let config = root.join("clawgate-matrix.toml");
    std::fs::write(
        &config,
        format!(
            "[gateway]\nlisten = \"127.0.0.1:0\"\n\n[[agents]]\nid = \"main\"\n\
             command = [{binary:?}, \"demo-agent\", \"--chunk-ms\", \"0\"]\n\n\
             [[channels]]\nkind = \"matrix\"\n[channels.settings]\n\
             homeserver_url = \"{}\"\nuser_id = \"{}\"\ntoken_env = \"BENCH_MX_TOKEN\"\n\
             poll_timeout_s = 10\n",
            synapse.base, bot.user_id
        ),
    )?;
    let child = Command::new(binary)
        .arg("--state-dir")
        .arg(&state)
        .arg("--config")
        .arg(&config)
        .arg("up")
        .env("BENCH_MX_TOKEN", &bot.token)
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
    // The account joins on its first /sync: wait for the first answer before timing.
    let warm = say(&synapse, &person, &first, "warm", "warm up").await;
    let warm_key = format!("matrix:reply:{warm}:0");
    let is_sent = |key: &str| {
        db.query_row(
            "SELECT status FROM send_intents WHERE idempotency_key = ?1",
            [key],
            |row| row.get::<_, String>(0),
        )
        .is_ok_and(|status| status == "sent")
    };
    let started = Instant::now();
    while !is_sent(&warm_key) {
        if started.elapsed() > Duration::from_secs(60) {
            bail!("no answer to the first message within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut latencies = Vec::with_capacity(ONE_AT_A_TIME);
    for n in 0..ONE_AT_A_TIME {
        let t0 = Instant::now();
        let event = say(
            &synapse,
            &person,
            &first,
            &format!("one-{n}"),
            &format!("message number {n}"),
        )
        .await;
        let key = format!("matrix:reply:{event}:0");
        while !is_sent(&key) {
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("message {n}: no committed reply after 30 s");
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        latencies.push(t0.elapsed());
    }

    let mut rooms = Vec::with_capacity(ROOMS);
    for _ in 0..ROOMS {
        rooms.push(room(&synapse, &person, &bot).await?);
    }
    // Every room joined before timing (a join comes with the account's next /sync).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = crate::gateway::sent_count(&db)?;
    let started = Instant::now();
    for round in 0..ROUNDS {
        for (r, room) in rooms.iter().enumerate() {
            say(
                &synapse,
                &person,
                room,
                &format!("many-{round}-{r}"),
                &format!("round {round} in room {r}"),
            )
            .await;
        }
    }
    let total = ROOMS * ROUNDS;
    while crate::gateway::sent_count(&db)? < before + total {
        if started.elapsed() > Duration::from_secs(300) {
            bail!(
                "{} of {total} finals after 300 s",
                crate::gateway::sent_count(&db)? - before
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    drop(gateway);

    let (p50, p99) = crate::gateway::percentiles(&mut latencies);
    let (base50, _) = {
        let mut b = baseline;
        crate::gateway::percentiles(&mut b)
    };
    println!("| figure | result |");
    println!("| --- | --- |");
    println!(
        "| inbound → committed final through Synapse, p50 / p99 ({ONE_AT_A_TIME} messages, one at a time) | {} / {} |",
        crate::gateway::ms(p50),
        crate::gateway::ms(p99)
    );
    println!(
        "| baseline: the same prompt turns straight to the agent, p50 | {} |",
        crate::gateway::ms(base50)
    );
    println!(
        "| gateway + Synapse cost around the agent (p50 ÷ baseline p50) | {:.1}× |",
        p50.as_secs_f64() / base50.as_secs_f64().max(1e-9)
    );
    println!(
        "| throughput, {ROOMS} rooms × {ROUNDS} messages sent at once | {:.0} messages/s ({:.1} s) |",
        total as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    Ok(())
}
