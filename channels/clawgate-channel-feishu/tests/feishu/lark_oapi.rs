//! The cross-check with Feishu's official SDK: `tests/python/lark_oapi_check.py` drives the
//! simulator with `lark_oapi.Client` (messages, uuid, replies in threads, updates, history,
//! CardKit streaming and its 300309, a frequency limit, a wrong secret) and feeds the
//! simulator's event pushes to `lark_oapi.EventDispatcherHandler`, which decrypts them and
//! checks their signatures; the script's assertions are this test's.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/lark-oapi`), or from `CLAWGATE_LARK_OAPI_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clawgate_channel_feishu::simulator::{Fault, FaultKind, FeishuSimulator, MESSAGES_PATH};

use crate::peer::quick;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_LARK_OAPI_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/lark-oapi/bin/python")
}

#[tokio::test]
async fn lark_oapi_drives_the_simulator_and_its_dispatcher_verifies_the_pushes() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs lark-oapi into a venv under the \
         target directory), or point CLAWGATE_LARK_OAPI_PYTHON at a python with lark-oapi",
        python.display()
    );
    let sim = FeishuSimulator::start(quick()).await.unwrap();
    let chat = sim.group("sdk", &["ada"]);
    // Nobody listens: the push fails and is pushed again, each attempt in the record.
    sim.set_callback_url(Some("http://127.0.0.1:9/unreachable"));
    let written = sim.writes(&chat, "ada", "hello bot");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sim.deliveries().len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no re-push came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sim.verify_url().await,
        None,
        "nobody answers the verification"
    );
    let deliveries: Vec<serde_json::Value> = sim
        .deliveries()
        .iter()
        .map(|d| {
            let kind = if d.event_id == written.event_id {
                "event"
            } else {
                "challenge"
            };
            serde_json::json!({ "kind": kind, "challenge": d.event_id, "body": d.body,
                "timestamp": d.timestamp, "nonce": d.nonce, "signature": d.signature })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deliveries.json");
    std::fs::write(&file, serde_json::to_vec(&deliveries).unwrap()).unwrap();
    sim.inject(Fault::on(MESSAGES_PATH, FaultKind::RateLimited(7)));
    let config = sim.config().clone();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/lark_oapi_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_API_URL", sim.api_url())
        .env("SIM_APP_ID", &config.app_id)
        .env("SIM_APP_SECRET", &config.app_secret)
        .env("SIM_ENCRYPT_KEY", &config.encrypt_key)
        .env("SIM_VERIFICATION_TOKEN", &config.verification_token)
        .env("SIM_CHAT", &chat)
        .env("SIM_PERSON_MESSAGE", &written.message_id)
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
        "the lark-oapi script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What the SDK did is in the platform's record: one create (its uuid repeat made nothing),
    // the edit, the card; the threaded reply recalled; nothing from the refused calls.
    let bot: Vec<(String, bool)> = sim
        .bot_messages(&chat)
        .into_iter()
        .map(|m| (m.text, m.card_id.is_some()))
        .collect();
    assert_eq!(
        bot,
        [
            ("edited by lark-oapi".to_owned(), false),
            ("final via full update".to_owned(), true)
        ]
    );
    sim.stop().await;
}
