//! Real ACP agents from npm, offline: Codex's adapter (`@zed-industries/codex-acp` 0.16.0, its
//! linux-x64 binary) and Claude Code's (`@zed-industries/claude-code-acp` 0.16.2), installed by
//! `cargo xtask setup` under the target directory. Without credentials each refuses with ACP's
//! `auth_required`: codex at `session/new`, claude at its first `session/prompt`. With a key and
//! a model endpoint on a closed loopback port, codex's prompt retries for about 25 s: long
//! enough to stop it from the chat. No test reaches beyond this machine: the model endpoints
//! are on 127.0.0.1 and Claude Code is told to send no telemetry.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{
    GatewayProcess, agent_config, bot_texts, eventually, external_platform, lease_processes, leases,
};

/// `<target>/node/acp-agents/node_modules`, found from this test binary
/// (`<target>/<profile>/deps/…`), or `CLAWGATE_ACP_AGENTS_DIR/node_modules`.
fn node_modules() -> PathBuf {
    let dir = match std::env::var_os("CLAWGATE_ACP_AGENTS_DIR") {
        Some(dir) => PathBuf::from(dir).join("node_modules"),
        None => std::env::current_exe()
            .expect("the test binary's path")
            .ancestors()
            .nth(3)
            .expect("the test binary sits in <target>/<profile>/deps")
            .join("node/acp-agents/node_modules"),
    };
    assert!(
        dir.join("@zed-industries/codex-acp-linux-x64/bin/codex-acp")
            .exists()
            && dir
                .join("@zed-industries/claude-code-acp/dist/index.js")
                .exists(),
        "{} has no codex-acp 0.16.0 or claude-code-acp 0.16.2: run `cargo xtask setup` (it \
         installs them under the target directory), or point CLAWGATE_ACP_AGENTS_DIR at a \
         directory with both in node_modules",
        dir.display()
    );
    dir
}

/// codex-acp as `npx` starts it: its node launcher, which runs the native binary as a child.
fn codex() -> Vec<String> {
    vec![
        "node".to_owned(),
        node_modules()
            .join("@zed-industries/codex-acp/bin/codex-acp.js")
            .display()
            .to_string(),
    ]
}

/// claude-code-acp as an `npx`-style launcher starts it: `sh -c` running node.
fn claude() -> Vec<String> {
    let index = node_modules().join("@zed-industries/claude-code-acp/dist/index.js");
    vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!("node '{}'", index.display()),
    ]
}

/// Every live process of the gateway's leases (the mark is inherited by the launcher, node and
/// the native binary alike), with its command line.
fn leftovers(state: &Path) -> Vec<(u32, String)> {
    leases(state)
        .iter()
        .flat_map(|(id, _)| lease_processes(id))
        .map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&raw).replace('\0', " "))
        })
        .collect()
}

const NOT_LOGGED_IN: &str = "not logged in";

/// Waits for the not-logged-in notice, then checks nothing else came and one process started.
async fn one_start_one_notice(
    platform: &clawgate_channel_qa::QaPlatform,
    state: &Path,
    conversation: &str,
) {
    eventually(
        Duration::from_secs(90),
        "the not-logged-in notice",
        || async {
            bot_texts(platform, conversation)
                .iter()
                .any(|t| t.contains(NOT_LOGGED_IN))
                .then_some(())
        },
    )
    .await;
    // A retry would start another process within the retry backoff.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let texts = bot_texts(platform, conversation);
    assert_eq!(texts.len(), 1, "one notice, nothing else: {texts:?}");
    assert_eq!(leases(state).len(), 1, "one start: {:?}", leases(state));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_without_credentials_is_started_once_and_leaves_no_process() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let codex_home = dir.path().join("codex-home");
    std::fs::create_dir_all(&codex_home).expect("codex home");
    let keys = format!(
        "env = {{ CODEX_HOME = {:?} }}",
        codex_home.display().to_string()
    );
    let config = agent_config(dir.path(), &platform, &codex(), &keys, 5);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-codex", "hello").await;
    one_start_one_notice(&platform, &state, "dm-codex").await;
    // `session/new` failed: the launcher and its native binary were ended with the start.
    let alive = leftovers(&state);
    assert!(
        alive.is_empty(),
        "codex processes alive after the failed start: {alive:?}"
    );
    assert_eq!(
        leases(&state)[0].1,
        "closed",
        "ended on purpose, nothing left"
    );
    let log = gateway.log();
    assert!(
        log.contains("codex-api-key (env CODEX_API_KEY)") && log.contains("chatgpt"),
        "the operator sees the methods codex offers"
    );
    let status = gateway.interrupt();
    assert!(status.success(), "clean stop: {status}");
    assert!(leftovers(&state).is_empty(), "nothing after the stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_without_a_key_is_started_once_and_the_person_told_once() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let keys = "env = { ANTHROPIC_BASE_URL = \"http://127.0.0.1:9\", \
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\", DISABLE_TELEMETRY = \"1\", \
                DISABLE_ERROR_REPORTING = \"1\", DISABLE_AUTOUPDATER = \"1\" }";
    let config = agent_config(dir.path(), &platform, &claude(), keys, 5);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-claude", "hello").await;
    one_start_one_notice(&platform, &state, "dm-claude").await;
    assert!(
        gateway.log().contains("claude-login"),
        "the operator sees the method claude offers"
    );
    // Its session lives on (the refusal came at the prompt): a clean stop ends all of it.
    let status = gateway.interrupt();
    assert!(status.success(), "clean stop: {status}");
    let alive = leftovers(&state);
    assert!(
        alive.is_empty(),
        "claude processes alive after the stop: {alive:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_reaches_codex_as_session_cancel_and_the_next_message_reuses_its_process() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // A fake key, passed through from the gateway's environment, and a model provider on a
    // closed loopback port: the prompt retries there for about 25 s.
    let codex_home = dir.path().join("codex-home");
    std::fs::create_dir_all(&codex_home).expect("codex home");
    std::fs::write(
        codex_home.join("config.toml"),
        "model_provider = \"loopback\"\n\n[model_providers.loopback]\nname = \"loopback\"\n\
         base_url = \"http://127.0.0.1:9/v1\"\nenv_key = \"OPENAI_API_KEY\"\n\
         wire_api = \"responses\"\n",
    )
    .expect("codex config");
    let keys = format!(
        "env_passthrough = [\"OPENAI_API_KEY\"]\nenv = {{ CODEX_HOME = {:?} }}",
        codex_home.display().to_string()
    );
    let config = agent_config(dir.path(), &platform, &codex(), &keys, 2);
    let gateway = GatewayProcess::try_start(&state, &config, &[("OPENAI_API_KEY", "sk-e2e-fake")])
        .unwrap_or_else(|why| panic!("{why}"));
    for (n, message) in ["write a poem", "write another"].into_iter().enumerate() {
        gateway.say("dm-codex-stop", message).await;
        eventually(Duration::from_secs(30), "codex prompted", || async {
            (gateway.log().matches("the agent is prompted").count() > n).then_some(())
        })
        .await;
        gateway.say("dm-codex-stop", "/stop").await;
        eventually(Duration::from_secs(20), "the stopped reply", || async {
            (bot_texts(&platform, "dm-codex-stop")
                .iter()
                .filter(|t| t.contains("(stopped"))
                .count()
                > n)
                .then_some(())
        })
        .await;
    }
    let texts = bot_texts(&platform, "dm-codex-stop");
    assert!(
        texts.iter().all(|t| !t.contains("could not answer")),
        "no failure: {texts:?}"
    );
    // Authenticated with the key from its environment, and one process served both turns.
    assert!(
        gateway
            .log()
            .contains("authenticated with a key from the agent's environment")
    );
    assert_eq!(leases(&state).len(), 1, "one process: {:?}", leases(&state));
    let status = gateway.interrupt();
    assert!(status.success(), "clean stop: {status}");
    assert!(leftovers(&state).is_empty(), "nothing after the stop");
}
