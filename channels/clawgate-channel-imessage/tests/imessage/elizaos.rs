//! The cross-check with a BlueBubbles client someone else wrote: elizaOS's
//! `elizaos-plugin-bluebubbles` (PyPI, 2.0.0a5). `tests/python/elizaos_bluebubbles_check.py`
//! probes the simulator, sends a text with a `tempGuid`, lists and queries the chat, edits and
//! unsends, meets a 401, and parses the webhook bodies the simulator posted with the plugin's
//! own models and service; this test then reads the simulator's record of what the client did.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/elizaos-plugin-bluebubbles`), or from `CLAWGATE_BLUEBUBBLES_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_imessage::simulator::{BlueBubblesSimulator, SimulatorConfig};
use serde_json::Value;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_BLUEBUBBLES_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/elizaos-plugin-bluebubbles/bin/python")
}

/// A webhook receiver keeping the bodies it was posted.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(body);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elizaos_bluebubbles_client_sends_queries_edits_and_parses_the_simulators_webhooks() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs elizaos-plugin-bluebubbles into a \
         venv under the target directory), or point CLAWGATE_BLUEBUBBLES_PYTHON at a python \
         with it",
        python.display()
    );
    let sim = BlueBubblesSimulator::start(SimulatorConfig {
        echo_delay: Duration::from_millis(20),
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let (url, bodies) = receiver().await;
    sim.set_webhook(Some(&url));
    let chat = sim.dm("+15557654321");
    sim.person_writes(&chat, "+15557654321", "a person writes");
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bodies.json");
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/elizaos_bluebubbles_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_URL", sim.base_url())
        .env("SIM_PASSWORD", sim.password())
        .env("SIM_CHAT", &chat)
        .env("SIM_BODIES", &file);
    let mut script = tokio::task::spawn_blocking(move || command.output());
    // The bodies of the client's own send, edit and unsend exist only once it made them: the
    // file is written (whole, then renamed) when they have all arrived, and the script waits
    // for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen: Vec<Value> = bodies.lock().unwrap().clone();
        let count = |kind: &str| seen.iter().filter(|b| b["type"] == kind).count();
        if count("new-message") >= 2 && count("updated-message") >= 2 {
            let partial = dir.path().join("bodies.part");
            std::fs::write(&partial, serde_json::to_vec(&seen).unwrap()).unwrap();
            std::fs::rename(&partial, &file).unwrap();
            break;
        }
        if script.is_finished() || std::time::Instant::now() >= deadline {
            // The script ended early (its output says why) or the webhooks never came.
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let output = (&mut script)
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the elizaos-plugin-bluebubbles script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What the client did, as the server recorded it.
    let calls: Vec<(String, u16)> = sim
        .calls()
        .iter()
        .map(|c| (c.path.clone(), c.status))
        .collect();
    let sends: Vec<_> = sim
        .calls()
        .into_iter()
        .filter(|c| c.path == "/api/v1/message/text")
        .collect();
    assert_eq!(sends.len(), 2, "{calls:?}");
    assert_eq!(sends[0].body["tempGuid"], "eliza-temp-1");
    assert_eq!(sends[0].body["method"], "apple-script");
    assert_eq!(sends[0].status, 200);
    assert_eq!(sends[1].status, 401, "the wrong password");
    assert!(
        sim.calls()
            .iter()
            .any(|c| c.path.ends_with("/edit") && c.status == 200)
    );
    assert!(
        sim.calls()
            .iter()
            .any(|c| c.path.ends_with("/unsend") && c.status == 200)
    );
    assert!(sim.our_texts(&chat).is_empty(), "unsent");
}
