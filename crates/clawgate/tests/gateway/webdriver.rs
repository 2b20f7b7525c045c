//! A minimal async W3C WebDriver client for browser tests of the web chat page.
//!
//! It drives Debian's headless Chromium through chromedriver's HTTP API
//! (`apt-get install chromium chromium-driver`; `.ci/run` installs them).
//! Only the handful of commands our tests use are here; everything talks to
//! 127.0.0.1 only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use reqwest::Method;
use serde_json::{Value, json};

/// How long `find` waits for an element and `Chromedriver::start` for the driver:
/// generous (both take well under a second) because CI machines have 2 cores.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// Polling interval for every bounded wait here.
const POLL: Duration = Duration::from_millis(50);

/// Per-request cap, so a hung browser fails the test instead of hanging CI.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The W3C key under which an element reference travels in JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

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

/// An error reported by the WebDriver server (`value.error` + `value.message`).
#[derive(Debug, Clone)]
pub(crate) struct WebDriverError {
    pub(crate) error: String,
    pub(crate) message: String,
}

impl std::fmt::Display for WebDriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "webdriver error `{}`: {}", self.error, self.message)
    }
}

impl std::error::Error for WebDriverError {}

/// A reference to an element in the current page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ElementId(pub(crate) String);

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
    http: reqwest::Client,
    child: std::sync::Mutex<Child>,
    // Holds driver.log: the driver's stdout + stderr.
    dir: TempDir,
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
        // Bind-then-release: chromedriver needs a port number up front. The window
        // in which another process could take it is tiny, and it fails loudly.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("picking a free port for chromedriver")?
            .port();
        let dir = TempDir::new("clawgate-chromedriver")?;
        let log_path = dir.0.join("driver.log");
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
        let http = reqwest::Client::builder()
            // Loopback only: never route through a proxy from the environment.
            .no_proxy()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("building the HTTP client")?;
        let driver = Driver {
            base: format!("http://127.0.0.1:{port}"),
            http,
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
        let profile = TempDir::new("clawgate-chromium")?;
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.0.display()));
        let caps = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": { "binary": binary, "args": args },
            }}
        });
        let value = self
            .inner
            .request(Method::POST, "/session", Some(caps))
            .await
            // The cause first, then what chromedriver said about it.
            .map_err(|err| {
                anyhow::anyhow!(
                    "starting a Chromium session: {err:#}\n{}",
                    self.inner.output()
                )
            })?;
        let id = value
            .get("sessionId")
            .and_then(Value::as_str)
            .with_context(|| format!("new session reply without sessionId: {value}"))?;
        Ok(Session {
            driver: Arc::clone(&self.inner),
            path: format!("/session/{id}"),
            open: true,
            _profile: profile,
        })
    }
}

impl Driver {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("driver.log")).unwrap_or_default()
    }

    /// The log, labelled, for error messages.
    fn output(&self) -> String {
        match self.log() {
            log if log.trim().is_empty() => "chromedriver printed nothing".to_owned(),
            log => format!("chromedriver output:\n{log}"),
        }
    }

    async fn wait_ready(&self, exe: &Path) -> anyhow::Result<()> {
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
            let last = match self.request(Method::GET, "/status", None).await {
                Ok(value) if value.get("ready") == Some(&Value::Bool(true)) => return Ok(()),
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

    /// One WebDriver command; returns the reply's `value`, or its error.
    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let what = format!("{method} {path}");
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.with_context(|| what.clone())?;
        let status = resp.status();
        let reply: Value = resp
            .json()
            .await
            .with_context(|| format!("{what}: reading the {status} reply"))?;
        let value = reply.get("value").cloned().unwrap_or(Value::Null);
        if let Some(error) = value.get("error").and_then(Value::as_str) {
            let message = value
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default();
            return Err(anyhow::Error::new(WebDriverError {
                error: error.to_owned(),
                message: message.to_owned(),
            })
            .context(what));
        }
        if !status.is_success() {
            bail!("{what}: HTTP {status}: {reply}");
        }
        Ok(value)
    }
}

/// One browser (a headless Chromium) under a `Chromedriver`. Dropping it deletes
/// the WebDriver session, which closes Chromium, then removes its profile.
#[derive(Debug)]
pub(crate) struct Session {
    driver: Arc<Driver>,
    /// `/session/{id}`.
    path: String,
    open: bool,
    // Dropped after `Drop::drop` has closed Chromium, which writes into it until then.
    _profile: TempDir,
}

impl Session {
    /// Navigates and waits for the page load (the W3C "normal" strategy).
    pub(crate) async fn goto(&self, url: &str) -> anyhow::Result<()> {
        self.cmd(Method::POST, "/url", Some(json!({ "url": url })))
            .await?;
        Ok(())
    }

    /// The first element matching `css`, waiting up to `DEFAULT_WAIT` for one.
    pub(crate) async fn find(&self, css: &str) -> anyhow::Result<ElementId> {
        self.find_within(css, DEFAULT_WAIT).await
    }

    /// The first element matching `css`, waiting up to `timeout` for one.
    pub(crate) async fn find_within(
        &self,
        css: &str,
        timeout: Duration,
    ) -> anyhow::Result<ElementId> {
        let deadline = Instant::now() + timeout;
        let body = json!({ "using": "css selector", "value": css });
        loop {
            match self.cmd(Method::POST, "/element", Some(body.clone())).await {
                Ok(value) => {
                    let id = value
                        .get(ELEMENT_KEY)
                        .and_then(Value::as_str)
                        .with_context(|| {
                            format!("find `{css}`: no element reference in {value}")
                        })?;
                    return Ok(ElementId(id.to_owned()));
                }
                Err(err)
                    if wd_error(&err) == Some("no such element") && Instant::now() < deadline => {}
                Err(err) => {
                    return Err(err.context(format!("finding `{css}` (waited up to {timeout:?})")));
                }
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Types `text` into the element (focusing it first, as a user would).
    pub(crate) async fn send_keys(&self, el: &ElementId, text: &str) -> anyhow::Result<()> {
        let path = format!("/element/{}/value", el.0);
        self.cmd(Method::POST, &path, Some(json!({ "text": text })))
            .await?;
        Ok(())
    }

    /// Clicks the element's center as a user would (an error if it is covered).
    pub(crate) async fn click(&self, el: &ElementId) -> anyhow::Result<()> {
        let path = format!("/element/{}/click", el.0);
        self.cmd(Method::POST, &path, Some(json!({}))).await?;
        Ok(())
    }

    /// The element's rendered text (`innerText`-like: hidden text excluded).
    pub(crate) async fn text(&self, el: &ElementId) -> anyhow::Result<String> {
        let path = format!("/element/{}/text", el.0);
        let value = self.cmd(Method::GET, &path, None).await?;
        value
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("element text is not a string: {value}"))
    }

    /// Runs `js` as a function body (use `return`); `args` are its `arguments`.
    pub(crate) async fn execute(&self, js: &str, args: &[Value]) -> anyhow::Result<Value> {
        let body = json!({ "script": js, "args": args });
        self.cmd(Method::POST, "/execute/sync", Some(body)).await
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
            let last = match self.execute(&script, &[]).await {
                Ok(value) if truthy(&value) => return Ok(value),
                Ok(value) => value.to_string(),
                Err(err) if wd_error(&err) == Some("javascript error") => format!("{err:#}"),
                Err(err) => return Err(err.context(format!("waiting for {what}"))),
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
        self.driver
            .request(Method::DELETE, &self.path, None)
            .await?;
        Ok(())
    }

    async fn cmd(&self, method: Method, path: &str, body: Option<Value>) -> anyhow::Result<Value> {
        let full = format!("{}{path}", self.path);
        self.driver.request(method, &full, body).await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        // Drop cannot await, and may run inside a runtime (where block_on
        // panics): delete on a scoped thread with its own small runtime and
        // client, so Chromium is gone before the profile dir is removed.
        let url = format!("{}{}", self.driver.base, self.path);
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
                        let _ = http.delete(&url).send().await;
                    }
                });
            });
        });
    }
}

/// The WebDriver error code (`value.error`) carried by `err`, if any.
fn wd_error(err: &anyhow::Error) -> Option<&str> {
    err.downcast_ref::<WebDriverError>()
        .map(|e| e.error.as_str())
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

/// A fresh directory under the system temp dir, removed (best-effort) on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> anyhow::Result<TempDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("{prefix}-{}-{nanos}-{n}", std::process::id()));
        // create_dir (not _all) fails if it exists: the dir is ours alone.
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
