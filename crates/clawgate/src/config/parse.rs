//! Reading the file: TOML errors name the dotted key and the line.

use std::path::Path;

use super::{Config, ConfigError};

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
    use clawgate_types::SessionVisibility;
    use std::path::PathBuf;

    use crate::config::{DurabilityPolicy, PostgresTlsMode, StateBackend};

    /// Every setting an error's advice names (as `` `[section] key` ``) is a key of the
    /// configuration, and no advice tells the operator to change a setting that does not
    /// exist.
    #[test]
    fn advice_names_only_settings_that_exist() {
        use clawgate_types::SessionKey;
        let key = |k: &str| SessionKey::parse(k).expect("key");
        let advice = [
            clawgate_store::StoreError::Busy {
                database: "/s/state.db".into(),
                timeout_ms: 5000,
            }
            .to_string(),
            clawgate_awareness::AwarenessError::NotVisible {
                key: key("agent:main:qa:dm-1"),
                requester: key("agent:main:qa:dm-2"),
            }
            .to_string(),
        ];
        let defaults = toml::Table::try_from(Config::default()).expect("defaults as TOML");
        let mut named = 0;
        for text in &advice {
            assert!(
                !text.contains("raise the busy timeout") && !text.contains("tools.sessions"),
                "advice names a setting that does not exist: {text}"
            );
            for mention in text.split("`[").skip(1) {
                let mention = mention.split('`').next().unwrap_or_default();
                let (section, setting) = mention.split_once("] ").expect("`[section] key`");
                assert!(
                    defaults
                        .get(section)
                        .and_then(toml::Value::as_table)
                        .is_some_and(|t| t.contains_key(setting)),
                    "advice names `[{section}] {setting}`, which the configuration lacks: {text}"
                );
                named += 1;
            }
        }
        assert!(
            named >= 2,
            "the visibility advice names its keys: {advice:?}"
        );
    }

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
[channels.settings]
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

    /// Enum values are read in any case; a wrong one is still refused, naming the key.
    #[test]
    fn enum_values_are_case_insensitive() {
        let config = Config::parse(
            "[state]\nbackend = \"SQLite\"\npostgres_tls = \"REQUIRE\"\n\
             [durability]\npolicy = \"Best_Effort\"\nsync = \"FULL\"\n\
             [sessions]\nvisibility = \"TREE\"\n",
            "clawgate.toml",
        )
        .expect("valid in any case");
        assert_eq!(config.state.backend, StateBackend::Sqlite);
        assert_eq!(config.state.postgres_tls, PostgresTlsMode::Require);
        assert_eq!(config.durability.policy, DurabilityPolicy::BestEffort);
        assert_eq!(config.durability.sync, crate::config::SyncMode::Full);
        assert_eq!(config.sessions.visibility, SessionVisibility::Tree);
        let wrong = error_of("[sessions]\nvisibility = \"TRE\"\n");
        assert!(
            wrong.contains("sessions.visibility") && wrong.contains("tree"),
            "{wrong}"
        );
    }

    fn error_of(text: &str) -> String {
        Config::parse(text, "clawgate.toml")
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn parse_errors_name_the_file_the_key_and_the_reason() {
        let e = error_of("[retry]\nmax_attempts = \"many\"\n");
        assert!(e.contains("clawgate.toml"), "{e}");
        assert!(e.contains("`retry.max_attempts`"), "{e}");
        assert!(e.contains("line 2"), "{e}");

        let e = error_of("[durability]\npolicy = \"sometimes\"\n");
        assert!(e.contains("`durability.policy`"), "{e}");
        assert!(e.contains("sometimes"), "{e}");

        let e = error_of("[gateway]\nlisen = \"127.0.0.1:1\"\n");
        assert!(e.contains("lisen"), "unknown keys are refused: {e}");
    }

    #[test]
    fn the_state_backend_is_sqlite_unless_postgres_is_named() {
        assert_eq!(Config::default().state.backend, StateBackend::Sqlite);
        let config = Config::parse(
            "[state]\nbackend = \"postgres\"\npostgres_url_env = \"TEAM_PG_URL\"\npostgres_pool_size = 4\n",
            "clawgate.toml",
        )
        .expect("a valid [state] section");
        assert_eq!(config.state.backend, StateBackend::Postgres);
        assert_eq!(config.state.postgres_url_env, "TEAM_PG_URL");
        assert_eq!(config.state.postgres_pool_size, 4);

        let e = error_of("[state]\nbackend = \"mysql\"\n");
        assert!(e.contains("`state.backend`") && e.contains("mysql"), "{e}");
        // The URL itself in the file is refused: it carries a password.
        let e = error_of(
            "[state]\nbackend = \"postgres\"\npostgres_url_env = \"postgres://u:secret@db/x\"\n",
        );
        assert!(e.contains("`state.postgres_url_env`"), "{e}");
        assert!(e.contains("not an environment variable name"), "{e}");
        assert!(!e.contains("secret"), "the value is not echoed: {e}");
        let e = error_of("[state]\nbackend = \"postgres\"\npostgres_pool_size = 0\n");
        assert!(e.contains("`state.postgres_pool_size`"), "{e}");
        let e = error_of("[state]\npostgres_url = \"postgres://db\"\n");
        assert!(e.contains("postgres_url"), "unknown keys are refused: {e}");
    }

    #[test]
    fn postgres_tls_is_auto_unless_named() {
        let config = Config::default();
        assert_eq!(config.state.postgres_tls, PostgresTlsMode::Auto);
        assert_eq!(config.state.postgres_ca_file, None);
        for (value, want) in [
            ("auto", PostgresTlsMode::Auto),
            ("require", PostgresTlsMode::Require),
            ("disable", PostgresTlsMode::Disable),
        ] {
            let config = Config::parse(
                &format!(
                    "[state]\nbackend = \"postgres\"\npostgres_tls = \"{value}\"\n\
                     postgres_ca_file = \"/etc/clawgate/pg-ca.pem\"\n"
                ),
                "clawgate.toml",
            )
            .expect("a valid [state] section");
            assert_eq!(config.state.postgres_tls, want, "{value}");
            assert_eq!(
                config.state.postgres_ca_file.as_deref(),
                Some(std::path::Path::new("/etc/clawgate/pg-ca.pem"))
            );
        }
        let e = error_of("[state]\npostgres_tls = \"prefer\"\n");
        assert!(
            e.contains("`state.postgres_tls`") && e.contains("prefer"),
            "{e}"
        );
    }

    #[test]
    fn a_missing_file_says_which() {
        let e = Config::load(Some(Path::new("/nonexistent/clawgate.toml")))
            .expect_err("missing")
            .to_string();
        assert!(e.contains("/nonexistent/clawgate.toml"), "{e}");
    }
}
