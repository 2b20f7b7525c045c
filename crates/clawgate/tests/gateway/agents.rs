//! Agents at the edge, with a fake ACP agent written apart from the gateway's own demo agent
//! (`fake_acp_agent.py`) in the shapes real agents take: a start whose `session/new` fails
//! behind an `npx`-style `sh -c` launcher with a grandchild that ignores stdin EOF, an agent that
//! prints its environment, one that never answers a prompt, one that is not logged in, and one
//! whose long task runs until it is cancelled.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::{
    BIN, GatewayProcess, MidReply, agent_config, bot_texts, eventually, external_platform,
    lease_processes, leases,
};

fn fake_agent() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/gateway/fake_acp_agent.py")
        .display()
        .to_string()
}

/// The Python interpreter itself (`sys.executable`): a `python3` on PATH may be a shell shim
/// that adds variables of its own to the agent's environment.
fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let output = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 runs");
            String::from_utf8(output.stdout)
                .expect("a path")
                .trim()
                .to_owned()
        })
        .clone()
}

/// The fake agent with `flags`, run by the Python interpreter.
fn fake(flags: &[&str]) -> Vec<String> {
    let mut command = vec![python(), fake_agent()];
    command.extend(flags.iter().map(|f| (*f).to_owned()));
    command
}

/// Every process alive that is one of this gateway's leases': its wrapper, or anything carrying
/// its mark (the agent, the launcher, the grandchild: the mark is inherited). Other tests run
/// fake agents at the same time: only the marks tell them apart.
fn leftovers(state: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = leases(state)
        .iter()
        .flat_map(|(id, _)| lease_processes(id))
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

const NOTICE: &str = "could not answer";

/// Waits until the fake agent has logged `method` in its events file.
async fn received(events: &Path, method: &str) {
    eventually(Duration::from_secs(20), method, || async {
        std::fs::read_to_string(events)
            .unwrap_or_default()
            .lines()
            .any(|line| line == method)
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_ends_the_agents_whole_tree_and_closes_its_lease() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // An `npx`-style launcher: `sh -c` runs the agent, which starts a grandchild that ignores
    // stdin EOF, and then fails `session/new`.
    let launcher = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!(
            "python3 {} --grandchild --fail-new-session; exit $?",
            fake_agent()
        ),
    ];
    let config = agent_config(dir.path(), &platform, &launcher, "", 2);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-failed-start", "hello").await;
    eventually(Duration::from_secs(60), "the failure notice", || async {
        bot_texts(&platform, "dm-failed-start")
            .iter()
            .any(|t| t.contains(NOTICE))
            .then_some(())
    })
    .await;
    // A start's tree is ended before its failure is reported: nothing is left by now.
    let alive = leftovers(&state);
    assert!(
        alive.is_empty(),
        "processes of the failed starts alive: {alive:?}"
    );
    let states = leases(&state);
    assert_eq!(states.len(), 2, "one start per attempt: {states:?}");
    // Ended on purpose, with nothing left: closed, not lost.
    assert!(states.iter().all(|(_, s)| s == "closed"), "{states:?}");
    assert!(
        gateway.log().contains("agent start failed"),
        "the failed start is logged at WARN"
    );
    let status = gateway.interrupt();
    assert!(status.success(), "clean stop: {status}");
    assert!(
        leftovers(&state).is_empty(),
        "nothing after the stop either"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_sees_only_the_allowlisted_environment() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let keys = "env_passthrough = [\"E2E_AGENT_KEY\"]\nenv = { E2E_AGENT_SETTING = \"on\" }";
    let config = agent_config(dir.path(), &platform, &fake(&["--print-env"]), keys, 2);
    let gateway = GatewayProcess::try_start(
        &state,
        &config,
        &[
            ("E2E_AGENT_KEY", "sk-e2e-passed"),
            ("E2E_UNRELATED", "must-not-pass"),
            ("IS_SANDBOX", "yes"),
        ],
    )
    .unwrap_or_else(|why| panic!("{why}"));
    gateway.say("dm-env", "print your environment").await;
    let reply = eventually(Duration::from_secs(30), "the env reply", || async {
        bot_texts(&platform, "dm-env")
            .into_iter()
            .find(|t| t.starts_with("env:"))
    })
    .await;
    let names: Vec<&str> = reply
        .trim_start_matches("env:")
        .split_whitespace()
        .collect();
    let allowed = [
        "PATH",
        "HOME",
        "LANG",
        "TERM",
        "TMPDIR",
        "USER",
        "E2E_AGENT_KEY",
        "E2E_AGENT_SETTING",
        // The wrapper's marks: the lease the process serves.
        "CLAWGATE_ACPX_LEASE_ID",
        "CLAWGATE_GATEWAY_INSTANCE_ID",
    ];
    let outside: Vec<&&str> = names
        .iter()
        .filter(|n| !allowed.contains(n) && !n.starts_with("LC_"))
        .collect();
    assert!(
        outside.is_empty(),
        "outside the allowlist: {outside:?} in {names:?}"
    );
    for wanted in ["PATH", "E2E_AGENT_KEY", "E2E_AGENT_SETTING"] {
        assert!(
            names.contains(&wanted),
            "{wanted} reaches the agent: {names:?}"
        );
    }
    // The channel's token (`E2E_QA_TOKEN`, set for the gateway) is in none of them.
    assert!(!names.contains(&"E2E_QA_TOKEN"), "{names:?}");
    // Its working directory is its own, under the state directory.
    assert!(state.join("agents/main").is_dir());
    drop(gateway);

    // Asking for a variable a `*_env` setting names is refused at start, naming it.
    let refused = config_with_passthrough(dir.path(), &platform, "E2E_QA_TOKEN");
    let output = std::process::Command::new(BIN)
        .arg("--state-dir")
        .arg(dir.path().join("state-refused"))
        .arg("--config")
        .arg(&refused)
        .arg("up")
        .env("E2E_QA_TOKEN", "e2e-token")
        .output()
        .expect("clawgate runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("agents[0].env_passthrough")
            && stderr.contains("E2E_QA_TOKEN")
            && stderr.contains("channels[0].settings.token_env"),
        "the error names the variable and the setting: {stderr}"
    );
}

fn config_with_passthrough(
    dir: &Path,
    platform: &clawgate_channel_qa::QaPlatform,
    name: &str,
) -> PathBuf {
    agent_config(
        dir,
        platform,
        &fake(&[]),
        &format!("env_passthrough = [\"{name}\"]"),
        2,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_agent_hears_still_working_then_the_deadline_ends_each_attempt() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let events = dir.path().join("events");
    let events_arg = events.display().to_string();
    let keys = "turn_timeout_secs = 3\nprogress_notice_secs = 1\ncancel_grace_secs = 1";
    let agent = fake(&[
        "--hang-on",
        "think",
        "--ignore-cancel",
        "--events",
        &events_arg,
    ]);
    let config = agent_config(dir.path(), &platform, &agent, keys, 2);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-hung", "think hard").await;
    eventually(
        Duration::from_secs(10),
        "the still-working line",
        || async {
            platform
                .log()
                .iter()
                .any(|e| e.text.contains("still working"))
                .then_some(())
        },
    )
    .await;
    // Two attempts of 3 s each (+1 s grace): the failure notice well within a minute.
    eventually(Duration::from_secs(60), "the failure notice", || async {
        bot_texts(&platform, "dm-hung")
            .iter()
            .any(|t| t.contains(NOTICE))
            .then_some(())
    })
    .await;
    let received = std::fs::read_to_string(&events).unwrap_or_default();
    assert!(
        received.lines().any(|l| l == "session/cancel"),
        "the deadline sent session/cancel first: {received}"
    );
    // The agent ignored the cancel: its session was closed, and the next attempt started a
    // process of its own.
    assert_eq!(leases(&state).len(), 2, "{:?}", leases(&state));
    assert!(
        gateway.log().contains("turn_timeout_secs"),
        "the deadline is logged"
    );
    let texts = bot_texts(&platform, "dm-hung");
    assert!(
        texts.iter().all(|t| !t.contains("still working")),
        "the still-working preview was removed, not left beside the notice: {texts:?}"
    );
    let status = crate::agent_pool::status(&gateway).await;
    assert_eq!(
        status["turnDeadlines"], 2,
        "one deadline per attempt: {status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_is_not_logged_in_is_started_once_and_the_person_told_once() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = agent_config(dir.path(), &platform, &fake(&["--auth-required"]), "", 5);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-auth", "hello").await;
    eventually(
        Duration::from_secs(30),
        "the not-logged-in notice",
        || async {
            bot_texts(&platform, "dm-auth")
                .iter()
                .any(|t| t.contains("not logged in"))
                .then_some(())
        },
    )
    .await;
    // Nothing more comes: no retry, no second notice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let texts = bot_texts(&platform, "dm-auth");
    assert_eq!(texts.len(), 1, "one notice, nothing else: {texts:?}");
    assert_eq!(leases(&state).len(), 1, "one start, not five");
    let log = gateway.log();
    assert!(
        log.contains("not logged in") && log.contains("fake-login"),
        "the operator's WARN names the advertised auth methods"
    );
    let status = crate::agent_pool::status(&gateway).await;
    assert_eq!(status["agentAuthFailures"], 1, "status counts it: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_cancels_the_running_turn_and_new_begins_a_fresh_session() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let events = dir.path().join("events");
    let events_arg = events.display().to_string();
    let agent = fake(&["--hang-on", "long task", "--events", &events_arg]);
    let config = agent_config(dir.path(), &platform, &agent, "", 2);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-stop", "long task").await;
    received(&events, "session/prompt").await;
    gateway.say("dm-stop", "/stop").await;
    eventually(Duration::from_secs(20), "the stopped reply", || async {
        bot_texts(&platform, "dm-stop")
            .iter()
            .any(|t| t == "partial work\n\n(stopped)")
            .then_some(())
    })
    .await;
    assert!(
        std::fs::read_to_string(&events)
            .unwrap_or_default()
            .lines()
            .any(|l| l == "session/cancel"),
        "/stop reached the agent as session/cancel"
    );
    // The next message is answered by the same process, in the same ACP session.
    gateway.say("dm-stop", "next").await;
    let next = eventually(Duration::from_secs(20), "the next reply", || async {
        bot_texts(&platform, "dm-stop")
            .into_iter()
            .find(|t| t.starts_with("echo: next"))
    })
    .await;
    assert_eq!(
        leases(&state).len(),
        1,
        "the same process: {:?}",
        leases(&state)
    );
    let session_of = |reply: &str| reply.rsplit_once("[session ").map(|(_, s)| s.to_owned());
    let first_session = session_of(&next).expect("a session id");

    // `/new` closes the session; the next message begins a fresh one.
    gateway.say("dm-stop", "/new").await;
    eventually(Duration::from_secs(20), "the /new answer", || async {
        bot_texts(&platform, "dm-stop")
            .iter()
            .any(|t| t.starts_with("Started a new session"))
            .then_some(())
    })
    .await;
    gateway.say("dm-stop", "again").await;
    let again = eventually(Duration::from_secs(20), "the reply after /new", || async {
        bot_texts(&platform, "dm-stop")
            .into_iter()
            .find(|t| t.starts_with("echo: again"))
    })
    .await;
    assert_ne!(
        session_of(&again),
        Some(first_session),
        "a fresh ACP session"
    );
    let texts = bot_texts(&platform, "dm-stop");
    assert!(
        texts
            .iter()
            .any(|t| t == "Stopping the agent's current turn."),
        "{texts:?}"
    );
    assert!(texts.iter().all(|t| !t.contains(NOTICE)), "{texts:?}");
    let status = crate::agent_pool::status(&gateway).await;
    assert_eq!(status["turnsCancelled"], 1, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_ends_within_the_stops_grace_keeps_its_answer() {
    // The bundled agent streams three words 300 ms apart: well within the 3 s grace.
    let mid = MidReply::start("dm-grace", "finish me", &["--chunk-ms", "300"]).await;
    let status = mid.gateway.interrupt();
    assert!(status.success(), "clean stop: {status}");
    let texts = bot_texts(&mid.platform, "dm-grace");
    assert_eq!(texts, ["echo: finish me"], "the answer, delivered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_cancels_a_running_turn_before_it_closes_the_session() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let events = dir.path().join("events");
    let events_arg = events.display().to_string();
    let agent = fake(&["--hang-on", "forever", "--events", &events_arg]);
    let config = agent_config(dir.path(), &platform, &agent, "", 2);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-stop-gateway", "work forever").await;
    received(&events, "session/prompt").await;
    let status = gateway.interrupt();
    assert!(status.success(), "clean stop: {status}");
    let received = std::fs::read_to_string(&events).unwrap_or_default();
    assert!(
        received.lines().any(|l| l == "session/cancel"),
        "session/cancel before the close: {received}"
    );
    // The turn the stop cut short is not answered (it is worked on after the restart): no
    // "(stopped)" reply, and its preview was removed.
    let texts = bot_texts(&platform, "dm-stop-gateway");
    assert!(texts.is_empty(), "{texts:?}");
    assert!(leftovers(&state).is_empty(), "nothing left");
}
