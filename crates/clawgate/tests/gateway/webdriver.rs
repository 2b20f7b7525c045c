//! Browser tests of the web chat page: Debian's headless Chromium driven through chromedriver
//! (`apt-get install chromium chromium-driver`; `.ci/run` installs them) with the `fantoccini`
//! WebDriver client.
//!
//! What is ours here is the setup: finding and starting chromedriver on a free 127.0.0.1 port,
//! the Chromium binary and its flags for an offline, root, headless CI machine, a fresh profile
//! per session, and shutting both down in order. Everything talks to 127.0.0.1 only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator, elements::Element};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

/// How long `find` waits for an element and `Chromedriver::start` for the driver:
/// generous (both take well under a second) because CI machines have 2 cores.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Polling interval for every bounded wait here.
const POLL: Duration = Duration::from_millis(50);

/// Cap on a page load or a script, enforced by chromedriver, so a hung page fails the test
/// instead of hanging CI.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);

/// Chromium flags for a root, offline, headless CI machine. `--no-sandbox` is
/// required as root. Without the background-networking ones Chromium keeps
/// dialing Google hosts that the closed network refuses; even with them it
/// still looks up a dozen (update, time, sign-in, autofill, search-engine
/// hosts), so the resolver rules fail every name but the loopback ones inside
/// the browser: no DNS query leaves the machine. (MAP * matches IP literals
/// too, hence the explicit 127.0.0.1.)
const CHROMIUM_ARGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
];

const INSTALL_HINT: &str =
    "install Debian's chromium and chromium-driver with apt-get (.ci/run does)";

/// A running chromedriver on a free 127.0.0.1 port; killed when the last
/// handle (this or a `Session` from it) is dropped.
#[derive(Debug)]
pub(crate) struct Chromedriver {
    inner: Arc<Driver>,
}

/// Shared by the driver handle and its sessions, so the driver outlives every
/// session: deleting a session is what shuts its Chromium down.
#[derive(Debug)]
struct Driver {
    base: String,
    child: std::sync::Mutex<Child>,
    // Holds driver.log: the driver's stdout + stderr.
    dir: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // A poisoned lock still holds the child; kill and reap it regardless.
        let child = match self.child.get_mut() {
            Ok(child) => child,
            Err(poisoned) => poisoned.into_inner(),
        };
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Chromedriver {
    /// Starts chromedriver (`CLAWGATE_CHROMEDRIVER`, else /usr/bin/chromedriver,
    /// else `chromedriver` on PATH) and waits until `/status` reports ready.
    pub(crate) async fn start() -> anyhow::Result<Chromedriver> {
        let exe = find_chromedriver()?;
        // Chromedriver needs a port number up front: one reserved for this process.
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        let dir = tempfile::Builder::new()
            .prefix("clawgate-chromedriver-")
            .tempdir()
            .context("creating chromedriver's log directory")?;
        let log_path = dir.path().join("driver.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        // A file rather than a pipe: nobody has to drain it, and it survives for
        // the error message.
        let child = Command::new(&exe)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating the log file handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let driver = Driver {
            base: format!("http://127.0.0.1:{port}"),
            child: std::sync::Mutex::new(child),
            dir,
        };
        driver.wait_ready(&exe).await?;
        Ok(Chromedriver {
            inner: Arc::new(driver),
        })
    }

    /// Opens a headless Chromium (`CLAWGATE_CHROMIUM`, else /usr/bin/chromium)
    /// with a fresh profile that is removed when the session is dropped.
    pub(crate) async fn new_session(&self) -> anyhow::Result<Session> {
        let binary = match std::env::var_os("CLAWGATE_CHROMIUM") {
            Some(path) => PathBuf::from(path),
            None => PathBuf::from("/usr/bin/chromium"),
        };
        if !binary.is_file() {
            bail!("Chromium not found at {}: {INSTALL_HINT}", binary.display());
        }
        let profile = tempfile::Builder::new()
            .prefix("clawgate-chromium-")
            .tempdir()
            .context("creating Chromium's profile directory")?;
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let timeout_ms = u64::try_from(BROWSER_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": binary, "args": args },
            "timeouts": { "pageLoad": timeout_ms, "script": timeout_ms, "implicit": 0 },
        });
        let Value::Object(caps) = caps else {
            unreachable!("json! of an object literal is an object")
        };
        // Plain HTTP to the loopback driver: no TLS, and no proxy from the environment.
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&self.inner.base)
            .await
            // The cause first, then what chromedriver said about it.
            .map_err(|err| {
                anyhow::anyhow!(
                    "starting a Chromium session: {err}\n{}",
                    self.inner.output()
                )
            })?;
        let id = client
            .session_id()
            .await
            .context("reading the new session's id")?
            .context("chromedriver answered a new session without an id")?;
        Ok(Session {
            url: format!("{}/session/{id}", self.inner.base),
            client,
            open: true,
            _driver: Arc::clone(&self.inner),
            _profile: profile,
        })
    }
}

impl Driver {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("driver.log")).unwrap_or_default()
    }

    /// The log, labelled, for error messages.
    fn output(&self) -> String {
        match self.log() {
            log if log.trim().is_empty() => "chromedriver printed nothing".to_owned(),
            log => format!("chromedriver output:\n{log}"),
        }
    }

    async fn wait_ready(&self, exe: &Path) -> anyhow::Result<()> {
        let http = reqwest::Client::builder()
            // Loopback only: never route through a proxy from the environment.
            .no_proxy()
            .timeout(DEFAULT_WAIT)
            .build()
            .context("building the HTTP client")?;
        let deadline = Instant::now() + DEFAULT_WAIT;
        loop {
            if let Ok(mut child) = self.child.lock()
                && let Ok(Some(status)) = child.try_wait()
            {
                bail!(
                    "{} exited with {status} before it was ready; {}",
                    exe.display(),
                    self.output()
                );
            }
            let last = match status(&http, &self.base).await {
                Ok(value) if value["value"]["ready"] == Value::Bool(true) => return Ok(()),
                Ok(value) => value.to_string(),
                Err(err) => format!("{err:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "{} not ready on {} after {DEFAULT_WAIT:?} (last: {last}); {}",
                    exe.display(),
                    self.base,
                    self.output()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// chromedriver's `/status` reply (a WebDriver command that needs no session).
async fn status(http: &reqwest::Client, base: &str) -> anyhow::Result<Value> {
    let reply = http.get(format!("{base}/status")).send().await?;
    Ok(reply.json().await?)
}

/// One browser (a headless Chromium) under a `Chromedriver`: the fantoccini client of its
/// session. Dropping it deletes the WebDriver session, which closes Chromium, then removes
/// its profile.
#[derive(Debug)]
pub(crate) struct Session {
    client: Client,
    /// `{driver}/session/{id}`, for the delete on drop.
    url: String,
    open: bool,
    _driver: Arc<Driver>,
    // Dropped after `Drop::drop` has closed Chromium, which writes into it until then.
    _profile: tempfile::TempDir,
}

impl std::ops::Deref for Session {
    type Target = Client;

    fn deref(&self) -> &Client {
        &self.client
    }
}

impl Session {
    /// The first element matching `css`, waiting up to `DEFAULT_WAIT` for one.
    pub(crate) async fn find(&self, css: &str) -> anyhow::Result<Element> {
        self.client
            .wait()
            .at_most(DEFAULT_WAIT)
            .every(POLL)
            .for_element(Locator::Css(css))
            .await
            .with_context(|| format!("finding `{css}` (waited up to {DEFAULT_WAIT:?})"))
    }

    /// Polls the JS expression `expr` every 50 ms until it is truthy and returns
    /// its value. A script that throws counts as "not yet" (the page may still be
    /// building what it reads); the timeout error names `what` and the last value.
    pub(crate) async fn wait_for(
        &self,
        expr: &str,
        timeout: Duration,
        what: &str,
    ) -> anyhow::Result<Value> {
        let script = format!("return ({expr});");
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.client.execute(&script, vec![]).await {
                Ok(value) if truthy(&value) => return Ok(value),
                Ok(value) => value.to_string(),
                Err(err @ CmdError::Standard(_)) if err.is_javascript_error() => err.to_string(),
                Err(err) => {
                    return Err(anyhow::Error::new(err).context(format!("waiting for {what}")));
                }
            };
            if Instant::now() >= deadline {
                bail!(
                    "timed out after {timeout:?} waiting for {what} (`{expr}`); last value: {last}"
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Deletes the session (closing Chromium) and reports any error, unlike Drop.
    pub(crate) async fn close(mut self) -> anyhow::Result<()> {
        self.open = false;
        self.client
            .clone()
            .close()
            .await
            .context("closing the browser session")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // Drop cannot await, and the client's own shutdown runs on the test's runtime,
        // which may be going away (a failed test): delete on a scoped thread with its own
        // small runtime and client, so Chromium is gone before the profile dir is removed.
        let url = &self.url;
        std::thread::scope(|s| {
            s.spawn(|| {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async {
                    if let Ok(http) = reqwest::Client::builder()
                        .no_proxy()
                        .timeout(Duration::from_secs(10))
                        .build()
                    {
                        let _ = http.delete(url).send().await;
                    }
                });
            });
        });
    }
}

/// JavaScript truthiness of a JSON-returned value (undefined and NaN arrive as null).
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

fn find_chromedriver() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("CLAWGATE_CHROMEDRIVER") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("CLAWGATE_CHROMEDRIVER={} does not exist", path.display());
        }
        return Ok(path);
    }
    let debian = PathBuf::from("/usr/bin/chromedriver");
    if debian.is_file() {
        return Ok(debian);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("chromedriver"))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "chromedriver not found (CLAWGATE_CHROMEDRIVER, /usr/bin, PATH): {INSTALL_HINT}"
            )
        })
}
