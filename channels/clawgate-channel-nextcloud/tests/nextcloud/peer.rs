//! A Talk channel built by its factory against a fresh simulator, in either mode, and the
//! simulator's side of what the tests need (conversations, people, faults, what landed).
//!
//! The bot peer runs the real [`WebhookSource`](clawgate_channel_nextcloud::WebhookSource) for
//! its whole life and hands the cases a source that attaches the case's event sink to it; while
//! no case listens, events wait (bounded) and are then answered 503 (and, Talk never retrying,
//! dropped).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_nextcloud::simulator::{
    Fault, FaultKind, NextcloudSimulator, Op, RoomType, SimulatorConfig,
};
use clawgate_channel_nextcloud::{NextcloudFactory, NextcloudSecret};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

/// The event sink of whichever case is listening now.
#[derive(Default)]
pub(crate) struct Relay {
    current: Mutex<Option<Arc<dyn EventSink>>>,
}

#[async_trait]
impl EventSink for Relay {
    async fn deliver(&self, event: PushedEvent) {
        // Talk does not deliver an event twice: a case still attaching its sink is waited for
        // (bounded, under Talk's 5 s) instead of losing the event.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        loop {
            let sink = self.current.lock().unwrap().clone();
            match sink {
                Some(sink) => return sink.deliver(event).await,
                None if std::time::Instant::now() >= deadline => {
                    return event.ack.nack("no case is listening");
                }
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            }
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

/// Sets `settings` over `base`.
fn merge(mut base: Value, settings: &Value) -> Value {
    for (key, value) in settings.as_object().unwrap() {
        base[key] = value.clone();
    }
    base
}

/// A Talk bot on a fresh simulator.
pub(crate) struct BotPeer {
    pub(crate) sim: NextcloudSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) webhook_url: String,
    relay: Arc<Relay>,
    listener: tokio::task::JoinHandle<()>,
    _state: tempfile::TempDir,
}

impl BotPeer {
    pub(crate) async fn start() -> BotPeer {
        BotPeer::with(SimulatorConfig::default(), json!({})).await
    }

    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> BotPeer {
        let sim = NextcloudSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let webhook_url = format!("http://127.0.0.1:{port}/nextcloud/webhook");
        sim.set_bot_url(Some(&webhook_url));
        let merged = merge(
            json!({
                "base_url": sim.base_url(),
                "mode": "bot",
                "bot_secret_env": "UNUSED_IN_TESTS",
                "webhook_listen": format!("127.0.0.1:{port}"),
                "request_timeout_ms": 3000,
            }),
            &settings,
        );
        let setup =
            clawgate_conformance::channel_setup(0, "nextcloud", "default", merged, state.path());
        let plugin = NextcloudFactory
            .build_with_secret(
                &setup,
                NextcloudSecret::BotSecret(Secret::new(sim.config().bot_secret.clone())),
            )
            .await
            .unwrap();
        let relay = Arc::new(Relay::default());
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("the Talk bot's source is pushed");
        };
        let sink: Arc<dyn EventSink> = relay.clone();
        let listener = tokio::spawn(async move {
            let _ = feed.run(sink).await;
        });
        let peer = BotPeer {
            sim,
            plugin,
            webhook_url,
            relay,
            listener,
            _state: state,
        };
        listening(&peer.webhook_url).await;
        peer
    }

    /// The plugin with the case-attaching source.
    pub(crate) fn attached_plugin(&self) -> ChannelPlugin {
        let mut plugin = self.plugin.clone();
        plugin.source = InboundSource::Pushed(Arc::new(Attach(self.relay.clone())));
        plugin
    }

    /// A fresh conversation with the bot enabled.
    pub(crate) fn conversation(&self, name: &str) -> MessageTarget {
        let room = self.sim.add_conversation(name, RoomType::Group);
        self.sim.enable_bot(&room.token);
        MessageTarget::group(room.token)
    }
}

/// Waits until the webhook listener at `url` accepts connections.
pub(crate) async fn listening(url: &str) {
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the webhook listener never came up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Drop for BotPeer {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The refusal a failure of `kind` is on the bot API (platform-apis-wave2 §6.2: 400, 401, 404,
/// 413, 429 from the brute-force throttle; 503 is the server's maintenance mode).
fn bot_refusal(kind: DeliveryFailureKind) -> Option<u16> {
    Some(match kind {
        DeliveryFailureKind::Transient => 503,
        DeliveryFailureKind::RateLimit => 429,
        DeliveryFailureKind::Auth => 401,
        DeliveryFailureKind::NotFound => 404,
        DeliveryFailureKind::InvalidPayload => 400,
        // The bot API has no 403; a conflict has no status either.
        _ => return None,
    })
}

/// The refusal a failure of `kind` is on the chat API (§6.3: 403 read-only, 404, 412 lobby,
/// 413).
fn chat_refusal(kind: DeliveryFailureKind) -> Option<u16> {
    Some(match kind {
        DeliveryFailureKind::Transient => 503,
        DeliveryFailureKind::RateLimit => 429,
        DeliveryFailureKind::Auth => 401,
        DeliveryFailureKind::Permission => 412,
        DeliveryFailureKind::NotFound => 404,
        DeliveryFailureKind::InvalidPayload => 413,
        _ => return None,
    })
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for BotPeer {
    fn plugin(&self) -> ChannelPlugin {
        self.attached_plugin()
    }

    fn target(&self, case: &str) -> MessageTarget {
        self.conversation(case)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(status) = bot_refusal(kind) else {
            return false;
        };
        self.sim.inject(
            Fault::new(Some(Op::BotSend), FaultKind::Refuse(status))
                .after(after)
                .times(count),
        );
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::new(Some(Op::BotSend), FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.sim.bot_texts(&target.id)
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        self.sim
            .messages(&target.id)
            .iter()
            .filter(|m| m.actor_type == "bots")
            .map(|m| m.to_json())
            .collect()
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        if bot {
            // Talk wakes no bot for a bot's message ("no bots for bots"), so no webhook
            // carries one; the event a bridged or application actor would make is built by
            // hand, on a real message id.
            let id = self.sim.other_bot_writes(&target.id, "helper", text);
            return Some(json!({ "via": "webhook", "event": {
                "type": "Create",
                "actor": { "type": "Application", "id": "bots/helper", "name": "helper" },
                "object": { "type": "Note", "id": id, "name": "message",
                    "content": json!({ "message": text, "parameters": [] }).to_string(),
                    "mediaType": "text/markdown" },
                "target": { "type": "Collection", "id": target.id, "name": "conversation" } } }));
        }
        self.sim.person_writes(&target.id, "ada", "Ada", text);
        // The delivery's body is recorded as it starts.
        let delivery = self.sim.deliveries().pop()?;
        Some(
            json!({ "via": "webhook", "event": serde_json::from_str::<Value>(&delivery.body).ok()? }),
        )
    }

    fn redeliver_pushed(&self) -> bool {
        // Talk never retries; a copy (a proxy's retry) must still be dropped.
        for delivery in self.sim.deliveries() {
            self.sim.replay(delivery.id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Webhooks come over HTTP: the analogue is an answer never read.
        self.sim.cut_next_delivery();
        true
    }
}

/// A Talk user on a fresh simulator.
pub(crate) struct UserPeer {
    pub(crate) sim: NextcloudSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) state: tempfile::TempDir,
}

impl UserPeer {
    pub(crate) async fn start() -> UserPeer {
        UserPeer::with(SimulatorConfig::default(), json!({})).await
    }

    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> UserPeer {
        let sim = NextcloudSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let plugin = UserPeer::build(&sim, state.path(), &settings)
            .await
            .unwrap();
        UserPeer { sim, plugin, state }
    }

    /// The user channel on `sim` with its state in `dir`.
    pub(crate) async fn build(
        sim: &NextcloudSimulator,
        dir: &std::path::Path,
        settings: &Value,
    ) -> Result<ChannelPlugin, SetupError> {
        let merged = merge(
            json!({
                "base_url": sim.base_url(),
                "mode": "user",
                "user": sim.config().user,
                "app_password_env": "UNUSED_IN_TESTS",
                "poll_timeout_s": 2,
                "request_timeout_ms": 3000,
            }),
            settings,
        );
        let setup = clawgate_conformance::channel_setup(0, "nextcloud", "default", merged, dir);
        NextcloudFactory
            .build_with_secret(
                &setup,
                NextcloudSecret::AppPassword(Secret::new(sim.config().app_password.clone())),
            )
            .await
    }

    /// A fresh conversation the user is in.
    pub(crate) fn conversation(&self, name: &str) -> MessageTarget {
        MessageTarget::group(self.sim.add_conversation(name, RoomType::Group).token)
    }
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for UserPeer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, case: &str) -> MessageTarget {
        self.conversation(case)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(status) = chat_refusal(kind) else {
            return false;
        };
        self.sim.inject(
            Fault::new(Some(Op::ChatSend), FaultKind::Refuse(status))
                .after(after)
                .times(count),
        );
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::new(Some(Op::ChatSend), FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.sim.user_texts(&target.id)
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        let user = self.sim.config().user.clone();
        self.sim
            .messages(&target.id)
            .iter()
            .filter(|m| m.actor_id == user && m.system_message.is_empty())
            .map(|m| m.to_json())
            .collect()
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let id = if bot {
            self.sim.other_bot_writes(&target.id, "helper", text)
        } else {
            self.sim.person_writes(&target.id, "ada", "Ada", text)
        };
        let message = self
            .sim
            .messages(&target.id)
            .into_iter()
            .find(|m| m.id == id)?;
        Some(json!({ "via": "chat", "message": message.to_json() }))
    }
}
