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
    AgentCapabilities, CancelNotification, CloseSessionRequest, ContentBlock, InitializeRequest,
    LoadSessionRequest, NewSessionRequest, PromptRequest, SessionNotification, SessionUpdate,
    StopReason, TextContent,
};
use agent_client_protocol::{Agent, ByteStreams, Client};
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
}

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
        let init = connection
            .send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await
            .map_err(protocol("initialize"))?;
        Ok(AcpClient {
            connection,
            updates: Mutex::new(updates_rx),
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
