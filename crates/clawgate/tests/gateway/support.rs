//! Starting the real `clawgate` binary on a temporary state directory and talking to it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clawgate_channel_qa::{Fault, LogEntry, PlatformMessage, QaPlatform, QaPlatformConfig};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_clawgate");

/// A running gateway process.
pub(crate) struct GatewayProcess {
    pub(crate) child: Child,
    pub(crate) state: PathBuf,
    pub(crate) url: String,
    /// Everything printed on stdout so far.
    pub(crate) stdout: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// A QA platform in the test process, standing in for a remote platform the gateway reaches
/// over HTTP: it outlives a gateway killed with SIGKILL, so the test can see what landed.
pub(crate) async fn external_platform() -> QaPlatform {
    QaPlatform::start(QaPlatformConfig {
        token: "e2e-token".into(),
        ..QaPlatformConfig::default()
    })
    .await
    .expect("QA platform starts")
}

/// A configuration file for a gateway on `platform`, answering with the bundled agent run
/// with `agent_args` (e.g. slow chunks to crash mid-reply).
pub(crate) fn config_file(
    dir: &Path,
    platform: Option<&QaPlatform>,
    agent_args: &[&str],
) -> PathBuf {
    let mut command = vec![BIN.to_owned(), "demo-agent".to_owned()];
    command.extend(agent_args.iter().map(|a| (*a).to_owned()));
    config_file_with_agent(dir, platform, &command)
}

/// As [`config_file`], with any agent command line.
pub(crate) fn config_file_with_agent(
    dir: &Path,
    platform: Option<&QaPlatform>,
    command: &[String],
) -> PathBuf {
    config_file_with_agent_keys(dir, platform, command, "")
}

/// As [`config_file_with_agent`], with more keys of the `[[agents]]` entry (`agent_keys`,
/// TOML lines such as `max_live = 2`).
pub(crate) fn config_file_with_agent_keys(
    dir: &Path,
    platform: Option<&QaPlatform>,
    command: &[String],
    agent_keys: &str,
) -> PathBuf {
    let command = command
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
         [retry]\nbase_delay_ms = 100\nreconcile_delay_ms = 100\n\n\
         [[agents]]\nid = \"main\"\ncommand = [{command}]\n{agent_keys}\n\n\
         [[channels]]\nkind = \"qa\"\n"
    );
    match platform {
        Some(platform) => text.push_str(&format!(
            "settings = {{ poll_timeout_ms = 1000, base_url = \"{}\", token_env = \"E2E_QA_TOKEN\" }}\n",
            platform.base_url()
        )),
        None => text.push_str("settings = { poll_timeout_ms = 1000 }\n"),
    }
    let path = dir.join("clawgate.toml");
    std::fs::write(&path, text).expect("config written");
    path
}

/// A gateway configuration on `platform` whose one agent is `command` with `agent_keys` (TOML
/// lines of its `[[agents]]` entry), each message getting `attempts` turn starts: the agent
/// tests' configuration (a fake agent, or a real one from npm).
pub(crate) fn agent_config(
    dir: &Path,
    platform: &QaPlatform,
    command: &[String],
    agent_keys: &str,
    attempts: u32,
) -> PathBuf {
    let command = command
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
         [retry]\nbase_delay_ms = 100\nreconcile_delay_ms = 100\n\n\
         [[agents]]\nid = \"main\"\ncommand = [{command}]\n{agent_keys}\n\n\
         [[channels]]\nkind = \"qa\"\nmax_turn_attempts = {attempts}\n\
         settings = {{ poll_timeout_ms = 1000, base_url = \"{}\", token_env = \"E2E_QA_TOKEN\" }}\n",
        platform.base_url()
    );
    let path = dir.join("clawgate.toml");
    std::fs::write(&path, text).expect("config written");
    path
}

/// A configuration with the bundled agent (`demo-agent` with `agent_args`) answering one
/// `[[channels]]` entry of `kind`, whose inline settings table holds `settings`: quick retries,
/// reconciliation after `reconcile_delay_ms`, and 50 turn starts per message (the channels'
/// crash matrices kill the gateway often).
pub(crate) fn channel_config(
    dir: &Path,
    kind: &str,
    settings: &str,
    agent_args: &[&str],
    reconcile_delay_ms: u64,
) -> PathBuf {
    let command = std::iter::once(BIN)
        .chain(std::iter::once("demo-agent"))
        .chain(agent_args.iter().copied())
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
         [retry]\nbase_delay_ms = 100\nmax_delay_ms = 5000\n\
         reconcile_delay_ms = {reconcile_delay_ms}\n\n\
         [[agents]]\nid = \"main\"\ncommand = [{command}]\n\n\
         [[channels]]\nkind = \"{kind}\"\nmax_turn_attempts = 50\n\
         settings = {{ {settings} }}\n"
    );
    let path = dir.join("clawgate.toml");
    std::fs::write(&path, text).expect("config written");
    path
}

impl GatewayProcess {
    /// Starts `clawgate up` and waits until it prints its URL.
    pub(crate) fn start(state: &Path, config: &Path) -> GatewayProcess {
        GatewayProcess::try_start(state, config, &[]).unwrap_or_else(|why| panic!("{why}"))
    }

    /// As [`GatewayProcess::start`], with more environment variables (set after the defaults,
    /// so `CLAWGATE_LOG` can be overridden); `Err` when the gateway exited (e.g. a crash hook
    /// fired during start) or printed no URL within 30 s.
    pub(crate) fn try_start(
        state: &Path,
        config: &Path,
        env: &[(&str, &str)],
    ) -> Result<GatewayProcess, String> {
        // The log file collects every start on this state directory: an error shows this one's.
        let log_start = std::fs::metadata(state.with_extension("log")).map_or(0, |m| m.len());
        let mut command = Command::new(BIN);
        command
            .arg("--state-dir")
            .arg(state)
            .arg("--config")
            .arg(config)
            .arg("up")
            .env("E2E_QA_TOKEN", "e2e-token")
            .env("CLAWGATE_LOG", "info");
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(state.with_extension("log"))
                    .expect("log file"),
            ))
            .spawn()
            .expect("clawgate starts");
        let stdout = child.stdout.take().expect("stdout");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (url_tx, url_rx) = std::sync::mpsc::channel();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.trim().strip_prefix("chat:") {
                    let _ = url_tx.send(url.trim().trim_end_matches('/').to_owned());
                }
                // A gateway without the QA channel has no chat page: its control API says
                // where it listens.
                if let Some(api) = line.trim().strip_prefix("control API:")
                    && let Some(url) = api.split_whitespace().next()
                {
                    let _ = url_tx.send(url.trim_end_matches("/v1").to_owned());
                }
                sink.lock().expect("lines").push(line);
            }
        });
        // The reader thread drops its sender when stdout closes: a gateway that exits before
        // printing its URL is noticed at once.
        match url_rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => Ok(GatewayProcess {
                child,
                state: state.to_path_buf(),
                url,
                stdout: lines,
            }),
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().expect("reaped");
                let log = std::fs::read(state.with_extension("log")).unwrap_or_default();
                let this_start = log
                    .get(usize::try_from(log_start).unwrap_or(0)..)
                    .unwrap_or_default();
                Err(format!(
                    "gateway did not print its URL within 30 s ({status}); this start's log: {}",
                    String::from_utf8_lossy(this_start)
                ))
            }
        }
    }

    /// The exit status, once the gateway has exited by itself (e.g. a crash hook fired).
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// SIGKILL: no shutdown code runs.
    pub(crate) fn kill_hard(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// SIGINT (Ctrl-C) and wait for a clean exit.
    pub(crate) fn interrupt(mut self) -> std::process::ExitStatus {
        signal(self.child.id(), libc_sigint());
        wait_with_timeout(&mut self.child, Duration::from_secs(20))
    }

    /// Whether the gateway printed a line containing `needle` on stdout.
    pub(crate) fn printed(&self, needle: &str) -> bool {
        self.stdout
            .lock()
            .expect("lines")
            .iter()
            .any(|line| line.contains(needle))
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.state.with_extension("log")).unwrap_or_default()
    }

    pub(crate) async fn say(&self, conversation: &str, text: &str) -> serde_json::Value {
        self.say_on(None, conversation, text).await
    }

    /// As [`GatewayProcess::say`], on the named channel (default: the first one).
    pub(crate) async fn say_on(
        &self,
        channel: Option<&str>,
        conversation: &str,
        text: &str,
    ) -> serde_json::Value {
        let response = reqwest::Client::new()
            .post(format!("{}/chat/api/send", self.url))
            .json(&serde_json::json!({
                "conversation": conversation, "text": text, "channel": channel
            }))
            .send()
            .await
            .expect("chat send");
        assert!(
            response.status().is_success(),
            "chat send: {}",
            response.status()
        );
        response.json().await.expect("message")
    }

    /// As [`GatewayProcess::say_on`], `Err` instead of a panic (the gateway may have died).
    pub(crate) async fn try_say_on(
        &self,
        channel: Option<&str>,
        conversation: &str,
        text: &str,
    ) -> Result<(), String> {
        let response = reqwest::Client::new()
            .post(format!("{}/chat/api/send", self.url))
            .json(&serde_json::json!({
                "conversation": conversation, "text": text, "channel": channel
            }))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("chat send: {}", response.status()))
        }
    }

    /// The conversation as the chat page sees it.
    pub(crate) async fn chat(&self, conversation: &str) -> Vec<serde_json::Value> {
        let answer: serde_json::Value = reqwest::Client::new()
            .get(format!("{}/chat/api/messages", self.url))
            .query(&[("conversation", conversation)])
            .send()
            .await
            .expect("chat messages")
            .json()
            .await
            .expect("json");
        answer["messages"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        // A failed test must not leave a gateway behind, and shows what the gateway logged.
        if std::thread::panicking() {
            eprintln!(
                "--- log of the gateway on {} ---\n{}",
                self.state.display(),
                self.log()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn libc_sigint() -> i32 {
    2
}

/// Sends a signal with the `kill` command (the tests stay free of unsafe code).
pub(crate) fn signal(pid: u32, signal: i32) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal} {pid}");
}

pub(crate) fn wait_with_timeout(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "process did not exit within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `check` until it returns `Some`, or panics with `what`.
pub(crate) async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Live processes of a lease: the wrapper (its argv names the lease) and everything started
/// under it (the wrapper marks the adapter's environment with the lease id, inherited below).
pub(crate) fn lease_processes(lease_id: &str) -> Vec<u32> {
    let marker = format!("CLAWGATE_ACPX_LEASE_ID={lease_id}");
    let mut pids: Vec<u32> = processes_mentioning(lease_id)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect();
    for (pid, _) in processes_mentioning("") {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if environ
            .split(|b| *b == 0)
            .any(|entry| entry == marker.as_bytes())
            && !pids.contains(&pid)
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

/// Processes whose command line mentions `needle` (from /proc).
pub(crate) fn processes_mentioning(needle: &str) -> Vec<(u32, String)> {
    // The same process table the lifecycle controller reads; zombies have nothing left to run.
    let table = clawgate_acpx::system_table()
        .list()
        .expect("the process table is readable");
    table
        .into_iter()
        .filter(|process| !process.zombie)
        .filter_map(|process| {
            let raw = std::fs::read(format!("/proc/{}/cmdline", process.pid)).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline.contains(needle).then_some((process.pid, cmdline))
        })
        .collect()
}

/// Lease rows of a state directory: (lease id, state).
pub(crate) fn leases(state: &Path) -> Vec<(String, String)> {
    state_pairs(
        state,
        "SELECT lease_id, state FROM acpx_leases ORDER BY started_at",
    )
}

/// Watches a state directory's delivery state (every reply intent's and inbound record's
/// status) for stillness. A crash matrix's judge excuses a message that waits behind an
/// unknown send of its conversation, but that wait may be about to end (the platform's echo
/// resolves the unknown and the lane goes on), so such an excuse is trusted only once the
/// state has held still for longer than the gateway takes to resolve an unknown.
pub(crate) struct Stillness {
    seen: Vec<(String, String)>,
    since: Instant,
}

impl Stillness {
    /// A message behind an unknown is excused only after this long without a change: longer
    /// than the test gateways' echo window (3 s) and reconcile backoff.
    pub(crate) const EXCUSED: Duration = Duration::from_secs(6);
    /// With nothing excused: a last look in which a duplicate would show.
    pub(crate) const SETTLED: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        Stillness {
            seen: Vec::new(),
            since: Instant::now(),
        }
    }

    /// Whether the delivery state read now has not changed for `window`.
    pub(crate) fn still_for(&mut self, state: &Path, window: Duration) -> bool {
        let mut now = state_pairs(state, "SELECT idempotency_key, status FROM send_intents");
        now.extend(state_pairs(
            state,
            "SELECT event_id, status FROM inbound_records",
        ));
        now.sort();
        if now != self.seen {
            self.seen = now;
            self.since = Instant::now();
        }
        self.since.elapsed() >= window
    }
}

/// The two text columns `query` selects from a state directory's database, read-only.
pub(crate) fn state_pairs(state: &Path, query: &str) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("state.db");
    let mut statement = db.prepare(query).expect("query");
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect()
}

/// One agent answering on its own QA account (its own embedded platform): the channel is
/// `qa` for the account `default`, else `qa-<account>`.
pub(crate) struct AccountSpec<'a> {
    pub(crate) account: &'a str,
    /// Arguments of the bundled `demo-agent` (e.g. `--chunk-ms`, `--words`).
    pub(crate) agent_args: &'a [&'a str],
}

/// A configuration with one embedded QA platform and one bundled agent per account, quick
/// retries and short polls (the crash tests restart the gateway often). `extra` is appended
/// (further sections).
pub(crate) fn config_file_accounts(
    dir: &Path,
    accounts: &[AccountSpec<'_>],
    extra: &str,
) -> PathBuf {
    let mut text = "[gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
                    [retry]\nbase_delay_ms = 100\nreconcile_delay_ms = 100\n\n"
        .to_owned();
    for spec in accounts {
        let mut command = vec![BIN.to_owned(), "demo-agent".to_owned()];
        command.extend(spec.agent_args.iter().map(|a| (*a).to_owned()));
        let command = command
            .iter()
            .map(|a| format!("{a:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        text.push_str(&format!(
            "[[agents]]\nid = \"agent-{}\"\ncommand = [{command}]\n\n",
            spec.account
        ));
    }
    for spec in accounts {
        text.push_str(&format!(
            "[[channels]]\nkind = \"qa\"\naccount = \"{0}\"\nagent = \"agent-{0}\"\n\
             settings = {{ poll_timeout_ms = 1000 }}\n\n",
            spec.account
        ));
    }
    text.push_str(extra);
    let path = dir.join("clawgate.toml");
    std::fs::write(&path, text).expect("config written");
    path
}

/// The reply the bundled agent streams for `prompt` with `--words words` (see
/// `clawgate_acpx::demo_agent`): `echo:`, the prompt's words, then `w1`, `w2`, … up to
/// `words` words in all.
pub(crate) fn demo_reply(prompt: &str, words: usize) -> String {
    let mut out: Vec<String> = std::iter::once("echo:".to_owned())
        .chain(prompt.split_whitespace().map(str::to_owned))
        .collect();
    let mut n = 0;
    while out.len() < words {
        n += 1;
        out.push(format!("w{n}"));
    }
    out.join(" ")
}

/// A gateway on an external platform, answering with the bundled agent run with `agent_args`,
/// caught mid-reply: `prompt` was sent to `conversation` and its first preview is visible.
pub(crate) struct MidReply {
    pub(crate) platform: QaPlatform,
    pub(crate) state: PathBuf,
    pub(crate) config: PathBuf,
    pub(crate) gateway: GatewayProcess,
    /// Keeps the state directory alive for the test.
    pub(crate) _dir: tempfile::TempDir,
}

impl MidReply {
    pub(crate) async fn start(conversation: &str, prompt: &str, agent_args: &[&str]) -> MidReply {
        let platform = external_platform().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let config = config_file(dir.path(), Some(&platform), agent_args);
        let gateway = GatewayProcess::start(&state, &config);
        gateway.say(conversation, prompt).await;
        eventually(Duration::from_secs(30), "the first preview", || async {
            (!bot_texts(&platform, conversation).is_empty()).then_some(())
        })
        .await;
        MidReply {
            platform,
            state,
            config,
            gateway,
            _dir: dir,
        }
    }
}

/// The bot's messages in a conversation of `platform`, as the platform shows them.
pub(crate) fn bot_texts(platform: &QaPlatform, conversation: &str) -> Vec<String> {
    platform
        .messages(conversation)
        .into_iter()
        .filter(|m| m.author_is_bot)
        .map(|m| m.text)
        .collect()
}

/// `gateway.json`'s entry of a channel's platform (written before the gateway prints its URL).
fn platform_entry(state: &Path, channel: &str) -> serde_json::Value {
    let runtime: serde_json::Value = serde_json::from_slice(
        &std::fs::read(state.join("gateway.json")).expect("gateway.json while running"),
    )
    .expect("gateway.json is JSON");
    runtime["channels"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == channel)
        .cloned()
        .unwrap_or_else(|| panic!("gateway.json names no platform for {channel}: {runtime}"))
}

/// `gateway.json`'s URL of a channel's platform.
pub(crate) fn platform_url(state: &Path, channel: &str) -> String {
    platform_entry(state, channel)["platformUrl"]
        .as_str()
        .expect("platformUrl")
        .to_owned()
}

/// `gateway.json`'s bearer token of a channel's embedded platform.
pub(crate) fn platform_token(state: &Path, channel: &str) -> String {
    platform_entry(state, channel)["platformToken"]
        .as_str()
        .expect("an embedded platform's token")
        .to_owned()
}

/// Queues QA faults on a running embedded platform (`POST /control/faults`).
pub(crate) async fn inject_faults(state: &Path, channel: &str, faults: &[Fault]) {
    let response = reqwest::Client::new()
        .post(format!("{}/control/faults", platform_url(state, channel)))
        .bearer_auth(platform_token(state, channel))
        .json(faults)
        .send()
        .await
        .expect("faults posted");
    assert!(
        response.status().is_success(),
        "faults: {}",
        response.status()
    );
}

/// What an embedded QA platform holds, read from its own state file in the state directory
/// (`<channel>-platform.json`, written before each answer goes out, so it survives SIGKILL).
pub(crate) struct PlatformRecord {
    /// Visible messages (deleted ones are gone), in platform order.
    pub(crate) messages: Vec<PlatformMessage>,
    /// Everything that landed.
    pub(crate) log: Vec<LogEntry>,
}

pub(crate) fn platform_record(state: &Path, channel: &str) -> PlatformRecord {
    let path = state.join(format!("{channel}-platform.json"));
    // The platform renames a complete file over the old one: a read sees one whole snapshot.
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return PlatformRecord {
                messages: vec![],
                log: vec![],
            };
        }
        Err(e) => panic!("cannot read {}: {e}", path.display()),
    };
    #[derive(serde::Deserialize)]
    struct Snapshot {
        messages: std::collections::BTreeMap<String, PlatformMessage>,
        log: Vec<LogEntry>,
    }
    let snapshot: Snapshot = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{} is not a QA platform state: {e}", path.display()));
    let mut messages: Vec<PlatformMessage> = snapshot.messages.into_values().collect();
    messages.sort_by_key(|m| m.seq);
    PlatformRecord {
        messages,
        log: snapshot.log,
    }
}

/// A human message the test sent, and the one final it must get.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub(crate) channel: String,
    pub(crate) conversation: String,
    pub(crate) text: String,
    pub(crate) expected: String,
}

/// What is visible for one human message that is not exactly its one complete final.
#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) sent: Sent,
    /// `missing`, `placeholder`, `partial`, `duplicate`, `wrong`, `not on the platform`.
    pub(crate) shape: &'static str,
    /// The visible bot messages attributed to it: (platform id, idempotency key, text).
    pub(crate) visible: Vec<(String, String, String)>,
}

/// The judgement of a run, from the platforms' own records only.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) messages: usize,
    pub(crate) finals: usize,
    /// Messages answered by the one marked failure notice (dead-lettered after
    /// `max_attempts`): allowed by the invariant, reported.
    pub(crate) notices: usize,
    pub(crate) violations: Vec<Violation>,
    /// Bot messages that belong to no message the test sent: (channel, id, key, text).
    pub(crate) strays: Vec<(String, String, String, String)>,
}

impl Verdict {
    pub(crate) fn holds(&self) -> bool {
        self.violations.is_empty() && self.strays.is_empty()
    }

    /// One line of everything wrong after a run — this verdict's violations and strays, the
    /// processes left and an unclean stop — or `None` when all is well.
    pub(crate) fn problems(
        &self,
        leftovers: Vec<String>,
        stop: std::process::ExitStatus,
    ) -> Option<String> {
        if self.holds() && leftovers.is_empty() && stop.success() {
            return None;
        }
        Some(
            self.violations
                .iter()
                .map(|v| {
                    let texts = v
                        .visible
                        .iter()
                        .map(|(id, _, text)| format!("{id} {text:?}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    format!("{} [{texts}]", v.shape)
                })
                .chain(
                    self.strays
                        .iter()
                        .map(|(_, id, key, text)| format!("stray {id} {key} {text:?}")),
                )
                .chain(leftovers)
                .chain((!stop.success()).then(|| format!("clean stop: {stop}")))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }

    /// Counts by shape, e.g. `missing=3 placeholder=1`.
    pub(crate) fn shapes(&self) -> String {
        let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
        for v in &self.violations {
            *counts.entry(v.shape).or_default() += 1;
        }
        if !self.strays.is_empty() {
            counts.insert("stray", self.strays.len());
        }
        counts
            .iter()
            .map(|(shape, n)| format!("{shape}={n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One line per violation: the message, what it shows, and the shape.
    pub(crate) fn table(&self) -> String {
        let mut out = format!(
            "{} message(s): {} with exactly one complete final, {} with the failure notice, {} \
             violation(s) [{}]\n",
            self.messages,
            self.finals,
            self.notices,
            self.violations.len() + self.strays.len(),
            self.shapes()
        );
        out.push_str(&format!(
            "{:<8} {:<6} {:<32} {:<12} visible bot messages (id key text)\n",
            "channel", "conv", "sent", "shape"
        ));
        for v in &self.violations {
            let visible = if v.visible.is_empty() {
                "-".to_owned()
            } else {
                v.visible
                    .iter()
                    .map(|(id, key, text)| format!("{id} {key} {text:?}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            out.push_str(&format!(
                "{:<8} {:<6} {:<32} {:<12} {visible}\n",
                v.sent.channel, v.sent.conversation, v.sent.text, v.shape
            ));
        }
        for (channel, id, key, text) in &self.strays {
            out.push_str(&format!(
                "{channel:<8} {:<6} {:<32} {:<12} {id} {key} {text:?}\n",
                "?", "(no message)", "stray"
            ));
        }
        out
    }
}

/// The event a bot message answers, from its idempotency key: `<channel>:reply:<event>:<gen>`
/// (a preview adds `~preview`) or `<channel>:failure:<event>` (the failure notice), each unit
/// with `#<unit>`.
fn answered_event(key: &str) -> Option<(&str, bool)> {
    let key = key.split_once('#').map_or(key, |(key, _)| key);
    let (_, rest) = key.split_once(':')?;
    if let Some(rest) = rest.strip_prefix("reply:") {
        return Some((rest.rsplit_once(':')?.0, false));
    }
    rest.strip_prefix("failure:").map(|event| (event, true))
}

/// Judges every sent message from the platforms' state files: exactly one visible bot message
/// answers it and it is the complete final (or the one failure notice); nothing else visible.
pub(crate) fn judge(state: &Path, sent: &[Sent]) -> Verdict {
    let mut verdict = Verdict {
        messages: sent.len(),
        ..Verdict::default()
    };
    let mut channels: Vec<&str> = sent.iter().map(|s| s.channel.as_str()).collect();
    channels.sort_unstable();
    channels.dedup();
    for channel in channels {
        let record = platform_record(state, channel);
        let mut claimed = std::collections::HashSet::new();
        for message in sent.iter().filter(|s| s.channel == channel) {
            // The texts the test sends are unique: the human message is found by its text.
            let Some(inbound) = record.messages.iter().find(|m| {
                !m.author_is_bot
                    && m.conversation_id == message.conversation
                    && m.text == message.text
            }) else {
                verdict.violations.push(Violation {
                    sent: message.clone(),
                    shape: "not on the platform",
                    visible: vec![],
                });
                continue;
            };
            let answers: Vec<&PlatformMessage> = record
                .messages
                .iter()
                .filter(|m| m.author_is_bot)
                .filter(|m| {
                    m.idempotency_key
                        .as_deref()
                        .and_then(answered_event)
                        .is_some_and(|(event, _)| event == inbound.id)
                })
                .collect();
            claimed.extend(answers.iter().map(|m| m.id.clone()));
            let notice = |m: &PlatformMessage| {
                m.idempotency_key
                    .as_deref()
                    .and_then(answered_event)
                    .is_some_and(|(_, notice)| notice)
            };
            let shape = match answers.as_slice() {
                [one] if one.text == message.expected => {
                    verdict.finals += 1;
                    continue;
                }
                [one] if notice(one) => {
                    verdict.notices += 1;
                    continue;
                }
                [] => "missing",
                many if many.iter().filter(|m| m.text == message.expected).count() > 1 => {
                    "duplicate"
                }
                many if many.len() > 1 => "extra",
                [one] if one.text.trim().is_empty() || one.text.trim() == "…" => "placeholder",
                [one] if message.expected.starts_with(one.text.as_str()) => "partial",
                _ => "wrong",
            };
            verdict.violations.push(Violation {
                sent: message.clone(),
                shape,
                visible: answers
                    .iter()
                    .map(|m| {
                        (
                            m.id.clone(),
                            m.idempotency_key.clone().unwrap_or_default(),
                            m.text.clone(),
                        )
                    })
                    .collect(),
            });
        }
        for m in record.messages.iter().filter(|m| m.author_is_bot) {
            if !claimed.contains(&m.id) {
                verdict.strays.push((
                    channel.to_owned(),
                    m.id.clone(),
                    m.idempotency_key.clone().unwrap_or_default(),
                    m.text.clone(),
                ));
            }
        }
    }
    verdict
}

/// After a clean stop: every lease of the state directory is resolved and none of its
/// processes runs. Returns what is wrong, if anything.
pub(crate) fn leftover_processes(state: &Path) -> Vec<String> {
    let mut wrong = Vec::new();
    for (lease, lease_state) in leases(state) {
        if lease_state == "open" || lease_state == "closing" {
            wrong.push(format!("lease {lease} is still {lease_state}"));
        }
        let pids = lease_processes(&lease);
        if !pids.is_empty() {
            wrong.push(format!(
                "lease {lease} ({lease_state}) still has processes {pids:?}"
            ));
        }
    }
    wrong
}

/// Waits until every message shows its final, or nothing lands for `quiet` (then the judge
/// says what is missing). Bounded, so a gateway that never answers fails instead of hanging.
pub(crate) async fn settle(state: &Path, messages: &[Sent], quiet: Duration) {
    const CAP: Duration = Duration::from_secs(120);
    let start = Instant::now();
    let mut last_change = Instant::now();
    let mut last_len = 0usize;
    loop {
        let (len, all) = landed(state, messages);
        if all {
            // A final that is there may still be followed by something wrong (a duplicate, a
            // late recovery): give that a moment to show.
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            return;
        }
        if len != last_len {
            last_len = len;
            last_change = Instant::now();
        }
        if last_change.elapsed() > quiet || start.elapsed() > CAP {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How many log entries the platforms hold, and whether every message has its final.
fn landed(state: &Path, messages: &[Sent]) -> (usize, bool) {
    let mut channels: Vec<&str> = messages.iter().map(|s| s.channel.as_str()).collect();
    channels.sort_unstable();
    channels.dedup();
    let mut len = 0;
    let mut all = true;
    for channel in channels {
        let record = platform_record(state, channel);
        len += record.log.len();
        all &= messages.iter().filter(|m| m.channel == channel).all(|m| {
            record.messages.iter().any(|p| {
                p.author_is_bot && p.conversation_id == m.conversation && p.text == m.expected
            })
        });
    }
    (len, all)
}

/// SplitMix64: a seeded sequence, the same on every machine (the crash matrices' kill times
/// and message plans).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// A number from the environment variable `name`, else `default`; a value that is not a number
/// stops the test naming it.
pub(crate) fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a number")),
        Err(_) => default,
    }
}

/// How many kills and messages a crash matrix runs: `CLAWGATE_<NAME>_CRASH_KILLS` /
/// `_MESSAGES` (`CLAWGATE_CRASH_…` for the QA matrix, whose `name` is empty), else the soak's
/// `CLAWGATE_SOAK_KILLS` / `_MESSAGES` (`cargo xtask soak` sizes every matrix at once), else
/// `kills` and `messages`, sized for CI.
pub(crate) fn crash_size(name: &str, kills: u64, messages: u64) -> (u64, usize) {
    let var = |what: &str| {
        if name.is_empty() {
            format!("CLAWGATE_CRASH_{what}")
        } else {
            format!("CLAWGATE_{name}_CRASH_{what}")
        }
    };
    let kills = env_number(&var("KILLS"), env_number("CLAWGATE_SOAK_KILLS", kills));
    let messages = env_number(
        &var("MESSAGES"),
        env_number("CLAWGATE_SOAK_MESSAGES", messages),
    );
    (kills, usize::try_from(messages).unwrap_or(usize::MAX))
}

/// The crash matrices' seed: `CLAWGATE_CRASH_SEED` replays a run, else the clock picks one.
pub(crate) fn crash_seed() -> u64 {
    env_number(
        "CLAWGATE_CRASH_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    )
}
