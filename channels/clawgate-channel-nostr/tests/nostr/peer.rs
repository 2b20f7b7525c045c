//! A Nostr channel built by its factory on a fresh relay (through the fault proxy), with a
//! person and a bot that write to it over the relay directly.

use std::time::Duration;

use clawgate_channel_nostr::testing::{Person, TestRelay};
use clawgate_channel_nostr::{NostrFactory, NostrLink, inbound_event};
use clawgate_channel_sdk::prelude::*;
use nostr_sdk::Keys;
use serde_json::{Value, json};

pub(crate) const KEY_ENV: &str = "CLAWGATE_TEST_NOSTR_KEY";

/// Settings for a channel on `relays`, merged over `extra`.
pub(crate) fn settings(relays: &[String], extra: Value) -> Value {
    let mut merged = json!({
        "secret_key_env": KEY_ENV,
        "relays": relays,
        "answer_timeout_ms": 3000,
        "connect_wait_ms": 3000,
        "reconnect_ms": 100,
    });
    for (key, value) in extra.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

pub(crate) async fn build(keys: &Keys, settings: Value, state: &std::path::Path) -> ChannelPlugin {
    let setup = clawgate_conformance::channel_setup(0, "nostr", "default", settings, state);
    build_from(keys, &setup).await
}

/// The channel built from `setup` with `keys`, once connected to its relays.
pub(crate) async fn build_from(keys: &Keys, setup: &ChannelSetup) -> ChannelPlugin {
    let secret = Secret::new(keys.secret_key().to_secret_hex());
    let plugin = NostrFactory
        .build_with_secrets(setup, &secret)
        .await
        .unwrap();
    assert!(
        link(&plugin).wait_connected(Duration::from_secs(20)).await,
        "the channel connects to its relays"
    );
    plugin
}

pub(crate) fn link(plugin: &ChannelPlugin) -> std::sync::Arc<NostrLink> {
    plugin
        .extension::<NostrLink>()
        .expect("a Nostr plugin carries its link")
}

pub(crate) struct Peer {
    pub(crate) relay: TestRelay,
    pub(crate) keys: Keys,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) person: Person,
    pub(crate) bot: Person,
    pub(crate) _state: tempfile::TempDir,
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(json!({})).await
    }

    pub(crate) async fn with(extra: Value) -> Peer {
        let relay = TestRelay::start().await;
        let person = Person::join(&relay).await;
        let bot = Person::join(&relay).await;
        let keys = Keys::generate();
        let state = tempfile::tempdir().unwrap();
        let mut extra = extra;
        extra["bot_senders"] = json!([bot.id()]);
        let plugin = build(&keys, settings(&[relay.url()], extra), state.path()).await;
        Peer {
            relay,
            keys,
            plugin,
            person,
            bot,
            _state: state,
        }
    }

    /// What the channel's key sent the person, as the relay holds it.
    pub(crate) async fn said(&self) -> Vec<String> {
        self.person
            .texts_from(&self.relay, &self.keys.public_key())
            .await
    }

    pub(crate) fn sender(&self) -> std::sync::Arc<dyn ChannelMessageAdapter> {
        self.plugin.sender.clone()
    }
}

fn blocking<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, _case: &str) -> MessageTarget {
        // Each case runs on its own relay with its own person: one conversation is fresh.
        MessageTarget::direct(self.person.id())
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        // The relay's own refusal: a write policy answers `OK false "blocked: …"`. A relay
        // down is not a refusal of one call (the channel's reconnects would meet it too);
        // `send.rs` covers it.
        if kind != DeliveryFailureKind::Permission {
            return false;
        }
        self.relay.refuse(count, after, "not on this relay's list");
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.relay.lose_answer(after);
        true
    }

    async fn visible_texts(&self, _target: &MessageTarget) -> Vec<String> {
        self.said().await
    }

    async fn inject_inbound(
        &self,
        _target: &MessageTarget,
        text: &str,
        bot: bool,
    ) -> Option<Value> {
        let writer = if bot { &self.bot } else { &self.person };
        let wrap = writer.send_dm(&self.keys.public_key(), text).await;
        Some(inbound_event(&wrap, &self.relay.direct_url()))
    }

    fn redeliver_pushed(&self) -> bool {
        // A sender's retry wraps the same rumor again: a new event on the relay, the same
        // message id.
        blocking(self.person.send_last_again());
        true
    }

    fn drop_connection(&self) -> bool {
        self.relay.set_down(true);
        self.relay.set_down(false);
        true
    }
}
