//! An iMessage channel built by its factory against a fresh BlueBubbles simulator, and the
//! simulator's side of what the tests need (people, chats, faults, what landed).
//!
//! The peer runs the real [`WebhookSource`](clawgate_channel_imessage::WebhookSource) for its
//! whole life and hands the cases a source that attaches the case's event sink to it; while no
//! case listens, events are answered 500 (and, BlueBubbles not retrying, lost).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_imessage::ImessageFactory;
use clawgate_channel_imessage::simulator::{
    BlueBubblesSimulator, Fault, FaultKind, SimulatorConfig,
};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

/// A handle the operator lists in `bot_senders`.
pub(crate) const OTHER_BOT: &str = "+15550009999";
/// The webhook URL's token.
pub(crate) const TOKEN: &str = "webhook-token-0123456789abcdef";

pub(crate) struct Peer {
    pub(crate) sim: BlueBubblesSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) settings: Value,
    relay: Arc<Relay>,
    listener: tokio::task::JoinHandle<()>,
    pub(crate) state: tempfile::TempDir,
}

/// A quick server: echoes 50 ms after the row.
pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        echo_delay: Duration::from_millis(50),
        webhook_timeout: Duration::from_secs(5),
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
        // BlueBubbles does not deliver an event twice: a case still attaching its sink is
        // waited for (bounded) instead of losing the event.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
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

/// A phone number for a conversation name.
pub(crate) fn address_for(name: &str) -> String {
    let n: u64 = name
        .bytes()
        .fold(17, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    format!("+1555{:07}", n % 10_000_000)
}

/// Builds the channel of `settings` in `state` with the simulator's password.
pub(crate) async fn build(
    sim: &BlueBubblesSimulator,
    state: &std::path::Path,
    settings: Value,
) -> Result<ChannelPlugin, SetupError> {
    let setup = clawgate_conformance::channel_setup(0, "imessage", "default", settings, state);
    ImessageFactory
        .build_with_secrets(&setup, Secret::new(sim.password()), Secret::new(TOKEN))
        .await
}

/// The settings of a channel on `sim` listening on `port`, `extra` merged over them.
pub(crate) fn settings(sim: &BlueBubblesSimulator, port: u16, extra: &Value) -> Value {
    let mut merged = json!({
        "server_url": sim.base_url(),
        "password_env": "UNUSED_IN_TESTS",
        "webhook_listen": format!("127.0.0.1:{port}"),
        "webhook_token_env": "UNUSED_IN_TESTS",
        "private_api": true,
        "bot_senders": [OTHER_BOT],
        "request_timeout_ms": 5000,
    });
    for (key, value) in extra.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

/// Waits until something accepts connections on `port`.
pub(crate) async fn listening(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the webhook listener never came up"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quick(), json!({})).await
    }

    /// A channel with `extra` settings, on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, extra: Value) -> Peer {
        let sim = BlueBubblesSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let webhook_url = format!("http://127.0.0.1:{port}/bluebubbles/webhook?token={TOKEN}");
        sim.set_webhook(Some(&webhook_url));
        let settings = settings(&sim, port, &extra);
        let plugin = build(&sim, state.path(), settings.clone()).await.unwrap();
        let relay = Arc::new(Relay::default());
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("the iMessage source is pushed");
        };
        let sink: Arc<dyn EventSink> = relay.clone();
        let listener = tokio::spawn(async move {
            let _ = feed.run(sink).await;
        });
        listening(port).await;
        Peer {
            sim,
            plugin,
            settings,
            relay,
            listener,
            state,
        }
    }

    /// The plugin with the case-attaching source.
    pub(crate) fn attached_plugin(&self) -> ChannelPlugin {
        let mut plugin = self.plugin.clone();
        plugin.source = InboundSource::Pushed(Arc::new(Attach(self.relay.clone())));
        plugin
    }

    /// The DM with the person of conversation `name`, as a target.
    pub(crate) fn person(&self, name: &str) -> MessageTarget {
        MessageTarget::direct(self.sim.dm(&address_for(name)))
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
        // iMessage failing a send is the one definite refusal a healthy server gives; the
        // others (a bad password, an unknown chat) are not faults of one call.
        if kind != DeliveryFailureKind::Transient {
            return false;
        }
        self.sim
            .inject(Fault::new(FaultKind::SendError).after(after).times(count));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.sim.our_texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let from = if bot {
            OTHER_BOT.to_owned()
        } else {
            target.id.rsplit(';').next()?.to_owned()
        };
        let guid = self.sim.person_writes(&target.id, &from, text);
        Some(json!({ "type": "new-message", "data": self.sim.serialized(&guid)? }))
    }

    fn redeliver_pushed(&self) -> bool {
        // BlueBubbles does not retry; a copy (a second registered URL, a replay) must still
        // be dropped.
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
