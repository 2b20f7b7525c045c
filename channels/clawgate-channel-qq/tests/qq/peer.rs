//! A QQ bot channel built by its factory against a fresh simulator, and the simulator's side of
//! what the tests need (people, faults, what landed).
//!
//! The peer runs the real [`CallbackSource`](clawgate_channel_qq::CallbackSource) for its whole
//! life and hands the cases a source that attaches the case's event sink to it; while no case
//! listens, dispatches are answered `{"op": 12, "d": 1}` and QQ pushes them again.
//!
//! Each conversation a case uses is a person who wrote to the bot just before (no dispatch of
//! it reaches the case): the channel saw that message, so what it sends there is a passive
//! reply to it, as a QQ bot's messages are.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_qq::simulator::{Fault, FaultKind, QqSimulator, SimChat, SimulatorConfig};
use clawgate_channel_qq::{CODE_MUTED, CODE_TOKEN_INVALID, QqFactory};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

/// The automated account the channel's settings list in `bot_senders`.
pub(crate) const BOT: &str = "B0TB0TB0TB0TB0TB0TB0TB0TB0TB0TB0";

pub(crate) struct Peer {
    pub(crate) sim: QqSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) callback_url: String,
    relay: Arc<Relay>,
    listener: tokio::task::JoinHandle<()>,
    pub(crate) state: tempfile::TempDir,
}

/// Quick re-pushes (QQ's schedule, compressed), so a dispatch nobody took is tried again at
/// once.
pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        retry_delays: vec![Duration::from_millis(50); 40],
        ..SimulatorConfig::default()
    }
}

/// The event sink of whichever case is listening now.
#[derive(Default)]
struct Relay {
    current: Mutex<Option<Arc<dyn EventSink>>>,
}

#[async_trait]
impl EventSink for Relay {
    async fn deliver(&self, event: PushedEvent) {
        let sink = self.current.lock().unwrap().clone();
        match sink {
            Some(sink) => sink.deliver(event).await,
            None => event.ack.nack("no case is listening"),
        }
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

/// What a case runs as the channel's source: it attaches the case's sink to the listener.
struct Attach(Arc<Relay>);

#[async_trait]
impl PushedFeed for Attach {
    async fn run(&self, sink: Arc<dyn EventSink>) -> Result<(), SourceError> {
        *self.0.current.lock().unwrap() = Some(sink.clone());
        sink.stopped().await;
        *self.0.current.lock().unwrap() = None;
        Ok(())
    }
}

/// A person's `user_openid` for a conversation name (32 hex-ish characters, as QQ's).
pub(crate) fn user_for(name: &str) -> String {
    let mut hash: u64 = 1469598103934665603;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(1099511628211);
    }
    format!("{hash:016X}{:016X}", hash.rotate_left(17))
}

/// The settings of a channel on `sim` listening on `port`, `overrides` merged over them.
pub(crate) fn settings(sim: &QqSimulator, port: u16, overrides: &Value) -> Value {
    let mut merged = json!({
        "app_id": sim.app_id(),
        "secret_env": "UNUSED_IN_TESTS",
        "callback_listen": format!("127.0.0.1:{port}"),
        "api_base": sim.api_url(),
        "token_base": sim.api_url(),
        "request_timeout_ms": 3000,
        "bot_senders": [BOT],
    });
    for (key, value) in overrides.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

/// Builds a channel on `sim` in `state` with `secret`.
pub(crate) async fn build(
    state: &std::path::Path,
    settings: Value,
    secret: &str,
) -> Result<ChannelPlugin, SetupError> {
    let setup = clawgate_conformance::channel_setup(0, "qq", "default", settings, state);
    QqFactory
        .build_with_secret(&setup, Secret::new(secret))
        .await
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quick(), json!({})).await
    }

    /// A channel with `overrides` merged over the default settings, on a simulator set up by
    /// `config`.
    pub(crate) async fn with(config: SimulatorConfig, overrides: Value) -> Peer {
        let sim = QqSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let callback_url = format!("http://127.0.0.1:{port}/qq/callback");
        let plugin = build(
            state.path(),
            settings(&sim, port, &overrides),
            &sim.secret(),
        )
        .await
        .unwrap();
        let relay = Arc::new(Relay::default());
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("the QQ source is pushed");
        };
        let sink: Arc<dyn EventSink> = relay.clone();
        let listener = tokio::spawn(async move {
            let _ = feed.run(sink).await;
        });
        let peer = Peer {
            sim,
            plugin,
            callback_url,
            relay,
            listener,
            state,
        };
        peer.listening().await;
        peer.sim.set_callback_url(Some(&peer.callback_url));
        peer
    }

    /// The plugin with the case-attaching source.
    pub(crate) fn attached_plugin(&self) -> ChannelPlugin {
        let mut plugin = self.plugin.clone();
        plugin.source = InboundSource::Pushed(Arc::new(Attach(self.relay.clone())));
        plugin
    }

    /// A case's sink is attached to the listener.
    pub(crate) fn attached(&self) -> bool {
        self.relay.current.lock().unwrap().is_some()
    }

    /// Waits until the callback listener accepts connections.
    async fn listening(&self) {
        let addr = self
            .callback_url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the callback listener never came up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The texts visible in `chat` (recalled ones gone), oldest first.
    pub(crate) fn texts(&self, chat: &SimChat) -> Vec<String> {
        self.sim
            .messages(chat)
            .into_iter()
            .filter(|m| !m.recalled)
            .map(|m| m.text)
            .collect()
    }

    /// A person who just wrote to the bot (the channel saw it), for conversation `name`;
    /// returns the target and the message's id.
    pub(crate) fn person_with_id(&self, name: &str) -> (MessageTarget, String) {
        let user = user_for(name);
        let payload = self
            .sim
            .person_wrote_earlier(&user, &format!("hello from {name}"));
        let seen = self
            .plugin
            .receiver
            .as_ref()
            .unwrap()
            .normalize(&payload)
            .unwrap();
        (MessageTarget::direct(user), seen.event_id)
    }

    /// A person who just wrote to the bot, for conversation `name`.
    pub(crate) fn person(&self, name: &str) -> MessageTarget {
        self.person_with_id(name).0
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The simulator's chat of a target.
pub(crate) fn chat(target: &MessageTarget) -> SimChat {
    match target.kind {
        TargetKind::Group => SimChat::Group(target.id.clone()),
        _ => SimChat::User(target.id.clone()),
    }
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.attached_plugin()
    }

    fn target(&self, case: &str) -> MessageTarget {
        self.person(case)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let (status, code, message, calls_per_send) = match kind {
            DeliveryFailureKind::Transient => (500, 850_027, "服务内部错误", 1),
            DeliveryFailureKind::RateLimit => (429, 20_028, "请求频率超限", 1),
            // A refused token is replaced and the send tried once more: both refused.
            DeliveryFailureKind::Auth => (401, CODE_TOKEN_INVALID, "token invalid", 2),
            DeliveryFailureKind::Permission => (400, CODE_MUTED, "机器人被禁言", 1),
            DeliveryFailureKind::InvalidPayload => (400, 40_034_001, "参数错误", 1),
            _ => return false,
        };
        self.sim.inject(
            Fault::new(FaultKind::Refuse(status, code, message.to_owned()))
                .after(after)
                .times(count * calls_per_send),
        );
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&chat(target))
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let from = if bot { BOT } else { target.id.as_str() };
        self.sim.person_writes(from, text);
        Some(self.sim.deliveries().pop()?.body)
    }

    fn redeliver_pushed(&self) -> bool {
        // QQ pushing every event again (a message pushed more than once).
        for delivery in self.sim.deliveries() {
            self.sim.replay(delivery.id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Callbacks come over HTTP: the analogue is an answer never read, which QQ retries.
        self.sim.cut_next_delivery();
        true
    }
}
