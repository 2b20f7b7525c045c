//! A WhatsApp channel built by its factory against a fresh simulator, and the simulator's side
//! of what the tests need (people, faults, what landed).
//!
//! Status webhooks settle sends whose answer was lost, so the channel's webhook source must be
//! listening whenever a send happens, not only while a case runs its own source. The peer runs
//! the real [`WebhookSource`] for its whole life, and hands the cases a source that attaches
//! the case's event sink to it; while no case listens, message deliveries are answered 503 and
//! the simulator delivers them again, as Meta does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_whatsapp::WhatsAppFactory;
use clawgate_channel_whatsapp::simulator::{
    Fault, FaultKind, GraphFault, SimulatorConfig, WhatsAppSimulator,
};
use serde_json::{Value, json};

/// The automated number the channel's settings list in `bot_senders`.
pub(crate) const BOT: &str = "4917000000001";
pub(crate) const VERIFY_TOKEN: &str = "meatyhamhock";

pub(crate) struct Peer {
    pub(crate) sim: WhatsAppSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) webhook_url: String,
    relay: Arc<Relay>,
    listener: tokio::task::JoinHandle<()>,
    _state: tempfile::TempDir,
}

/// Quick redeliveries, so a delivery nobody took is tried again at once.
pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        answer_deadline: Duration::from_secs(5),
        retry_delays: vec![Duration::from_millis(50)],
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

/// A person's number for a conversation name: digits only.
pub(crate) fn number_for(name: &str) -> String {
    let mut hash: u64 = 1469598103934665603;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(1099511628211);
    }
    format!("49151{:08}", hash % 100_000_000)
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quick(), json!({})).await
    }

    /// A channel with `settings` merged over the defaults, on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = WhatsAppSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let webhook_url = format!("http://127.0.0.1:{port}/whatsapp/webhook");
        let mut merged = json!({
            "token_env": "UNUSED_IN_TESTS",
            "app_secret_env": "UNUSED_IN_TESTS",
            "verify_token_env": "UNUSED_IN_TESTS",
            "phone_number_id": sim.phone_number_id(),
            "webhook_listen": format!("127.0.0.1:{port}"),
            "api_base": sim.api_url(),
            "bot_senders": [BOT],
            "request_timeout_ms": 3000,
        });
        for (key, value) in settings.as_object().unwrap() {
            merged[key] = value.clone();
        }
        let setup =
            clawgate_conformance::channel_setup(0, "whatsapp", "default", merged, state.path());
        let plugin = WhatsAppFactory
            .build_with_secrets(
                &setup,
                Secret::new(sim.token()),
                Secret::new(sim.app_secret()),
                Secret::new(VERIFY_TOKEN),
            )
            .await
            .unwrap();
        let relay = Arc::new(Relay::default());
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("the WhatsApp source is pushed");
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
            _state: state,
        };
        peer.listening().await;
        peer.sim
            .subscribe(&peer.webhook_url, VERIFY_TOKEN)
            .await
            .unwrap();
        peer
    }

    /// The channel's state directory.
    pub(crate) fn state_dir(&self) -> &std::path::Path {
        self._state.path()
    }

    /// The channel built again on the same store for `account`, as another gateway (or a
    /// restart) builds it, with `legacy` files to import; its webhook listener is not run.
    pub(crate) async fn build_again(&self, account: &str, legacy: LegacyFiles) -> ChannelPlugin {
        let settings = json!({
            "token_env": "UNUSED_IN_TESTS",
            "app_secret_env": "UNUSED_IN_TESTS",
            "verify_token_env": "UNUSED_IN_TESTS",
            "phone_number_id": self.sim.phone_number_id(),
            "webhook_listen": "127.0.0.1:0",
            "api_base": self.sim.api_url(),
            "bot_senders": [BOT],
            "request_timeout_ms": 3000,
        });
        let setup =
            clawgate_conformance::channel_setup(0, "whatsapp", account, settings, self.state_dir())
                .with_legacy_files(legacy);
        WhatsAppFactory
            .build_with_secrets(
                &setup,
                Secret::new(self.sim.token()),
                Secret::new(self.sim.app_secret()),
                Secret::new(VERIFY_TOKEN),
            )
            .await
            .unwrap()
    }

    /// The status book of the channel's account, on its store.
    pub(crate) async fn status_book(&self) -> clawgate_channel_whatsapp::StatusBook {
        let state = clawgate_conformance::channel_state(self.state_dir(), "whatsapp", "default");
        clawgate_channel_whatsapp::StatusBook::open(&state)
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

    /// The texts (and captions) the business sent to `wa_id`, oldest first.
    pub(crate) fn texts(&self, wa_id: &str) -> Vec<String> {
        self.sim
            .sent(wa_id)
            .into_iter()
            .filter_map(|m| m.text)
            .collect()
    }

    /// A person whose window is open, for conversation `name`.
    pub(crate) fn person(&self, name: &str) -> MessageTarget {
        let number = number_for(name);
        self.sim.open_window(&number);
        MessageTarget::direct(number)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The Cloud API error a refusal of `kind` is.
fn refusal(kind: DeliveryFailureKind) -> Option<GraphFault> {
    Some(GraphFault::code(match kind {
        DeliveryFailureKind::Transient => 131_000,
        DeliveryFailureKind::RateLimit => 130_429,
        DeliveryFailureKind::Auth => 190,
        DeliveryFailureKind::Permission => 131_047,
        DeliveryFailureKind::NotFound => 131_026,
        DeliveryFailureKind::InvalidPayload => 100,
        // The messages endpoint answers no conflict.
        _ => return None,
    }))
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
        let Some(fault) = refusal(kind) else {
            return false;
        };
        self.sim.inject(
            Fault::new(FaultKind::Refuse(fault))
                .after(after)
                .times(count),
        );
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        // What landed, once its status webhooks reached the channel (they settle sends).
        assert!(self.sim.statuses_settled(Duration::from_secs(20)).await);
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let from = if bot { BOT } else { target.id.as_str() };
        self.sim.person_writes(from, "Ada", text);
        Some(self.sim.deliveries().pop()?.body)
    }

    fn attachment_url(&self) -> String {
        "https://example.org/conformance.png".into()
    }

    fn redeliver_pushed(&self) -> bool {
        // Meta delivering every notification again (retries that raced their answer, and the
        // copies sent to every app subscribed to the business account).
        for delivery in self.sim.deliveries() {
            self.sim.replay(delivery.id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Webhooks come over HTTP: the analogue is an answer never read, which Meta retries.
        self.sim.cut_next_delivery();
        true
    }
}
