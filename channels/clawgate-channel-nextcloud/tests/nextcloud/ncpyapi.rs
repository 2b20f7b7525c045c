//! The cross-check with `nc-py-api` (PyPI, 0.30.3), Nextcloud's own Python framework:
//! `tests/python/ncpyapi_check.py` drives the simulator with its Talk client (capabilities, the
//! current user, conversations, send, history, delete, a refused password) and its `TalkBot`
//! (a message signed over random ‖ text, and a forged one refused), and parses the webhooks the
//! simulator POSTed with its `TalkBotMessage`; this test then reads the simulator's record.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/nc-py-api`), or from `CLAWGATE_NCPYAPI_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_nextcloud::simulator::RoomType;
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

use crate::peer::UserPeer;

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_NCPYAPI_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/nc-py-api/bin/python")
}

type Bodies = Arc<Mutex<Vec<(String, String, String)>>>;

/// A webhook receiver keeping the random, signature and raw body of each POST.
async fn receiver() -> (String, Bodies) {
    let got: Bodies = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let keep = keep.clone();
            async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                keep.lock().unwrap().push((
                    h("x-nextcloud-talk-random"),
                    h("x-nextcloud-talk-signature"),
                    body,
                ));
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
async fn nc_py_api_talks_to_the_simulator_and_parses_its_webhooks() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs nc-py-api into a venv under the \
         target directory), or point CLAWGATE_NCPYAPI_PYTHON at a python with nc-py-api",
        python.display()
    );
    let peer = UserPeer::start().await;
    let sim = &peer.sim;
    let (url, bodies) = receiver().await;
    sim.set_bot_url(Some(&url));
    let room = sim.add_conversation("cross-check", RoomType::Group);
    sim.enable_bot(&room.token);
    // The gateway's own send first (nc-py-api reads it back from history).
    let target = MessageTarget::group(room.token.clone());
    let key = "cross-1";
    peer.plugin
        .sender
        .send_unit(
            &SendContext::new(ChannelMessage::outbound(key, "nextcloud", target, "x"), key),
            &RenderedMessageUnit::text(0, "hello from the gateway"),
        )
        .await
        .unwrap();
    let asked = sim.person_writes(
        &room.token,
        "grace",
        "Grace H.",
        "a question, ünïcode & {braces}",
    );
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bodies.json");
    std::fs::write(&file, serde_json::to_vec(&*bodies.lock().unwrap()).unwrap()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/ncpyapi_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_URL", sim.base_url())
        .env("SIM_TOKEN", &room.token)
        .env("SIM_USER", &sim.config().user)
        .env("SIM_PASSWORD", &sim.config().app_password)
        .env("SIM_BOT_SECRET", &sim.config().bot_secret)
        .env("SIM_BODIES", &file);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the nc-py-api script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    let report: Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    // The webhooks nc-py-api parsed: the user's message (a user's message wakes bots) and the
    // person's, as the channel reads them too.
    let gateway_message = sim
        .messages(&room.token)
        .into_iter()
        .find(|m| m.message == "hello from the gateway")
        .unwrap();
    assert_eq!(
        report["events"],
        json!([
            { "type": "Create", "actor": "users/clawgate", "id": gateway_message.id,
              "text": "hello from the gateway", "name": "message" },
            { "type": "Create", "actor": "users/grace", "id": asked,
              "text": "a question, ünïcode & {braces}", "name": "message" },
        ])
    );
    // What landed, by the server's own record: the gateway's message; nc-py-api's user
    // message, deleted; its bot message with its referenceId; not the forged one.
    assert_eq!(sim.user_texts(&room.token), vec!["hello from the gateway"]);
    let messages = sim.messages(&room.token);
    let deleted = messages
        .iter()
        .find(|m| m.id == report["sent"].as_i64().unwrap())
        .unwrap();
    assert_eq!(deleted.message_type, "comment_deleted");
    assert_eq!(sim.bot_texts(&room.token), vec!["hello from talk_bot"]);
    let bot = messages.iter().find(|m| m.actor_type == "bots").unwrap();
    assert_eq!(json!(bot.reference_id), report["reference"]);
}
