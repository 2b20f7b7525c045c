//! The cross-check with pywa: `tests/python/pywa_check.py` drives the Graph API with pywa's
//! client and verifies and parses the simulator's webhooks with pywa's own validator and
//! update handlers; the script's assertions are this test's, and this test then reads the
//! simulator's record of what pywa sent.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/pywa`), or from `CLAWGATE_PYWA_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clawgate_channel_whatsapp::simulator::{Fault, WhatsAppSimulator};
use serde_json::json;

use crate::{quick, receiver, send_text};

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_PYWA_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/pywa/bin/python")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pywa_drives_the_graph_api_and_verifies_and_parses_the_webhooks() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs pywa into a venv under the target \
         directory), or point CLAWGATE_PYWA_PYTHON at a python with pywa",
        python.display()
    );
    let sim = WhatsAppSimulator::start(quick()).await.unwrap();
    let (url, got) = receiver(vec![]).await;
    sim.set_webhook_url(Some(&url));
    let (person, closed, throttled, unreachable) = (
        "4915112345678",
        "4915199999999",
        "4915188888888",
        "4915177777777",
    );
    let inbound = sim.person_writes(person, "Ada", "hello from a person");
    let (status, _) = send_text(
        &sim,
        person,
        "from the test",
        json!({ "biz_opaque_callback_data": "rust-key-1" }),
    )
    .await;
    assert_eq!(status, 200);
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let deliveries: Vec<serde_json::Value> = got
        .lock()
        .unwrap()
        .iter()
        .map(|r| json!({ "body": r.body, "signature": r.signature }))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deliveries.json");
    std::fs::write(&file, serde_json::to_vec(&deliveries).unwrap()).unwrap();
    sim.open_window(throttled);
    sim.open_window(unreachable);
    sim.inject(Fault::code(131_056).to(throttled));
    sim.inject(Fault::code(131_026).to(unreachable));
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/pywa_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_BASE_URL", sim.api_url())
        .env("SIM_TOKEN", sim.token())
        .env("SIM_PHONE_ID", sim.phone_number_id())
        .env("SIM_APP_SECRET", sim.app_secret())
        .env("SIM_PERSON", person)
        .env("SIM_INBOUND", &inbound)
        .env("SIM_CLOSED", closed)
        .env("SIM_THROTTLED", throttled)
        .env("SIM_UNREACHABLE", unreachable)
        .env("SIM_DELIVERIES", &file)
        .env("SIM_STATUS_TRACKER", "rust-key-1");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the pywa script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What pywa sent, as the platform recorded it.
    let sent = sim.sent(person);
    let by_pywa = sent
        .iter()
        .find(|m| m.text.as_deref() == Some("hello from pywa"))
        .unwrap();
    assert!(by_pywa.preview_url);
    assert_eq!(by_pywa.callback_data.as_deref(), Some("pywa-tracker-1"));
    let quoted = sent
        .iter()
        .find(|m| m.text.as_deref() == Some("a quoted reply"))
        .unwrap();
    assert_eq!(quoted.context.as_deref(), Some(inbound.as_str()));
    assert!(
        sim.inbound().iter().all(|m| m.read),
        "pywa marked the message read"
    );
    for refused in [closed, throttled, unreachable] {
        assert!(
            sim.sent(refused).is_empty(),
            "{refused}: a refusal sends nothing"
        );
    }
}
