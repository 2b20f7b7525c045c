//! Session keys, the typed events of the per-session signal log, and state versions.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::UnixMillis;

/// A session key could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionKeyError {
    /// The text is empty.
    #[error("session key is empty")]
    Empty,
    /// The text contains whitespace or control characters.
    #[error("session key {0:?} contains whitespace or control characters")]
    BadCharacter(String),
    /// A `:`-separated segment is empty, or `agent:<id>` names no session.
    #[error("session key {0:?} has an empty segment (expected `agent:<agentId>:<name>`)")]
    EmptySegment(String),
    /// The text is longer than 512 bytes.
    #[error("session key {0:?} is longer than 512 bytes")]
    TooLong(String),
    /// The agent id of a global-scope session is not one key segment.
    #[error(
        "agent id {0:?} cannot own a global-scope session: it must be non-empty, without \
         whitespace, control characters or `:`"
    )]
    BadAgentId(String),
}

/// The shared key of `session.scope = "global"`: ambiguous between agents.
pub const GLOBAL_SESSION_KEY: &str = "global";

/// A session key such as `agent:main:subagent:child`.
///
/// Three shapes exist: agent-qualified keys (`agent:<agentId>:<rest>`), the global-scope key
/// (`global`), and unqualified legacy keys. Only agent-qualified keys may act as watchers.
///
/// Under `session.scope = "global"` every agent's session is called `global`, yet each agent's
/// is its own session (own registry row, signal log, history). [`SessionKey::global_of`] keeps
/// the agent beside the text: the key still reads, prints and serializes as `global` (the wire
/// and the spec speak of `global` plus the row's agent id), while equality, ordering and the
/// store's [`SessionKey::storage_key`] tell two agents' global sessions apart. A bare
/// [`SessionKey::global`] (parsed from text, or stored before agents were told apart) names no
/// agent and is a session of its own.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionKey {
    raw: String,
    /// Byte range of the agent id inside `raw`, for agent-qualified keys (keys are at most 512
    /// bytes; small offsets keep the key, and every error carrying one, small).
    agent: Option<(u16, u16)>,
    /// The agent owning a global-scope session (`global_of`); never set for other shapes.
    global_agent: Option<Box<str>>,
}

/// How the store spells an agent's global session: `global::<agentId>`. The empty segment
/// makes it text [`SessionKey::parse`] rejects, so it can never collide with a real key (a
/// legacy key `global@main` stays a different session).
const GLOBAL_STORAGE_PREFIX: &str = "global::";

impl SessionKey {
    /// Parses and validates a key.
    pub fn parse(text: &str) -> Result<SessionKey, SessionKeyError> {
        if text.is_empty() {
            return Err(SessionKeyError::Empty);
        }
        if text.len() > 512 {
            return Err(SessionKeyError::TooLong(text.to_owned()));
        }
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(SessionKeyError::BadCharacter(text.to_owned()));
        }
        if text.split(':').any(str::is_empty) {
            return Err(SessionKeyError::EmptySegment(text.to_owned()));
        }
        let agent = match text.strip_prefix("agent:") {
            Some(rest) => match rest.find(':') {
                Some(end) => Some((6, u16::try_from(6 + end).unwrap_or(u16::MAX))),
                // `agent:main` names an agent but no session within it.
                None => return Err(SessionKeyError::EmptySegment(text.to_owned())),
            },
            None => None,
        };
        Ok(SessionKey {
            raw: text.to_owned(),
            agent,
            global_agent: None,
        })
    }

    /// Builds `agent:<agent_id>:<rest>`.
    pub fn for_agent(agent_id: &str, rest: &str) -> Result<SessionKey, SessionKeyError> {
        SessionKey::parse(&format!("agent:{agent_id}:{rest}"))
    }

    /// The global-scope key naming no agent (as parsed from the text `global`).
    pub fn global() -> SessionKey {
        SessionKey {
            raw: GLOBAL_SESSION_KEY.to_owned(),
            agent: None,
            global_agent: None,
        }
    }

    /// Agent `agent_id`'s global-scope session: reads as `global`, distinct from every other
    /// agent's. The agent id must be one key segment (non-empty, no whitespace, no `:`).
    pub fn global_of(agent_id: &str) -> Result<SessionKey, SessionKeyError> {
        let valid = !agent_id.is_empty()
            && agent_id.len() <= 256
            && !agent_id
                .chars()
                .any(|c| c == ':' || c.is_whitespace() || c.is_control());
        if !valid {
            return Err(SessionKeyError::BadAgentId(agent_id.to_owned()));
        }
        Ok(SessionKey {
            raw: GLOBAL_SESSION_KEY.to_owned(),
            agent: None,
            global_agent: Some(agent_id.into()),
        })
    }

    /// The agent owning this global-scope session, when the key names one.
    pub fn global_agent(&self) -> Option<&str> {
        self.global_agent.as_deref()
    }

    /// The text a store keys this session by: the key itself, but `global::<agentId>` for an
    /// agent's global session, so two agents' global sessions never share a row or a log.
    pub fn storage_key(&self) -> std::borrow::Cow<'_, str> {
        match &self.global_agent {
            Some(agent) => format!("{GLOBAL_STORAGE_PREFIX}{agent}").into(),
            None => self.raw.as_str().into(),
        }
    }

    /// Reads a [`SessionKey::storage_key`] back.
    pub fn from_storage(text: &str) -> Result<SessionKey, SessionKeyError> {
        match text.strip_prefix(GLOBAL_STORAGE_PREFIX) {
            Some(agent) => SessionKey::global_of(agent),
            None => SessionKey::parse(text),
        }
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The agent id of an agent-qualified key.
    pub fn agent_id(&self) -> Option<&str> {
        self.agent
            .map(|(start, end)| &self.raw[usize::from(start)..usize::from(end)])
    }

    /// The part after `agent:<agentId>:`.
    pub fn rest(&self) -> &str {
        match self.agent {
            Some((_, end)) => &self.raw[usize::from(end) + 1..],
            None => &self.raw,
        }
    }

    /// Whether the key has the `agent:<agentId>:<rest>` shape.
    pub fn is_agent_qualified(&self) -> bool {
        self.agent.is_some()
    }

    /// Whether this is the global-scope key.
    pub fn is_global(&self) -> bool {
        self.raw == GLOBAL_SESSION_KEY
    }

    /// Whether this session may hold watch cursors and receive proactive notices.
    pub fn can_watch(&self) -> bool {
        self.is_agent_qualified()
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.global_agent {
            Some(agent) => write!(f, "SessionKey({:?} of agent {agent:?})", self.raw),
            None => write!(f, "SessionKey({:?})", self.raw),
        }
    }
}

impl std::str::FromStr for SessionKey {
    type Err = SessionKeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SessionKey::parse(s)
    }
}

impl Serialize for SessionKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

impl<'de> Deserialize<'de> for SessionKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        SessionKey::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for SessionKey {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SessionKey".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "`agent:<agentId>:<name>`, `global`, or an unqualified legacy key",
            "minLength": 1,
            "maxLength": 512
        })
    }
}

/// A session's state version: the highest sequence of its signal log (0 before any change).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct StateVersion(pub u64);

impl fmt::Display for StateVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What changed in a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SessionStateEventKind {
    /// The session was created (log only; marks its creation version).
    Created,
    /// A human sent a turn directly into the watched session. Notifies.
    HumanDirectMessage,
    /// The session's goal was created, updated or cleared. Notifies.
    GoalChanged,
    /// A subagent or ACP child was spawned. Sets the parent's cursor; no notice.
    ChildSpawned,
    /// A child run ended successfully. Log only.
    RunCompleted,
    /// A child run failed, timed out or was cancelled (outcome kept). Log only.
    RunFailed,
    /// The session's history was compacted. Log only.
    Compacted,
}

impl SessionStateEventKind {
    /// Whether an event of this kind opens a stale-state notice for lagging watchers.
    pub fn notifies(self) -> bool {
        matches!(
            self,
            SessionStateEventKind::HumanDirectMessage | SessionStateEventKind::GoalChanged
        )
    }
}

/// Who caused an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ActorType {
    /// A person.
    Human,
    /// An agent session.
    Agent,
    /// The gateway itself.
    System,
}

/// The precise result of a failed child run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The run was cancelled.
    Cancelled,
    /// The run ran out of time.
    Timeout,
    /// The run failed with an error.
    Error,
}

/// One row of a session's signal log: metadata and a one-line summary, never message content.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SessionStateEvent {
    /// The event's position in the session's log (the state version it creates).
    pub sequence: u64,
    /// What changed.
    pub kind: SessionStateEventKind,
    /// Who caused it.
    pub actor_type: ActorType,
    /// The acting session key, user id or subsystem; used to suppress self-notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<String>,
    /// A one-line summary, never message content.
    pub summary: String,
    /// Present on `run_failed`: cancelled, timeout or error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<RunOutcome>,
    /// For `child_spawned`: the child's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_session_key: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// When it happened.
    pub created_at: Option<UnixMillis>,
}
