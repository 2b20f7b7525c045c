//! Inputs of the session visibility rule (the rule itself lives with the session registry).

use serde::{Deserialize, Serialize};

use crate::SessionKey;

/// How far a requester may see other sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionVisibility {
    /// Only the requester's own session.
    #[serde(rename = "self")]
    OwnSession,
    /// The requester's session plus rows it owns or spawned.
    Tree,
    /// The same agent only, unless explicit ownership says the row is the requester's.
    Agent,
    /// Same agent, a2a-allowed other agents, and requester-owned rows of other agents.
    All,
}

/// Agent-to-agent policy: whether sessions of other agents may be reached, and which.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentToAgentPolicy {
    /// Whether sessions of other agents may be reached at all.
    pub enabled: bool,
    /// Agent id patterns: `*` wildcards match case-insensitively, exact names case-sensitively;
    /// blank patterns match nothing.
    #[serde(default)]
    pub allow: Vec<String>,
}

/// The row metadata visibility may look at: nothing else (no secondary lookups).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct VisibilityRow {
    /// The row's session key.
    pub key: SessionKey,
    /// The agent the row's session runs.
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The session that owns the row.
    pub owner_session_key: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The session that spawned the row.
    pub spawned_by: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The row's parent in the session tree.
    pub parent_session_key: Option<SessionKey>,
}

/// Everything `can_see_session_row` decides on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionVisibilityInput {
    /// The session asking to see the row.
    pub requester_session_key: SessionKey,
    /// The row's metadata.
    pub row: VisibilityRow,
    /// How far the requester may see.
    pub visibility: SessionVisibility,
    /// The agent-to-agent policy in force.
    pub a2a_policy: AgentToAgentPolicy,
    /// Sandboxed requesters are clamped to `tree`.
    #[serde(default)]
    pub requester_sandboxed: bool,
}
