//! Ownership of ACP sessions and ACPX process leases.

use serde::{Deserialize, Serialize};

use crate::{GatewayInstanceId, LeaseId, SessionKey, UnixMillis};

/// The process backend of an ACP session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum AcpBackend {
    Acpx,
}

/// Normalized ownership metadata of a spawned ACP session; it lives on the session row, so
/// visibility is a pure check of row metadata.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AcpSessionOwner {
    pub session_key: SessionKey,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spawned_by: Option<SessionKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_key: Option<SessionKey>,
    pub owner_session_key: SessionKey,
    pub agent_id: String,
    pub backend: AcpBackend,
    pub gateway_instance_id: GatewayInstanceId,
    pub created_at: UnixMillis,
}

/// Where a lease is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// Written before the wrapper starts; the process tree may be alive.
    Open,
    /// A verified close is in progress.
    Closing,
    /// The owned tree was verified and ended.
    Closed,
    /// The process was already gone when cleanup looked.
    Lost,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::Open => "open",
            LeaseState::Closing => "closing",
            LeaseState::Closed => "closed",
            LeaseState::Lost => "lost",
        }
    }

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
    pub lease_id: LeaseId,
    pub gateway_instance_id: GatewayInstanceId,
    pub session_key: SessionKey,
    pub wrapper_root: String,
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
    pub process_group_id: Option<u32>,
    pub command_hash: String,
    pub started_at: UnixMillis,
    pub state: LeaseState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<UnixMillis>,
}
