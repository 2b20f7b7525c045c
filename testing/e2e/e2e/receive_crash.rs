//! kill -9 of a gateway-side process in the middle of a turn: after the restart each accepted
//! update is processed once and answered once.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use clawgate_channel_qa::{InboundRequest, LogEvent, QaPlatform, QaPlatformConfig};

const WORKER: &str = env!("CARGO_BIN_EXE_send-worker");

fn worker(dir: &std::path::Path, platform: &QaPlatform, boundary: &str) -> Command {
    let mut command = Command::new(WORKER);
    command.args([
        "turns",
        dir.to_str().unwrap(),
        &platform.base_url(),
        platform.token(),
        "idempotent",
        boundary,
    ]);
    command
}

async fn run_case(boundary: &str) {
    let platform = QaPlatform::start(QaPlatformConfig::default())
        .await
        .unwrap();
    for n in 1..=3 {
        platform
            .inject_inbound(
                "room-1",
                InboundRequest {
                    text: format!("q{n}"),
                    author_id: "alice".into(),
                    author_is_bot: false,
                    thread_id: None,
                    reply_to_id: None,
                    metadata: None,
                },
            )
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let (d, p) = (dir.path().to_path_buf(), &platform);
    tokio::task::block_in_place(|| {
        let mut child = worker(&d, p, boundary)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .next()
            .unwrap()
            .unwrap();
        assert!(
            line.starts_with("STOPPED"),
            "stopped at the boundary: {line}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let out = worker(&d, p, "none").output().unwrap();
        assert!(
            out.status.success(),
            "restart failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("DRAINED 3"),
            "every update finished after the restart: {stdout}"
        );
    });
    let log = platform.log();
    for n in 1..=3 {
        let replies = log
            .iter()
            .filter(|e| e.event == LogEvent::Sent && e.text == format!("re: q{n}"))
            .count();
        assert_eq!(
            replies, 1,
            "crash at {boundary}: q{n} answered exactly once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_accepting_an_update_it_is_processed_once_after_restart() {
    run_case("inbound_recorded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_reply_landed_the_reply_is_not_sent_twice() {
    run_case("reply_accepted").await;
}
