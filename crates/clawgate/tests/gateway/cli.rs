//! The operator CLI as an operator runs it: on a stopped gateway's state directory (seeded
//! through the store) and through a running gateway's control API.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use clawgate::{qa, views};
use clawgate_store::testing::sample_intent;
use clawgate_store::{
    InboundKey, InboundStatus, InboundStore, InstanceStore, IntentStore, LeaseStore,
};
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::{
    AcpxProcessLease, DeliveryFailure, DeliveryFailureKind, DurableSendIntent, FailureReason,
    IntentStatus, LeaseId, LeaseState, SessionKey, SessionStateEvent, SessionStateEventKind,
};
use serde::de::DeserializeOwned;

use crate::support::{BIN, GatewayProcess, config_file};

/// One finished CLI run.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json<T: DeserializeOwned>(&self) -> T {
        assert!(self.ok, "command failed: {}", self.stderr);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not the wire JSON ({e}): {}", self.stdout))
    }

    fn failed_with(&self, needle: &str) {
        assert!(!self.ok, "expected a failure, got: {}", self.stdout);
        assert!(
            self.stderr.contains(needle),
            "stderr lacks {needle:?}: {}",
            self.stderr
        );
    }
}

fn clawgate(state: &Path, args: &[&str]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN)
        .arg("--state-dir")
        .arg(state)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("clawgate runs");
    Run {
        ok: status.success(),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn open(state: &Path) -> SqliteStore {
    std::fs::create_dir_all(state).expect("state dir");
    clawgate_store_sqlite::testing::open_store(state)
}

/// Records intent `n` and walks it to `status` through legal moves.
async fn seed_intent(store: &SqliteStore, n: u64, status: IntentStatus) -> DurableSendIntent {
    seed_intent_at(store, n, status, 1_000 + n as i64).await
}

/// [`seed_intent`], created and last changed at `at`.
async fn seed_intent_at(
    store: &SqliteStore,
    n: u64,
    status: IntentStatus,
    at: i64,
) -> DurableSendIntent {
    use IntentStatus::*;
    let mut intent = sample_intent(n, at);
    store.insert_intent(&intent, None).await.expect("insert");
    let path: &[IntentStatus] = match status {
        Pending => &[],
        UnknownAfterSend => &[Sending, UnknownAfterSend],
        Sent => &[Sending, Committing, Sent],
        Failed => &[Failed],
        other => panic!("no seed path to {other}"),
    };
    for next in path {
        let before = intent.status;
        intent.status = *next;
        if *next == Failed {
            intent.failure = Some(DeliveryFailure {
                kind: DeliveryFailureKind::Transient,
                message: "platform answered 503".into(),
                reason: Some(FailureReason::MaxAttemptsExceeded),
                retry_after_ms: None,
                platform_code: Some("503".into()),
                at: 2_000,
            });
        }
        store
            .save_intent(&intent, before, None)
            .await
            .expect("walk");
    }
    intent
}

#[test]
fn stopped_outbox_lists_retries_and_cancels_by_the_transition_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let rt = runtime();
    let (failed, unknown, pending, sent) = rt.block_on(async {
        let store = open(&state);
        (
            seed_intent(&store, 1, IntentStatus::Failed).await,
            seed_intent(&store, 2, IntentStatus::UnknownAfterSend).await,
            seed_intent(&store, 3, IntentStatus::Pending).await,
            seed_intent(&store, 4, IntentStatus::Sent).await,
        )
    });

    let all = clawgate(&state, &["outbox", "list", "--json"]);
    assert!(
        all.stderr.contains("gateway not running"),
        "says which mode: {}",
        all.stderr
    );
    let all: views::OutboxList = all.json();
    let statuses: Vec<IntentStatus> = all.intents.iter().map(|i| i.status).collect();
    use IntentStatus::*;
    assert_eq!(statuses, [Failed, UnknownAfterSend, Pending, Sent]);
    assert_eq!(
        all.intents[0].failure_reason,
        Some(FailureReason::MaxAttemptsExceeded)
    );
    assert!(!all.more);

    let stuck: views::OutboxList = clawgate(
        &state,
        &[
            "outbox",
            "list",
            "--status",
            "failed,unknown_after_send",
            "--json",
        ],
    )
    .json();
    assert_eq!(stuck.intents.len(), 2);
    let table = clawgate(&state, &["outbox", "list", "--status", "failed"]);
    assert!(table.ok, "{}", table.stderr);
    assert!(
        table.stdout.starts_with("ID ")
            && table.stdout.contains(failed.id.as_str())
            && table.stdout.contains("transient/max_attempts_exceeded")
            && !table.stdout.contains(sent.id.as_str()),
        "{}",
        table.stdout
    );

    // failed → pending, due now.
    let retried = clawgate(&state, &["outbox", "retry", failed.id.as_str()]);
    assert!(retried.ok, "{}", retried.stderr);
    assert!(
        retried.stdout.contains("failed -> pending"),
        "{}",
        retried.stdout
    );
    let shown: DurableSendIntent =
        clawgate(&state, &["outbox", "show", failed.id.as_str(), "--json"]).json();
    assert_eq!(shown.status, Pending);
    assert!(shown.next_attempt_at.is_some(), "due: {shown:?}");

    // unknown_after_send → pending is the operator's call, with a warning.
    let retried: views::OutboxAction =
        clawgate(&state, &["outbox", "retry", unknown.id.as_str(), "--json"]).json();
    assert_eq!(retried.previous_status, UnknownAfterSend);
    assert!(
        retried
            .warning
            .as_deref()
            .is_some_and(|w| w.contains("duplicates")),
        "{retried:?}"
    );

    // pending → cancelled, with the operator's reason.
    let cancelled: views::OutboxAction =
        clawgate(&state, &["outbox", "cancel", pending.id.as_str(), "--json"]).json();
    assert_eq!(cancelled.intent.status, Cancelled);
    assert_eq!(
        cancelled.intent.failure_reason,
        Some(FailureReason::OperatorCancelled)
    );

    // Illegal moves are refused and say why; nothing changes.
    clawgate(&state, &["outbox", "cancel", sent.id.as_str()])
        .failed_with(&format!("cannot cancel send intent {} (sent)", sent.id));
    clawgate(&state, &["outbox", "retry", pending.id.as_str()]).failed_with("cancelled");
    clawgate(&state, &["outbox", "show", "intent-999999"]).failed_with("no send intent");
    clawgate(&state, &["outbox", "list", "--status", "lost"]).failed_with("unknown intent status");
    let after: views::OutboxList = clawgate(&state, &["outbox", "list", "--json"]).json();
    let statuses: Vec<IntentStatus> = after.intents.iter().map(|i| i.status).collect();
    assert_eq!(statuses, [Pending, Pending, Cancelled, Sent]);
}

#[test]
fn stopped_inbox_leases_and_status_read_the_state_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let rt = runtime();
    let lease_id = rt.block_on(async {
        let store = open(&state);
        seed_intent(&store, 1, IntentStatus::Failed).await;
        // A live reply a dead gateway left mid-stream: no final recorded yet.
        let mut streaming = sample_intent(2, 1_002);
        streaming.batch = None;
        streaming.live_state = Some(clawgate_types::LiveMessageState::empty(
            clawgate_types::LiveMode::Partial,
        ));
        store.insert_intent(&streaming, None).await.expect("insert");
        for (event, dead) in [("ev-1", false), ("ev-2", true)] {
            let key = InboundKey {
                channel: "qa".into(),
                account_id: "default".into(),
                event_id: event.into(),
            };
            let payload = serde_json::json!({"target": {"id": "room-7"}, "body": {"text": event}});
            store
                .record_inbound(&key, &payload, 10)
                .await
                .expect("record");
            let (status, error) = if dead {
                (InboundStatus::DeadLettered, Some("agent crashed"))
            } else {
                (InboundStatus::Completed, None)
            };
            store
                .finish_inbound(&key, status, error, 20)
                .await
                .expect("finish");
        }
        // A lease whose wrapper never reported a pid: provably not running.
        let lease = AcpxProcessLease {
            lease_id: LeaseId::parse("lease-cli-1").expect("id"),
            gateway_instance_id: store.gateway_instance_id().await.expect("instance"),
            session_key: SessionKey::parse("agent:main:qa:room-7").expect("key"),
            wrapper_root: "/nonexistent".into(),
            wrapper_path: "/nonexistent/clawgate".into(),
            root_pid: None,
            root_start_time: None,
            boot_id: None,
            process_group_id: None,
            command_hash: "0".repeat(64),
            started_at: 30,
            state: LeaseState::Open,
            ended_at: None,
            survivors: Vec::new(),
            stderr_tail: Vec::new(),
        };
        store.insert_lease(&lease).await.expect("lease");
        lease.lease_id
    });

    let inbox: views::InboxList = clawgate(&state, &["inbox", "list", "--json"]).json();
    assert_eq!(inbox.records.len(), 2);
    let dead: views::InboxList = clawgate(
        &state,
        &["inbox", "list", "--status", "dead_lettered", "--json"],
    )
    .json();
    let [record] = dead.records.as_slice() else {
        panic!("one dead letter: {dead:?}")
    };
    assert_eq!(record.event_id, "ev-2");
    assert_eq!(record.attempts, 1);
    assert_eq!(record.last_error.as_deref(), Some("agent crashed"));
    assert_eq!(record.conversation.as_deref(), Some("room-7"));
    let table = clawgate(&state, &["inbox", "list"]);
    assert!(
        table.stdout.contains("dead_lettered") && table.stdout.contains("agent crashed"),
        "{}",
        table.stdout
    );

    let status: views::StatusView = clawgate(&state, &["status", "--json"]).json();
    assert!(!status.running && status.gateway.is_none());
    assert_eq!(status.intents[&IntentStatus::Failed], 1);
    assert_eq!(status.intents[&IntentStatus::Sent], 0);
    assert_eq!(
        (
            status.intents[&IntentStatus::Pending],
            status.replies_streaming
        ),
        (1, 1),
        "the pending reply is one without a final"
    );
    assert_eq!(status.inbound_dead_lettered, 1);
    assert_eq!(status.inbound_unfinished, 0);
    assert_eq!(status.open_leases, 1);
    assert_eq!(status.schema_version, status.supported_schema_version);
    let text = clawgate(&state, &["status"]);
    assert!(
        text.stdout.contains("not running")
            && text.stdout.contains("failed 1")
            && text
                .stdout
                .contains("pending 1 (1 streaming, no final yet)"),
        "{}",
        text.stdout
    );
    let outbox = clawgate(&state, &["outbox", "list", "--status", "pending"]);
    assert!(
        outbox.stdout.contains("pending (streaming, no final yet)"),
        "{}",
        outbox.stdout
    );

    let leases: views::LeaseList = clawgate(&state, &["leases", "list", "--json"]).json();
    assert_eq!(leases.leases.len(), 1);
    assert_eq!(leases.leases[0].state, LeaseState::Open);
    // Reaping a lease that never reported a process signals nothing and marks it lost.
    let reaped: views::ReapSummary = clawgate(&state, &["leases", "reap", "--json"]).json();
    let [outcome] = reaped.outcomes.as_slice() else {
        panic!("one lease reaped: {reaped:?}")
    };
    assert_eq!(outcome.lease_id, lease_id);
    assert_eq!(outcome.result, views::ReapResult::Lost);
    let lost: views::LeaseList =
        clawgate(&state, &["leases", "list", "--state", "lost", "--json"]).json();
    assert_eq!(lost.leases.len(), 1);
    let open: views::LeaseList =
        clawgate(&state, &["leases", "list", "--state", "open", "--json"]).json();
    assert!(open.leases.is_empty());
}

#[test]
fn migrate_creates_and_upgrades_a_state_database() {
    use clawgate_store_sqlite::SCHEMA_VERSION;
    let dir = tempfile::tempdir().expect("tempdir");
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("dir");
    clawgate(&empty, &["status"]).failed_with("no state database");
    let first = clawgate(&empty, &["migrate"]);
    assert!(first.ok, "{}", first.stderr);
    assert!(
        first
            .stdout
            .contains(&format!("schema version 0 -> {SCHEMA_VERSION}"))
            && (1..=SCHEMA_VERSION)
                .all(|v| first.stderr.contains(&format!("applying migration {v:04}"))),
        "progress and result: {} / {}",
        first.stdout,
        first.stderr
    );
    assert!(empty.join("state.db").is_file());
    let again = clawgate(&empty, &["migrate"]);
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    let status: views::StatusView = clawgate(&empty, &["status", "--json"]).json();
    assert_eq!(status.schema_version, SCHEMA_VERSION);

    // One migration behind (a state written by the previous build): an operator's read
    // refuses it and changes nothing; `migrate` brings it up.
    let older = dir.path().join("older");
    std::fs::create_dir(&older).expect("dir");
    let db = older.join("state.db");
    {
        let conn = rusqlite::Connection::open(&db).expect("open");
        conn.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, \
             applied_at INTEGER NOT NULL) STRICT",
        )
        .expect("migrations table");
        for m in &clawgate_store_sqlite::MIGRATIONS[..clawgate_store_sqlite::MIGRATIONS.len() - 1] {
            conn.execute_batch(m.sql).expect("migration");
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?1, ?2, 1)",
                rusqlite::params![m.version, m.name],
            )
            .expect("recorded");
        }
    }
    let recorded = |db: &Path| -> i64 {
        rusqlite::Connection::open(db)
            .expect("open")
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .expect("count")
    };
    for command in [&["status"][..], &["outbox", "list"]] {
        clawgate(&older, command).failed_with(&format!(
            "schema version {}, this build needs {SCHEMA_VERSION}: run `clawgate migrate` first",
            SCHEMA_VERSION - 1
        ));
    }
    assert_eq!(
        recorded(&db),
        SCHEMA_VERSION - 1,
        "the refusal applied nothing"
    );
    let upgraded = clawgate(&older, &["migrate"]);
    assert!(upgraded.ok, "{}", upgraded.stderr);
    assert_eq!(recorded(&db), SCHEMA_VERSION);
    let listed = clawgate(&older, &["outbox", "list"]);
    assert!(listed.ok, "a current schema opens: {}", listed.stderr);

    // Written by a newer build: `migrate` refuses as `up` does, and changes nothing.
    let newer = dir.path().join("newer");
    std::fs::create_dir(&newer).expect("dir");
    std::fs::copy(empty.join("state.db"), newer.join("state.db")).expect("copy");
    rusqlite::Connection::open(newer.join("state.db"))
        .expect("open")
        .execute(
            "INSERT INTO schema_migrations VALUES (99, 'from the future', 1)",
            [],
        )
        .expect("a newer migration");
    clawgate(&newer, &["migrate"]).failed_with(&format!(
        "has schema version 99, newer than the {SCHEMA_VERSION} this build knows"
    ));
    assert_eq!(recorded(&newer.join("state.db")), SCHEMA_VERSION + 1);

    let missing = dir.path().join("missing");
    clawgate(&missing, &["migrate"]).failed_with("--create");
    assert!(!missing.exists(), "nothing created without --create");
    let created = clawgate(&missing, &["migrate", "--create"]);
    assert!(
        created.ok && missing.join("state.db").is_file(),
        "{}",
        created.stderr
    );
}

/// A following command (`qa tail`, `sessions watch`) and the JSON lines it printed.
struct Follower {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Follower {
    fn start(state: &Path, args: &[&str]) -> Follower {
        let mut child = Command::new(BIN)
            .arg("--state-dir")
            .arg(state)
            .args(args)
            .arg("--json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the follower starts");
        let (tx, lines) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Follower {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first printed object (one per line) `found` accepts, within `timeout`.
    fn wait_for<T: DeserializeOwned>(
        &mut self,
        timeout: Duration,
        what: &str,
        found: impl Fn(&T) -> bool,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = self.lines.recv_timeout(left) else {
                panic!("no {what} within {timeout:?}; printed: {:#?}", self.seen);
            };
            let value: T = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not one JSON object a line ({e}): {line}"));
            self.seen.push(line);
            if found(&value) {
                return value;
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `check` to return `Some`, polling the CLI.
fn eventually<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Retention runs when the gateway starts (then hourly): replies finished before the outbox
/// window go; a reply finished within it and intents waiting for an operator stay.
#[test]
fn a_running_gateway_prunes_replies_finished_before_the_outbox_window() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let rt = runtime();
    let (old, kept) = rt.block_on(async {
        let store = open(&state);
        // Seeded intents carry 1970 timestamps: far past any window.
        let old = seed_intent(&store, 1, IntentStatus::Sent).await;
        let mut kept = vec![
            seed_intent(&store, 2, IntentStatus::Failed).await,
            seed_intent(&store, 3, IntentStatus::UnknownAfterSend).await,
        ];
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        kept.push(seed_intent_at(&store, 4, IntentStatus::Sent, now).await);
        (old, kept)
    });
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let store = open(&state);
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.load_intent(&old.id).await.expect("load").is_some() {
            assert!(Instant::now() < deadline, "the old reply was never pruned");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for intent in &kept {
            assert!(
                store.load_intent(&intent.id).await.expect("load").is_some(),
                "{} ({}) must stay",
                intent.id,
                intent.status
            );
        }
    });
    drop(gateway);
}

#[test]
fn operator_commands_go_through_a_running_gateway() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let pid = gateway.child.id();
    let cli = |args: &[&str]| {
        let mut all = vec!["--config", config.to_str().expect("utf-8 path")];
        all.extend_from_slice(args);
        clawgate(&state, &all)
    };

    let status = cli(&["status", "--json"]);
    assert!(
        status.stderr.contains(&format!(
            "(via running gateway pid {pid} at {})",
            gateway.url
        )),
        "says it went through the gateway: {}",
        status.stderr
    );
    let status: views::StatusView = status.json();
    assert!(status.running);
    assert_eq!(status.gateway.as_ref().map(|g| g.pid), Some(pid));

    // `qa tail` follows the conversation while a person writes into it from the terminal.
    let mut tail = Follower::start(&state, &["qa", "tail", "--conversation", "cli-e2e"]);
    let sent = cli(&[
        "qa",
        "send",
        "--conversation",
        "cli-e2e",
        "hello from a terminal",
    ]);
    assert!(sent.ok, "{}", sent.stderr);
    let own = tail.wait_for(
        Duration::from_secs(30),
        "the person's message",
        |m: &qa::QaMessage| !m.from_agent,
    );
    assert_eq!(own.text, "hello from a terminal");
    assert_eq!(own.author_id.as_deref(), Some("operator"));
    let final_reply = tail.wait_for(
        Duration::from_secs(60),
        "the final reply",
        |m: &qa::QaMessage| m.from_agent && m.state == qa::QaMessageState::Final,
    );
    assert!(
        final_reply.text.starts_with("echo: hello from a terminal"),
        "{final_reply:?}"
    );
    drop(tail);

    // The session exists, with the turn in its signal log.
    let key = "agent:main:qa:cli-e2e";
    let sessions: views::SessionsListResult = cli(&["sessions", "list", "--json"]).json();
    assert!(
        sessions.sessions.iter().any(|s| s.key.as_str() == key),
        "{sessions:?}"
    );
    let changes: views::SessionStatusResult =
        cli(&["sessions", "status", key, "--changes-since", "0", "--json"]).json();
    let events = changes.state_changes.expect("changes").events;
    assert!(
        events
            .iter()
            .any(|e| e.actor_id.as_deref() == Some("operator")),
        "the person's message is in the log: {events:?}"
    );

    // sessions_send lands in the conversation as `session:operator`, and the agent answers;
    // `sessions watch` sees the message arrive in the session's signal log.
    // Explicit --since: the watcher may poll first only after the send.
    let now: views::SessionStatusResult = cli(&["sessions", "status", key, "--json"]).json();
    let since = now.state_version.0.to_string();
    let mut watch = Follower::start(&state, &["sessions", "watch", key, "--since", &since]);
    let delivered: views::SessionsSendResult =
        cli(&["sessions", "send", key, "ping from the operator", "--json"]).json();
    assert_eq!(delivered.session_key.as_str(), key);
    let seen = watch.wait_for(
        Duration::from_secs(30),
        "the sent message in the signal log",
        |e: &SessionStateEvent| e.actor_id.as_deref() == Some("session:operator"),
    );
    assert_eq!(seen.kind, SessionStateEventKind::HumanDirectMessage);
    drop(watch);
    eventually(
        Duration::from_secs(60),
        "the answer to sessions send",
        || {
            let history: views::SessionsHistoryResult =
                cli(&["sessions", "history", key, "--json"]).json();
            let asked = history
                .events
                .iter()
                .any(|e| e.actor_id.as_deref() == Some("session:operator"));
            let answered = history
                .events
                .iter()
                .filter(|e| e.kind == SessionStateEventKind::RunCompleted)
                .count();
            (asked && answered >= 2).then_some(())
        },
    );

    // The replies are sent intents; errors come back as the API's answers.
    let outbox: views::OutboxList = cli(&["outbox", "list", "--json"]).json();
    assert!(
        outbox.intents.len() >= 2
            && outbox
                .intents
                .iter()
                .all(|i| i.status == IntentStatus::Sent),
        "{outbox:?}"
    );
    let first = outbox.intents[0].id.to_string();
    cli(&["outbox", "cancel", &first]).failed_with("(HTTP 409)");
    cli(&["outbox", "list", "--status", "bogus"]).failed_with("(HTTP 400)");
    cli(&["sessions", "status", "agent:main:qa:nobody"]).failed_with("(HTTP 404)");
    let open: views::LeaseList = cli(&["leases", "list", "--state", "open", "--json"]).json();
    assert_eq!(
        open.leases.len(),
        1,
        "the conversation's agent runs: {open:?}"
    );

    let exit = gateway.interrupt();
    assert!(exit.success(), "clean exit: {exit:?}");
    let after = cli(&["status", "--json"]);
    assert!(
        after.stderr.contains("gateway not running"),
        "{}",
        after.stderr
    );
    let after: views::StatusView = after.json();
    assert_eq!(after.open_leases, 0, "Ctrl-C closed the agent's lease");
}

#[test]
fn the_bundled_agent_explains_its_options() {
    let output = std::process::Command::new(crate::support::BIN)
        .args(["demo-agent", "--help"])
        .stdin(std::process::Stdio::piped())
        .output()
        .expect("clawgate demo-agent runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    for option in ["--chunk-ms", "--words", "echo: <prompt text>"] {
        assert!(text.contains(option), "--help explains {option}: {text}");
    }
}
