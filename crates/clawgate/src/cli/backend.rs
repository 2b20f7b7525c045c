//! Where a command's answers come from: a running gateway's control API, or the state
//! directory of a stopped one.

use std::sync::Arc;

use clawgate_awareness::SessionTools;
use clawgate_store::Store;
use clawgate_store_sqlite::STATE_DB_FILE;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::{Config, StateBackend};
use crate::state::{StateDir, StateError, StateLock};
use crate::views;

use super::{CliError, CliResult};

// ---------------------------------------------------------------------------------------------
// Modes

/// Where the command's answers come from.
pub(crate) enum Backend {
    Running {
        api: ControlClient,
        pid: u32,
        url: String,
    },
    Stopped(Box<Local>),
}

/// A stopped gateway's state, opened by the CLI.
pub(crate) struct Local {
    pub(crate) state: StateDir,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) tools: SessionTools,
}

impl Local {
    pub(crate) fn lock_for_change(&self) -> CliResult<StateLock> {
        lock_for_change(&self.state)
    }
}

/// Holds the directory's gateway lock while a change runs on a stopped gateway's state: a
/// gateway starting meanwhile would otherwise recover intents (or reap leases, or migrate)
/// while the operator changes them.
pub(crate) fn lock_for_change(state: &StateDir) -> CliResult<StateLock> {
    state.lock_exclusive().map_err(|e| match e {
        StateError::Busy { path, .. } => CliError::GatewayStarted(path),
        other => CliError::State(other),
    })
}

impl Backend {
    /// Finds the gateway or the state directory of `config` and says which on stderr.
    pub(crate) async fn connect(config: &Config) -> CliResult<Backend> {
        let backend = Backend::locate(config).await?;
        match &backend {
            Backend::Running { pid, url, .. } => {
                eprintln!("(via running gateway pid {pid} at {url})")
            }
            Backend::Stopped(local) => eprintln!(
                "(state directory {}, gateway not running)",
                local.state.path().display()
            ),
        }
        Ok(backend)
    }

    async fn locate(config: &Config) -> CliResult<Backend> {
        let state = StateDir::existing(&config.state_dir)
            .ok_or_else(|| CliError::NoStateDir(config.state_dir.clone()))?;
        if state.is_locked() {
            let Some(info) = state.read_runtime() else {
                let pid =
                    std::fs::read_to_string(state.path().join("gateway.lock")).unwrap_or_default();
                return Err(CliError::LockedWithoutGateway {
                    path: state.path().to_path_buf(),
                    pid: pid.trim().to_owned(),
                });
            };
            return Ok(Backend::Running {
                api: ControlClient {
                    http: clawgate_channel_sdk::http::loopback_client_builder()
                        .build()
                        .unwrap_or_default(),
                    base: info.url.clone(),
                    token: info.control_token,
                },
                pid: info.pid,
                url: info.url,
            });
        }
        if config.state.backend == StateBackend::Sqlite {
            let db = state.path().join(STATE_DB_FILE);
            if !db.exists() {
                return Err(CliError::NoDatabase(state.path().to_path_buf()));
            }
        }
        // An operator's command never migrates silently: a schema that is not current is
        // refused, on either backend, saying to run `clawgate migrate`.
        let store = crate::store::open(
            config,
            state.path(),
            crate::store::Migrations::RequireCurrent,
            None,
        )
        .await?;
        let tools = views::offline_tools(store.clone());
        Ok(Backend::Stopped(Box::new(Local {
            state,
            store,
            tools,
        })))
    }

    /// The control API, for commands only a running gateway can serve.
    pub(crate) fn running(&self, what: &'static str) -> CliResult<&ControlClient> {
        match self {
            Backend::Running { api, .. } => Ok(api),
            Backend::Stopped(_) => Err(CliError::NeedsGateway(what)),
        }
    }
}

/// The running gateway's control API.
pub(crate) struct ControlClient {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl ControlClient {
    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &impl Serialize,
    ) -> CliResult<T> {
        let request = self.http.get(format!("{}{path}", self.base)).query(query);
        self.send(request).await
    }

    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> CliResult<T> {
        let request = self.http.post(format!("{}{path}", self.base)).json(body);
        self.send(request).await
    }

    async fn send<T: DeserializeOwned>(&self, request: reqwest::RequestBuilder) -> CliResult<T> {
        let unreachable = |source| CliError::Unreachable {
            url: self.base.clone(),
            source,
        };
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status();
        if status.is_success() {
            return response.json().await.map_err(unreachable);
        }
        let message = match response.json::<views::ErrorBody>().await {
            Ok(body) => body.error,
            Err(_) => "the gateway gave no reason".to_owned(),
        };
        Err(CliError::Api {
            status: status.as_u16(),
            message,
        })
    }
}

/// One path segment, percent-encoded (session keys may hold `/`, `?`, `#`, `%`…).
pub(crate) fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(segment("agent:main:qa:room-1"), "agent:main:qa:room-1");
        assert_eq!(segment("a/b?c#d%e"), "a%2Fb%3Fc%23d%25e");
        assert_eq!(segment("é"), "%C3%A9");
    }
}
