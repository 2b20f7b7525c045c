//! Bounded agent processes, black box: the real binary and the bundled agent, judged from the
//! conversations, the lease table, the process table and `status`.
//! - an idle session is closed (process gone, lease closed) and its next message resumes the
//!   ACP session with `session/load`; an agent that cannot load begins afresh, and the
//!   session's signal log says so;
//! - at `max_live` with every session busy, turns wait (counted in `status`) and none is lost;
//!   no more than `max_live` agent processes ever run; a turn that waits gets one busy notice;
//! - at the cap, the least recently used idle session makes room: its process serves the new
//!   session (or, with `reuse_processes = false`, ends and another starts);
//! - SIGKILL while sessions are being closed for idleness leaves no orphan and loses no reply.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{
    BIN, GatewayProcess, config_file_with_agent_keys, eventually, leftover_processes,
    processes_mentioning, state_pairs,
};

/// A gateway on the embedded QA platform with the bundled agent run with `agent_args` and
/// the `[[agents]]` keys `agent_keys`.
fn start(dir: &Path, agent_args: &[&str], agent_keys: &str) -> GatewayProcess {
    let mut command = vec![BIN.to_owned(), "demo-agent".to_owned()];
    command.extend(agent_args.iter().map(|a| (*a).to_owned()));
    let config = config_file_with_agent_keys(dir, None, &command, agent_keys);
    GatewayProcess::start(&dir.join("state"), &config)
}

/// `GET /v1/status` of the running gateway: its `gateway` part.
pub(crate) async fn status(gateway: &GatewayProcess) -> serde_json::Value {
    let runtime: serde_json::Value = serde_json::from_slice(
        &std::fs::read(gateway.state.join("gateway.json")).expect("gateway.json"),
    )
    .expect("JSON");
    let token = runtime["controlToken"].as_str().expect("token").to_owned();
    let view: serde_json::Value = reqwest::Client::new()
        .get(format!("{}/v1/status", gateway.url))
        .bearer_auth(token)
        .send()
        .await
        .expect("status answered")
        .json()
        .await
        .expect("status JSON");
    view["gateway"].clone()
}

/// The status figures of the agent pool: [evictions, hand-overs, live agent sessions].
async fn pool_figures(gateway: &GatewayProcess) -> [Option<u64>; 3] {
    let g = status(gateway).await;
    ["evictions", "handovers", "agentSessionsLive"].map(|figure| g[figure].as_u64())
}

/// The final texts of the agent in `conversation`.
async fn finals(gateway: &GatewayProcess, conversation: &str) -> Vec<String> {
    gateway
        .chat(conversation)
        .await
        .into_iter()
        .filter(|m| m["fromAgent"] == true && m["state"] == "final")
        .filter_map(|m| m["text"].as_str().map(str::to_owned))
        .collect()
}

async fn answered(gateway: &GatewayProcess, conversation: &str, prefix: &str, count: usize) {
    eventually(
        Duration::from_secs(60),
        &format!("{count} finals in {conversation}"),
        || async {
            let replies: Vec<String> = finals(gateway, conversation)
                .await
                .into_iter()
                .filter(|t| t.starts_with(prefix))
                .collect();
            (replies.len() >= count).then_some(replies)
        },
    )
    .await;
}

/// The lease rows (id, state) of the session of QA conversation `conversation`.
fn leases_of(state: &Path, conversation: &str) -> Vec<(String, String)> {
    state_pairs(
        state,
        &format!(
            "SELECT lease_id, state FROM acpx_leases WHERE session_key = 'agent:main:qa:{conversation}' \
             ORDER BY started_at"
        ),
    )
}

/// The agent processes (wrappers) of `state`'s gateway running now.
fn wrappers(gateway: &GatewayProcess) -> usize {
    let instance = state_pairs(
        &gateway.state,
        "SELECT 'instance', gateway_instance_id FROM acpx_leases LIMIT 1",
    )
    .into_iter()
    .next()
    .map(|(_, id)| id);
    instance.map_or(0, |id| {
        processes_mentioning(&id)
            .into_iter()
            .filter(|(_, cmdline)| cmdline.contains("acpx-wrapper"))
            .count()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_is_closed_and_its_next_message_resumes_it_with_session_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sessions = dir.path().join("agent-sessions");
    let sessions = sessions.to_str().expect("UTF-8");
    let gateway = start(
        dir.path(),
        &["--chunk-ms", "0", "--sessions-dir", sessions],
        "idle_close_secs = 1",
    );
    gateway.say("c1", "first").await;
    answered(&gateway, "c1", "echo: first", 1).await;
    // Idle for a second: closed through the controller.
    let closed = eventually(Duration::from_secs(20), "the idle close", || async {
        let g = status(&gateway).await;
        (g["idleCloses"] == 1 && g["agentSessionsLive"] == 0).then_some(g)
    })
    .await;
    assert_eq!(closed["turnsQueued"], 0);
    let first = leases_of(&gateway.state, "c1");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].1, "closed", "the lease is closed, not lost");
    assert_eq!(wrappers(&gateway), 0, "no agent process is left running");

    gateway.say("c1", "second").await;
    answered(&gateway, "c1", "echo: second", 1).await;
    let leases = leases_of(&gateway.state, "c1");
    assert_eq!(
        leases.len(),
        2,
        "a new process under a new lease: {leases:?}"
    );
    // The agent was asked to load the session the first process began, and had its reply.
    let log = gateway.log();
    assert!(
        log.contains("session/load sess-") && log.contains(": 1 earlier replies"),
        "the second process resumed the session: {log}"
    );
    assert!(!log.contains("began afresh"), "{log}");
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_load_begins_afresh_and_the_signal_log_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway = start(
        dir.path(),
        &["--chunk-ms", "0", "--no-load-session"],
        "idle_close_secs = 1",
    );
    gateway.say("c2", "first").await;
    answered(&gateway, "c2", "echo: first", 1).await;
    eventually(Duration::from_secs(20), "the idle close", || async {
        (status(&gateway).await["idleCloses"] == 1).then_some(())
    })
    .await;
    gateway.say("c2", "second").await;
    answered(&gateway, "c2", "echo: second", 1).await;
    let events = state_pairs(
        &gateway.state,
        "SELECT kind, summary FROM session_state_events WHERE session_key = 'agent:main:qa:c2'",
    );
    let afresh: Vec<_> = events
        .iter()
        .filter(|(_, summary)| summary.contains("began afresh"))
        .collect();
    assert_eq!(afresh.len(), 1, "one note in the signal log: {events:?}");
    assert!(
        afresh[0].1.contains("loadSession"),
        "it says why: {afresh:?}"
    );
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_live_turns_wait_none_is_lost_and_no_more_processes_run() {
    const CONVERSATIONS: usize = 5;
    let dir = tempfile::tempdir().expect("tempdir");
    // About 1.5 s a reply: five at once against a cap of two wait for each other.
    let gateway = start(
        dir.path(),
        &["--chunk-ms", "100", "--words", "15"],
        "max_live = 2\nbusy_notice_secs = 1",
    );
    for n in 0..CONVERSATIONS {
        gateway.say(&format!("b{n}"), &format!("busy {n}")).await;
    }
    let mut most = 0;
    let mut queued_seen = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        most = most.max(wrappers(&gateway));
        let g = status(&gateway).await;
        queued_seen = queued_seen.max(g["turnsQueued"].as_u64().unwrap_or(0));
        assert!(
            g["agentSessionsLive"].as_u64().unwrap_or(0) <= 2,
            "live sessions above the cap: {g}"
        );
        let mut done = 0;
        for n in 0..CONVERSATIONS {
            let replies = finals(&gateway, &format!("b{n}")).await;
            done += usize::from(
                replies
                    .iter()
                    .any(|t| t.starts_with(&format!("echo: busy {n}"))),
            );
        }
        if done == CONVERSATIONS {
            break;
        }
        assert!(Instant::now() < deadline, "not every message was answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        most <= 2,
        "{most} agent processes ran at once under max_live = 2"
    );
    assert!(queued_seen >= 1, "turns waited, and status showed them");
    let mut told = 0;
    for n in 0..CONVERSATIONS {
        let replies = finals(&gateway, &format!("b{n}")).await;
        let answers = replies
            .iter()
            .filter(|t| t.starts_with(&format!("echo: busy {n}")))
            .count();
        assert_eq!(answers, 1, "one final in b{n}: {replies:?}");
        let notices = replies.iter().filter(|t| t.contains("are busy")).count();
        assert!(notices <= 1, "at most one busy notice in b{n}: {replies:?}");
        told += notices;
        // The notice is the gateway's output, marked so a bot in a shared room drops its echo;
        // the agent's answer is not.
        for message in gateway.chat(&format!("b{n}")).await {
            let text = message["text"].as_str().unwrap_or_default();
            let code = &message["origin"]["code"];
            if text.contains("are busy") {
                assert_eq!(code, "agents_busy", "the busy notice is marked: {message}");
                assert_eq!(message["origin"]["kind"], "gateway_failure", "{message}");
            } else {
                assert!(code.is_null(), "only gateway notices are marked: {message}");
            }
        }
    }
    assert!(
        told >= 1,
        "a turn that waited over a second was told it is queued"
    );
    assert!(gateway.interrupt().success());
}

/// Three conversations at `max_live = 2`: l1, l2, l1 again, then l3, which needs l2's slot
/// (the least recently used); returns the gateway once l3 is answered.
async fn third_conversation_at_the_cap(dir: &Path, agent_keys: &str) -> GatewayProcess {
    let gateway = start(dir, &["--chunk-ms", "0"], agent_keys);
    for (conversation, text) in [("l1", "one"), ("l2", "two"), ("l1", "again")] {
        gateway.say(conversation, text).await;
        answered(&gateway, conversation, &format!("echo: {text}"), 1).await;
    }
    gateway.say("l3", "three").await;
    answered(&gateway, "l3", "echo: three", 1).await;
    gateway
}

/// The lease id a conversation's session row names (the last lease that served it).
fn row_lease(state: &Path, conversation: &str) -> String {
    state_pairs(
        state,
        &format!(
            "SELECT session_key, json_extract(payload, '$.leaseId') FROM sessions \
             WHERE session_key = 'agent:main:qa:{conversation}'"
        ),
    )
    .into_iter()
    .next()
    .map(|(_, lease)| lease)
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_the_least_recently_used_idle_sessions_process_serves_the_new_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway = third_conversation_at_the_cap(dir.path(), "max_live = 2").await;
    // l2 was the least recently used: its process, under its lease, serves l3 now.
    let l2 = row_lease(&gateway.state, "l2");
    assert_eq!(
        row_lease(&gateway.state, "l3"),
        l2,
        "l3 runs on l2's process"
    );
    assert_eq!(
        leases_of(&gateway.state, "l3"),
        [(l2.clone(), "open".to_owned())],
        "the lease names the session it serves now"
    );
    assert!(leases_of(&gateway.state, "l2").is_empty());
    let l1 = leases_of(&gateway.state, "l1");
    assert!(
        matches!(l1.as_slice(), [(id, s)] if *id != l2 && s == "open"),
        "the recently used one keeps its own: {l1:?}"
    );
    assert_eq!(wrappers(&gateway), 2, "no process ended, none started");
    assert_eq!(pool_figures(&gateway).await, [Some(1), Some(1), Some(2)]);
    // l2 again: l1 is now the least recently used, and its process takes l2 back.
    gateway.say("l2", "two again").await;
    answered(&gateway, "l2", "echo: two again", 1).await;
    assert_eq!(row_lease(&gateway.state, "l2"), l1[0].0);
    let state = gateway.state.clone();
    assert!(gateway.interrupt().success());
    assert!(leftover_processes(&state).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reuse_the_least_recently_used_idle_session_is_closed_to_make_room() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway =
        third_conversation_at_the_cap(dir.path(), "max_live = 2\nreuse_processes = false").await;
    let state = |conversation| {
        leases_of(&gateway.state, conversation)
            .last()
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    };
    assert_eq!(state("l2"), "closed", "the least recently used went");
    assert_eq!(state("l1"), "open", "the recently used one stays");
    assert_eq!(state("l3"), "open");
    assert_eq!(pool_figures(&gateway).await, [Some(1), Some(0), Some(2)]);
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_while_idle_sessions_close_leaves_no_orphan_and_loses_no_reply() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let keys = "idle_close_secs = 1";
    let gateway = start(dir.path(), &["--chunk-ms", "0"], keys);
    for n in 0..6 {
        gateway.say(&format!("k{n}"), &format!("kill {n}")).await;
    }
    for n in 0..6 {
        answered(&gateway, &format!("k{n}"), &format!("echo: kill {n}"), 1).await;
    }
    // The sweep runs every second once a session idled a second: kill inside that window.
    eventually(Duration::from_secs(20), "the first idle close", || async {
        (status(&gateway).await["idleCloses"].as_u64().unwrap_or(0) >= 1).then_some(())
    })
    .await;
    gateway.kill_hard();
    let gateway = start(dir.path(), &["--chunk-ms", "0"], keys);
    // The restarted gateway's reaper resolved every lease of the killed one.
    eventually(
        Duration::from_secs(20),
        "every earlier lease resolved",
        || async {
            let open: Vec<_> = crate::support::leases(&state)
                .into_iter()
                .filter(|(_, s)| s == "open" || s == "closing")
                .collect();
            open.is_empty().then_some(())
        },
    )
    .await;
    for n in 0..6 {
        gateway.say(&format!("k{n}"), &format!("after {n}")).await;
    }
    for n in 0..6 {
        answered(&gateway, &format!("k{n}"), &format!("echo: after {n}"), 1).await;
        let replies = finals(&gateway, &format!("k{n}")).await;
        assert_eq!(
            replies.len(),
            2,
            "one final per message in k{n}: {replies:?}"
        );
    }
    assert!(gateway.interrupt().success());
    assert!(leftover_processes(&state).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_conversation_cannot_starve_another_at_the_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    // One process for everyone, about half a second a reply.
    let gateway = start(
        dir.path(),
        &["--chunk-ms", "60", "--words", "8"],
        "max_live = 1\nbusy_notice_secs = 600",
    );
    for n in 0..4 {
        gateway.say("busy", &format!("flood {n}")).await;
    }
    answered(&gateway, "busy", "echo: flood 0", 1).await;
    // The flood's next turns are queued in their lane; another conversation writes now.
    gateway.say("quiet", "just one").await;
    answered(&gateway, "quiet", "echo: just one", 1).await;
    answered(&gateway, "busy", "echo: flood 3", 1).await;
    // Finals in the order they landed on the platform.
    let mut landed: Vec<(u64, String)> = Vec::new();
    for conversation in ["busy", "quiet"] {
        for m in gateway.chat(conversation).await {
            if m["fromAgent"] == true && m["state"] == "final" {
                landed.push((
                    m["seq"].as_u64().expect("seq"),
                    m["text"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
    }
    landed.sort();
    let quiet_at = landed
        .iter()
        .position(|(_, t)| t.starts_with("echo: just one"))
        .expect("the quiet conversation's final");
    assert!(
        quiet_at <= 2,
        "the quiet conversation waited for at most one more of the flood's turns: {landed:?}"
    );
    assert!(gateway.interrupt().success());
}
