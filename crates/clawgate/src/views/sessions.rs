//! `clawgate sessions`, `/v1/sessions`: the session tools, with the operator as requester.

use std::sync::Arc;

use clawgate_awareness::{self as aw, Requester, SessionTools};
use clawgate_store::Store;
use clawgate_types::{AgentToAgentPolicy, SessionKey, SessionVisibility, StateVersion};
use serde::{Deserialize, Serialize};

use crate::config::SessionsSection;

use super::{OPERATOR_SESSION_KEY, ViewError};

/// The operator as a session-tools requester: visibility `all`, every agent allowed, not
/// sandboxed. `from` lets it act as a session (a watch needs an agent-qualified watcher).
pub fn operator_requester(from: Option<SessionKey>) -> Requester {
    let session_key = from.unwrap_or_else(|| {
        SessionKey::parse(OPERATOR_SESSION_KEY).expect("the operator key is a valid session key")
    });
    Requester {
        session_key,
        visibility: SessionVisibility::All,
        a2a_policy: AgentToAgentPolicy {
            enabled: true,
            allow: vec!["*".into()],
        },
        sandboxed: false,
    }
}

/// The session tools' own wire types, which the control API serves as they are.
pub use clawgate_awareness::{
    SendStatus, SessionListEntry, SessionStatusResult, SessionsHistoryResult, SessionsListParams,
    SessionsListResult, SessionsSendResult, StateChanges,
};

// The tools' parameters name their session; the control API takes it from the path, so its
// query and body types below are the parameters without the key.

/// `GET /v1/sessions/{key}/history` query (`sessions_history` without the key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionsHistoryParams {
    /// The newest this many retained events (capped by the gateway, 200 by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `GET /v1/sessions/{key}` query (`session_status` without the key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatusParams {
    /// With a version: the typed events after it (`stateChanges`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes_since: Option<u64>,
}

/// `POST /v1/sessions/{key}/send` body (`sessions_send` without the key, with the sender).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionsSendBody {
    pub message: String,
    /// After the send, the sender watches the receiving session (needs an agent-qualified
    /// `from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<bool>,
    /// The session sending it (default: `operator`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<SessionKey>,
}

pub fn parse_session_key(text: &str) -> Result<SessionKey, ViewError> {
    SessionKey::parse(text).map_err(|e| ViewError::BadRequest(e.to_string()))
}

pub async fn sessions_list(
    tools: &SessionTools,
    params: &SessionsListParams,
) -> Result<SessionsListResult, ViewError> {
    Ok(tools
        .sessions_list(&operator_requester(None), params)
        .await?)
}

pub async fn sessions_history(
    tools: &SessionTools,
    key: SessionKey,
    params: &SessionsHistoryParams,
) -> Result<SessionsHistoryResult, ViewError> {
    Ok(tools
        .sessions_history(
            &operator_requester(None),
            &aw::SessionsHistoryParams {
                session_key: key,
                limit: params.limit,
            },
        )
        .await?)
}

pub async fn session_status(
    tools: &SessionTools,
    key: SessionKey,
    params: &SessionStatusParams,
) -> Result<SessionStatusResult, ViewError> {
    Ok(tools
        .session_status(
            &operator_requester(None),
            &aw::SessionStatusParams {
                session_key: key,
                changes_since: params.changes_since.map(StateVersion),
            },
        )
        .await?)
}

/// Who sends: the operator when `from` is absent; a session (`from`) sends under the
/// configured visibility and agent-to-agent policy, like any session-tool call of that session.
pub fn sender_requester(from: Option<SessionKey>, policy: &SessionsSection) -> Requester {
    match from {
        None => operator_requester(None),
        Some(session_key) => Requester {
            session_key,
            visibility: policy.visibility,
            a2a_policy: policy.a2a.clone(),
            sandboxed: false,
        },
    }
}

pub async fn sessions_send(
    tools: &SessionTools,
    policy: &SessionsSection,
    key: SessionKey,
    body: &SessionsSendBody,
) -> Result<SessionsSendResult, ViewError> {
    if body.message.trim().is_empty() {
        return Err(ViewError::BadRequest("the message is empty".into()));
    }
    Ok(tools
        .sessions_send(
            &sender_requester(body.from.clone(), policy),
            &aw::SessionsSendParams {
                session_key: key,
                message: body.message.clone(),
                watch: body.watch,
            },
        )
        .await?)
}

/// `GET /v1/sessions/{key}/watchers`: who watches the session and whom it watches, each watch
/// with its pending notice (the store's watch cursors, as they are).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionWatchers {
    pub session_key: SessionKey,
    /// Sessions watching this one.
    pub watched_by: Vec<WatchSummary>,
    /// Sessions this one watches.
    pub watching: Vec<WatchSummary>,
}

/// One watch: a watcher session following a target session's state changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchSummary {
    pub watcher: SessionKey,
    pub target: SessionKey,
    /// `spawn` (a parent watches its child) or `explicit` (`sessions_send` with `watch`).
    pub source: String,
    /// The watcher has seen everything up to this version.
    pub acked_version: StateVersion,
    /// A notice is pending for the watcher, up to this version (shown in its next prompt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_notice_version: Option<StateVersion>,
    /// The newest change of the target worth a notice.
    pub material_version: StateVersion,
    /// The target was deleted, by this actor (the pending notice says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_deleted_by: Option<String>,
    pub updated_at: clawgate_types::UnixMillis,
}

impl WatchSummary {
    pub fn of(cursor: &clawgate_store::WatchCursor) -> WatchSummary {
        WatchSummary {
            watcher: cursor.watcher_key.clone(),
            target: cursor.target_key.clone(),
            source: cursor.source.as_str().to_owned(),
            acked_version: cursor.acked_version,
            pending_notice_version: cursor.notified_version,
            material_version: cursor.material_version,
            target_deleted_by: cursor.target_deleted_by.clone(),
            updated_at: cursor.updated_at,
        }
    }
}

pub async fn session_watchers<S: clawgate_store::WatchCursorStore + ?Sized>(
    store: &S,
    key: SessionKey,
) -> Result<SessionWatchers, ViewError> {
    let watched_by = store.cursors_on_target(&key).await?;
    let watching = store.cursors_of_watcher(&key).await?;
    Ok(SessionWatchers {
        session_key: key,
        watched_by: watched_by.iter().map(WatchSummary::of).collect(),
        watching: watching.iter().map(WatchSummary::of).collect(),
    })
}

/// The delivery of a stopped gateway: there is nobody to deliver to.
#[derive(Debug)]
pub struct NoDelivery;

#[async_trait::async_trait]
impl aw::SessionDelivery for NoDelivery {
    async fn deliver(
        &self,
        _from: &SessionKey,
        _to: &SessionKey,
        _message: &str,
    ) -> Result<SessionKey, Box<dyn std::error::Error + Send + Sync>> {
        Err(NEEDS_GATEWAY_TO_SEND.into())
    }
}

pub const NEEDS_GATEWAY_TO_SEND: &str = "sending into a session needs a running gateway (it \
     delivers through the session's conversation): start one with `clawgate up`";

/// The session tools over a store, for a stopped gateway (reads only; sends are refused).
pub fn offline_tools(store: Arc<dyn Store>) -> SessionTools {
    let awareness = Arc::new(aw::Awareness::builder(store).build());
    SessionTools::new(awareness, Arc::new(NoDelivery))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests fail loudly by design.
    use super::*;

    #[test]
    fn a_session_sends_under_the_configured_visibility() {
        let row = clawgate_store::SessionRow {
            session_key: SessionKey::parse("agent:other:qa:room").unwrap(),
            agent_id: "other".into(),
            owner_session_key: None,
            spawned_by: None,
            parent_session_key: None,
            label: None,
            acp_owner: None,
            lease_id: None,
            acp_session_id: None,
            created_at: 0,
            updated_at: 0,
            reset_at: None,
            deleted_at: None,
        };
        let from = Some(SessionKey::parse("agent:main:qa:dm-1").unwrap());
        let tree = crate::config::SessionsSection::default();
        assert!(
            !sender_requester(from.clone(), &tree).can_see(&row),
            "tree: another agent's session is out of reach"
        );
        let all = crate::config::SessionsSection {
            visibility: SessionVisibility::All,
            a2a: AgentToAgentPolicy {
                enabled: true,
                allow: vec!["oth*".into()],
            },
        };
        assert!(
            sender_requester(from, &all).can_see(&row),
            "all + a2a allow"
        );
        assert!(
            sender_requester(None, &tree).can_see(&row),
            "the operator sees every session whatever the policy"
        );
    }

    #[test]
    fn the_operator_sees_every_session() {
        let requester = operator_requester(None);
        let row = |key: &str, agent: &str| clawgate_store::SessionRow {
            session_key: SessionKey::parse(key).unwrap(),
            agent_id: agent.into(),
            owner_session_key: None,
            spawned_by: None,
            parent_session_key: None,
            label: None,
            acp_owner: None,
            lease_id: None,
            acp_session_id: None,
            created_at: 0,
            updated_at: 0,
            reset_at: None,
            deleted_at: None,
        };
        assert!(requester.can_see(&row("agent:main:qa:room", "main")));
        assert!(requester.can_see(&row("agent:other:x", "other")));
        assert!(requester.can_see(&row("legacy", "main")));
    }
}

/// `POST /v1/sessions/{key}/cancel` and `/close`: what was done to the session's agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionAction {
    pub session: SessionKey,
    /// `cancel` (the running turn ended with ACP `session/cancel`; the session and its process
    /// stay) or `close` (the agent session closed: the next message begins a fresh one).
    pub action: String,
    /// Whether a turn was running (and was cancelled).
    pub turn_was_running: bool,
}
