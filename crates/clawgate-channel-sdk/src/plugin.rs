//! How a channel crate plugs into the gateway: a [`ChannelFactory`] of a `kind` turns one
//! configured account (`[[channels]]` with its own `settings` table) into a [`ChannelPlugin`],
//! the one value the gateway holds for it. The gateway knows factories through a
//! [`ChannelRegistry`] and nothing else about a platform.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use clawgate_types::clock::Clock;

use crate::state::{ChannelState, LegacyFiles};
use crate::{ChannelMessageAdapter, InboundSource, MessageReceiveAdapter};

/// Everything the gateway needs of one configured channel account.
///
/// Live previews and origin markers come with the sender
/// ([`ChannelMessageAdapter::live`], [`ChannelMessageAdapter::origin`]).
#[derive(Clone)]
#[non_exhaustive]
pub struct ChannelPlugin {
    /// Sends, edits, deletes and reconciles.
    pub sender: Arc<dyn ChannelMessageAdapter>,
    /// Normalizes inbound events (absent for a send-only channel).
    pub receiver: Option<Arc<dyn MessageReceiveAdapter>>,
    /// Where inbound events come from.
    pub source: InboundSource,
    /// One line for operators: what this channel talks to (`Telegram bot @name`), never a
    /// secret.
    pub description: String,
    /// The platform's base URL, when it has one worth showing.
    pub platform_url: Option<String>,
    /// The platform runs inside the gateway process (a test platform).
    pub embedded: bool,
    /// A live preview older than this is not finalized in place: the final is sent fresh and
    /// the preview removed. `None`: the engine's default.
    pub preview_stale_after: Option<std::time::Duration>,
    extension: Option<Arc<dyn Any + Send + Sync>>,
}

impl ChannelPlugin {
    /// A send-only channel; add a receiver and source with [`ChannelPlugin::with_inbound`].
    pub fn new(sender: Arc<dyn ChannelMessageAdapter>) -> ChannelPlugin {
        ChannelPlugin {
            description: format!("channel {}", sender.channel()),
            sender,
            receiver: None,
            source: InboundSource::None,
            platform_url: None,
            embedded: false,
            preview_stale_after: None,
            extension: None,
        }
    }

    /// The channel receives: `receiver` normalizes what `source` delivers.
    pub fn with_inbound(
        mut self,
        receiver: Arc<dyn MessageReceiveAdapter>,
        source: InboundSource,
    ) -> ChannelPlugin {
        self.receiver = Some(receiver);
        self.source = source;
        self
    }

    /// The operator-facing line.
    pub fn with_description(mut self, description: impl Into<String>) -> ChannelPlugin {
        self.description = description.into();
        self
    }

    /// Where the platform is, and whether it runs in this process.
    pub fn with_platform_url(mut self, url: impl Into<String>, embedded: bool) -> ChannelPlugin {
        self.platform_url = Some(url.into());
        self.embedded = embedded;
        self
    }

    /// Previews older than `age` get a fresh final (the account's configured preview age).
    pub fn with_preview_stale_after(mut self, age: std::time::Duration) -> ChannelPlugin {
        self.preview_stale_after = Some(age);
        self
    }

    /// Anything the channel's own wiring needs back later (a platform handle the channel keeps
    /// alive, a test platform's control client). The gateway core never looks inside.
    pub fn with_extension<T: Any + Send + Sync>(mut self, extension: Arc<T>) -> ChannelPlugin {
        self.extension = Some(extension);
        self
    }

    /// The extension of type `T`, when this channel carries one.
    pub fn extension<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.extension.clone()?.downcast::<T>().ok()
    }

    /// The channel name messages carry.
    pub fn name(&self) -> &str {
        self.sender.channel()
    }
}

impl std::fmt::Debug for ChannelPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelPlugin")
            .field("channel", &self.sender.channel())
            .field("description", &self.description)
            .field("source", &self.source)
            .field("platform_url", &self.platform_url)
            .field("embedded", &self.embedded)
            .finish_non_exhaustive()
    }
}

/// A configured account, as a factory receives it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ChannelSetup {
    /// The position in the configuration's `channels` list (for error paths).
    pub index: usize,
    /// The channel name messages carry (`telegram`, `telegram-<account>`).
    pub name: String,
    /// The account id.
    pub account: String,
    /// The entry's `settings` table, as JSON.
    pub settings: serde_json::Value,
    /// This account's durable state in the gateway's store, and the gateway's clock: the one
    /// place a channel keeps anything between runs.
    pub state: ChannelState,
    /// Files an earlier release of the channel kept in the gateway's state directory, to
    /// import into [`state`](Self::state) once.
    pub legacy: LegacyFiles,
}

impl ChannelSetup {
    /// A setup for entry `index` named `name`, keeping its state in `state`.
    pub fn new(
        index: usize,
        name: impl Into<String>,
        account: impl Into<String>,
        settings: serde_json::Value,
        state: ChannelState,
    ) -> ChannelSetup {
        ChannelSetup {
            index,
            name: name.into(),
            account: account.into(),
            settings,
            state,
            legacy: LegacyFiles::none(),
        }
    }

    /// With files of an earlier release to import.
    #[must_use]
    pub fn with_legacy_files(mut self, legacy: LegacyFiles) -> ChannelSetup {
        self.legacy = legacy;
        self
    }

    /// The gateway's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.state.clock()
    }

    /// The path of a settings key in errors: `channels[2].settings.token_env`.
    pub fn key(&self, key: &str) -> String {
        if key.is_empty() {
            format!("channels[{}].settings", self.index)
        } else {
            format!("channels[{}].settings.{key}", self.index)
        }
    }

    /// An error about settings key `key`.
    pub fn invalid(&self, key: &str, reason: impl Into<String>) -> SetupError {
        SetupError {
            key: self.key(key),
            reason: reason.into(),
        }
    }

    /// Parses the settings table into the channel's own type (declare it with
    /// `#[serde(deny_unknown_fields)]` so a misspelt key is an error, not ignored). Errors name
    /// the key: `channels[0].settings.poll_timeout_ms: invalid type: string "x", expected u64`.
    pub fn settings<T: DeserializeOwned>(&self) -> Result<T, SetupError> {
        let settings = match &self.settings {
            serde_json::Value::Null => serde_json::Value::Object(serde_json::Map::new()),
            other => other.clone(),
        };
        serde_path_to_error::deserialize(settings).map_err(|e| {
            // The path names the key at fault, an unknown one included.
            let path = e.path().to_string();
            let key = if path == "." { String::new() } else { path };
            self.invalid(&key, e.into_inner().to_string())
        })
    }

    /// Resolves a secret from the environment variable a `*_env` setting names. `setting` is
    /// that setting's key (for errors); `variable` its value.
    pub fn secret(&self, setting: &str, variable: &str) -> Result<Secret, SetupError> {
        match std::env::var(variable) {
            Ok(value) if !value.is_empty() => Ok(Secret(value)),
            Ok(_) => Err(self.invalid(
                setting,
                format!("the environment variable {variable} is empty"),
            )),
            Err(_) => Err(self.invalid(
                setting,
                format!(
                    "the environment variable {variable} is not set; export it before starting"
                ),
            )),
        }
    }
}

/// A secret value (a token): never printed by `Debug` or `Display`, compared in constant time.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that sends it to the platform.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether a caller presented this secret (see [`same_secret`]).
    pub fn matches(&self, given: &[u8]) -> bool {
        same_secret(self.0.as_bytes(), given)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.matches(other.0.as_bytes())
    }
}

impl Eq for Secret {}

/// Whether `given` is `expected`, compared in time that does not depend on where they first
/// differ: a secret checked with `==` tells a caller who times the answers how much of a guess
/// was right. Only the length may show. Every check of a presented token, password or
/// signature goes through here.
pub fn same_secret(expected: &[u8], given: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    expected.len() == given.len() && bool::from(expected.ct_eq(given))
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A channel entry could not be set up: which key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
#[non_exhaustive]
pub struct SetupError {
    /// The configuration key at fault (`channels[0].settings.base_url`).
    pub key: String,
    /// What is wrong and what to do.
    pub reason: String,
}

impl SetupError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> SetupError {
        SetupError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// Builds channels of one kind.
#[async_trait]
pub trait ChannelFactory: Send + Sync {
    /// The `kind` configuration names (`telegram`, `qa`).
    fn kind(&self) -> &str;

    /// Turns one configured account into a channel: parses its settings
    /// ([`ChannelSetup::settings`]), resolves its secrets ([`ChannelSetup::secret`]), and
    /// builds the adapter and source. Nothing is polled or listened on yet.
    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError>;
}

/// The channel kinds a gateway build knows.
#[derive(Clone, Default)]
pub struct ChannelRegistry {
    factories: BTreeMap<String, Arc<dyn ChannelFactory>>,
}

impl ChannelRegistry {
    /// No kinds.
    pub fn new() -> ChannelRegistry {
        ChannelRegistry::default()
    }

    /// Adds (or replaces) the factory of its kind.
    pub fn register(&mut self, factory: Arc<dyn ChannelFactory>) -> &mut ChannelRegistry {
        self.factories.insert(factory.kind().to_owned(), factory);
        self
    }

    /// The factory of `kind`.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn ChannelFactory>> {
        self.factories.get(kind)
    }

    /// The kinds, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }
}

impl std::fmt::Debug for ChannelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelRegistry")
            .field("kinds", &self.kinds())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_matches_only_itself_and_prints_nothing() {
        let secret = Secret::new("s3cr3t-token-value");
        assert!(secret.matches(b"s3cr3t-token-value"));
        assert!(!secret.matches(b"s3cr3t-token-valuf"), "last byte differs");
        assert!(!secret.matches(b"s3cr3t-token-valu"), "a prefix");
        assert!(!secret.matches(b"s3cr3t-token-value-and-more"), "longer");
        assert!(!secret.matches(b""));
        assert!(same_secret(b"", b""));
        assert_eq!(secret, Secret::new("s3cr3t-token-value"));
        assert_ne!(secret, Secret::new("another"));
        assert!(!format!("{secret:?}").contains("s3cr3t"));
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Settings {
        #[serde(default)]
        poll_timeout_ms: u64,
        #[serde(default)]
        nested: Option<Nested>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nested {
        depth: u32,
    }

    fn setup(settings: serde_json::Value) -> ChannelSetup {
        ChannelSetup::new(
            2,
            "memory",
            "default",
            settings,
            crate::state::tests::unused_state(),
        )
    }

    #[test]
    fn settings_errors_name_the_key() {
        let e = setup(serde_json::json!({ "poll_timeout_ms": "soon" }))
            .settings::<Settings>()
            .expect_err("a string is not a number");
        assert_eq!(e.key, "channels[2].settings.poll_timeout_ms");
        let e = setup(serde_json::json!({ "poll_timeout": 1 }))
            .settings::<Settings>()
            .expect_err("unknown key");
        assert_eq!(e.key, "channels[2].settings.poll_timeout", "{e}");
        let e = setup(serde_json::json!({ "nested": { "deep": 1 } }))
            .settings::<Settings>()
            .expect_err("unknown nested key");
        assert_eq!(e.key, "channels[2].settings.nested.deep", "{e}");
        assert!(
            setup(serde_json::Value::Null)
                .settings::<Settings>()
                .is_ok()
        );
    }

    #[test]
    fn secrets_come_from_the_named_variable_and_never_print() {
        let e = setup(serde_json::Value::Null)
            .secret("token_env", "CLAWGATE_SDK_TEST_SURELY_UNSET")
            .expect_err("unset");
        assert_eq!(e.key, "channels[2].settings.token_env");
        assert!(e.reason.contains("CLAWGATE_SDK_TEST_SURELY_UNSET"), "{e}");
        let secret = Secret::new("hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        assert_eq!(secret.expose(), "hunter2");
    }
}
