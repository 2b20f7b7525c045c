//! A Tlon channel built by its factory against a fresh simulated ship, and the ship's side of
//! what the tests need (people, channels, faults, what landed).

use std::time::Duration;

use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_tlon::TlonFactory;
use clawgate_channel_tlon::simulator::{Fault, Ship, ShipConfig};
use serde_json::{Value, json};

/// The group channel every peer's ship has.
pub(crate) const NEST: &str = "chat/~zod/general";
/// A second one, listed as open (every post answered).
pub(crate) const OPEN_NEST: &str = "chat/~zod/lounge";
/// The model signature the peer's account appends.
pub(crate) const SIGNATURE: &str = "— test-model";

pub(crate) struct Peer {
    pub(crate) ship: Ship,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) state: tempfile::TempDir,
    pub(crate) settings: Value,
}

/// A ship set up for tests: two channels, a quick clog only where a test asks.
pub(crate) fn config() -> ShipConfig {
    ShipConfig {
        nests: vec![NEST.into(), OPEN_NEST.into()],
        ..ShipConfig::default()
    }
}

/// A ship name for a case name (`~case-lost-answer`).
pub(crate) fn ship_for(case: &str) -> String {
    let clean: String = case
        .chars()
        .map(|c| if c.is_ascii_lowercase() { c } else { '-' })
        .collect();
    format!("~case-{}", clean.to_ascii_lowercase())
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(config(), json!({})).await
    }

    /// A channel whose account signs the model's replies with [`SIGNATURE`].
    pub(crate) async fn signing() -> Peer {
        Peer::with(config(), json!({ "signature": SIGNATURE })).await
    }

    /// A channel with `settings` merged over the defaults, on a ship set up by `config`.
    pub(crate) async fn with(config: ShipConfig, settings: Value) -> Peer {
        let ship = Ship::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let mut merged = json!({
            "url": ship.url(),
            "ship": ship.our(),
            "code_env": "UNUSED_IN_TESTS",
            "open_channels": [OPEN_NEST],
            "request_timeout_ms": 3_000,
            "poke_timeout_ms": 800,
            "settle_window_ms": 0,
        });
        for (key, value) in settings.as_object().unwrap() {
            merged[key] = value.clone();
        }
        let plugin = build(&ship, &merged, state.path()).await;
        Peer {
            ship,
            plugin,
            state,
            settings: merged,
        }
    }

    /// The same account built again on the same state directory (a restarted gateway).
    pub(crate) async fn rebuilt(&self) -> ChannelPlugin {
        build(&self.ship, &self.settings, self.state.path()).await
    }

    /// A DM target for `case`.
    pub(crate) fn person(&self, case: &str) -> MessageTarget {
        MessageTarget::direct(ship_for(case))
    }

    /// A thread of the peer's group channel.
    pub(crate) fn thread(&self, parent: &str) -> MessageTarget {
        let mut target = MessageTarget::group(NEST);
        target.thread_id = Some(parent.to_owned());
        target
    }

    /// Waits until `check` holds (or panics naming `what` after 20 s).
    pub(crate) async fn until(&self, what: &str, check: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

pub(crate) async fn build(ship: &Ship, settings: &Value, state: &std::path::Path) -> ChannelPlugin {
    build_as(ship, settings, state, "default", LegacyFiles::none()).await
}

/// [`build`] for `account`, with `legacy` files to import.
pub(crate) async fn build_as(
    ship: &Ship,
    settings: &Value,
    state: &std::path::Path,
    account: &str,
    legacy: LegacyFiles,
) -> ChannelPlugin {
    let setup = clawgate_conformance::channel_setup(0, "tlon", account, settings.clone(), state)
        .with_legacy_files(legacy);
    TlonFactory
        .build_with_code(&setup, Secret::new(ship.code()))
        .await
        .unwrap()
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, case: &str) -> MessageTarget {
        self.person(case)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let fault = match kind {
            // Eyre did not take the PUT.
            DeliveryFailureKind::Transient => Fault::PutStatus(500),
            // The agent crashed the poke.
            DeliveryFailureKind::InvalidPayload => Fault::Nack("%chat: bad memo".into()),
            DeliveryFailureKind::Permission => {
                Fault::Nack("%chat: permission denied: not in this conversation".into())
            }
            _ => return false,
        };
        self.ship.inject(after, fault.clone());
        for _ in 1..count {
            self.ship.inject(0, fault.clone());
        }
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.ship.inject(after, Fault::LoseResult);
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        match target.kind {
            TargetKind::Direct => self.ship.our_dm_texts(&target.id),
            _ => self
                .ship
                .posts(&target.id)
                .into_iter()
                .filter(|p| p.author == self.ship.our())
                .map(|p| p.text)
                .collect(),
        }
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        // Tlon delivers a message only to subscriptions that exist when it is written (no
        // backfill): a feed the case just started gets a moment to subscribe. A case that runs
        // no feed (it normalizes the returned event itself) waits the deadline out.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while (self.ship.subscriptions().len() < 2 || self.ship.open_streams() == 0)
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if bot {
            self.ship.dm_from_bot(&target.id, text);
        } else {
            self.ship.dm_from(&target.id, text);
        }
        self.ship.last_event()
    }

    fn redeliver_pushed(&self) -> bool {
        self.ship.repeat_diffs() > 0
    }

    fn drop_connection(&self) -> bool {
        self.ship.drop_streams();
        true
    }
}
