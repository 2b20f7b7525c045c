//! `[[channels]] kind = "nostr"`: the settings of one key on its relays, and the plugin built
//! from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use nostr_sdk::{Client, Keys, PublicKey, RelayUrl, ToBech32};
use serde::Deserialize;

use crate::adapter::NostrAdapter;
use crate::client::{RelayTimings, Relays, SentRule};
use crate::dm::DmProtocol;
use crate::receive::NostrReceiver;
use crate::source::{NostrFeed, import_legacy_checkpoint};

/// When an event counts as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SentWhen {
    /// One relay accepted it (the default).
    Any,
    /// Every relay accepted it.
    All,
    /// `quorum` relays accepted it.
    Quorum,
}

/// `[channels.settings]` of a `nostr` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NostrSettings {
    /// The environment variable holding the secret key (`nsec1…` or 64 hex digits).
    pub secret_key_env: String,
    /// The relays (`wss://…`, `ws://…`): messages are published to and read from each.
    pub relays: Vec<String>,
    /// When a message counts as sent: `any` relay, `all`, or a `quorum`.
    #[serde(default = "default_sent_when")]
    pub sent_when: SentWhen,
    /// The relays needed with `sent_when = "quorum"`.
    #[serde(default)]
    pub quorum: Option<usize>,
    /// `nip17` gift wraps (default) or `nip04` kind-4 events (deprecated; old clients only).
    #[serde(default = "default_dm")]
    pub dm: DmProtocol,
    /// Public keys answered (hex or npub); empty: everyone.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Public keys reported as bot authors (hex or npub).
    #[serde(default)]
    pub bot_senders: Vec<String>,
    /// How long a relay has to answer an `EVENT` (`OK`) or a lookup (`EOSE`).
    #[serde(default = "default_answer_timeout_ms")]
    pub answer_timeout_ms: u64,
    /// How long a send waits for a relay that is connecting before it counts as not sent there.
    #[serde(default = "default_connect_wait_ms")]
    pub connect_wait_ms: u64,
    /// The pause between reconnect attempts to a relay.
    #[serde(default = "default_reconnect_ms")]
    pub reconnect_ms: u64,
}

fn default_sent_when() -> SentWhen {
    SentWhen::Any
}
fn default_dm() -> DmProtocol {
    DmProtocol::Nip17
}
fn default_answer_timeout_ms() -> u64 {
    10_000
}
fn default_connect_wait_ms() -> u64 {
    5_000
}
fn default_reconnect_ms() -> u64 {
    3_000
}

/// Builds `nostr` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct NostrFactory;

/// The relays of a Nostr channel, for operators and tests (the plugin's extension).
#[derive(Debug, Clone)]
pub struct NostrLink {
    relays: Relays,
    public_key: PublicKey,
}

impl NostrLink {
    /// Our public key.
    pub fn public_key(&self) -> PublicKey {
        self.public_key
    }

    /// The relays connected now.
    pub async fn connected(&self) -> Vec<String> {
        let relays = self.relays.client().relays().await;
        relays
            .into_iter()
            .filter(|(_, relay)| relay.is_connected())
            .map(|(url, _)| url.to_string())
            .collect()
    }

    /// Waits up to `timeout` until every relay is connected; whether they are.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let client = self.relays.client();
        client.wait_for_connection(timeout).await;
        let relays = client.relays().await;
        !relays.is_empty() && relays.values().all(nostr_sdk::Relay::is_connected)
    }
}

#[async_trait]
impl ChannelFactory for NostrFactory {
    fn kind(&self) -> &str {
        "nostr"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: NostrSettings = setup.settings()?;
        let secret = setup.secret("secret_key_env", &settings.secret_key_env)?;
        self.build_with_secrets(&setup, &secret).await
    }
}

impl NostrFactory {
    /// Builds the key of `setup` with its secret key given (the gateway reads it from the
    /// variable `secret_key_env` names). The relays connect in the background.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        secret_key: &Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: NostrSettings = setup.settings()?;
        // The parse error could quote the key: it is not passed on.
        let keys = Keys::parse(secret_key.expose().trim()).map_err(|_| {
            setup.invalid(
                "secret_key_env",
                format!(
                    "${} is not a Nostr secret key: give nsec1… or 64 hex digits",
                    settings.secret_key_env
                ),
            )
        })?;
        if settings.relays.is_empty() {
            return Err(setup.invalid("relays", "name at least one relay (wss://…)"));
        }
        let mut urls = Vec::new();
        for relay in &settings.relays {
            let url = RelayUrl::parse(relay).map_err(|e| {
                setup.invalid(
                    "relays",
                    format!("{relay:?} is not a relay URL (wss://…): {e}"),
                )
            })?;
            if !urls.contains(&url) {
                urls.push(url);
            }
        }
        let rule = match (settings.sent_when, settings.quorum) {
            (SentWhen::Any, None) => SentRule::Any,
            (SentWhen::All, None) => SentRule::All,
            (SentWhen::Quorum, Some(n)) if n >= 1 && n <= urls.len() => SentRule::Quorum(n),
            (SentWhen::Quorum, _) => {
                return Err(setup.invalid(
                    "quorum",
                    format!(
                        "sent_when = \"quorum\" needs quorum between 1 and {} (the relays)",
                        urls.len()
                    ),
                ));
            }
            (_, Some(_)) => {
                return Err(
                    setup.invalid("quorum", "quorum is only read with sent_when = \"quorum\"")
                );
            }
        };
        let mut allowed = Vec::new();
        for sender in &settings.allowed_senders {
            allowed.push(PublicKey::parse(sender).map_err(|e| {
                setup.invalid(
                    "allowed_senders",
                    format!("{sender:?} is not a public key: {e}"),
                )
            })?);
        }
        let mut bots = Vec::new();
        for bot in &settings.bot_senders {
            bots.push(PublicKey::parse(bot).map_err(|e| {
                setup.invalid("bot_senders", format!("{bot:?} is not a public key: {e}"))
            })?);
        }
        let timings = RelayTimings {
            answer_timeout: Duration::from_millis(settings.answer_timeout_ms.max(1)),
            connect_wait: Duration::from_millis(settings.connect_wait_ms),
            reconnect: Duration::from_millis(settings.reconnect_ms.max(100)),
        };
        let client = Client::builder().signer(keys.clone()).build();
        let relays = Relays::new(client, urls.clone(), rule, timings)
            .await
            .map_err(|e| setup.invalid("relays", e))?;
        let public_key = keys.public_key();
        let adapter = Arc::new(NostrAdapter::new(
            &setup.name,
            keys.clone(),
            settings.dm,
            relays.clone(),
            setup.clock().clone(),
        ));
        let receiver =
            Arc::new(NostrReceiver::new(&setup.name, keys, settings.dm, allowed).with_bots(bots));
        import_legacy_checkpoint(&setup.state, &setup.legacy, &public_key)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let feed = Arc::new(NostrFeed::new(
            relays.clone(),
            public_key,
            settings.dm,
            setup.state.clone(),
        ));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, InboundSource::Pushed(feed))
            .with_description(format!(
                "Nostr {} on {}",
                public_key
                    .to_bech32()
                    .unwrap_or_else(|_| public_key.to_hex()),
                urls.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .with_extension(Arc::new(NostrLink { relays, public_key })))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn setup(settings: serde_json::Value) -> ChannelSetup {
        clawgate_conformance::channel_setup_in_memory(1, "nostr", "default", settings)
    }

    #[tokio::test]
    async fn settings_are_checked_and_errors_name_the_key_without_the_secret() {
        let key = Secret::new(Keys::generate().secret_key().to_secret_hex());
        let ok = json!({ "secret_key_env": "K", "relays": ["ws://127.0.0.1:9"] });
        let plugin = NostrFactory
            .build_with_secrets(&setup(ok), &key)
            .await
            .expect("valid settings build");
        assert!(
            plugin.description.starts_with("Nostr npub1"),
            "{}",
            plugin.description
        );
        let link = plugin.extension::<NostrLink>().expect("the link");
        let shown = format!("{link:?}");
        assert!(
            !shown.contains(key.expose()),
            "the secret key is not in Debug: {shown}"
        );
        assert!(shown.contains(&link.public_key().to_hex()));
        for (settings, k) in [
            (
                json!({ "secret_key_env": "K", "relays": [] }),
                "channels[1].settings.relays",
            ),
            (
                json!({ "secret_key_env": "K", "relays": ["http//x"] }),
                "channels[1].settings.relays",
            ),
            (
                json!({ "secret_key_env": "K", "relays": ["ws://a"], "sent_when": "quorum", "quorum": 2 }),
                "channels[1].settings.quorum",
            ),
            (
                json!({ "secret_key_env": "K", "relays": ["ws://a"], "typo": 1 }),
                "channels[1].settings.typo",
            ),
            (
                json!({ "secret_key_env": "K", "relays": ["ws://a"], "allowed_senders": ["bob"] }),
                "channels[1].settings.allowed_senders",
            ),
        ] {
            let error = NostrFactory
                .build_with_secrets(&setup(settings), &key)
                .await
                .expect_err("refused");
            assert_eq!(error.key, k, "{error}");
        }
        let bad = Secret::new("nsec1-but-not-really-0123456789");
        let error = NostrFactory
            .build_with_secrets(
                &setup(json!({ "secret_key_env": "K", "relays": ["ws://a"] })),
                &bad,
            )
            .await
            .expect_err("refused");
        assert_eq!(error.key, "channels[1].settings.secret_key_env");
        assert!(!error.to_string().contains("nsec1-but"), "{error}");
    }
}
