//! The gateway's configuration: a TOML file, every key optional (no file at all runs the
//! embedded defaults). Invalid configuration fails at start with the file, the key and the
//! reason. Secrets are never in the file: it names environment variables that hold them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clawgate_types::{AgentToAgentPolicy, MessageDurabilityPolicy, SessionVisibility};
use serde::{Deserialize, Serialize};

/// A configuration that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the configuration file {file}: {source}")]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration in {file}, key `{key}`: {reason}")]
    Invalid {
        file: String,
        key: String,
        reason: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where the durable state lives (relative paths are relative to the working directory).
    pub state_dir: PathBuf,
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
    pub policy: DurabilityPolicy,
    /// SQLite `synchronous`: `full` (survives power loss) or `normal` (survives a crash).
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
    /// Working directory of the agent's sessions (default: the working directory).
    pub cwd: Option<PathBuf>,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            id: "main".into(),
            command: Vec::new(),
            cwd: None,
        }
    }
}

/// `[[channels]]`: a chat platform account.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChannelSection {
    /// The platform: `qa` (the QA platform) for now.
    pub kind: String,
    pub account: String,
    /// The agent that answers on this account.
    pub agent: String,
    /// Base URL of an already running platform. Unset for `qa` = start the QA platform
    /// in-process on loopback, its state under `<state_dir>/qa-platform.json`.
    pub base_url: Option<String>,
    /// Environment variable holding the account's token (never logged). Unset for an embedded
    /// platform = a token generated per run.
    pub token_env: Option<String>,
    /// How long the receive loop's long poll waits for updates.
    pub poll_timeout_ms: u64,
    /// How many times one inbound message's turn may start before it is set aside
    /// (dead-lettered, the person told once). Counted when each start begins, so a message
    /// whose turn kills the gateway every time is set aside too; a gateway that crash-loops
    /// for other reasons uses up the in-flight messages' starts as well.
    pub max_turn_attempts: u32,
}

impl Default for ChannelSection {
    fn default() -> Self {
        ChannelSection {
            kind: "qa".into(),
            account: "default".into(),
            agent: "main".into(),
            base_url: None,
            token_env: None,
            poll_timeout_ms: 10_000,
            max_turn_attempts: 5,
        }
    }
}

impl Config {
    /// Reads `path`, or the embedded defaults when `path` is `None`.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            file: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates TOML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .map(|span| key_at(text, span.start))
                .unwrap_or_default();
            let position = e
                .span()
                .map(|span| {
                    let line = text[..span.start].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            ConfigError::Invalid {
                file: file.to_owned(),
                key: if key.is_empty() { "(file)".into() } else { key },
                reason: format!("{}{position}", e.message().trim()),
            }
        })?;
        config.validate(file)?;
        Ok(config)
    }

    fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: String| ConfigError::Invalid {
            file: file.to_owned(),
            key: key.to_owned(),
            reason,
        };
        if !self.gateway.listen.ip().is_loopback() {
            return Err(invalid(
                "gateway.listen",
                format!(
                    "{} is not a loopback address; the control API and chat page are served on \
                     127.0.0.1 or ::1 only",
                    self.gateway.listen
                ),
            ));
        }
        if self.retry.max_attempts == 0 {
            return Err(invalid("retry.max_attempts", "must be at least 1".into()));
        }
        if self.retry.max_delay_ms < self.retry.base_delay_ms {
            return Err(invalid(
                "retry.max_delay_ms",
                "must not be below retry.base_delay_ms".into(),
            ));
        }
        if self.retention.outbox_days < self.retention.inbound_days {
            // An event still deduplicated by its inbound record must still find its reply, or
            // a redelivery handled again would answer twice.
            return Err(invalid(
                "retention.outbox_days",
                format!(
                    "{} is below retention.inbound_days ({}): replies must be kept at least as \
                     long as the events they answer",
                    self.retention.outbox_days, self.retention.inbound_days
                ),
            ));
        }
        if self.agents.is_empty() {
            return Err(invalid("agents", "at least one [[agents]] entry".into()));
        }
        for (n, agent) in self.agents.iter().enumerate() {
            let key = format!("agents[{n}].id");
            if agent.id.is_empty()
                || !agent
                    .id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(invalid(
                    &key,
                    format!("{:?} must be letters, digits, `-` or `_`", agent.id),
                ));
            }
            if self.agents[..n].iter().any(|a| a.id == agent.id) {
                return Err(invalid(
                    &key,
                    format!("agent {:?} is defined twice", agent.id),
                ));
            }
            if let Some(program) = agent.command.first() {
                if program.is_empty() {
                    return Err(invalid(
                        &format!("agents[{n}].command"),
                        "the program (first element) is empty".into(),
                    ));
                }
                if find_program(program).is_none() {
                    return Err(invalid(
                        &format!("agents[{n}].command"),
                        format!(
                            "the agent program {program:?} was not found (no such executable \
                             file, nor on PATH); install it or fix the command"
                        ),
                    ));
                }
            }
        }
        for (n, channel) in self.channels.iter().enumerate() {
            if channel.kind != "qa" {
                return Err(invalid(
                    &format!("channels[{n}].kind"),
                    format!(
                        "unknown channel kind {:?}; this build supports: qa",
                        channel.kind
                    ),
                ));
            }
            if channel.account.is_empty() || channel.account.contains(':') {
                return Err(invalid(
                    &format!("channels[{n}].account"),
                    "must be non-empty and without `:`".into(),
                ));
            }
            if !self.agents.iter().any(|a| a.id == channel.agent) {
                return Err(invalid(
                    &format!("channels[{n}].agent"),
                    format!("no [[agents]] entry with id {:?}", channel.agent),
                ));
            }
            if self.channels[..n]
                .iter()
                .any(|c| c.kind == channel.kind && c.account == channel.account)
            {
                return Err(invalid(
                    &format!("channels[{n}].account"),
                    format!("{}/{} is configured twice", channel.kind, channel.account),
                ));
            }
            if let Some(url) = &channel.base_url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(invalid(
                    &format!("channels[{n}].base_url"),
                    format!("{url:?} is not an http(s) URL"),
                ));
            }
            if channel.max_turn_attempts == 0 {
                return Err(invalid(
                    &format!("channels[{n}].max_turn_attempts"),
                    "must be at least 1".into(),
                ));
            }
            if channel.base_url.is_some() && channel.token_env.is_none() {
                return Err(invalid(
                    &format!("channels[{n}].token_env"),
                    "an external platform needs the name of the environment variable holding \
                     its token"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// The account token of a channel: from its environment variable (never logged).
    pub fn channel_token(&self, n: usize) -> Result<Option<String>, ConfigError> {
        let Some(var) = &self.channels[n].token_env else {
            return Ok(None);
        };
        match std::env::var(var) {
            Ok(value) if !value.is_empty() => Ok(Some(value)),
            _ => Err(ConfigError::Invalid {
                file: "(environment)".into(),
                key: format!("channels[{n}].token_env"),
                reason: format!("environment variable {var} is not set (it holds the token)"),
            }),
        }
    }

    pub fn retry_policy(&self) -> clawgate_messages::RetryPolicy {
        let ms = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        clawgate_messages::RetryPolicy {
            max_attempts: self.retry.max_attempts,
            base_delay_ms: ms(self.retry.base_delay_ms),
            max_delay_ms: ms(self.retry.max_delay_ms),
            time_to_live_ms: ms(self.retry.time_to_live_secs.saturating_mul(1_000)),
            reconcile_delay_ms: ms(self.retry.reconcile_delay_ms),
            // A dead gateway's claims are released at once (its pid and start time are in the
            // token); the time-to-live only has to outlast the longest live reply stream.
            claim_ttl_ms: 30 * 60_000,
        }
    }

    pub fn agent(&self, id: &str) -> Option<&AgentSection> {
        self.agents.iter().find(|a| a.id == id)
    }
}

/// Where `program` would be run from: a path as given, a bare name through `PATH`.
fn find_program(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let path = Path::new(program);
        return executable(path).then(|| path.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
}

/// The dotted key whose line contains byte `offset` (`[section]` + `key = …`), best effort.
fn key_at(text: &str, offset: usize) -> String {
    let mut section = String::new();
    let mut key = String::new();
    let mut start = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(name) = trimmed
            .strip_prefix("[[")
            .and_then(|r| r.strip_suffix("]]"))
            .or_else(|| trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')))
        {
            section = name.trim().to_owned();
            key.clear();
        } else if let Some((name, _)) = trimmed.split_once('=') {
            key = name.trim().to_owned();
        }
        start += line.len();
        if start > offset {
            break;
        }
    }
    match (section.is_empty(), key.is_empty()) {
        (true, _) => key,
        (false, true) => section,
        (false, false) => format!("{section}.{key}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_means_the_embedded_defaults() {
        let config = Config::load(None).expect("defaults");
        assert_eq!(config.state_dir, PathBuf::from(".clawgate"));
        assert_eq!(config.channels[0].kind, "qa");
        assert!(config.agents[0].command.is_empty(), "bundled agent");
        assert_eq!(Config::parse("", "x.toml").expect("empty file"), config);
    }

    #[test]
    fn a_full_file_parses() {
        let config = Config::parse(
            r#"
state_dir = "/var/lib/clawgate"
[gateway]
listen = "127.0.0.1:0"
[durability]
policy = "best_effort"
sync = "normal"
[retry]
max_attempts = 3
[sessions]
visibility = "all"
a2a = { enabled = true, allow = ["ops-*"] }
[[agents]]
id = "coder"
command = ["sh", "--acp"]
[[channels]]
kind = "qa"
account = "bot"
agent = "coder"
base_url = "http://127.0.0.1:9000"
token_env = "QA_TOKEN"
"#,
            "clawgate.toml",
        )
        .expect("valid");
        assert_eq!(config.durability.policy, DurabilityPolicy::BestEffort);
        assert_eq!(config.sessions.visibility, SessionVisibility::All);
        assert_eq!(config.retry_policy().max_attempts, 3);
        assert_eq!(config.agent("coder").expect("agent").command[1], "--acp");
    }

    fn error_of(text: &str) -> String {
        Config::parse(text, "clawgate.toml")
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn errors_name_the_file_the_key_and_the_reason() {
        let e = error_of("[retry]\nmax_attempts = \"many\"\n");
        assert!(e.contains("clawgate.toml"), "{e}");
        assert!(e.contains("`retry.max_attempts`"), "{e}");
        assert!(e.contains("line 2"), "{e}");

        let e = error_of("[durability]\npolicy = \"sometimes\"\n");
        assert!(e.contains("`durability.policy`"), "{e}");
        assert!(e.contains("sometimes"), "{e}");

        let e = error_of("[gateway]\nlisten = \"0.0.0.0:80\"\n");
        assert!(
            e.contains("`gateway.listen`") && e.contains("loopback"),
            "{e}"
        );

        let e = error_of("[[channels]]\nkind = \"fax\"\n");
        assert!(e.contains("`channels[0].kind`") && e.contains("fax"), "{e}");

        let e = error_of("[[channels]]\nagent = \"ghost\"\n");
        assert!(
            e.contains("`channels[0].agent`") && e.contains("ghost"),
            "{e}"
        );

        let e = error_of("[[channels]]\nbase_url = \"http://127.0.0.1:1\"\n");
        assert!(e.contains("`channels[0].token_env`"), "{e}");

        let e = error_of("[[channels]]\nmax_turn_attempts = 0\n");
        assert!(
            e.contains("`channels[0].max_turn_attempts`") && e.contains("at least 1"),
            "{e}"
        );

        let e = error_of("[gateway]\nlisen = \"127.0.0.1:1\"\n");
        assert!(e.contains("lisen"), "unknown keys are refused: {e}");

        let e = error_of("[[agents]]\ncommand = [\"/nonexistent/agent\", \"--acp\"]\n");
        assert!(
            e.contains("`agents[0].command`") && e.contains("/nonexistent/agent"),
            "a missing agent binary stops the start: {e}"
        );
        let e = error_of("[[agents]]\ncommand = [\"no-such-agent-program\"]\n");
        assert!(e.contains("not found"), "{e}");

        let e = error_of("[[agents]]\nid = \"a\"\n[[agents]]\nid = \"a\"\n");
        assert!(e.contains("`agents[1].id`") && e.contains("twice"), "{e}");

        let e = error_of("[retention]\ninbound_days = 14\noutbox_days = 7\n");
        assert!(
            e.contains("`retention.outbox_days`") && e.contains("inbound_days (14)"),
            "replies outlive the events they answer: {e}"
        );
    }

    #[test]
    fn a_missing_token_variable_names_the_variable_not_a_value() {
        let config = Config::parse(
            "[[channels]]\nbase_url = \"http://127.0.0.1:1\"\ntoken_env = \"CLAWGATE_TEST_UNSET_TOKEN\"\n",
            "c.toml",
        )
        .expect("valid");
        let e = config.channel_token(0).expect_err("unset").to_string();
        assert!(e.contains("CLAWGATE_TEST_UNSET_TOKEN"), "{e}");
    }

    #[test]
    fn a_missing_file_says_which() {
        let e = Config::load(Some(Path::new("/nonexistent/clawgate.toml")))
            .expect_err("missing")
            .to_string();
        assert!(e.contains("/nonexistent/clawgate.toml"), "{e}");
    }
}
