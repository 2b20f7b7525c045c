//! The gateway's configuration: a TOML file, every key optional (no file at all runs the
//! embedded defaults). Invalid configuration fails at start with the file, the key and the
//! reason. Secrets are never in the file: it names environment variables that hold them.

use std::path::PathBuf;

mod parse;
mod sections;
mod validate;

#[cfg(test)]
mod fuzz;

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
    pub fn retry_policy(&self) -> clawgate_messages::RetryPolicy {
        let ms = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        clawgate_messages::RetryPolicy {
            max_attempts: self.retry.max_attempts,
            base_delay_ms: ms(self.retry.base_delay_ms),
            max_delay_ms: ms(self.retry.max_delay_ms),
            time_to_live_ms: ms(self.retry.time_to_live_secs.saturating_mul(1_000)),
            reconcile_delay_ms: ms(self.retry.reconcile_delay_ms),
            reconcile_window_ms: ms(self.retry.reconcile_window_ms),
            max_reconciliations: self.retry.max_reconciliations,
            // A dead gateway's claims are released at once (its pid and start time are in the
            // token); the time-to-live only has to outlast the longest live reply stream.
            claim_ttl_ms: 30 * 60_000,
        }
    }

    pub fn agent(&self, id: &str) -> Option<&AgentSection> {
        self.agents.iter().find(|a| a.id == id)
    }
}
