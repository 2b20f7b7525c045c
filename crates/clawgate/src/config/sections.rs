//! The shape of the configuration file and its defaults, section by section.

use std::net::SocketAddr;
use std::path::PathBuf;

use clawgate_types::{AgentToAgentPolicy, MessageDurabilityPolicy, SessionVisibility};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// An enum value written in any case (`"TREE"`, `"Best_Effort"`): the spellings are lower
/// case, and capitals an operator typed should not stop a start. Unknown values are still
/// refused, naming the accepted ones.
fn any_case<'de, D: Deserializer<'de>, T: DeserializeOwned>(value: D) -> Result<T, D::Error> {
    let text = String::deserialize(value)?;
    T::deserialize(serde::de::value::StrDeserializer::<D::Error>::new(
        &text.to_ascii_lowercase(),
    ))
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the durable state lives (relative paths are relative to the working directory).
    pub state_dir: PathBuf,
    pub state: StateSection,
    pub gateway: GatewaySection,
    pub durability: DurabilitySection,
    pub retry: RetrySection,
    pub retention: RetentionSection,
    pub sessions: SessionsSection,
    pub agents: Vec<AgentSection>,
    pub channels: Vec<ChannelSection>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            state_dir: PathBuf::from(".clawgate"),
            state: StateSection::default(),
            gateway: GatewaySection::default(),
            durability: DurabilitySection::default(),
            retry: RetrySection::default(),
            retention: RetentionSection::default(),
            sessions: SessionsSection::default(),
            agents: vec![AgentSection::default()],
            channels: vec![ChannelSection::default()],
        }
    }
}

/// `[state]`: where the durable state is kept. `state_dir` always holds this gateway's own
/// files (its lock, runtime file, instance id); the database is in it (SQLite) or on a server
/// several gateways share (PostgreSQL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StateSection {
    #[serde(deserialize_with = "any_case")]
    pub backend: StateBackend,
    /// PostgreSQL: the environment variable holding the connection URL
    /// (`postgres://user:password@host:port/dbname`); the URL is never written in the file nor
    /// logged.
    pub postgres_url_env: String,
    /// PostgreSQL: connections in this gateway's pool.
    pub postgres_pool_size: u32,
    /// PostgreSQL: the schema holding the tables (created if missing), so several independent
    /// states can share one database; unset, the server's default (`public`).
    pub postgres_schema: Option<String>,
    /// PostgreSQL: TLS to the server. `auto`: none to a loopback host, `localhost` or a Unix
    /// socket, required and verified to any other host.
    #[serde(deserialize_with = "any_case")]
    pub postgres_tls: PostgresTlsMode,
    /// PostgreSQL: a PEM file of CA certificates trusted besides Mozilla's roots (a private
    /// CA that signed the server's certificate).
    pub postgres_ca_file: Option<PathBuf>,
    /// How long a gateway's hold on a channel account lasts unrenewed: when a gateway sharing
    /// the database dies, another one takes its accounts after this (it renews every third).
    pub account_lease_secs: u64,
}

impl Default for StateSection {
    fn default() -> Self {
        StateSection {
            backend: StateBackend::Sqlite,
            postgres_url_env: "CLAWGATE_POSTGRES_URL".into(),
            postgres_pool_size: 16,
            postgres_schema: None,
            postgres_tls: PostgresTlsMode::Auto,
            postgres_ca_file: None,
            account_lease_secs: 15,
        }
    }
}

/// Which database holds the durable state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    /// One embedded SQLite file in `state_dir`: one gateway, nothing to run beside it.
    Sqlite,
    /// A PostgreSQL database several gateways share.
    Postgres,
}

/// `[state] postgres_tls`: whether the connections to PostgreSQL use TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PostgresTlsMode {
    /// No TLS to this machine; required, certificate and host name verified, to any other.
    Auto,
    /// TLS always, verified.
    Require,
    /// Never TLS: an explicit choice for a trusted private network or a tunnel.
    Disable,
}

/// `[gateway]`: the loopback HTTP listener (web chat page and control API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySection {
    /// Loopback address; port 0 picks a free port (the chosen URL is printed and written to
    /// `<state_dir>/gateway.json`).
    pub listen: SocketAddr,
    /// How long Ctrl-C waits for the running turns before closing sessions anyway.
    pub shutdown_grace_ms: u64,
}

impl Default for GatewaySection {
    fn default() -> Self {
        GatewaySection {
            listen: SocketAddr::from(([127, 0, 0, 1], 8640)),
            shutdown_grace_ms: 5_000,
        }
    }
}

/// `[durability]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DurabilitySection {
    /// `required` (fail closed), `best_effort` or `disabled`, for every reply.
    #[serde(deserialize_with = "any_case")]
    pub policy: DurabilityPolicy,
    /// SQLite `synchronous`: `full` (survives power loss) or `normal` (survives a crash).
    #[serde(deserialize_with = "any_case")]
    pub sync: SyncMode,
}

impl Default for DurabilitySection {
    fn default() -> Self {
        DurabilitySection {
            policy: DurabilityPolicy::Required,
            sync: SyncMode::Full,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityPolicy {
    Required,
    BestEffort,
    Disabled,
}

impl DurabilityPolicy {
    pub fn to_policy(self) -> MessageDurabilityPolicy {
        match self {
            DurabilityPolicy::Required => MessageDurabilityPolicy::Required,
            DurabilityPolicy::BestEffort => MessageDurabilityPolicy::BestEffort,
            DurabilityPolicy::Disabled => MessageDurabilityPolicy::Disabled,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    Full,
    Normal,
}

/// `[retry]`: how failed sends are retried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetrySection {
    pub max_attempts: u32,
    pub base_delay_ms: u64,
    pub max_delay_ms: u64,
    /// A reply older than this is failed with reason `expired` instead of delivered.
    pub time_to_live_secs: u64,
    pub reconcile_delay_ms: u64,
    /// An unknown outcome the platform cannot settle within this long is parked for an
    /// operator, so the conversation's later replies stop waiting behind it.
    pub reconcile_window_ms: u64,
    /// Reconciliations of one unknown outcome that leave it unresolved before it is failed
    /// (never resent).
    pub max_reconciliations: u32,
}

impl Default for RetrySection {
    fn default() -> Self {
        let policy = clawgate_messages::RetryPolicy::default();
        RetrySection {
            max_attempts: policy.max_attempts,
            base_delay_ms: policy.base_delay_ms.unsigned_abs(),
            max_delay_ms: policy.max_delay_ms.unsigned_abs(),
            time_to_live_secs: policy.time_to_live_ms.unsigned_abs() / 1_000,
            reconcile_delay_ms: policy.reconcile_delay_ms.unsigned_abs(),
            reconcile_window_ms: policy.reconcile_window_ms.unsigned_abs(),
            max_reconciliations: policy.max_reconciliations,
        }
    }
}

/// `[retention]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSection {
    pub signal_log_days: u64,
    pub signal_log_max_rows: u64,
    /// Closed and lost process leases are kept this long.
    pub lease_days: u64,
    /// Completed inbound records (the dedupe window) are kept this long.
    pub inbound_days: u64,
    /// Finished send intents (`sent`, `cancelled`) are kept this long after their last change:
    /// the outbound dedupe window. Intents waiting for an operator are kept until handled.
    pub outbox_days: u64,
}

impl Default for RetentionSection {
    fn default() -> Self {
        RetentionSection {
            signal_log_days: 30,
            signal_log_max_rows: 50_000,
            lease_days: 7,
            inbound_days: 7,
            outbox_days: 7,
        }
    }
}

/// `[sessions]`: what the session tools let one session see of others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsSection {
    #[serde(deserialize_with = "any_case")]
    pub visibility: SessionVisibility,
    pub a2a: AgentToAgentPolicy,
}

impl Default for SessionsSection {
    fn default() -> Self {
        SessionsSection {
            visibility: SessionVisibility::Tree,
            a2a: AgentToAgentPolicy::default(),
        }
    }
}

/// `[[agents]]`: an ACP agent, started through the wrapper under a lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    pub id: String,
    /// The ACP adapter command line. Empty = the bundled deterministic demo agent.
    pub command: Vec<String>,
    /// Working directory of the agent's sessions (default: `agents/<id>/` in the state
    /// directory, created private; never the gateway's own working directory).
    pub cwd: Option<PathBuf>,
    /// Variables set in the agent's environment, on top of the base allowlist (`PATH`,
    /// `HOME`, `LANG`, `LC_*`, `TERM`, `TMPDIR`, `USER`). Values are written here in the clear:
    /// put secrets in `env_passthrough` instead.
    pub env: std::collections::BTreeMap<String, String>,
    /// Variables of the gateway's environment the agent gets too (an API key such as
    /// `ANTHROPIC_API_KEY`). Nothing else of the gateway's environment reaches an agent, and a
    /// variable any `*_env` setting names (a channel token, the PostgreSQL URL) is refused.
    pub env_passthrough: Vec<String>,
    /// One prompt may run this long; then the turn is cancelled (`session/cancel`; the session
    /// closed if the agent does not end it within `cancel_grace_secs`), counted as an attempt,
    /// and retried or set aside.
    pub turn_timeout_secs: u64,
    /// After this long without visible output the person is told once that the agent is still
    /// working (in the reply's preview where the platform has one, else a marked notice).
    pub progress_notice_secs: u64,
    /// How long an agent asked to cancel a turn (`/stop`, the deadline, a stop of the gateway)
    /// may take before its session is closed.
    pub cancel_grace_secs: u64,
    /// A session idle this long is closed (process ended, lease `closed`); its next message
    /// starts a process again and resumes the ACP session (`session/load`) when the agent can.
    /// 0 keeps idle sessions open.
    pub idle_close_secs: u64,
    /// Live agent processes of this agent at most (default: sized to the machine's memory).
    /// At the cap the least recently used idle session is closed for a new one; when every
    /// session is busy, turns wait in their conversation.
    pub max_live: Option<usize>,
    /// At the cap, the least recently used idle session's process is handed to the new
    /// session (the agent closes the old ACP session; the new one is loaded or begun on the
    /// same process) instead of one process ending and another starting. Only for an agent
    /// that advertises `session/close`; false always ends and starts processes.
    pub reuse_processes: bool,
    /// A turn that waits this long for a free session tells the person once that the message
    /// is queued.
    pub busy_notice_secs: u64,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            id: "main".into(),
            command: Vec::new(),
            cwd: None,
            env: std::collections::BTreeMap::new(),
            env_passthrough: Vec::new(),
            turn_timeout_secs: 600,
            progress_notice_secs: 60,
            cancel_grace_secs: 10,
            idle_close_secs: 600,
            max_live: None,
            reuse_processes: true,
            busy_notice_secs: 30,
        }
    }
}

impl AgentSection {
    /// `max_live`, or the default for this machine: about one process per 64 MiB of memory
    /// (an agent and its wrapper take some 20 MiB; the rest is headroom), from 8 to 512.
    pub fn max_live_or_default(&self) -> usize {
        self.max_live.unwrap_or_else(|| {
            let memory = std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|info| {
                    info.lines()
                        .find_map(|line| line.strip_prefix("MemTotal:"))
                        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                })
                .map_or(4 << 30, |kb| kb.saturating_mul(1024));
            usize::try_from(memory / (64 << 20))
                .unwrap_or(512)
                .clamp(8, 512)
        })
    }
}

/// `[[channels]]`: a chat platform account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelSection {
    /// The channel kind: a factory of this build's registry (`qa`, …).
    pub kind: String,
    pub account: String,
    /// The agent that answers on this account.
    pub agent: String,
    /// The channel kind's own settings (`[channels.settings]`), parsed and checked by its
    /// factory when the gateway starts. Secrets are never written here: a `*_env` key names the
    /// environment variable holding one.
    pub settings: toml::Table,
    /// How many times one inbound message's turn may start before it is set aside
    /// (dead-lettered, the person told once). Counted when each start begins, so a message
    /// whose turn kills the gateway every time is set aside too; a gateway that crash-loops
    /// for other reasons uses up the in-flight messages' starts as well.
    pub max_turn_attempts: u32,
    /// Whether messages other bots write on this account are answered. Gateway-failure echoes
    /// are dropped before this is asked (by their origin marker, or the channel's outbound
    /// registry), and the bot-loop guard still cools down a pair of bots answering each other.
    pub allow_bots: bool,
    /// Whether a person's `/stop` (cancel the running turn) and `/new` (begin a fresh agent
    /// session) are commands to the gateway rather than prompts.
    pub commands: bool,
}

impl Default for ChannelSection {
    fn default() -> Self {
        ChannelSection {
            kind: "qa".into(),
            account: "default".into(),
            agent: "main".into(),
            settings: toml::Table::new(),
            max_turn_attempts: 5,
            allow_bots: false,
            commands: true,
        }
    }
}
