//! The cross-check with LINE's official SDK: `tests/python/line_bot_sdk_check.py` drives the
//! simulator with `linebot.v3.messaging.MessagingApi` and parses its webhook deliveries with
//! `linebot.v3.WebhookParser`; the script's assertions are this test's.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/line-bot-sdk`), or from `CLAWGATE_LINE_BOT_SDK_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clawgate_channel_line::simulator::{LineSimulator, Via};

use crate::peer::quick;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_LINE_BOT_SDK_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/line-bot-sdk/bin/python")
}

#[tokio::test]
async fn line_bot_sdk_drives_the_simulator_and_verifies_its_webhooks() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs line-bot-sdk into a venv under the \
         target directory), or point CLAWGATE_LINE_BOT_SDK_PYTHON at a python with line-bot-sdk",
        python.display()
    );
    let sim = LineSimulator::start(quick()).await.unwrap();
    let user = sim.user("ada");
    // Nobody listens: the delivery fails and is redelivered, each attempt in the record.
    sim.set_webhook_url(Some("http://127.0.0.1:9/unreachable"));
    let written = sim.user_writes(&user, "hello bot");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sim.deliveries().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no redelivery came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deliveries: Vec<serde_json::Value> = sim
        .deliveries()
        .iter()
        .map(|d| serde_json::json!({ "body": d.body, "signature": d.signature }))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deliveries.json");
    std::fs::write(&file, serde_json::to_vec(&deliveries).unwrap()).unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/line_bot_sdk_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_API_URL", sim.api_url())
        .env("SIM_TOKEN", sim.access_token())
        .env("SIM_SECRET", sim.channel_secret())
        .env("SIM_BOT", sim.bot_user_id())
        .env("SIM_USER", &user)
        .env("SIM_REPLY_TOKEN", &written.reply_token)
        .env("SIM_EVENT_ID", &written.event_id)
        .env("SIM_DELIVERIES", &file);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the line-bot-sdk script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What the SDK did is in the platform's record: one reply, one push (its repeat was a
    // 409), nothing from the refused calls.
    let bot: Vec<(String, bool)> = sim
        .bot_messages(&user)
        .into_iter()
        .map(|m| (m.text, matches!(m.via, Via::Reply(_))))
        .collect();
    assert_eq!(
        bot,
        [
            ("reply from the sdk".to_owned(), true),
            ("push from the sdk".to_owned(), false)
        ]
    );
    sim.stop().await;
}
