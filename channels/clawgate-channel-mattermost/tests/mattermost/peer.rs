//! A Mattermost channel built by its factory against a fresh simulator, and the simulator's side
//! of what the tests need (channels, faults, what is visible).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clawgate_channel_mattermost::MattermostFactory;
use clawgate_channel_mattermost::simulator::{
    Fault, FaultKind, MattermostSimulator, SimUser, SimulatorConfig,
};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

pub(crate) struct Peer {
    pub(crate) sim: MattermostSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) bot: SimUser,
    pub(crate) person: SimUser,
    pub(crate) other_bot: SimUser,
    channels: Mutex<HashMap<String, String>>,
    _state: tempfile::TempDir,
}

impl Peer {
    /// A channel answering every post (the contract's cases write without mentions; the
    /// mention rule has tests of its own).
    pub(crate) async fn start() -> Peer {
        Peer::with(
            SimulatorConfig::default(),
            json!({ "require_mention": false }),
        )
        .await
    }

    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = MattermostSimulator::start(config).await.unwrap();
        let bot = sim.add_bot("clawgate");
        let person = sim.add_person("ada");
        let other_bot = sim.add_bot("otherbot");
        let state = tempfile::tempdir().unwrap();
        let plugin = build(&sim, &bot, state.path(), "mattermost", settings)
            .await
            .unwrap();
        Peer {
            sim,
            plugin,
            bot,
            person,
            other_bot,
            channels: Mutex::new(HashMap::new()),
            _state: state,
        }
    }

    /// A channel of the bot, the person and the other bot.
    pub(crate) fn channel(&self, name: &str) -> String {
        self.sim
            .add_channel(name, &[&self.bot, &self.person, &self.other_bot])
    }

    /// Texts our bot's posts show in `channel`, oldest first.
    pub(crate) fn texts(&self, channel: &str) -> Vec<String> {
        self.sim
            .visible(channel)
            .into_iter()
            .filter(|p| p.user_id == self.bot.id)
            .map(|p| p.message)
            .collect()
    }

    /// Waits (with a deadline) until the bot's WebSocket is open.
    pub(crate) async fn socket_open(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.sim.socket_stats().open == 0 {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

/// The channel built for `bot` against `sim` (settings merged over the simulator's).
pub(crate) async fn build(
    sim: &MattermostSimulator,
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
    build_from(bot, &setup).await
}

/// `settings` merged over the simulator's.
pub(crate) fn settings_for(sim: &MattermostSimulator, settings: Value) -> Value {
    let mut merged = json!({
        "token_env": "UNUSED_IN_TESTS",
        "url": sim.url(),
        "request_timeout_ms": 3000,
    });
    for (key, value) in settings.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

/// The channel built from `setup` with `bot`'s token.
pub(crate) async fn build_from(
    bot: &SimUser,
    setup: &ChannelSetup,
) -> Result<ChannelPlugin, SetupError> {
    MattermostFactory
        .build_with_secrets(setup, Secret::new(bot.token.clone()))
        .await
}

/// The server's answer to a refusal of `kind` (its real error ids).
pub(crate) fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    let error = |status, id: &str, message: &str| FaultKind::Error {
        status,
        id: id.to_owned(),
        message: message.to_owned(),
    };
    Some(match kind {
        DeliveryFailureKind::Transient => {
            error(500, "app.post.save.app_error", "Unable to save the Post.")
        }
        DeliveryFailureKind::RateLimit => FaultKind::RateLimited { reset_s: 1 },
        DeliveryFailureKind::Auth => error(
            401,
            "api.context.session_expired.app_error",
            "Invalid or expired session, please login again.",
        ),
        DeliveryFailureKind::Permission => error(
            403,
            "api.context.permissions.app_error",
            "You do not have the appropriate permissions.",
        ),
        DeliveryFailureKind::NotFound => error(
            404,
            "app.channel.get.existing.app_error",
            "Unable to find the existing channel.",
        ),
        DeliveryFailureKind::InvalidPayload => error(
            400,
            "model.post.is_valid.message_length.app_error",
            "Post Message property is longer than the maximum permitted length.",
        ),
        // The server answers no post call with a conflict.
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
            .or_insert_with(|| self.channel(case))
            .clone();
        MessageTarget::group(id)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(kind) = refusal(kind) else {
            return false;
        };
        for n in 0..count {
            self.sim
                .inject(Fault::any(kind.clone()).after(if n == 0 { after } else { 0 }));
        }
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::any(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&target.id)
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        self.sim
            .visible(&target.id)
            .into_iter()
            .filter(|p| p.user_id == self.bot.id)
            .map(|p| self.sim.posted_event(&p))
            .collect()
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        // The server pushes a post only to connections open when it is written: a feed that is
        // starting gets to connect first (a case without a feed waits the short deadline out).
        self.socket_open().await;
        let author = if bot { &self.other_bot } else { &self.person };
        let post = self.sim.person_writes(&target.id, author, text, None);
        Some(self.sim.posted_event(&post))
    }

    fn drop_connection(&self) -> bool {
        self.sim.drop_sockets();
        true
    }

    /// A server restart: the connection cannot be resumed, so the feed re-fetches over REST,
    /// with its overlap, and hands the recorded post over again.
    fn redeliver_pushed(&self) -> bool {
        self.sim.restart();
        true
    }
}
