//! The cross-check with `synochat` (PyPI, 1.0.4), a Synology Chat client written against the
//! real server: `tests/python/synochat_check.py` posts through the simulator's incoming
//! webhook with it (and gets its own exceptions for 411, 404 and 117), and parses the webhook
//! bodies the simulator posted, as they arrived, with its `OutgoingWebhook` and `SlashCommand`;
//! this test then reads the simulator's record of what synochat posted.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/synochat`), or from `CLAWGATE_SYNOCHAT_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use clawgate_channel_synology::simulator::{SimulatorConfig, SynologySimulator};

use crate::peer::quick;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_SYNOCHAT_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/synochat/bin/python")
}

/// A webhook receiver keeping the raw bodies it was posted.
async fn receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: Bytes| {
            let keep = keep.clone();
            async move {
                keep.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&body).into_owned());
                axum::http::StatusCode::NO_CONTENT
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
async fn synochat_posts_through_the_simulator_and_parses_its_webhooks() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs synochat into a venv under the \
         target directory), or point CLAWGATE_SYNOCHAT_PYTHON at a python with synochat",
        python.display()
    );
    let sim = SynologySimulator::start(SimulatorConfig {
        min_send_interval: Duration::from_secs(60),
        ..quick()
    })
    .await
    .unwrap();
    let (url, bodies) = receiver().await;
    let channel = sim.add_channel("general", "synochat-hook");
    let outgoing = sim
        .set_outgoing_webhook(channel.channel_id, &["!ask"], &url)
        .unwrap();
    sim.set_bot_url(Some(&url));
    sim.add_user("grace", "Grace H.");
    sim.person_posts("grace", channel.channel_id, "!ask does this parse? & = + %");
    sim.person_dms_bot("grace", "a DM, ünïcode too");
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bodies.json");
    std::fs::write(&file, serde_json::to_vec(&*bodies.lock().unwrap()).unwrap()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/synochat_check.py");
    let port = sim.base_url().rsplit(':').next().unwrap().to_owned();
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_PORT", port)
        .env("SIM_INCOMING_TOKEN", &channel.incoming_token)
        .env("SIM_OUTGOING_TOKEN", &outgoing)
        .env("SIM_BOT_TOKEN", sim.bot_token())
        .env("SIM_CHANNEL_ID", channel.channel_id.to_string())
        .env("SIM_BODIES", &file);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the synochat script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // What synochat posted, as the platform recorded it: the one accepted post only.
    assert_eq!(
        sim.integration_texts_in(channel.channel_id),
        vec!["hello from synochat"]
    );
    let codes: Vec<_> = sim
        .calls()
        .iter()
        .filter(|c| c.method == "incoming")
        .map(|c| c.code)
        .collect();
    assert_eq!(codes, vec![None, Some(411), Some(404), Some(117)]);
}
