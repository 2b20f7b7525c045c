//! The cross-check with the official Python SDK: `tests/python/slack_sdk_check.py` drives the
//! Web API with `slack_sdk.WebClient` and verifies the simulator's event signatures with
//! `slack_sdk.signature.SignatureVerifier`; the script's assertions are this test's.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/slack-sdk`), or from `CLAWGATE_SLACK_SDK_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::Harness;
use crate::events::{quick, receiver};

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_SLACK_SDK_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/slack-sdk/bin/python")
}

#[tokio::test]
async fn slack_sdk_drives_the_simulator_and_verifies_its_signatures() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs slack-sdk into a venv under the \
         target directory), or point CLAWGATE_SLACK_SDK_PYTHON at a python with slack_sdk",
        python.display()
    );
    let h = Harness::with(quick()).await;
    let (url, got) = receiver(vec![]).await;
    h.sim.set_request_url(Some(&url));
    let person = h
        .sim
        .person_writes(&h.channel, &h.person, "from a person", None);
    let bot = h.sim.other_bot("helper");
    h.sim.bot_writes(&h.channel, &bot, "from a bot", None, None);
    assert!(h.sim.events_settled(Duration::from_secs(10)).await);
    let deliveries: Vec<serde_json::Value> = got
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            serde_json::json!({
                "body": r.body,
                "timestamp": r.headers["x-slack-request-timestamp"].to_str().unwrap(),
                "signature": r.headers["x-slack-signature"].to_str().unwrap(),
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deliveries.json");
    std::fs::write(&file, serde_json::to_vec(&deliveries).unwrap()).unwrap();
    let dm = h.sim.dm(&h.person);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/slack_sdk_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_API_URL", h.sim.api_url())
        .env("SIM_TOKEN", h.sim.token())
        .env("SIM_SIGNING_SECRET", h.sim.signing_secret())
        .env("SIM_CHANNEL", &h.channel)
        .env("SIM_DM", &dm)
        .env("SIM_PERSON_TS", &person.ts)
        .env("SIM_DELIVERIES", &file);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the slack_sdk script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What the SDK did is in the record: the edited message stays, the reply was deleted.
    let texts: Vec<String> = h
        .sim
        .messages(&h.channel)
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(
        texts,
        ["from a person", "from a bot", "edited by slack_sdk"]
    );
    let limited = h
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.status == 429)
        .count();
    assert_eq!(limited, 1);
    h.sim.stop().await;
}
