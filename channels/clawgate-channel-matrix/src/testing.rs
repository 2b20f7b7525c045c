//! A real Synapse homeserver for tests (feature `testing`): from the venv `cargo xtask setup`
//! installs under the target directory (`<target>/python/synapse`), on a free loopback port,
//! with its SQLite database and config in a temporary directory, users registered through the
//! shared secret, stopped by its pid when dropped. The channel's own tests and the gateway's
//! run against it.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // A test fixture: failures panic loudly.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Digest;

/// The Synapse release the tests are written against (the xtask installs the same).
pub const SYNAPSE_VERSION: &str = "1.163.2";

/// The rate limits one Synapse applies to sends.
#[derive(Debug, Clone, Copy)]
pub struct MessageLimit {
    /// Sends per second per user.
    pub per_second: f64,
    /// Sends allowed in a burst.
    pub burst_count: u32,
}

impl MessageLimit {
    /// Limits no test reaches.
    pub const RAISED: MessageLimit = MessageLimit {
        per_second: 10_000.0,
        burst_count: 10_000,
    };
}

/// An account on the homeserver.
#[derive(Debug, Clone)]
pub struct User {
    /// `@name:localhost`.
    pub user_id: String,
    /// Its access token.
    pub token: String,
}

/// A running Synapse.
pub struct Synapse {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    secret: String,
    dir: tempfile::TempDir,
    /// A client for calls straight to it.
    pub http: reqwest::Client,
}

impl std::fmt::Debug for Synapse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The registration secret stays out.
        f.debug_struct("Synapse")
            .field("base", &self.base)
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

/// The venv's interpreter: `$CLAWGATE_SYNAPSE_VENV`, else `<target>/python/synapse`, the
/// target directory found from the running binary (a test in `<target>/<profile>/deps`, a tool
/// in `<target>/<profile>`).
fn python() -> PathBuf {
    let venv = std::env::var_os("CLAWGATE_SYNAPSE_VENV").map_or_else(
        || {
            let exe = std::env::current_exe().expect("the running binary's path");
            exe.ancestors()
                .skip(1)
                .map(|dir| dir.join("python/synapse"))
                .find(|venv| venv.exists())
                .unwrap_or_else(|| {
                    exe.ancestors()
                        .nth(3)
                        .unwrap_or(Path::new("target"))
                        .join("python/synapse")
                })
        },
        PathBuf::from,
    );
    let python = venv.join("bin/python");
    assert!(
        python.exists(),
        "Synapse is not installed at {}: run `cargo xtask setup` (it creates the venv with \
         matrix-synapse=={SYNAPSE_VERSION}), or point CLAWGATE_SYNAPSE_VENV at such a venv",
        venv.display()
    );
    python
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Unpadded standard base64 (Synapse's key format).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

impl Synapse {
    /// A homeserver whose sends are limited by `limit`.
    pub async fn start_with(limit: MessageLimit) -> Synapse {
        Synapse::start_configured(limit, None).await
    }

    /// A homeserver that keeps no `/sync` answer for a repeated request (by default it answers
    /// the same request from the same device with its cached answer for two minutes): a second
    /// client of one account starting soon after the first sees the server as it would after
    /// that while, not the first client's initial answer.
    pub async fn start_without_sync_cache(limit: MessageLimit) -> Synapse {
        Synapse::start_configured(limit, Some("caches: {sync_response_cache_duration: 0}\n")).await
    }

    async fn start_configured(limit: MessageLimit, extra: Option<&str>) -> Synapse {
        let python = python();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let path = dir.path().display().to_string();
        let seed = sha2::Sha256::digest(format!("{path}:{port}").as_bytes());
        std::fs::write(
            dir.path().join("signing.key"),
            format!("ed25519 a_test {}\n", base64(&seed)),
        )
        .expect("signing key written");
        std::fs::write(
            dir.path().join("log.yaml"),
            format!(
                "version: 1\n\
                 formatters: {{precise: {{format: '%(asctime)s %(name)s %(levelname)s %(message)s'}}}}\n\
                 handlers: {{file: {{class: logging.FileHandler, formatter: precise, filename: {path}/homeserver.log}}}}\n\
                 root: {{level: WARNING, handlers: [file]}}\n\
                 disable_existing_loggers: false\n"
            ),
        )
        .expect("log config written");
        let secret = format!("shared-{port}");
        let raised = "{per_second: 10000, burst_count: 10000}";
        let message = format!(
            "{{per_second: {}, burst_count: {}}}",
            limit.per_second, limit.burst_count
        );
        let config = format!(
            "server_name: localhost\n\
             pid_file: {path}/homeserver.pid\n\
             public_baseurl: http://127.0.0.1:{port}/\n\
             listeners:\n  - port: {port}\n    bind_addresses: ['127.0.0.1']\n    type: http\n    tls: false\n    x_forwarded: false\n    resources: [{{names: [client], compress: false}}]\n\
             database: {{name: sqlite3, args: {{database: {path}/homeserver.db}}}}\n\
             log_config: {path}/log.yaml\n\
             media_store_path: {path}/media\n\
             registration_shared_secret: {secret}\n\
             report_stats: false\n\
             macaroon_secret_key: macaroon-{port}\n\
             form_secret: form-{port}\n\
             signing_key_path: {path}/signing.key\n\
             trusted_key_servers: []\n\
             suppress_key_server_warning: true\n\
             presence: {{enabled: false}}\n\
             rc_message: {message}\n\
             rc_registration: {raised}\n\
             rc_login: {{address: {raised}, account: {raised}, failed_attempts: {raised}}}\n\
             rc_joins: {{local: {raised}, remote: {raised}}}\n\
             rc_joins_per_room: {raised}\n\
             rc_invites: {{per_room: {raised}, per_user: {raised}, per_issuer: {raised}}}\n\
             rc_room_creation: {raised}\n\
             rc_admin_redaction: {raised}\n{}",
            extra.unwrap_or_default()
        );
        let config_path = dir.path().join("homeserver.yaml");
        std::fs::write(&config_path, config).expect("config written");
        let child = Command::new(python)
            .args(["-m", "synapse.app.homeserver", "-c"])
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(dir.path().join("stderr.log"))
                    .map_or(Stdio::null(), Stdio::from),
            )
            .spawn()
            .expect("Synapse starts");
        let mut synapse = Synapse {
            child,
            base: format!("http://127.0.0.1:{port}"),
            secret,
            dir,
            http: reqwest::Client::new(),
        };
        synapse.wait_ready().await;
        synapse
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(90);
        let url = format!("{}/_matrix/client/versions", self.base);
        loop {
            if let Ok(response) = self.http.get(&url).send().await
                && response.status().is_success()
            {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "Synapse exited ({status}) before answering:\n{}",
                    self.logs()
                );
            }
            assert!(
                Instant::now() < deadline,
                "Synapse did not answer within 90 s:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The end of Synapse's logs, for failure messages.
    pub fn logs(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        let all = format!("{}{}", read("stderr.log"), read("homeserver.log"));
        let start = all.len().saturating_sub(4_000);
        all[all.floor_char_boundary(start)..].to_owned()
    }

    /// Registers `name` through the shared-secret admin API.
    pub async fn register(&self, name: &str) -> User {
        let url = format!("{}/_synapse/admin/v1/register", self.base);
        let nonce: Value = self
            .http
            .get(&url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let nonce = nonce["nonce"].as_str().unwrap().to_owned();
        let password = format!("{name}-password");
        let mut mac = Hmac::<sha1::Sha1>::new_from_slice(self.secret.as_bytes()).unwrap();
        mac.update(format!("{nonce}\0{name}\0{password}\0notadmin").as_bytes());
        let mac: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let answer: Value = self
            .http
            .post(&url)
            .json(
                &json!({ "nonce": nonce, "username": name, "password": password,
                           "admin": false, "mac": mac }),
            )
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        User {
            user_id: answer["user_id"]
                .as_str()
                .unwrap_or_else(|| panic!("registered: {answer}"))
                .to_owned(),
            token: answer["access_token"].as_str().unwrap().to_owned(),
        }
    }

    /// A new login (a new device) of the user registered as `name`.
    pub async fn login(&self, name: &str) -> User {
        let answer: Value = self
            .http
            .post(format!("{}/_matrix/client/v3/login", self.base))
            .json(&json!({
                "type": "m.login.password",
                "identifier": { "type": "m.id.user", "user": name },
                "password": format!("{name}-password"),
            }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        User {
            user_id: answer["user_id"]
                .as_str()
                .unwrap_or_else(|| panic!("logged in: {answer}"))
                .to_owned(),
            token: answer["access_token"].as_str().unwrap().to_owned(),
        }
    }

    /// A client-server call as `user` straight to Synapse (no proxy); panics on an error answer.
    pub async fn call(
        &self,
        user: &User,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let (status, answer) = self.try_call(user, method, path, body).await;
        assert!(status < 300, "{path}: {status} {answer}");
        answer
    }

    /// A client-server call as `user`: its status and JSON answer.
    pub async fn try_call(
        &self,
        user: &User,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}/_matrix/client/v3/{path}", self.base))
            .bearer_auth(&user.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

impl Drop for Synapse {
    fn drop(&mut self) {
        // By its pid: the child we started, nothing else.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A path segment, percent-encoded.
pub fn enc(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
