//! Every listener `clawgate up` starts answers only to this machine: the embedded QA platform's
//! API and control routes refuse a non-loopback `Host` (DNS rebinding) and want its token.

use crate::support::{GatewayProcess, config_file, platform_token, platform_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_platform_refuses_other_hosts_and_callers_without_its_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let url = platform_url(&state, "qa");
    let token = platform_token(&state, "qa");
    let http = reqwest::Client::new();
    let inject = serde_json::json!({ "text": "injected", "authorId": "mallory" });
    let calls = || {
        [
            http.post(format!("{url}/control/conversations/c1/inbound"))
                .json(&inject),
            http.get(format!("{url}/control/log")),
            http.post(format!("{url}/control/webhook"))
                .json(&serde_json::json!({ "url": "http://evil.example/hook" })),
            http.post(format!("{url}/control/faults"))
                .json(&serde_json::json!([])),
            http.get(format!("{url}/api/updates")),
        ]
    };
    // A page that rebound its domain to 127.0.0.1: refused whatever it sends.
    for call in calls() {
        let answer = call
            .header(reqwest::header::HOST, "evil.example")
            .bearer_auth(&token)
            .send()
            .await
            .expect("answered");
        assert_eq!(
            answer.status(),
            reqwest::StatusCode::MISDIRECTED_REQUEST,
            "{}",
            answer.url()
        );
    }
    // This machine without the token: refused.
    for call in calls() {
        let answer = call.send().await.expect("answered");
        assert_eq!(
            answer.status(),
            reqwest::StatusCode::UNAUTHORIZED,
            "{}",
            answer.url()
        );
    }
    assert!(
        gateway.chat("c1").await.is_empty(),
        "nothing was injected into the conversation"
    );
    // With the token (from gateway.json, the user's alone): the platform's operator.
    let log = http
        .get(format!("{url}/control/log"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("answered");
    assert!(log.status().is_success(), "{}", log.status());
}

/// The gateway's listener takes no body over its one limit, on any route, authenticated or
/// not: a declared length over it is answered 413 before anything is read, a chunked body is
/// cut off at it (413 as well); refusals are JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_body_over_the_limit_with_413() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("gateway.json")).expect("gateway.json"))
            .expect("json");
    let token = info["controlToken"].as_str().expect("token").to_owned();
    let addr = gateway.url.trim_start_matches("http://").to_owned();

    // 50 MB announced, nothing sent: the answer comes without the body.
    for (path, auth) in [
        ("/v1/qa/send", format!("Authorization: Bearer {token}\r\n")),
        ("/chat/api/send", String::new()),
        (
            "/v1/sessions/agent:main:qa:x/send",
            format!("Authorization: Bearer {token}\r\n"),
        ),
    ] {
        let mut stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
             Content-Length: 52428800\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.expect("head");
        let mut answer = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            stream.read_to_end(&mut answer),
        )
        .await
        .expect("answered without waiting for the body")
        .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "{path}: {answer}");
        assert!(
            answer.contains("the limit of every route"),
            "{path}: {answer}"
        );
    }

    // Chunked, no length declared: cut off at the limit.
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/qa/send HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let chunk = "x".repeat(64 * 1024);
    let mut framed = format!("{:x}\r\n{{\"text\": \"{chunk}\r\n", chunk.len() + 10);
    for _ in 0..8 {
        // The server may answer and close before every chunk is written.
        if stream.write_all(framed.as_bytes()).await.is_err() {
            break;
        }
        framed = format!("{:x}\r\n{chunk}\r\n", chunk.len());
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await
    .expect("answered");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("\"error\""), "a JSON error: {answer}");

    // The chat page refuses a malformed body as the control API does: JSON, 400.
    let answer = reqwest::Client::new()
        .post(format!("{}/chat/api/send", gateway.url))
        .json(&serde_json::json!({ "conversation": "c", "text": 5 }))
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), reqwest::StatusCode::BAD_REQUEST);
    let body: serde_json::Value = answer.json().await.expect("a JSON error");
    assert!(body["error"].is_string(), "{body}");
}

/// `up --listen` follows the configuration file's rule: never a non-loopback address.
#[test]
fn up_refuses_a_non_loopback_listen_address_from_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:8640"] {
        let output = std::process::Command::new(crate::support::BIN)
            .arg("--config")
            .arg(&config)
            .arg("--state-dir")
            .arg(&state)
            .args(["up", "--listen", listen])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("clawgate runs");
        assert!(!output.status.success(), "{listen}: refused");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("is not a loopback address") && stderr.contains("--listen 127.0.0.1"),
            "{listen}: says why and what to do: {stderr}"
        );
        assert!(
            !state.join("gateway.json").exists(),
            "{listen}: nothing started"
        );
    }
}

/// The state directory is this user's alone: created 0700 with its files 0600 (the database,
/// its WAL and shared memory, the embedded platform's snapshot, gateway.json); one made wider
/// (by hand, or by an earlier build) is narrowed at start, and the operator is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_directory_and_its_files_are_private_to_the_user() {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("c1", "hello").await;
    crate::support::eventually(std::time::Duration::from_secs(30), "a reply", || async {
        (gateway.chat("c1").await.len() >= 2).then_some(())
    })
    .await;
    assert_eq!(mode(&state), 0o700, "the state directory");
    for file in [
        "state.db",
        "state.db-wal",
        "state.db-shm",
        "qa-platform.json",
        "gateway.json",
        "gateway.lock",
    ] {
        assert_eq!(mode(&state.join(file)), 0o600, "{file}");
    }
    assert!(gateway.interrupt().success());
    // A plain restart finds nothing to narrow, so it says nothing about it.
    let gateway = GatewayProcess::start(&state, &config);
    assert!(
        !gateway.printed("readable by other accounts"),
        "nothing was widened: {:?}",
        gateway.stdout.lock().expect("lines")
    );
    assert!(gateway.interrupt().success());

    // Widened by hand: narrowed at the next start, and said so.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(
        state.join("state.db"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let gateway = GatewayProcess::start(&state, &config);
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("state.db")), 0o600);
    assert!(
        gateway.printed("was readable by other accounts (0755); now 0700"),
        "the operator is told"
    );
    assert!(gateway.interrupt().success());
}

/// Every file and directory under `root` (itself included): its mode, and a file's bytes.
fn tree(root: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, (u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut found = std::collections::BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta =
            std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let bytes = if meta.is_file() {
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        } else {
            Vec::new()
        };
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read_dir") {
                pending.push(entry.expect("entry").path());
            }
        }
        found.insert(path, (meta.permissions().mode() & 0o7777, bytes));
    }
    found
}

/// `clawgate up` on `state` with `config`, which must refuse to start: its stderr. A gateway
/// that starts instead (it publishes gateway.json) is killed, and the test fails.
fn refused_start(state: &std::path::Path, config: &std::path::Path) -> String {
    use std::time::{Duration, Instant};
    let out = tempfile::tempdir().expect("tempdir");
    let stderr_file = out.path().join("stderr");
    let mut child = std::process::Command::new(crate::support::BIN)
        .arg("--config")
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .arg("up")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&stderr_file).expect("stderr file"))
        .spawn()
        .expect("clawgate runs");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if state.join("gateway.json").exists() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&stderr_file).expect("stderr");
    match status {
        Some(status) => assert!(!status.success(), "refused: {stderr}"),
        None => panic!("the gateway started instead of refusing; stderr: {stderr}"),
    }
    stderr
}

/// A channel account becomes part of the channel's name, its files and its stored state: one
/// that is not a plain name (`../../x`) stops the start with the key and the rule, before
/// anything is written, inside the state directory or out of it.
#[test]
fn a_channel_account_that_is_not_a_plain_name_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Deep enough that `../../x` from the state directory still lands in `dir`, where the
    // test looks.
    let state = dir.path().join("a/b/state");
    let config = config_file(dir.path(), None, &[]);
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(
        "\n[[channels]]\nkind = \"qa\"\naccount = \"../../x\"\n\
         settings = { poll_timeout_ms = 1000 }\n",
    );
    std::fs::write(&config, text).expect("config written");
    let before = tree(dir.path());
    let stderr = refused_start(&state, &config);
    assert!(
        stderr.contains("`channels[1].account`")
            && stderr.contains("\"../../x\"")
            && stderr.contains("letters, digits, `-` or `_`"),
        "names the key, the value and what is allowed: {stderr}"
    );
    assert_eq!(tree(dir.path()), before, "nothing was created");
}

/// A state the operator made read-only (the database, or the directory, without its owner's
/// write bit) is refused at start with the store's read-only error, and left exactly as it
/// was. The gateway reads the mode bits, so this holds for root too, whom the OS lets write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_state_is_refused_and_left_as_it_was() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("c1", "hello").await;
    let chat = crate::support::eventually(
        std::time::Duration::from_secs(30),
        "the final reply",
        || {
            let gateway = &gateway;
            async move {
                let chat = gateway.chat("c1").await;
                chat.iter()
                    .any(|m| m["fromAgent"] == true && m["state"] == "final")
                    .then_some(chat)
            }
        },
    )
    .await;
    assert!(gateway.interrupt().success());

    let state = std::fs::canonicalize(&state).expect("canonical");
    let db = state.join("state.db");
    for (path, read_only, writable) in [(&db, 0o444, 0o600), (&state, 0o555, 0o700)] {
        let chmod = |mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        };
        chmod(read_only);
        let before = tree(&state);
        let stderr = refused_start(&state, &config);
        assert!(
            stderr.contains("is read-only")
                && stderr.contains(&path.display().to_string())
                && stderr.contains(&format!("{read_only:04o}"))
                && stderr.contains("chmod u+w"),
            "says what is read-only and what to do: {stderr}"
        );
        assert_eq!(
            tree(&state),
            before,
            "{:04o} {}: nothing in the state changed, modes and bytes",
            read_only,
            path.display()
        );
        chmod(writable);
    }

    // Writable again: the conversation is all there.
    let gateway = GatewayProcess::start(&state, &config);
    assert_eq!(gateway.chat("c1").await, chat);
    assert!(gateway.interrupt().success());
}

/// Narrowing takes away group and other bits and nothing else: a 0644 database becomes 0600,
/// a 0750 directory 0700, and a file the operator made 0444 becomes 0400, not writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narrowing_takes_away_only_group_and_other_bits() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    assert!(GatewayProcess::start(&state, &config).interrupt().success());
    let notes = state.join("operator-notes.txt");
    std::fs::write(&notes, "kept as it is").expect("notes");
    for (path, mode) in [
        (&state, 0o750),
        (&state.join("state.db"), 0o644),
        (&notes, 0o444),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let gateway = GatewayProcess::start(&state, &config);
    for (path, was, now) in [
        (&state, 0o750, 0o700),
        (&state.join("state.db"), 0o644, 0o600),
        (&notes, 0o444, 0o400),
    ] {
        let mode = std::fs::metadata(path).expect("meta").permissions().mode() & 0o7777;
        assert_eq!(mode, now, "{}", path.display());
        let line = format!("was readable by other accounts ({was:04o}); now {now:04o}");
        assert!(gateway.printed(&line), "the operator is told: {line}");
    }
    assert!(gateway.interrupt().success());
}
