//! The gateway's configuration: a TOML file, every key optional (no file at all runs the
//! embedded defaults). Invalid configuration fails at start with the file, the key and the
//! reason. Secrets are never in the file: it names environment variables that hold them.

use std::path::PathBuf;

mod parse;
mod sections;
mod validate;

pub use sections::*;

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

impl Config {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
