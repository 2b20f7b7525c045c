//! Stale-state notices reach the agent: a watcher's next turn carries one line per changed
//! session, linking to that session's status on the control API, and is acknowledged only
//! once the agent answered — a gateway killed before that shows the notice again.

use std::path::Path;
use std::time::Duration;

use clawgate_channel_qa::QaPlatform;

use crate::support::{GatewayProcess, config_file, eventually, external_platform, state_pairs};

const COORDINATOR: &str = "agent:main:qa:coord";
const WORKER: &str = "agent:main:qa:worker";

/// The control API's address and token, from the running gateway's `gateway.json`.
fn control(state: &Path) -> (String, String) {
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.join("gateway.json")).expect("gateway.json while running"),
    )
    .expect("gateway.json is JSON");
    (
        info["url"].as_str().expect("url").to_owned(),
        info["controlToken"].as_str().expect("token").to_owned(),
    )
}

/// The agent's replies in `conversation`, oldest first (not the relayed session messages the
/// bot also writes there).
fn finals(platform: &QaPlatform, conversation: &str) -> Vec<String> {
    platform
        .messages(conversation)
        .into_iter()
        .filter(|m| m.author_is_bot && m.text.starts_with("echo:"))
        .map(|m| m.text)
        .collect()
}

async fn next_final(platform: &QaPlatform, conversation: &str, after: usize, ends: &str) -> String {
    eventually(Duration::from_secs(60), "the agent's final", || async {
        finals(platform, conversation)
            .get(after)
            .filter(|text| text.ends_with(ends))
            .cloned()
    })
    .await
}

/// `(watcher, notified version or "")` of the coordinator's cursor on the worker.
fn pending(state: &Path) -> Option<String> {
    state_pairs(
        state,
        "SELECT watcher_key, COALESCE(CAST(notified_version AS TEXT), '') \
         FROM session_watch_cursors WHERE target_key = 'agent:main:qa:worker'",
    )
    .into_iter()
    .find(|(watcher, _)| watcher == COORDINATOR)
    .map(|(_, notified)| notified)
}

/// A configuration on `platform` whose sessions see every session of their agent (the
/// coordinator watches a conversation it did not spawn).
fn config(dir: &Path, platform: &QaPlatform, agent_args: &[&str]) -> std::path::PathBuf {
    let path = config_file(dir, Some(platform), agent_args);
    let mut text = std::fs::read_to_string(&path).expect("config");
    text.push_str("\n[sessions]\nvisibility = \"agent\"\n");
    std::fs::write(&path, text).expect("config written");
    path
}

/// The coordinator watches the worker (through `sessions_send` with `watch`), and a person
/// then writes to the worker: the coordinator's cursor holds a pending notice.
async fn coordinator_watching_a_changed_worker(
    gateway: &GatewayProcess,
    platform: &QaPlatform,
    state: &Path,
) {
    gateway.say("coord", "hello").await;
    next_final(platform, "coord", 0, "hello").await;
    gateway.say("worker", "hi").await;
    next_final(platform, "worker", 0, "hi").await;
    let (url, token) = control(state);
    let sent: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{WORKER}/send"))
        .bearer_auth(&token)
        .json(&serde_json::json!({
            "message": "build it", "from": COORDINATOR, "watch": true
        }))
        .send()
        .await
        .expect("sessions send")
        .json()
        .await
        .expect("json");
    assert_eq!(sent["watched"], true, "{sent}");
    next_final(platform, "worker", 1, "build it").await;
    assert_eq!(
        pending(state).as_deref(),
        Some(""),
        "the coordinator's own message opens no notice for it"
    );
    gateway.say("worker", "the requirements changed").await;
    next_final(platform, "worker", 2, "the requirements changed").await;
    let notified = pending(state).expect("cursor");
    assert!(!notified.is_empty(), "a person's message opens a notice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchers_next_turn_carries_the_notice_with_a_link_and_acknowledges_it() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config(dir.path(), &platform, &["--chunk-ms", "0"]);
    let gateway = GatewayProcess::start(&state, &config);
    coordinator_watching_a_changed_worker(&gateway, &platform, &state).await;

    gateway.say("coord", "what is new").await;
    let reply = next_final(&platform, "coord", 1, "what is new").await;
    let (url, token) = control(&state);
    let link = reply
        .split_whitespace()
        .find(|word| word.starts_with(&format!("{url}/v1/sessions/{WORKER}?changesSince=")))
        .unwrap_or_else(|| panic!("the prompt carried the notice with its link: {reply}"))
        .to_owned();
    assert!(
        reply.starts_with(&format!(
            "echo: Session \"{WORKER}\" changed (another actor)."
        )),
        "{reply}"
    );
    assert_eq!(pending(&state).as_deref(), Some(""), "acknowledged");

    // The link answers the reconcile call: the person's message is among the changes.
    let status: serde_json::Value = reqwest::Client::new()
        .get(&link)
        .bearer_auth(&token)
        .send()
        .await
        .expect("status link")
        .json()
        .await
        .expect("json");
    let events = status["stateChanges"]["events"].as_array().expect("events");
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "human_direct_message" && e["actorId"] == "web-user"),
        "{status}"
    );

    // Seen once: the next turn has no notice.
    gateway.say("coord", "and now").await;
    let reply = next_final(&platform, "coord", 2, "and now").await;
    assert_eq!(reply, "echo: and now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_shown_to_a_turn_killed_before_its_answer_is_shown_again() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // Slow enough to kill mid-reply.
    let config = config(dir.path(), &platform, &["--chunk-ms", "150"]);
    let gateway = GatewayProcess::start(&state, &config);
    coordinator_watching_a_changed_worker(&gateway, &platform, &state).await;

    gateway.say("coord", "what is new").await;
    eventually(
        Duration::from_secs(30),
        "a preview of the notice",
        || async {
            platform
                .messages("coord")
                .into_iter()
                .any(|m| m.author_is_bot && m.text.contains("changed"))
                .then_some(())
        },
    )
    .await;
    gateway.kill_hard();
    assert!(
        !pending(&state).expect("cursor").is_empty(),
        "not acknowledged before the agent answered"
    );

    let restarted = GatewayProcess::start(&state, &config);
    eventually(
        Duration::from_secs(60),
        "the final after the restart",
        || async {
            pending(&state).filter(String::is_empty).and_then(|_| {
                finals(&platform, "coord")
                    .into_iter()
                    .rfind(|t| t.ends_with("what is new"))
            })
        },
    )
    .await;
    let replies = finals(&platform, "coord");
    assert_eq!(replies.len(), 2, "one reply per message: {replies:?}");
    assert!(
        replies[1].starts_with(&format!("echo: Session \"{WORKER}\" changed")),
        "the replayed turn showed the notice again: {replies:?}"
    );
    drop(restarted);
}
