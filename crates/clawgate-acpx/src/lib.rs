//! ACPX process leases (layer 2): the gateway's claim on the agent processes it starts.
//!
//! * [`table`]: the process-table seam (`/proc` on Linux, "cannot tell" elsewhere) with handles
//!   bound to one process; `sim` (feature `testing`): a simulated table for tests.
//! * [`verify`]: [`verify_owned_tree`] compares a lease with live evidence only, answering
//!   owned tree / not ours / cannot tell.
//! * [`terminate`]: children first, TERM, grace, re-verification, KILL — through bound handles.
//! * [`controller`]: the lifecycle controller (`ensure_session`, `cancel_turn`, `close_session`,
//!   `reap_startup_orphans`, retention), writing leases before wrappers start.
//! * [`acp`]: the ACP client runtime over the wrapper's stdio.
//! * [`environment`]: [`AgentEnv`], the allowlisted environment an agent starts with.
//! * [`stderr`]: the last lines an agent wrote on stderr, secrets masked.
//! * `demo_agent` (feature `demo-agent`): the bundled deterministic ACP agent (echoes prompts
//!   word by word).
//!
//! Invariants:
//! * no signal without live evidence matching a lease of *this* gateway instance;
//! * evidence missing or unreadable → nothing is signalled, and the refusal is logged with its
//!   reason;
//! * startup reaping starts from this instance's open leases (and its lost ones whose processes
//!   carry the lease's mark), never from a scan for look-alike command lines;
//! * nothing of the gateway's environment reaches an agent but its [`AgentEnv`];
//! * depends on the store traits only (never on SQLite).

pub mod acp;
pub mod controller;
#[cfg(feature = "demo-agent")]
pub mod demo_agent;
pub mod environment;
pub mod evidence;
pub mod pool;
#[cfg(feature = "testing")]
pub mod sim;
pub mod stderr;
pub mod table;
pub mod terminate;
pub mod verify;

pub use acp::{AcpClient, AcpError, TurnOutcome};
/// How an agent ended a prompt turn (ACP `stopReason`).
pub use agent_client_protocol::v1::schema::StopReason;
pub use controller::*;
pub use environment::AgentEnv;
pub use pool::{AgentLimits, PoolFigures};
pub use table::{ProcessHandle, ProcessTable, Sig, TableError, system_table};
pub use terminate::{Termination, Timing, terminate_tree};
pub use verify::{CannotTell, NotOurs, OwnedTree, Verdict, verify_owned_tree};
