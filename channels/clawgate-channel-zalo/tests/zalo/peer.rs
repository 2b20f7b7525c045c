//! A Zalo OA channel built by its factory against a fresh simulator, and the simulator's side
//! of what the tests need (people, faults, what landed).
//!
//! Echo webhooks settle sends whose answer was lost, so the channel's webhook source must be
//! listening whenever a send happens, not only while a case runs its own source. The peer runs
//! the real [`WebhookSource`] for its whole life, and hands the cases a source that attaches
//! the case's event sink to it; while no case listens, people's messages are answered 500 and
//! the simulator posts them again, as Zalo does.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo::simulator::{Fault, FaultKind, SimulatorConfig, ZaloSimulator};
use clawgate_channel_zalo::{TOKENS_VALUE, ZaloFactory};
use serde_json::{Value, json};

/// The automated account the channel's settings list in `bot_senders`.
pub(crate) const BOT: &str = "8000000000000000001";

pub(crate) struct Peer {
    pub(crate) sim: ZaloSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) webhook_url: String,
    relay: Arc<Relay>,
    listener: tokio::task::JoinHandle<()>,
    refresh: String,
    state: tempfile::TempDir,
}

/// Quick redeliveries (Zalo's 30 s … 1 h schedule, compressed), so a delivery nobody took is
/// tried again at once.
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

/// A person's OA-scoped user id for a conversation name: digits only.
pub(crate) fn user_for(name: &str) -> String {
    let mut hash: u64 = 1469598103934665603;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(1099511628211);
    }
    format!("8{:018}", hash % 1_000_000_000_000_000_000)
}

/// The settings of a channel on `sim` listening on `port`, `overrides` merged over them.
pub(crate) fn settings(sim: &ZaloSimulator, port: u16, overrides: &Value) -> Value {
    let mut merged = json!({
        "app_id": sim.app_id(),
        "app_secret_env": "UNUSED_IN_TESTS",
        "oa_secret_key_env": "UNUSED_IN_TESTS",
        "refresh_token_env": "ZALO_REFRESH_TOKEN",
        "webhook_listen": format!("127.0.0.1:{port}"),
        "api_base": sim.api_url(),
        "oauth_base": sim.api_url(),
        "request_timeout_ms": 3000,
        "bot_senders": [BOT],
    });
    for (key, value) in overrides.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

/// Builds a channel on `sim` with its state in the store in `state` and the configured refresh
/// token `refresh`.
pub(crate) async fn build(
    sim: &ZaloSimulator,
    state: &Path,
    settings: Value,
    refresh: &str,
) -> Result<ChannelPlugin, SetupError> {
    build_account(sim, state, "default", settings, refresh, None).await
}

/// [`build`] for `account`, importing the files of an earlier release in `legacy`.
pub(crate) async fn build_account(
    sim: &ZaloSimulator,
    state: &Path,
    account: &str,
    settings: Value,
    refresh: &str,
    legacy: Option<&Path>,
) -> Result<ChannelPlugin, SetupError> {
    let mut setup = clawgate_conformance::channel_setup(0, "zalo", account, settings, state);
    if let Some(dir) = legacy {
        setup = setup.with_legacy_files(LegacyFiles::in_dir(dir));
    }
    ZaloFactory
        .build_with_secrets(
            &setup,
            Secret::new(sim.app_secret()),
            Secret::new(sim.oa_secret_key()),
            Secret::new(refresh),
        )
        .await
}

/// The tokens `account` keeps in the store in `state`, as stored.
pub(crate) async fn stored_tokens(state: &Path, account: &str) -> Value {
    clawgate_conformance::channel_state(state, "zalo", account)
        .value::<Value>(TOKENS_VALUE)
        .await
        .unwrap()
        .expect("the account keeps its tokens")
        .value
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quick(), json!({})).await
    }

    /// A channel with `overrides` merged over the default settings, on a simulator set up
    /// by `config`.
    pub(crate) async fn with(config: SimulatorConfig, overrides: Value) -> Peer {
        let sim = ZaloSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let webhook_url = format!("http://127.0.0.1:{port}/zalo/webhook");
        let refresh = sim.authorize();
        let plugin = build(
            &sim,
            state.path(),
            settings(&sim, port, &overrides),
            &refresh,
        )
        .await
        .unwrap();
        let relay = Arc::new(Relay::default());
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("the Zalo source is pushed");
        };
        let sink: Arc<dyn EventSink> = relay.clone();
        let listener = tokio::spawn(async move {
            let _ = feed.run(sink).await;
        });
        let peer = Peer {
            sim,
            plugin,
            webhook_url,
            relay,
            listener,
            refresh,
            state,
        };
        peer.listening().await;
        peer.sim.set_webhook_url(Some(&peer.webhook_url));
        peer
    }

    /// The same account built by another gateway sharing this one's store (its webhook
    /// listener not running: the echoes reach this one's).
    pub(crate) async fn second_gateway(&self) -> ChannelPlugin {
        let port = clawgate_conformance::ports::reserve_loopback_port();
        build(
            &self.sim,
            self.state.path(),
            settings(&self.sim, port, &json!({})),
            &self.refresh,
        )
        .await
        .unwrap()
    }

    /// The plugin with the case-attaching source.
    pub(crate) fn attached_plugin(&self) -> ChannelPlugin {
        let mut plugin = self.plugin.clone();
        plugin.source = InboundSource::Pushed(Arc::new(Attach(self.relay.clone())));
        plugin
    }

    /// Waits until the webhook listener accepts connections.
    async fn listening(&self) {
        let addr = self
            .webhook_url
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

    /// The texts the OA sent to `user_id`, oldest first.
    pub(crate) fn texts(&self, user_id: &str) -> Vec<String> {
        self.sim.sent(user_id).into_iter().map(|m| m.text).collect()
    }

    /// A person who interacted with the OA recently, for conversation `name`.
    pub(crate) fn person(&self, name: &str) -> MessageTarget {
        let user = user_for(name);
        self.sim.open_window(&user);
        MessageTarget::direct(user)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.listener.abort();
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
        let (fault, calls_per_send) = match kind {
            DeliveryFailureKind::Transient => (FaultKind::Unavailable, 1),
            DeliveryFailureKind::RateLimit => (FaultKind::code(-32), 1),
            // A refused access token is refreshed and the send tried once more: both refused.
            DeliveryFailureKind::Auth => (FaultKind::code(-216), 2),
            DeliveryFailureKind::Permission => (FaultKind::code(-230), 1),
            DeliveryFailureKind::InvalidPayload => (FaultKind::code(-201), 1),
            // Zalo answers an unknown recipient with -201 (invalid parameters), and has no
            // conflict.
            _ => return false,
        };
        self.sim
            .inject(Fault::new(fault).after(after).times(count * calls_per_send));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        // What landed, once its echoes reached the channel (they settle sends).
        assert!(self.sim.echoes_settled(Duration::from_secs(20)).await);
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let from = if bot { BOT } else { target.id.as_str() };
        self.sim.person_writes(from, text);
        Some(self.sim.deliveries().pop()?.body)
    }

    fn redeliver_pushed(&self) -> bool {
        // Zalo posting every event again (retries that raced their answer).
        for delivery in self.sim.deliveries() {
            self.sim.replay(delivery.id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Webhooks come over HTTP: the analogue is an answer never read, which Zalo retries.
        self.sim.cut_next_delivery();
        true
    }
}
