//! Ownership of ACP sessions and ACPX process leases.

use serde::{Deserialize, Serialize};

use crate::{GatewayInstanceId, LeaseId, SessionKey, UnixMillis};

/// The process backend of an ACP session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AcpBackend {
    /// The ACPX process-group wrapper.
    Acpx,
}

/// Normalized ownership metadata of a spawned ACP session; it lives on the session row, so
/// visibility is a pure check of row metadata.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AcpSessionOwner {
    /// The spawned ACP session.
    pub session_key: SessionKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The session whose tool call spawned it.
    pub spawned_by: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The session it hangs under in the session tree.
    pub parent_session_key: Option<SessionKey>,
    /// The session that owns it (sees it, may steer and close it).
    pub owner_session_key: SessionKey,
    /// The agent the session runs.
    pub agent_id: String,
    /// The process backend it runs on.
    pub backend: AcpBackend,
    /// The gateway instance that spawned it.
    pub gateway_instance_id: GatewayInstanceId,
    /// When it was spawned.
    pub created_at: UnixMillis,
}

/// Where a lease is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Written before the wrapper starts; the process tree may be alive.
    Open,
    /// A verified close is in progress, or owned processes outlived KILL (listed in the
    /// lease's `survivors`): looked at again until they are gone.
    Closing,
    /// The owned tree was verified and ended.
    Closed,
    /// The process was already gone when cleanup looked.
    Lost,
}

impl LeaseState {
    /// The wire spelling, also the stored column value.
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Open => "open",
            LeaseState::Closing => "closing",
            LeaseState::Closed => "closed",
            LeaseState::Lost => "lost",
        }
    }

    /// Parses the wire spelling.
    pub fn parse(text: &str) -> Option<LeaseState> {
        [
            LeaseState::Open,
            LeaseState::Closing,
            LeaseState::Closed,
            LeaseState::Lost,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    /// Closed and lost leases only await retention.
    pub fn is_finished(self) -> bool {
        matches!(self, LeaseState::Closed | LeaseState::Lost)
    }
}

impl std::fmt::Display for LeaseState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A durable claim that one wrapper process tree belongs to one gateway instance and session.
/// Nothing is signalled unless live evidence matches a lease of this gateway instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AcpxProcessLease {
    /// The lease's id.
    pub lease_id: LeaseId,
    /// The gateway instance the process tree belongs to.
    pub gateway_instance_id: GatewayInstanceId,
    /// The session the process tree serves.
    pub session_key: SessionKey,
    /// The directory the wrapper runs in.
    pub wrapper_root: String,
    /// The wrapper binary that was started.
    pub wrapper_path: String,
    /// Unknown until the wrapper has started (the lease is written first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pid: Option<u32>,
    /// Start time of the root process (clock ticks since boot, `/proc/PID/stat` field 22).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_start_time: Option<u64>,
    /// Boot id the start time belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The wrapper's process group, once it has started.
    pub process_group_id: Option<u32>,
    /// Hash of the command line, to recognise the process again.
    pub command_hash: String,
    /// When the lease was written.
    pub started_at: UnixMillis,
    /// Where the lease is in its life.
    pub state: LeaseState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// When the lease was closed or found lost.
    pub ended_at: Option<UnixMillis>,
    /// Owned processes still alive after the last KILL (uninterruptible sleep, a tracer holding
    /// them): while any is listed the lease stays `closing` and is looked at again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survivors: Vec<LeaseSurvivor>,
    /// The last lines the agent wrote on stderr before its start or a turn failed (secrets
    /// masked): why it failed, for the operator (`leases list`, the console).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr_tail: Vec<String>,
}

/// One owned process that outlived KILL, named by pid and start time (in the lease's boot), so
/// a later look never mistakes a process that reused the pid for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct LeaseSurvivor {
    /// Its pid.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/PID/stat` field 22).
    pub start_time: u64,
}
