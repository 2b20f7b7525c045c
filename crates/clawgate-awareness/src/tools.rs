//! The session tools as a typed API (`sessions_list`, `sessions_history`, `sessions_send`,
//! `session_status`), with the camelCase JSON shapes of the design pages.
//!
//! Every tool answers through one visibility rule ([`crate::can_see_session_row`]) on the
//! target's registry row, so a session `sessions_list` shows is never refused by another tool.
//! Reading tools move no cursor.
//!
//! With the `schema` feature the parameter and result types the gateway's control API serves
//! derive `JsonSchema` (`cargo xtask codegen` writes them to `docs/schema/`). The parameters
//! that name their session (`sessionKey`) do not: the control API takes the key from the path.

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_store::SessionRow;
use clawgate_store::Store;
use clawgate_types::{
    AcpSessionOwner, AgentToAgentPolicy, SessionKey, SessionStateEvent, SessionVisibility,
    SessionVisibilityInput, StateVersion, UnixMillis,
};
use serde::{Deserialize, Serialize};

use crate::engine::Awareness;
use crate::error::{AwarenessError, AwarenessResult};
use crate::visibility::{can_see_session_row, visibility_row};

/// Who is calling a session tool, and the visibility configured for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    pub session_key: SessionKey,
    pub visibility: SessionVisibility,
    pub a2a_policy: AgentToAgentPolicy,
    /// Sandboxed requesters are clamped to `tree`.
    pub sandboxed: bool,
}

impl Requester {
    /// Whether this requester may see `row` — the one rule behind every tool.
    pub fn can_see(&self, row: &SessionRow) -> bool {
        can_see_session_row(&SessionVisibilityInput {
            requester_session_key: self.session_key.clone(),
            row: visibility_row(row),
            visibility: self.visibility,
            a2a_policy: self.a2a_policy.clone(),
            requester_sandboxed: self.sandboxed,
        })
    }
}

/// `sessions_list` parameters (`GET /v1/sessions` query).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionsListParams {
    /// At most this many sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// One visible session of the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionListEntry {
    pub key: SessionKey,
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_session_key: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_by: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_key: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acp_owner: Option<AcpSessionOwner>,
    pub created_at: UnixMillis,
    pub updated_at: UnixMillis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_at: Option<UnixMillis>,
    /// Present once the session has recorded changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_version: Option<StateVersion>,
}

/// `sessions_list` result (`GET /v1/sessions`): the sessions the requester may see (the
/// operator sees all of them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionsListResult {
    pub sessions: Vec<SessionListEntry>,
}

/// `sessions_history` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionsHistoryParams {
    pub session_key: SessionKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `sessions_history` result (`GET /v1/sessions/{key}/history`): the newest retained state
/// changes of a session (message transcripts belong to the gateway's transcript store; this is
/// the session's state history).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionsHistoryResult {
    pub session_key: SessionKey,
    pub state_version: StateVersion,
    pub events: Vec<SessionStateEvent>,
    /// Older retained events exist beyond `limit`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Older history was removed by retention.
    pub history_gap: bool,
}

/// `sessions_send` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionsSendParams {
    pub session_key: SessionKey,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<bool>,
}

/// `sessions_send` result (`POST /v1/sessions/{key}/send`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionsSendResult {
    /// Always `sent` (a failed delivery is an error).
    pub status: SendStatus,
    /// The session that actually received the message.
    pub session_key: SessionKey,
    /// Present when `watch` was set: whether the sender now watches the receiving session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watched: Option<bool>,
}

/// What became of a `sessions_send` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SendStatus {
    /// Handed to the delivery path.
    Sent,
}

impl SendStatus {
    /// The wire name (`sent`).
    pub fn as_str(self) -> &'static str {
        match self {
            SendStatus::Sent => "sent",
        }
    }
}

impl std::fmt::Display for SendStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `session_status` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatusParams {
    pub session_key: SessionKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes_since: Option<StateVersion>,
}

/// The delta after a version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct StateChanges {
    pub events: Vec<SessionStateEvent>,
    /// More than the returned events exist after the version: ask again from the last one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The version is older than the retained history: refresh the whole session state
    /// instead of treating this as an exact delta.
    pub history_gap: bool,
}

/// `session_status` result (`GET /v1/sessions/{key}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionStatusResult {
    pub session_key: SessionKey,
    pub agent_id: String,
    /// Always reported (0 before any change).
    pub state_version: StateVersion,
    /// With `changesSince`: the events after that version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_changes: Option<StateChanges>,
}

/// Delivers a `sessions_send` message; the gateway plugs its dispatcher in here.
#[async_trait]
pub trait SessionDelivery: Send + Sync {
    /// Dispatches `message` from `from` to `to` and names the session that actually received
    /// it (routing may resolve `to` to another session).
    async fn deliver(
        &self,
        from: &SessionKey,
        to: &SessionKey,
        message: &str,
    ) -> Result<SessionKey, Box<dyn std::error::Error + Send + Sync>>;
}

/// The session tools over an engine and a delivery path.
pub struct SessionTools {
    awareness: Arc<Awareness>,
    delivery: Arc<dyn SessionDelivery>,
}

impl std::fmt::Debug for SessionTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTools").finish_non_exhaustive()
    }
}

impl SessionTools {
    pub fn new(awareness: Arc<Awareness>, delivery: Arc<dyn SessionDelivery>) -> Self {
        SessionTools {
            awareness,
            delivery,
        }
    }

    fn store(&self) -> &dyn Store {
        self.awareness.store().as_ref()
    }

    /// The row of `key` if the requester may see it; one error for missing and hidden. A bare
    /// `global` (as the wire spells every agent's global-scope session) means the requester's
    /// own agent's: each agent's is its own session.
    async fn visible_row(&self, req: &Requester, key: &SessionKey) -> AwarenessResult<SessionRow> {
        let requester_agent = req
            .session_key
            .global_agent()
            .or(req.session_key.agent_id());
        let resolved = match requester_agent {
            Some(agent) if key.is_global() && key.global_agent().is_none() => {
                SessionKey::global_of(agent).unwrap_or_else(|_| key.clone())
            }
            _ => key.clone(),
        };
        match self.awareness.session(&resolved).await? {
            Some(row) if req.can_see(&row) => Ok(row),
            _ => Err(AwarenessError::NotVisible {
                key: key.clone(),
                requester: req.session_key.clone(),
            }),
        }
    }

    #[tracing::instrument(name = "sessions_list", skip_all, fields(session = %req.session_key))]
    pub async fn sessions_list(
        &self,
        req: &Requester,
        params: &SessionsListParams,
    ) -> AwarenessResult<SessionsListResult> {
        let limit = params.limit.map_or(usize::MAX, |l| l as usize);
        let mut sessions = Vec::new();
        for row in self.store().list_sessions().await? {
            if sessions.len() >= limit {
                break;
            }
            if !req.can_see(&row) {
                continue;
            }
            let head = self.store().session_head(&row.session_key).await?;
            sessions.push(SessionListEntry {
                state_version: (head.state_version.0 > 0).then_some(head.state_version),
                key: row.session_key,
                agent_id: row.agent_id,
                label: row.label,
                owner_session_key: row.owner_session_key,
                spawned_by: row.spawned_by,
                parent_session_key: row.parent_session_key,
                acp_owner: row.acp_owner,
                created_at: row.created_at,
                updated_at: row.updated_at,
                reset_at: row.reset_at,
            });
        }
        Ok(SessionsListResult { sessions })
    }

    #[tracing::instrument(name = "sessions_history", skip_all, fields(session = %params.session_key))]
    pub async fn sessions_history(
        &self,
        req: &Requester,
        params: &SessionsHistoryParams,
    ) -> AwarenessResult<SessionsHistoryResult> {
        let key = self
            .visible_row(req, &params.session_key)
            .await?
            .session_key;
        let cap = self.awareness.config().changes_limit;
        let limit = params.limit.unwrap_or(cap).min(cap);
        let head = self.store().session_head(&key).await?;
        // Sequences are contiguous per session and pruning removes a prefix, so the newest
        // `limit` retained events start here.
        let since = head
            .state_version
            .0
            .saturating_sub(u64::from(limit))
            .max(head.pruned_through);
        let changes = self
            .store()
            .events_since(&key, StateVersion(since), limit)
            .await?;
        Ok(SessionsHistoryResult {
            session_key: key,
            state_version: changes.state_version,
            events: changes.events,
            truncated: since > head.pruned_through,
            history_gap: head.pruned_through > 0,
        })
    }

    /// Sends a message through the delivery path; with `watch: true`, after a successful
    /// send, registers the sender as a watcher of the session that actually received it,
    /// starting at that session's current version.
    #[tracing::instrument(name = "sessions_send", skip_all, fields(session = %params.session_key))]
    pub async fn sessions_send(
        &self,
        req: &Requester,
        params: &SessionsSendParams,
    ) -> AwarenessResult<SessionsSendResult> {
        let key = self
            .visible_row(req, &params.session_key)
            .await?
            .session_key;
        let received_by = self
            .delivery
            .deliver(&req.session_key, &key, &params.message)
            .await
            .map_err(|source| AwarenessError::Delivery { key, source })?;
        let watched = match params.watch {
            Some(true) => Some(self.watch_receiver(req, &received_by).await),
            Some(false) => Some(false),
            None => None,
        };
        Ok(SessionsSendResult {
            status: SendStatus::Sent,
            session_key: received_by,
            watched,
        })
    }

    async fn watch_receiver(&self, req: &Requester, received_by: &SessionKey) -> bool {
        // A watch on a session the sender may not see would leak its changes through notices.
        match self.awareness.session(received_by).await {
            Ok(Some(row)) if req.can_see(&row) => {
                self.awareness.watch(&req.session_key, received_by).await
            }
            Ok(_) => false,
            Err(error) => {
                tracing::warn!(%error, "could not load the receiving session to watch it");
                false
            }
        }
    }

    /// Reports a session's state version, and with `changes_since` the typed events after it
    /// (at most the configured 200), `truncated` and an exact `historyGap`. Moves no cursor.
    #[tracing::instrument(name = "session_status", skip_all, fields(session = %params.session_key))]
    pub async fn session_status(
        &self,
        req: &Requester,
        params: &SessionStatusParams,
    ) -> AwarenessResult<SessionStatusResult> {
        let row = self.visible_row(req, &params.session_key).await?;
        let (state_version, state_changes) = match params.changes_since {
            Some(since) => {
                let changes = self
                    .store()
                    .events_since(
                        &row.session_key,
                        since,
                        self.awareness.config().changes_limit,
                    )
                    .await?;
                (
                    changes.state_version,
                    Some(StateChanges {
                        events: changes.events,
                        truncated: changes.truncated,
                        history_gap: changes.history_gap,
                    }),
                )
            }
            None => (
                self.store()
                    .session_head(&row.session_key)
                    .await?
                    .state_version,
                None,
            ),
        };
        Ok(SessionStatusResult {
            session_key: row.session_key,
            agent_id: row.agent_id,
            state_version,
            state_changes,
        })
    }
}
