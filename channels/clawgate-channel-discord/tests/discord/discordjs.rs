//! The cross-check with clients written by others against the real Discord: discord.js's
//! `@discordjs/rest` and `@discordjs/ws` run `tests/js/discordjs_check.mjs` against the
//! simulator; the script's assertions are this test's, and the simulator's record must show that
//! discord.js's own limiter found nothing to trip on (the only 429 is the planned one).
//!
//! The packages come from `cargo xtask setup` (pinned, under `<target>/node/discordjs`), or from
//! `CLAWGATE_DISCORDJS_MODULES` (a `node_modules` holding both).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use clawgate_channel_discord::simulator::{
    DiscordSimulator, Fault, FaultKind, Limit, Route, SimulatorConfig, WriteOptions,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// `<target>/node/discordjs/node_modules`, found from this test binary
/// (`<target>/<profile>/deps/…`).
fn modules() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLAWGATE_DISCORDJS_MODULES") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("node/discordjs/node_modules")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_js_drives_the_simulator() {
    let modules = modules();
    assert!(
        modules.join("@discordjs/rest").exists() && modules.join("@discordjs/ws").exists(),
        "{} lacks @discordjs/rest and @discordjs/ws: run `cargo xtask setup` (it installs them, \
         pinned, under the target directory), or point CLAWGATE_DISCORDJS_MODULES at a \
         node_modules with both",
        modules.display()
    );
    let sim = DiscordSimulator::start(SimulatorConfig {
        create_limit: Limit::new(2, Duration::from_secs(1)),
        ..SimulatorConfig::fast()
    })
    .await
    .unwrap();
    let bot = sim.add_bot("djs");
    let person = sim.add_person("ada");
    let channel = sim.add_channel("djs");
    sim.inject(Fault::on(
        Route::CreateMessage,
        FaultKind::RateLimited {
            retry_after: 0.3,
            global: false,
        },
    ));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js/discordjs_check.mjs");
    let mut child = tokio::process::Command::new("node")
        .arg(&script)
        .env("DISCORDJS_MODULES", &modules)
        .env("SIM_ORIGIN", sim.http_origin())
        .env("SIM_TOKEN", bot.token.clone().unwrap())
        .env("SIM_CHANNEL", &channel)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts (install Node.js 20 or later)");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut said = Vec::new();
    let read = async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            match line.as_str() {
                "gateway ready" => {
                    sim.person_writes(&channel, &person, "hello gateway", WriteOptions::default());
                    stdin.write_all(b"written 1\n").await.unwrap();
                }
                "got the first message" => {
                    assert_eq!(sim.disconnect(&bot), 1);
                    sim.person_writes(&channel, &person, "after the drop", WriteOptions::default());
                    stdin.write_all(b"written 2\n").await.unwrap();
                }
                _ => {}
            }
            said.push(line);
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("the script finished in time");
    let output = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the discord.js script failed ({}):\n{said:?}\n{stderr}",
        output.status
    );
    assert!(said.iter().any(|l| l == "checks passed"), "{said:?}");
    let statuses: Vec<u16> = sim
        .calls()
        .iter()
        .filter(|c| c.route == Route::CreateMessage)
        .map(|c| c.status)
        .collect();
    assert_eq!(statuses.first(), Some(&429), "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        1,
        "discord.js read the buckets and never ran into one: {statuses:?}"
    );
    let stats = sim.gateway_stats(&bot);
    assert_eq!(
        (stats.identifies, stats.resumes),
        (1, 1),
        "discord.js resumed after the drop"
    );
    sim.stop().await;
}
