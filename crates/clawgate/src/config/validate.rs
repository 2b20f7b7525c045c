//! What serde cannot check: loopback only, sane retry and retention bounds, agents and
//! channels that exist, are unique and can run.

use std::path::Path;

use super::{Config, ConfigError, StateBackend};

impl Config {
    pub(super) fn validate(&self, file: &str) -> Result<(), ConfigError> {
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
        if self.state.backend == StateBackend::Postgres {
            if !is_env_name(&self.state.postgres_url_env) {
                return Err(invalid(
                    "state.postgres_url_env",
                    // The value is not echoed: it may be the URL, password included.
                    "is not an environment variable name (letters, digits and `_`, not \
                     starting with a digit); name the variable that holds the URL, never the \
                     URL itself"
                        .into(),
                ));
            }
            if self.state.postgres_pool_size == 0 {
                return Err(invalid(
                    "state.postgres_pool_size",
                    "must be at least 1".into(),
                ));
            }
        }
        if self.state.account_lease_secs == 0 {
            return Err(invalid(
                "state.account_lease_secs",
                "must be at least 1".into(),
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
            if !is_name(&agent.id) {
                return Err(invalid(&key, format!("{:?} must be {NAME_RULE}", agent.id)));
            }
            if self.agents[..n].iter().any(|a| a.id == agent.id) {
                return Err(invalid(
                    &key,
                    format!("agent {:?} is defined twice", agent.id),
                ));
            }
            if agent.max_live == Some(0) {
                return Err(invalid(
                    &format!("agents[{n}].max_live"),
                    "must be at least 1 (leave it out for the default sized to this machine)"
                        .into(),
                ));
            }
            if agent.turn_timeout_secs == 0 {
                return Err(invalid(
                    &format!("agents[{n}].turn_timeout_secs"),
                    "must be at least 1: a turn needs time to answer".into(),
                ));
            }
            let secret_names = self.secret_env_names();
            for (field, name) in agent
                .env_passthrough
                .iter()
                .map(|name| ("env_passthrough", name))
                .chain(agent.env.keys().map(|name| ("env", name)))
            {
                if !is_env_name(name) {
                    return Err(invalid(
                        &format!("agents[{n}].{field}"),
                        format!("{name:?} is not an environment variable name"),
                    ));
                }
                if let Some(setting) = secret_names.iter().find(|(_, v)| v == name) {
                    return Err(invalid(
                        &format!("agents[{n}].{field}"),
                        format!(
                            "{name:?} holds the gateway's own secret ({} names it): it is never \
                             handed to an agent, where anyone who can prompt it could read it",
                            setting.0
                        ),
                    ));
                }
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
            // Whether this build has the kind is the registry's answer, at start.
            if channel.kind.is_empty() {
                return Err(invalid(
                    &format!("channels[{n}].kind"),
                    "must name a channel kind (`qa`, …)".into(),
                ));
            }
            if !is_name(&channel.account) {
                return Err(invalid(
                    &format!("channels[{n}].account"),
                    format!(
                        "{:?} must be {NAME_RULE}: it becomes part of the channel's name, its \
                         files in the state directory and its stored state",
                        channel.account
                    ),
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
            if channel.max_turn_attempts == 0 {
                return Err(invalid(
                    &format!("channels[{n}].max_turn_attempts"),
                    "must be at least 1".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Where `program` would be run from: a path as given, a bare name through `PATH`.
impl Config {
    /// Every environment variable a `*_env` setting names, with the setting: the gateway's own
    /// secrets (channel tokens, signing secrets, the PostgreSQL URL).
    pub fn secret_env_names(&self) -> Vec<(String, String)> {
        let mut names = vec![(
            "state.postgres_url_env".to_owned(),
            self.state.postgres_url_env.clone(),
        )];
        for (n, channel) in self.channels.iter().enumerate() {
            collect_env_names(
                &format!("channels[{n}].settings"),
                &toml::Value::Table(channel.settings.clone()),
                &mut names,
            );
        }
        names
    }
}

/// The string values of every key ending in `_env` under `value` (nested tables and arrays
/// too), with their paths.
fn collect_env_names(path: &str, value: &toml::Value, out: &mut Vec<(String, String)>) {
    match value {
        toml::Value::Table(table) => {
            for (key, value) in table {
                let at = format!("{path}.{key}");
                match value {
                    toml::Value::String(name) if key.ends_with("_env") => {
                        out.push((at, name.clone()));
                    }
                    other => collect_env_names(&at, other, out),
                }
            }
        }
        toml::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_env_names(&format!("{path}[{i}]"), item, out);
            }
        }
        _ => {}
    }
}

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

/// What an agent id or a channel account may be made of.
const NAME_RULE: &str = "one or more letters, digits, `-` or `_`";

/// An agent id or a channel account: both end up in file names, channel names and store keys,
/// so nothing that could climb out of a directory (`/`, `..`) or split a key (`:`).
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// An environment variable name as shells write it.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_secret_is_never_passed_to_an_agent() {
        let e = error_of(
            "[[agents]]\nenv_passthrough = [\"ANTHROPIC_API_KEY\", \"E2E_BOT_TOKEN\"]\n\
             [[channels]]\nsettings = { token_env = \"E2E_BOT_TOKEN\" }\n",
        );
        assert!(
            e.contains("`agents[0].env_passthrough`")
                && e.contains("E2E_BOT_TOKEN")
                && e.contains("channels[0].settings.token_env"),
            "{e}"
        );
        let e = error_of("[[agents]]\nenv = { CLAWGATE_POSTGRES_URL = \"x\" }\n");
        assert!(
            e.contains("`agents[0].env`") && e.contains("state.postgres_url_env"),
            "{e}"
        );
        let e = error_of("[[agents]]\nenv_passthrough = [\"A=B\"]\n");
        assert!(e.contains("not an environment variable name"), "{e}");
        // A key the gateway does not hold itself is fine.
        Config::parse(
            "[[agents]]\nenv_passthrough = [\"ANTHROPIC_API_KEY\"]\nenv = { X = \"1\" }\n",
            "clawgate.toml",
        )
        .expect("valid");
    }

    fn error_of(text: &str) -> String {
        Config::parse(text, "clawgate.toml")
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn validation_errors_name_the_file_the_key_and_the_reason() {
        let e = error_of("[gateway]\nlisten = \"0.0.0.0:80\"\n");
        assert!(e.contains("clawgate.toml"), "{e}");
        assert!(
            e.contains("`gateway.listen`") && e.contains("loopback"),
            "{e}"
        );

        let e = error_of("[[channels]]\nkind = \"\"\n");
        assert!(e.contains("`channels[0].kind`"), "{e}");

        let e = error_of("[[channels]]\nagent = \"ghost\"\n");
        assert!(
            e.contains("`channels[0].agent`") && e.contains("ghost"),
            "{e}"
        );

        let e = error_of("[[channels]]\nbase_url = \"http://127.0.0.1:1\"\n");
        assert!(
            e.contains("base_url"),
            "platform keys live in the kind's own settings table: {e}"
        );

        let e = error_of("[[channels]]\nmax_turn_attempts = 0\n");
        assert!(
            e.contains("`channels[0].max_turn_attempts`") && e.contains("at least 1"),
            "{e}"
        );

        let e = error_of("[[agents]]\ncommand = [\"/nonexistent/agent\", \"--acp\"]\n");
        assert!(
            e.contains("`agents[0].command`") && e.contains("/nonexistent/agent"),
            "a missing agent binary stops the start: {e}"
        );
        let e = error_of("[[agents]]\ncommand = [\"no-such-agent-program\"]\n");
        assert!(e.contains("not found"), "{e}");

        for account in ["../../x", "a/b", "a:b", "", "bot.1"] {
            let e = error_of(&format!(
                "[[channels]]\naccount = \"default\"\n[[channels]]\naccount = {account:?}\n"
            ));
            assert!(
                e.contains("`channels[1].account`") && e.contains(NAME_RULE),
                "{account:?}: {e}"
            );
        }
        let e = error_of("[[agents]]\nid = \"../a\"\n");
        assert!(e.contains("`agents[0].id`") && e.contains(NAME_RULE), "{e}");

        let e = error_of("[[agents]]\nid = \"a\"\n[[agents]]\nid = \"a\"\n");
        assert!(e.contains("`agents[1].id`") && e.contains("twice"), "{e}");

        let e = error_of("[retention]\ninbound_days = 14\noutbox_days = 7\n");
        assert!(
            e.contains("`retention.outbox_days`") && e.contains("inbound_days (14)"),
            "replies outlive the events they answer: {e}"
        );
    }
}
