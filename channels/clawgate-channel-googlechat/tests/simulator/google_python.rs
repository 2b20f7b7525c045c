//! The cross-check with Google's own client: `tests/python/google_chat_check.py` drives the REST
//! API with `google.apps.chat_v1.ChatServiceClient` (REST transport, pointed at the simulator)
//! and verifies the event tokens the simulator sent with `google.oauth2.id_token.verify_token`
//! against its x509 certificate URL; the script's assertions are this test's.
//!
//! The Python comes from the venv `cargo xtask setup` installs under the target directory
//! (`<target>/python/google-apps-chat`), or from `CLAWGATE_GOOGLE_CHAT_PYTHON`.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;
use clawgate_channel_googlechat::simulator::{GoogleChatSimulator, SimulatorConfig, SpaceKind};
use serde_json::{Value, json};

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("CLAWGATE_GOOGLE_CHAT_PYTHON") {
        return PathBuf::from(python);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let target = exe
        .ancestors()
        .nth(3)
        .expect("the test binary sits in <target>/<profile>/deps");
    target.join("python/google-apps-chat/bin/python")
}

/// An endpoint on loopback that keeps what each delivery carried and answers `{}`.
async fn endpoint() -> (String, Arc<Mutex<Vec<Value>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let kept = got.clone();
    let app = axum::Router::new().route(
        "/events",
        axum::routing::post(move |headers: HeaderMap, body: String| {
            let kept = kept.clone();
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                kept.lock().unwrap().push(json!({
                    "token": header("authorization").trim_start_matches("Bearer ").to_owned(),
                    "user_agent": header("user-agent"),
                    "body": body,
                }));
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/events", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

#[tokio::test]
async fn googles_client_drives_the_simulator_and_google_auth_verifies_its_event_tokens() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs google-apps-chat into a venv under \
         the target directory), or point CLAWGATE_GOOGLE_CHAT_PYTHON at a python with \
         google-apps-chat",
        python.display()
    );
    let sim = GoogleChatSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let (url, got) = endpoint().await;
    sim.set_endpoint_url(Some(&url));
    let ada = sim.person("ada");
    let space = sim.create_space("room", SpaceKind::Room, Some(&ada));
    let question = sim.person_writes(&space, &ada, "a question", None).unwrap();
    assert!(sim.events_settled(Duration::from_secs(30)).await);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deliveries.json");
    std::fs::write(&file, serde_json::to_vec(&*got.lock().unwrap()).unwrap()).unwrap();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/google_chat_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_API_URL", sim.api_url())
        .env("SIM_TOKEN", sim.access_token())
        .env("SIM_SPACE", &space)
        .env("SIM_THREAD", &question.thread)
        .env("SIM_PERSON_MESSAGE", &question.name)
        .env("SIM_AUDIENCE", sim.audience())
        .env("SIM_CERTS_URL", sim.x509_url())
        .env("SIM_DELIVERIES", &file);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the google-apps-chat script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(
        stdout.contains("2 tokens verified, checks passed"),
        "{stdout}"
    );
    // What the client did is in the platform's record.
    let texts: Vec<String> = sim.messages(&space).into_iter().map(|m| m.text).collect();
    assert_eq!(texts, ["a question", "edited by google-apps-chat"]);
    let reply = sim
        .all_messages(&space)
        .into_iter()
        .find(|m| m.text == "in the thread");
    assert!(reply.is_some_and(|m| m.deleted && m.thread == question.thread));
    sim.stop().await;
}

#[tokio::test]
async fn google_auths_service_account_credentials_get_a_token_from_the_simulator() {
    let python = python();
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (it installs google-apps-chat, with google-auth, \
         into a venv under the target directory), or point CLAWGATE_GOOGLE_CHAT_PYTHON at a \
         python with google-apps-chat",
        python.display()
    );
    let sim = GoogleChatSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let email = "py-app@clawgate-simulator.iam.gserviceaccount.com";
    let key = sim.add_test_service_account(email);
    let ada = sim.person("ada");
    let space = sim.create_space("room", SpaceKind::Room, Some(&ada));
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/google_auth_check.py");
    let mut command = Command::new(&python);
    command
        .arg(&script)
        .env("SIM_KEY", &key)
        .env("SIM_TOKEN_URI", sim.token_uri())
        .env("SIM_API_URL", sim.api_url())
        .env("SIM_SPACE", &space);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the script's task")
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the google-auth script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
    // The endpoint's own record: one grant to the account, one invalid_grant to the stranger.
    let requests: Vec<_> = sim
        .token_requests()
        .into_iter()
        .map(|r| (r.client_email.unwrap_or_default(), r.status, r.error))
        .collect();
    assert_eq!(
        requests,
        [
            (email.to_owned(), 200, None),
            (
                "stranger@elsewhere.iam.gserviceaccount.com".to_owned(),
                400,
                Some("invalid_grant".to_owned())
            ),
        ]
    );
    assert_eq!(sim.tokens_issued(email), 1);
    let texts: Vec<String> = sim.messages(&space).into_iter().map(|m| m.text).collect();
    assert_eq!(texts, ["as a service account"]);
    sim.stop().await;
}
