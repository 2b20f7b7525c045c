//! Starting the real `clawgate` binary on a temporary state directory and talking to it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clawgate_channel_qa::{QaPlatform, QaPlatformConfig};

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
    let command = command
        .iter()
        .map(|a| format!("{a:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut text = format!(
        "[gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
         [retry]\nbase_delay_ms = 100\nreconcile_delay_ms = 100\n\n\
         [[agents]]\nid = \"main\"\ncommand = [{command}]\n\n[[channels]]\nkind = \"qa\"\n\
         poll_timeout_ms = 1000\n"
    );
    if let Some(platform) = platform {
        text.push_str(&format!(
            "base_url = \"{}\"\ntoken_env = \"E2E_QA_TOKEN\"\n",
            platform.base_url()
        ));
    }
    let path = dir.join("clawgate.toml");
    std::fs::write(&path, text).expect("config written");
    path
}

impl GatewayProcess {
    /// Starts `clawgate up` and waits until it prints its URL.
    pub(crate) fn start(state: &Path, config: &Path) -> GatewayProcess {
        let mut child = Command::new(BIN)
            .arg("--state-dir")
            .arg(state)
            .arg("--config")
            .arg(config)
            .arg("up")
            .env("E2E_QA_TOKEN", "e2e-token")
            .env("CLAWGATE_LOG", "info")
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
                sink.lock().expect("lines").push(line);
            }
        });
        let url = url_rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| {
                panic!(
                    "gateway did not print its URL within 30 s; log: {}",
                    std::fs::read_to_string(state.with_extension("log")).unwrap_or_default()
                )
            });
        GatewayProcess {
            child,
            state: state.to_path_buf(),
            url,
            stdout: lines,
        }
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
        let response = reqwest::Client::new()
            .post(format!("{}/chat/api/send", self.url))
            .json(&serde_json::json!({ "conversation": conversation, "text": text }))
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
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .expect("state.db");
    let mut statement = db
        .prepare("SELECT lease_id, state FROM acpx_leases ORDER BY started_at")
        .expect("query");
    statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect()
}
