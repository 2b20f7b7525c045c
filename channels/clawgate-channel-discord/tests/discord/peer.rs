//! A Discord channel built by its factory against a fresh simulator, and the simulator's side of
//! what the tests need (channels, faults, what is visible).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clawgate_channel_discord::simulator::{
    DiscordSimulator, Fault, FaultKind, SimUser, SimulatorConfig, WriteOptions,
};
use clawgate_channel_discord::{DiscordFactory, EchoRegistry};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

pub(crate) struct Peer {
    pub(crate) sim: DiscordSimulator,
    pub(crate) factory: DiscordFactory,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) bot: SimUser,
    pub(crate) person: SimUser,
    pub(crate) other_bot: SimUser,
    channels: Mutex<HashMap<String, String>>,
    pub(crate) state: tempfile::TempDir,
}

impl Peer {
    /// A channel on a simulator with loose limits (the contract cases send bursts; buckets have
    /// tests of their own).
    pub(crate) async fn start() -> Peer {
        Peer::with(SimulatorConfig::fast(), json!({})).await
    }

    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = DiscordSimulator::start(config).await.unwrap();
        let bot = sim.add_bot("clawgate");
        let person = sim.add_person("ada");
        let other_bot = sim.add_bot("otherbot");
        let state = tempfile::tempdir().unwrap();
        let factory = DiscordFactory::with_echo_registry(Arc::new(EchoRegistry::default()));
        let plugin = build(&factory, &sim, &bot, state.path(), "discord", settings)
            .await
            .unwrap();
        Peer {
            sim,
            factory,
            plugin,
            bot,
            person,
            other_bot,
            channels: Mutex::new(HashMap::new()),
            state,
        }
    }

    /// The channel id of a target.
    pub(crate) fn channel(&self, target: &MessageTarget) -> String {
        target
            .thread_id
            .clone()
            .unwrap_or_else(|| target.id.clone())
    }

    /// Texts our bot wrote in `channel`.
    pub(crate) fn texts(&self, channel: &str) -> Vec<String> {
        self.sim
            .messages(channel)
            .into_iter()
            .filter(|m| m.author_id == self.bot.id)
            .map(|m| m.content)
            .collect()
    }
}

/// The channel `factory` builds for `bot` against `sim` (settings merged over the simulator's).
pub(crate) async fn build(
    factory: &DiscordFactory,
    sim: &DiscordSimulator,
    bot: &SimUser,
    state_dir: &std::path::Path,
    name: &str,
    settings: Value,
) -> Result<ChannelPlugin, SetupError> {
    let setup = clawgate_conformance::channel_setup(
        0,
        name,
        "default",
        settings_for(sim, settings),
        state_dir,
    );
    build_from(factory, bot, &setup).await
}

/// `settings` merged over the simulator's.
pub(crate) fn settings_for(sim: &DiscordSimulator, settings: Value) -> Value {
    let mut merged = json!({
        "token_env": "UNUSED_IN_TESTS",
        "api_base": sim.api_base(),
        "request_timeout_ms": 3000,
    });
    for (key, value) in settings.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

/// The channel `factory` builds from `setup` with `bot`'s token.
pub(crate) async fn build_from(
    factory: &DiscordFactory,
    bot: &SimUser,
    setup: &ChannelSetup,
) -> Result<ChannelPlugin, SetupError> {
    factory
        .build_with_secrets(setup, Secret::new(bot.token.clone().unwrap()))
        .await
}

/// Discord's answer to a refusal of `kind` (platform-apis §3.2).
fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    let error = |status, code, message: &str| FaultKind::Error {
        status,
        code,
        message: message.to_owned(),
    };
    Some(match kind {
        DeliveryFailureKind::Transient => error(502, 0, "502: Bad Gateway"),
        // Short, so the limiter waits it out before the next case's call.
        DeliveryFailureKind::RateLimit => FaultKind::RateLimited {
            retry_after: 0.05,
            global: false,
        },
        DeliveryFailureKind::Auth => error(401, 0, "401: Unauthorized"),
        DeliveryFailureKind::Permission => error(403, 50013, "Missing Permissions"),
        DeliveryFailureKind::NotFound => error(404, 10003, "Unknown Channel"),
        DeliveryFailureKind::InvalidPayload => error(400, 50006, "Cannot send an empty message"),
        // Discord answers no send with a conflict.
        _ => return None,
    })
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, case: &str) -> MessageTarget {
        let id = self
            .channels
            .lock()
            .unwrap()
            .entry(case.to_owned())
            .or_insert_with(|| self.sim.add_channel(case))
            .clone();
        MessageTarget::group(id)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(kind) = refusal(kind) else {
            return false;
        };
        for n in 0..count {
            self.sim.inject(Fault {
                route: None,
                after: if n == 0 { after } else { 0 },
                kind: kind.clone(),
            });
        }
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim.inject(Fault {
            route: None,
            after,
            kind: FaultKind::LoseAnswer,
        });
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&self.channel(target))
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        let guild = self.sim.guild_id();
        self.sim
            .messages(&self.channel(target))
            .into_iter()
            .filter(|m| m.author_id == self.bot.id)
            .map(|m| m.to_event(Some(&guild)))
            .collect()
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        // Discord delivers a message only to sessions open when it is written: a feed that is
        // starting gets to identify first (a case without a feed waits the short deadline out).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while self.sim.gateway_stats(&self.bot).sessions == 0
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let author = if bot { &self.other_bot } else { &self.person };
        let written =
            self.sim
                .person_writes(&self.channel(target), author, text, WriteOptions::default());
        Some(written.to_event(Some(&self.sim.guild_id())))
    }

    fn drop_connection(&self) -> bool {
        self.sim.disconnect(&self.bot);
        true
    }

    fn redeliver_pushed(&self) -> bool {
        self.sim.replay(&self.bot);
        true
    }
}
