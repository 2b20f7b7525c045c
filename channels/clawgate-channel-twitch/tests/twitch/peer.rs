//! A Twitch channel built by its factory against a fresh simulator, with a person and another
//! bot in its channel.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_twitch::simulator::{
    Fault, FaultKind, SimUser, SimulatorConfig, TwitchSimulator,
};
use clawgate_channel_twitch::{TwitchFactory, TwitchLink, inbound_event, limits};
use serde_json::{Value, json};

pub(crate) const CHANNEL: &str = "clawchan";

pub(crate) struct Peer {
    pub(crate) sim: TwitchSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) person: SimUser,
    pub(crate) other_bot: SimUser,
    /// The link's session when the peer cut it, until the next write waits for the rejoin.
    cut_at: Mutex<Option<u64>>,
}

/// Settings for a channel on `sim`, merged over `extra`.
pub(crate) fn settings(sim: &TwitchSimulator, extra: Value) -> Value {
    let config = sim.config();
    let mut merged = json!({
        "login": config.bot_login,
        "token_env": "TWITCH_TOKEN",
        "user_id": config.bot_user_id,
        "client_id": config.client_id,
        "channels": [format!("#{CHANNEL}")],
        "irc_server": "127.0.0.1",
        "irc_port": sim.irc_port(),
        "helix_base": sim.helix_base(),
        "bot_logins": ["otherbot"],
        "request_timeout_ms": 3000,
        "answer_timeout_ms": 3000,
        "send_wait_ms": 10000,
        "reconnect_min_ms": 50,
        "reconnect_max_ms": 500,
    });
    for (key, value) in extra.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

pub(crate) async fn build(sim: &TwitchSimulator, settings: Value) -> ChannelPlugin {
    let setup = clawgate_conformance::channel_setup_in_memory(0, "twitch", "default", settings);
    TwitchFactory
        .build_with_secrets(&setup, Secret::new(sim.config().bot_token))
        .await
        .unwrap()
}

pub(crate) fn link(plugin: &ChannelPlugin) -> std::sync::Arc<TwitchLink> {
    plugin
        .extension::<TwitchLink>()
        .expect("a Twitch plugin carries its link")
}

/// Polls `check` until it holds; panics naming `what` after 20 s.
pub(crate) async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(SimulatorConfig::default(), json!({})).await
    }

    pub(crate) async fn with(config: SimulatorConfig, extra: Value) -> Peer {
        let sim = TwitchSimulator::start(config).await.unwrap();
        let person = sim.person("ada");
        let other_bot = sim.person("otherbot");
        let plugin = build(&sim, settings(&sim, extra)).await;
        Peer {
            sim,
            plugin,
            person,
            other_bot,
            cut_at: Mutex::new(None),
        }
    }

    pub(crate) fn bot_login(&self) -> String {
        self.sim.config().bot_login
    }

    /// Connects the channel and waits until the simulator has it in the channel.
    pub(crate) async fn joined(&self) {
        let link = link(&self.plugin);
        let cut = *self.cut_at.lock().unwrap();
        link.wait_joined(&[CHANNEL], Duration::from_secs(20))
            .await
            .expect("the bot joins");
        let login = self.bot_login();
        until("the bot in the channel", || {
            link.session().is_some_and(|s| cut.is_none_or(|c| s > c))
                && self.sim.joined(&login).iter().any(|c| c == CHANNEL)
        })
        .await;
        *self.cut_at.lock().unwrap() = None;
    }

    /// What the bot said in `channel`, as the simulator recorded it (duplicate suffix off).
    pub(crate) fn said(&self, channel: &str) -> Vec<String> {
        let login = self.bot_login();
        self.sim
            .messages(channel)
            .into_iter()
            .filter(|m| m.sender_login == login)
            .map(|m| limits::without_suffix(&m.text).to_owned())
            .collect()
    }
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, _case: &str) -> MessageTarget {
        // Each case runs on its own simulator, so one channel is a fresh conversation.
        MessageTarget::group(format!("#{CHANNEL}"))
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let (status, message) = match kind {
            DeliveryFailureKind::Transient => (503, "Service Unavailable"),
            DeliveryFailureKind::RateLimit => (429, "Request limit exceeded"),
            DeliveryFailureKind::Auth => (401, "Invalid OAuth token"),
            DeliveryFailureKind::Permission => (
                403,
                "The sender must have authorized the app with the user:write:chat scope",
            ),
            DeliveryFailureKind::InvalidPayload => (400, "Malformed request body"),
            _ => return false,
        };
        self.sim.inject(
            Fault::once(FaultKind::HelixError {
                status,
                message: message.into(),
            })
            .after(after)
            .times(count),
        );
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::once(FaultKind::HelixLoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.said(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        // Twitch chat keeps no backlog: write only once the bot is in the channel.
        self.joined().await;
        let writer = if bot { &self.other_bot } else { &self.person };
        let login = self.bot_login();
        let sent = self
            .sim
            .person_writes(&target.id, writer, &format!("@{login} {text}"), None);
        let line = format!(
            "@display-name={};id={};room-id={};user-id={} :{w}!{w}@{w}.tmi.twitch.tv PRIVMSG #{} :{}",
            writer.display_name,
            sent.id,
            self.sim.room_id(&target.id).unwrap_or_default(),
            writer.id,
            sent.channel,
            sent.text,
            w = writer.login,
        );
        Some(inbound_event(&line, &login))
    }

    fn drop_connection(&self) -> bool {
        *self.cut_at.lock().unwrap() = link(&self.plugin).session();
        self.sim.cut(&self.bot_login());
        true
    }
}
