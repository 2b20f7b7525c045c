//! kill -9 at every lifecycle boundary of a durable send, restart, recover, and count what
//! landed on the QA platform: every final exactly once with the idempotent adapter, and never a
//! blind replay without it.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};

use clawgate_channel_qa::{LogEvent, QaPlatform, QaPlatformConfig};

const WORKER: &str = env!("CARGO_BIN_EXE_send-worker");

/// Two units (over the QA 4,000-character limit) so a crash can fall between them.
fn two_unit_text() -> String {
    format!("{}{}", "x".repeat(4_000), "y".repeat(100))
}

/// Runs `send` until the worker stops at `boundary`, then SIGKILLs it.
fn send_and_kill(dir: &std::path::Path, platform: &QaPlatform, variant: &str, boundary: &str) {
    let mut child = Command::new(WORKER)
        .args([
            "send",
            dir.to_str().unwrap(),
            &platform.base_url(),
            platform.token(),
            variant,
            boundary,
            &two_unit_text(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(
        line,
        format!("STOPPED {boundary}"),
        "the worker must stop at the boundary"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Restarts the worker in recovery mode and returns the final status of each intent.
fn recover(dir: &std::path::Path, platform: &QaPlatform, variant: &str) -> Vec<String> {
    let output = Command::new(WORKER)
        .args([
            "recover",
            dir.to_str().unwrap(),
            &platform.base_url(),
            platform.token(),
            variant,
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "recovery failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            l.strip_prefix("INTENT ")
                .map(|rest| rest.split(' ').nth(1).unwrap_or("").to_owned())
        })
        .collect()
}

/// How many times each unit's text landed (unit 0 is the x-run, unit 1 the y-run).
fn landings(platform: &QaPlatform) -> (usize, usize) {
    let log = platform.log();
    let sent = |c: char| {
        log.iter()
            .filter(|e| e.event == LogEvent::Sent && e.text.starts_with(c))
            .count()
    };
    (sent('x'), sent('y'))
}

async fn platform() -> QaPlatform {
    QaPlatform::start(QaPlatformConfig::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_adapter_lands_every_final_exactly_once_after_a_crash_at_any_boundary() {
    for boundary in ["intent_recorded", "unit_delivered_0", "platform_accepted"] {
        let platform = platform().await;
        let dir = tempfile::tempdir().unwrap();
        let (p, d) = (&platform, dir.path().to_path_buf());
        tokio::task::block_in_place(|| send_and_kill(&d, p, "idempotent", boundary));
        let statuses = tokio::task::block_in_place(|| recover(&d, p, "idempotent"));
        assert_eq!(
            statuses,
            vec!["sent"],
            "crash at {boundary}: recovered and committed"
        );
        assert_eq!(
            landings(&platform),
            (1, 1),
            "crash at {boundary}: each unit landed exactly once"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_without_reconciliation_never_replays_blindly_after_a_crash() {
    // (boundary, final status, landings): before any I/O recovery may send; after possible I/O
    // the outcome stays unknown for an operator and nothing is sent twice. (The receipt and its
    // commit are one write, so there is no durable point between them to crash at.)
    let cases = [
        ("intent_recorded", "sent", (1, 1)),
        ("unit_delivered_0", "unknown_after_send", (1, 0)),
        ("platform_accepted", "unknown_after_send", (1, 1)),
    ];
    for (boundary, status, landed) in cases {
        let platform = platform().await;
        let dir = tempfile::tempdir().unwrap();
        let (p, d) = (&platform, dir.path().to_path_buf());
        tokio::task::block_in_place(|| send_and_kill(&d, p, "plain", boundary));
        let statuses = tokio::task::block_in_place(|| recover(&d, p, "plain"));
        assert_eq!(statuses, vec![status], "crash at {boundary}");
        assert_eq!(
            landings(&platform),
            landed,
            "crash at {boundary}: no blind replay"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_preview_visible_at_a_kill_is_cleaned_after_restart() {
    let platform = platform().await;
    let dir = tempfile::tempdir().unwrap();
    let (p, d) = (&platform, dir.path().to_path_buf());
    tokio::task::block_in_place(|| {
        let mut child = Command::new(WORKER)
            .args([
                "live",
                d.to_str().unwrap(),
                &p.base_url(),
                p.token(),
                "idempotent",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line = BufReader::new(child.stdout.take().unwrap())
            .lines()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(line, "STOPPED live_preview");
        child.kill().unwrap();
        child.wait().unwrap();
    });
    assert_eq!(
        platform.messages("room-1").len(),
        1,
        "the preview was visible at the kill"
    );
    let statuses = tokio::task::block_in_place(|| recover(&d, p, "idempotent"));
    assert_eq!(statuses, vec!["cancelled"], "the stream died with its turn");
    assert!(
        platform.messages("room-1").is_empty(),
        "the preview is not left dangling"
    );
}
