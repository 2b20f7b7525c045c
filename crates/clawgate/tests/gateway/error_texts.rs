//! Error texts an operator can act on: a client error is a 4xx naming the real limit or the
//! unknown field, each cause is said once, and a process left alone after its pid was reused
//! is reported at the default log level.

use std::time::Duration;

use crate::support::{BIN, GatewayProcess, config_file, eventually, lease_processes, leases};

fn control_token(state: &std::path::Path) -> String {
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("gateway.json")).expect("gateway.json"))
            .expect("json");
    info["controlToken"].as_str().expect("token").to_owned()
}

async fn post(url: &str, token: Option<&str>, body: serde_json::Value) -> (u16, serde_json::Value) {
    let mut request = reqwest::Client::new().post(url).json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.expect("answered");
    let status = answer.status().as_u16();
    let body = answer.json().await.expect("a JSON body");
    (status, body)
}

/// A message longer than the QA platform takes (4000 characters) is the caller's to fix: 422
/// with the real numbers, on the control API and on the chat page alike; never a 502 with a
/// placeholder for the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_platform_limit_is_a_422_naming_the_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let token = control_token(&state);
    let long = "x".repeat(10_000);
    for (path, token) in [
        ("/v1/qa/send", Some(token.as_str())),
        ("/chat/api/send", None),
    ] {
        let (status, body) = post(
            &format!("{}{path}", gateway.url),
            token,
            serde_json::json!({ "conversation": "dm-long", "text": long }),
        )
        .await;
        let error = body["error"].as_str().unwrap_or_default();
        assert_eq!(status, 422, "{path}: {body}");
        assert!(
            error.contains("text is 10000 characters; the limit is 4000")
                && !error.contains("max_text_chars"),
            "{path}: the real length and limit: {error}"
        );
    }
    assert!(
        gateway.chat("dm-long").await.is_empty(),
        "nothing was written into the conversation"
    );
}

/// A body field a route does not know is refused by name (a typo is never silently ignored);
/// the chat page's own requests still go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_body_fields_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &["--chunk-ms", "1"]);
    let gateway = GatewayProcess::start(&state, &config);
    let token = control_token(&state);
    for (path, token, body, field) in [
        (
            "/v1/qa/send",
            Some(token.as_str()),
            serde_json::json!({ "conversation": "dm-u", "text": "hi", "colour": "red" }),
            "colour",
        ),
        (
            "/chat/api/send",
            None,
            serde_json::json!({ "conversation": "dm-u", "text": "hi", "autor": "x" }),
            "autor",
        ),
        (
            "/v1/sessions/agent:main:qa:dm-u/send",
            Some(token.as_str()),
            serde_json::json!({ "message": "hi", "wach": true }),
            "wach",
        ),
    ] {
        let (status, body) = post(&format!("{}{path}", gateway.url), token, body).await;
        assert_eq!(status, 400, "{path}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(&format!("unknown field `{field}`")),
            "{path}: names the field: {error}"
        );
    }
    assert!(
        gateway.chat("dm-u").await.is_empty(),
        "nothing refused was written"
    );
    // The chat page's own send (conversation, text, channel) still works.
    gateway.say("dm-u", "hello").await;
    eventually(Duration::from_secs(30), "the final", || async {
        gateway
            .chat("dm-u")
            .await
            .into_iter()
            .find(|m| m["fromAgent"] == true && m["state"] == "final")
    })
    .await;
}

/// `clawgate up` on `state`: it must fail; its stderr.
fn failed_start(state: &std::path::Path, config: &std::path::Path) -> String {
    let output = std::process::Command::new(BIN)
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .arg("up")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("clawgate runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "refused: {stderr}");
    stderr
}

/// Each cause of a failed start is said once: errors name their cause in their own text, and
/// the printed chain does not repeat it.
#[test]
fn each_cause_of_a_failed_start_is_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_file(dir.path(), None, &[]);

    // The state directory cannot be created: a file is in the way.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").expect("file");
    let stderr = failed_start(&file.join("state"), &config);
    assert!(
        stderr.contains("cannot create the state directory"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("Not a directory (os error 20)").count(),
        1,
        "said once: {stderr}"
    );

    // The database cannot be opened: a directory where state.db belongs.
    let state = dir.path().join("state");
    std::fs::create_dir_all(state.join("state.db")).expect("dir");
    let stderr = failed_start(&state, &config);
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("an error line: {stderr}"));
    let parts: Vec<&str> = error.split(": ").collect();
    for (n, part) in parts.iter().enumerate() {
        assert!(
            !parts[n + 1..].iter().any(|later| later.contains(part)),
            "{part:?} is said again later in: {error}"
        );
    }
    assert!(error.contains("state.db"), "{error}");
}

/// A lease whose recorded pid now names an unrelated live process (the agent died with its
/// gateway, and the pid was handed out again): the start leaves that process alone, marks the
/// lease lost, and says so at the default log level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_reused_by_a_stranger_is_reported_at_the_default_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &["--chunk-ms", "1"]);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-reuse", "hello").await;
    eventually(Duration::from_secs(30), "the final", || async {
        gateway
            .chat("dm-reuse")
            .await
            .into_iter()
            .find(|m| m["fromAgent"] == true && m["state"] == "final")
    })
    .await;
    let lease = leases(&state)[0].0.clone();
    gateway.kill_hard();
    eventually(
        Duration::from_secs(30),
        "the agent gone with its gateway",
        || async { lease_processes(&lease).is_empty().then_some(()) },
    )
    .await;

    // A stranger now holds the lease's pid (as far as the lease can tell: same pid, another
    // start time).
    let mut stranger = std::process::Command::new("sleep")
        .arg("120")
        .spawn()
        .expect("sleep");
    std::thread::sleep(Duration::from_millis(50));
    let db = rusqlite::Connection::open(state.join("state.db")).expect("state.db");
    let payload: String = db
        .query_row(
            "SELECT payload FROM acpx_leases WHERE lease_id = ?1",
            [&lease],
            |r| r.get(0),
        )
        .expect("lease row");
    let mut payload: serde_json::Value = serde_json::from_str(&payload).expect("json");
    assert_eq!(payload["state"], "open", "{payload}");
    payload["rootPid"] = serde_json::json!(stranger.id());
    db.execute(
        "UPDATE acpx_leases SET payload = ?1 WHERE lease_id = ?2",
        rusqlite::params![payload.to_string(), lease],
    )
    .expect("update");
    drop(db);

    let gateway = GatewayProcess::try_start(&state, &config, &[("CLAWGATE_LOG", "warn")])
        .unwrap_or_else(|why| panic!("{why}"));
    assert_eq!(
        stranger.try_wait().expect("try_wait"),
        None,
        "the stranger still runs"
    );
    assert_eq!(leases(&state)[0], (lease.clone(), "lost".to_owned()));
    let log = gateway.log();
    let line = log
        .lines()
        .find(|l| l.contains(&lease) && l.contains("not ours, not signalled"))
        .unwrap_or_else(|| panic!("a warning for lease {lease}: {log}"));
    assert!(
        line.contains("WARN") && line.contains(&format!("pid {} was reused", stranger.id())),
        "{line}"
    );
    let _ = stranger.kill();
    let _ = stranger.wait();
}
