//! The ACP client runtime: one JSON-RPC connection over the wrapper's stdin/stdout, driven by
//! the `agent-client-protocol` crate (protocol v1).
//!
//! * `initialize` once per connection; `session/new` per ACP session, `session/load` to resume
//!   one (when the agent advertises `loadSession`);
//! * `session/prompt` with streamed `session/update` chunks;
//! * [`AcpClient::cancel`] sends the `session/cancel` notification: the running prompt answers
//!   with stopReason `cancelled` and the session stays usable;
//! * [`AcpClient::close_session`] sends `session/close` when the agent advertises it.
//!
//! None of these ends a process: that is the lifecycle controller's job, after verification.

use std::path::Path;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthenticateRequest, CancelNotification, CloseSessionRequest, ContentBlock,
    InitializeRequest, InitializeResponse, LoadSessionRequest, NewSessionRequest, PromptRequest,
    SessionNotification, SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{Agent, ByteStreams, Client, UntypedMessage};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// ACP failures, with the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum AcpError {
    #[error("ACP {step} failed: {source}")]
    Protocol {
        step: &'static str,
        #[source]
        source: agent_client_protocol::Error,
    },
    #[error("the ACP connection closed during {step} (the agent process exited or closed stdout)")]
    Disconnected { step: &'static str },
}

impl AcpError {
    /// True when the step failed because the connection is gone (the agent process exited,
    /// closed its stdout, or the connection was shut down) rather than because the agent
    /// answered with an error: the session cannot be used again, a fresh process can.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, AcpError::Disconnected { .. })
    }

    /// True when the agent refused because it is not logged in: ACP's `auth_required`
    /// (-32000: codex-acp, claude-code-acp and Gemini CLI 0.61 all use it), or an error whose
    /// text says a key or a login is missing under a generic code (as agents did before they
    /// adopted -32000). Retrying cannot help until an operator logs the agent in.
    pub fn is_auth_required(&self) -> bool {
        let AcpError::Protocol { source, .. } = self else {
            return false;
        };
        if i32::from(source.code) == AUTH_REQUIRED_CODE {
            return true;
        }
        let mut text = source.message.to_lowercase();
        if let Some(data) = &source.data {
            text.push(' ');
            text.push_str(&data.to_string().to_lowercase());
        }
        AUTH_PHRASES.iter().any(|phrase| text.contains(phrase))
    }
}

/// One authentication method an agent advertised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthMethodInfo {
    /// Its id (what `authenticate` takes).
    pub id: String,
    /// For an `env_var` method, the variables it reads (the agent's key comes from its
    /// environment); empty for every other kind (a browser login, a terminal command).
    pub env_vars: Vec<String>,
}

impl std::fmt::Display for AuthMethodInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.env_vars.is_empty() {
            f.write_str(&self.id)
        } else {
            write!(f, "{} (env {})", self.id, self.env_vars.join(", "))
        }
    }
}

/// The `authMethods` of a raw `initialize` answer. An `env_var` method names its variables in
/// `vars: [{name}]` (as codex-acp 0.16 sends it) or, in earlier drafts, `varName`.
fn auth_methods(raw: &serde_json::Value) -> Vec<AuthMethodInfo> {
    let Some(methods) = raw.get("authMethods").and_then(serde_json::Value::as_array) else {
        return Vec::new();
    };
    methods
        .iter()
        .filter_map(|method| {
            let id = method.get("id")?.as_str()?.to_owned();
            let env_var = method.get("type").and_then(serde_json::Value::as_str) == Some("env_var");
            let mut env_vars: Vec<String> = Vec::new();
            if env_var {
                if let Some(vars) = method.get("vars").and_then(serde_json::Value::as_array) {
                    env_vars.extend(
                        vars.iter()
                            .filter_map(|v| v.get("name")?.as_str())
                            .map(str::to_owned),
                    );
                }
                if let Some(name) = method.get("varName").and_then(serde_json::Value::as_str) {
                    env_vars.push(name.to_owned());
                }
            }
            Some(AuthMethodInfo { id, env_vars })
        })
        .collect()
}

/// ACP's `auth_required` error code.
pub const AUTH_REQUIRED_CODE: i32 = -32000;

/// What agents say when they have no credentials, lower-cased.
const AUTH_PHRASES: &[&str] = &[
    "authentication required",
    "api key is missing",
    "not logged in",
    "please log in",
    "please login",
    "invalid api key",
    "missing api key",
];

/// A request the SDK failed because the transport reached EOF or the connection ended is a
/// disconnection, not an answer of the agent: it gets its own variant.
fn protocol(step: &'static str) -> impl FnOnce(agent_client_protocol::Error) -> AcpError {
    move |source| {
        if agent_client_protocol::is_incoming_transport_closed(&source)
            || agent_client_protocol::is_connection_terminated(&source)
        {
            AcpError::Disconnected { step }
        } else {
            AcpError::Protocol { step, source }
        }
    }
}

/// How a prompt turn ended, and what the agent streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnOutcome {
    pub stop_reason: StopReason,
    /// The text of the agent message chunks, in order.
    pub chunks: Vec<String>,
}

/// A connected ACP client.
#[derive(Debug)]
pub struct AcpClient {
    connection: ConnectionTo<Agent>,
    updates: Mutex<mpsc::UnboundedReceiver<SessionNotification>>,
    capabilities: AgentCapabilities,
    auth_methods: Vec<AuthMethodInfo>,
    shutdown: std::sync::Mutex<Option<oneshot::Sender<()>>>,
}

impl AcpClient {
    /// Connects over a child's stdio and runs `initialize`.
    pub async fn connect(stdin: ChildStdin, stdout: ChildStdout) -> Result<AcpClient, AcpError> {
        let (updates_tx, updates_rx) = mpsc::unbounded_channel();
        let (connection_tx, connection_rx) = oneshot::channel();
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let transport = ByteStreams::new(stdin.compat_write(), stdout.compat());
        let driver = Client
            .v1()
            .name("clawgate")
            .on_receive_notification(
                async move |notification: SessionNotification, _cx| {
                    // The receiver is gone only when the client was dropped.
                    let _ = updates_tx.send(notification);
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                let _ = connection_tx.send(cx.clone());
                tokio::select! {
                    _ = cx.incoming_closed() => {}
                    _ = shutdown_rx => {}
                }
                Ok(())
            });
        tokio::spawn(async move {
            if let Err(error) = driver.await {
                tracing::debug!(%error, "ACP connection ended");
            }
        });
        let connection = connection_rx
            .await
            .map_err(|_| AcpError::Disconnected { step: "initialize" })?;
        // Sent untyped: the schema's types drop what an `env_var` authentication method says
        // about its variables, which decides whether the gateway can authenticate.
        let request =
            UntypedMessage::new("initialize", InitializeRequest::new(ProtocolVersion::V1))
                .map_err(protocol("initialize"))?;
        let raw = connection
            .send_request(request)
            .block_task()
            .await
            .map_err(protocol("initialize"))?;
        let auth_methods = auth_methods(&raw);
        let init: InitializeResponse =
            serde_json::from_value(raw).map_err(|e| AcpError::Protocol {
                step: "initialize",
                source: agent_client_protocol::Error::new(
                    -32603,
                    format!("the agent's initialize answer is not ACP: {e}"),
                ),
            })?;
        Ok(AcpClient {
            connection,
            updates: Mutex::new(updates_rx),
            auth_methods,
            capabilities: init.agent_capabilities,
            shutdown: std::sync::Mutex::new(Some(shutdown_tx)),
        })
    }

    /// True once the connection has ended: stdout reached EOF (the wrapper and its agent are
    /// gone) or the driver stopped. Nothing sent on it can be answered any more.
    pub fn is_closed(&self) -> bool {
        self.connection.is_incoming_closed() || self.connection.termination().is_some()
    }

    pub fn capabilities(&self) -> &AgentCapabilities {
        &self.capabilities
    }

    /// The authentication methods the agent advertised in `initialize`.
    pub fn auth_methods(&self) -> &[AuthMethodInfo] {
        &self.auth_methods
    }

    /// `authenticate` with one of the advertised methods.
    pub async fn authenticate(&self, method_id: &str) -> Result<(), AcpError> {
        self.connection
            .send_request(AuthenticateRequest::new(method_id.to_owned()))
            .block_task()
            .await
            .map_err(protocol("authenticate"))?;
        Ok(())
    }

    /// `session/new`; returns the ACP session id.
    pub async fn new_session(&self, cwd: &Path) -> Result<String, AcpError> {
        let response = self
            .connection
            .send_request(NewSessionRequest::new(cwd.to_path_buf()))
            .block_task()
            .await
            .map_err(protocol("session/new"))?;
        Ok(response.session_id.to_string())
    }

    /// `session/load`: resumes an existing ACP session (after a gateway restart, say). Returns
    /// the text the agent replayed as history, or `None` when the agent does not advertise
    /// `loadSession` (then only `session/new` is possible).
    pub async fn load_session(
        &self,
        session_id: &str,
        cwd: &Path,
    ) -> Result<Option<Vec<String>>, AcpError> {
        if !self.capabilities.load_session {
            return Ok(None);
        }
        let mut updates = self.updates.lock().await;
        self.connection
            .send_request(LoadSessionRequest::new(
                session_id.to_owned(),
                cwd.to_path_buf(),
            ))
            .block_task()
            .await
            .map_err(protocol("session/load"))?;
        // The agent streams the history before it answers: it is queued by now. Taking it here
        // keeps it out of the next prompt's output.
        let mut history = Vec::new();
        while let Ok(notification) = updates.try_recv() {
            if notification.session_id.to_string() == session_id
                && let SessionUpdate::AgentMessageChunk(chunk) = notification.update
                && let ContentBlock::Text(text) = chunk.content
            {
                history.push(text.text);
            }
        }
        Ok(Some(history))
    }

    /// `session/prompt` with one text block; `on_chunk` sees each streamed text chunk as it
    /// arrives. One turn at a time per client.
    pub async fn prompt(
        &self,
        session_id: &str,
        text: &str,
        mut on_chunk: impl FnMut(&str) + Send,
    ) -> Result<TurnOutcome, AcpError> {
        let mut updates = self.updates.lock().await;
        let request = self.connection.send_request(PromptRequest::new(
            session_id.to_owned(),
            vec![ContentBlock::Text(TextContent::new(text.to_owned()))],
        ));
        let response = request.block_task();
        tokio::pin!(response);
        let mut chunks = Vec::new();
        let mut take = |notification: SessionNotification, chunks: &mut Vec<String>| {
            if notification.session_id.to_string() != session_id {
                return;
            }
            if let SessionUpdate::AgentMessageChunk(chunk) = notification.update
                && let ContentBlock::Text(text) = chunk.content
            {
                on_chunk(&text.text);
                chunks.push(text.text);
            }
        };
        let result = loop {
            tokio::select! {
                biased;
                Some(notification) = updates.recv() => take(notification, &mut chunks),
                result = &mut response => break result,
            }
        };
        let response = result.map_err(protocol("session/prompt"))?;
        // Updates the agent sent before its answer may still be queued.
        while let Ok(notification) = updates.try_recv() {
            take(notification, &mut chunks);
        }
        Ok(TurnOutcome {
            stop_reason: response.stop_reason,
            chunks,
        })
    }

    /// `session/cancel`: asks the agent to end the running turn. The session stays usable.
    pub fn cancel(&self, session_id: &str) -> Result<(), AcpError> {
        self.connection
            .send_notification(CancelNotification::new(session_id.to_owned()))
            .map_err(protocol("session/cancel"))
    }

    /// `session/close` when the agent advertises it; `Ok(false)` when it does not.
    pub async fn close_session(&self, session_id: &str) -> Result<bool, AcpError> {
        if self.capabilities.session_capabilities.close.is_none() {
            return Ok(false);
        }
        self.connection
            .send_request(CloseSessionRequest::new(session_id.to_owned()))
            .block_task()
            .await
            .map_err(protocol("session/close"))?;
        Ok(true)
    }

    /// Stops driving the connection (drops our end of the transport).
    pub fn shutdown(&self) {
        let sender = self
            .shutdown
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(());
        }
    }
}

impl Drop for AcpClient {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_var_auth_methods_keep_their_variables() {
        // codex-acp 0.16.0's answer, offline, trimmed to its authMethods.
        let raw = serde_json::json!({"authMethods": [
            {"id": "chatgpt", "name": "Login with ChatGPT"},
            {"type": "env_var", "id": "codex-api-key", "name": "Use CODEX_API_KEY",
             "vars": [{"name": "CODEX_API_KEY"}]},
            {"type": "env_var", "id": "legacy", "name": "x", "varName": "LEGACY_KEY"},
            {"type": "terminal", "id": "tui", "name": "Log in", "args": ["login"]}
        ]});
        let methods = auth_methods(&raw);
        let ids: Vec<(&str, Vec<&str>)> = methods
            .iter()
            .map(|m| {
                (
                    m.id.as_str(),
                    m.env_vars.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            ids,
            [
                ("chatgpt", vec![]),
                ("codex-api-key", vec!["CODEX_API_KEY"]),
                ("legacy", vec!["LEGACY_KEY"]),
                ("tui", vec![]),
            ]
        );
        assert_eq!(methods[1].to_string(), "codex-api-key (env CODEX_API_KEY)");
        assert!(auth_methods(&serde_json::json!({})).is_empty());
    }

    #[test]
    fn auth_errors_are_told_apart_from_other_failures() {
        let error = |code: i32, message: &str| AcpError::Protocol {
            step: "session/prompt",
            source: agent_client_protocol::Error::new(code, message.to_owned()),
        };
        assert!(error(-32000, "Authentication required").is_auth_required());
        assert!(error(-32603, "Error: API key is missing").is_auth_required());
        assert!(!error(-32603, "Internal error: API Error: Unable to connect").is_auth_required());
        assert!(!AcpError::Disconnected { step: "x" }.is_auth_required());
    }
}
