//! What an agent process may see of the gateway's environment: an allowlist, never the whole.
//!
//! A coding agent prompted from a chat can be asked to print its environment, so the wrapper
//! and its agent start from an empty environment plus [`AgentEnv`]: by default only
//! [`BASE_VARIABLES`] (and `LC_*`) taken from the gateway, then what the operator passes
//! through by name or sets explicitly. Values are secrets as far as logs go: `Debug` shows
//! names only.

use std::collections::BTreeMap;

/// The variables an agent gets from the gateway's environment by default (plus every `LC_*`):
/// what a program needs to find its tools, its home, its locale and a temporary directory.
pub const BASE_VARIABLES: &[&str] = &["PATH", "HOME", "LANG", "TERM", "TMPDIR", "USER"];

/// The environment an agent process starts with (names and values). `Debug` prints the names
/// only: values may be API keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AgentEnv {
    vars: BTreeMap<String, String>,
}

impl std::fmt::Debug for AgentEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.vars.keys()).finish()
    }
}

impl AgentEnv {
    /// Nothing at all.
    pub fn empty() -> AgentEnv {
        AgentEnv::default()
    }

    /// [`BASE_VARIABLES`] and `LC_*` as the gateway has them.
    pub fn base() -> AgentEnv {
        AgentEnv::base_from(std::env::vars())
    }

    /// [`BASE_VARIABLES`] and `LC_*` out of `vars` (the gateway's environment, in tests any).
    pub fn base_from(vars: impl IntoIterator<Item = (String, String)>) -> AgentEnv {
        AgentEnv {
            vars: vars.into_iter().filter(|(name, _)| is_base(name)).collect(),
        }
    }

    /// Adds `name` with the gateway's value, if the gateway has it; returns whether it did.
    pub fn pass_through(&mut self, name: &str) -> bool {
        match std::env::var(name) {
            Ok(value) => {
                self.vars.insert(name.to_owned(), value);
                true
            }
            Err(_) => false,
        }
    }

    /// Sets `name` to `value` (replacing a passed-through value).
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.vars.insert(name.into(), value.into());
    }

    /// The value of `name`, if the agent gets it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// Whether the agent gets `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.vars.contains_key(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.keys().map(String::as_str)
    }

    /// Every (name, value), sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

fn is_base(name: &str) -> bool {
    BASE_VARIABLES.contains(&name) || name.starts_with("LC_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_base_variables_are_taken_and_debug_shows_no_value() {
        let gateway = [
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("LC_ALL", "C.UTF-8"),
            ("TELEGRAM_BOT_TOKEN", "123:secret"),
            ("DATABASE_URL", "postgres://u:pw@h/db"),
            ("IS_SANDBOX", "yes"),
            ("PATHX", "no"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let mut env = AgentEnv::base_from(gateway);
        assert_eq!(
            env.names().collect::<Vec<_>>(),
            ["HOME", "LC_ALL", "PATH"],
            "the allowlist, nothing else"
        );
        env.set("ANTHROPIC_API_KEY", "sk-ant-very-secret");
        let debug = format!("{env:?}");
        assert!(debug.contains("ANTHROPIC_API_KEY"), "{debug}");
        assert!(
            !debug.contains("very-secret") && !debug.contains("/usr/bin"),
            "values never print: {debug}"
        );
    }
}
