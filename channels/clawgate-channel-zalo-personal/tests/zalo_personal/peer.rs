//! A Zalo Personal channel built by its factory against a fresh simulator, and the
//! simulator's side of what the tests need (people, faults, what landed).
//!
//! Echoes on the listener settle sends whose answer was lost, so the channel's listener must
//! be connected whenever a send happens, not only while a case runs its own source. The peer
//! runs the real [`ZaloListener`](clawgate_channel_zalo_personal::ZaloListener) for its whole
//! life (again after each end, as the engine does), and hands the cases a source that
//! attaches the case's event sink to it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo_personal::simulator::{
    Fault, FaultKind, SimulatorConfig, ZaloWebSimulator,
};
use clawgate_channel_zalo_personal::{Account, ZaloPersonalFactory};
use serde_json::{Value, json};

/// The automated account the channel's settings list in `bot_senders`.
pub(crate) const BOT: &str = "6000000000000000001";
/// The group the channel's settings list in `allowed_groups`.
pub(crate) const GROUP: &str = "5000000000000000001";
/// Whose messages only mark how far the listener read (never handed to a case).
const SYNC: &str = "6999999999999999999";
/// A browser's user agent.
pub(crate) const UA: &str =
    "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";

pub(crate) struct Peer {
    pub(crate) sim: ZaloWebSimulator,
    pub(crate) plugin: ChannelPlugin,
    relay: Arc<Relay>,
    listener: tokio::task::JoinHandle<()>,
    _state: tempfile::TempDir,
}

/// The event sink of whichever case is listening now.
#[derive(Default)]
pub(crate) struct Relay {
    current: Mutex<Option<Arc<dyn EventSink>>>,
    /// Events that came while no case listened (a case's engine attaches a moment after it
    /// starts); handed over when one attaches, as the engine's own sink would have taken them.
    pending: Mutex<Vec<PushedEvent>>,
    /// `msgId`s the listener handed over.
    pub(crate) seen: Mutex<HashSet<String>>,
}

#[async_trait]
impl EventSink for Relay {
    async fn deliver(&self, event: PushedEvent) {
        let msg = &event.raw["message"];
        if let Some(id) = msg["msgId"].as_str() {
            self.seen.lock().unwrap().insert(id.to_owned());
        }
        if msg["uidFrom"] == SYNC {
            event.ack.ack();
            return;
        }
        // The pending list's lock orders this against a case attaching.
        let sink = {
            let mut pending = self.pending.lock().unwrap();
            let sink = self.current.lock().unwrap().clone();
            if sink.is_none() {
                pending.push(event);
                return;
            }
            sink
        };
        if let Some(sink) = sink {
            sink.deliver(event).await;
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
        let waiting: Vec<PushedEvent> = {
            let mut pending = self.0.pending.lock().unwrap();
            *self.0.current.lock().unwrap() = Some(sink.clone());
            std::mem::take(&mut *pending)
        };
        for event in waiting {
            sink.deliver(event).await;
        }
        sink.stopped().await;
        *self.0.current.lock().unwrap() = None;
        Ok(())
    }
}

/// A person's Zalo user id for a conversation name: digits only.
pub(crate) fn user_for(name: &str) -> String {
    let mut hash: u64 = 1469598103934665603;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(1099511628211);
    }
    format!("1{:018}", hash % 1_000_000_000_000_000_000)
}

/// The settings of a channel on `sim`, `overrides` merged over them.
pub(crate) fn settings(sim: &ZaloWebSimulator, overrides: &Value) -> Value {
    let mut merged = json!({
        "cookie_env": "UNUSED_IN_TESTS",
        "imei_env": "UNUSED_IN_TESTS",
        "user_agent": UA,
        "login_base": sim.url(),
        "request_timeout_ms": 3000,
        "bot_senders": [BOT],
        "allowed_groups": [GROUP],
    });
    for (key, value) in overrides.as_object().unwrap() {
        merged[key] = value.clone();
    }
    merged
}

/// Builds a channel on `sim` in `state` with the account's cookie and IMEI.
pub(crate) async fn build(
    sim: &ZaloWebSimulator,
    state: &std::path::Path,
    settings: Value,
) -> Result<ChannelPlugin, SetupError> {
    let setup = clawgate_conformance::channel_setup(0, "zalo-personal", "default", settings, state);
    ZaloPersonalFactory
        .build_with_secrets(&setup, Secret::new(sim.cookie()), Secret::new(sim.imei()))
        .await
}

/// Runs `plugin`'s feed into `sink` as the engine does: again after each end, with a pause.
pub(crate) fn run_feed(
    plugin: &ChannelPlugin,
    sink: Arc<dyn EventSink>,
) -> tokio::task::JoinHandle<()> {
    let InboundSource::Pushed(feed) = plugin.source.clone() else {
        panic!("the Zalo Personal source is pushed");
    };
    tokio::spawn(async move {
        loop {
            let _ = feed.run(sink.clone()).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

/// The account of a plugin (its extension).
pub(crate) fn account(plugin: &ChannelPlugin) -> Account {
    plugin
        .extension::<Account>()
        .map(|a| (*a).clone())
        .expect("the plugin's extension is its Account")
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(SimulatorConfig::default(), json!({})).await
    }

    /// A channel with `overrides` merged over the default settings, on a simulator set up
    /// by `config`.
    pub(crate) async fn with(config: SimulatorConfig, overrides: Value) -> Peer {
        let sim = ZaloWebSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let plugin = build(&sim, state.path(), settings(&sim, &overrides))
            .await
            .unwrap();
        let relay = Arc::new(Relay::default());
        let listener = run_feed(&plugin, relay.clone());
        assert!(
            sim.listening(Duration::from_secs(20)).await,
            "the channel's listener never connected"
        );
        Peer {
            sim,
            plugin,
            relay,
            listener,
            _state: state,
        }
    }

    /// The plugin with the case-attaching source.
    pub(crate) fn attached_plugin(&self) -> ChannelPlugin {
        let mut plugin = self.plugin.clone();
        plugin.source = InboundSource::Pushed(Arc::new(Attach(self.relay.clone())));
        plugin
    }

    /// Waits until the listener has read every frame pushed so far (a marker message went
    /// through after them): the echoes before it are in the send book.
    pub(crate) async fn read_up(&self) {
        assert!(self.sim.listening(Duration::from_secs(20)).await);
        let marker = self.sim.person_writes(SYNC, "sync");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !self.relay.seen.lock().unwrap().contains(&marker) {
            assert!(
                std::time::Instant::now() < deadline,
                "the listener never read up to its marker"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The texts the account sent into `thread`, oldest first.
    pub(crate) fn texts(&self, thread: &str) -> Vec<String> {
        self.sim
            .landed_in(thread)
            .into_iter()
            .map(|m| m.text)
            .collect()
    }

    /// Whether the listener handed over message `msg_id`.
    pub(crate) fn seen(&self, msg_id: &str) -> bool {
        self.relay.seen.lock().unwrap().contains(msg_id)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.listener.abort();
        self.sim.stop();
    }
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.attached_plugin()
    }

    fn target(&self, case: &str) -> MessageTarget {
        MessageTarget::direct(user_for(case))
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let fault = match kind {
            DeliveryFailureKind::Transient => FaultKind::ServerError(502),
            // A non-zero error_code: Zalo Web's codes are undocumented, so every refusal is
            // final for its message.
            DeliveryFailureKind::InvalidPayload => {
                FaultKind::Refuse(-1400, "invalid params".into())
            }
            // Zalo Web gives no rate-limit signal, and its refusals carry no class.
            _ => return false,
        };
        self.sim.inject(Fault::new(fault).after(after).times(count));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        // What landed, once its echoes reached the channel (they settle sends).
        self.read_up().await;
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        // Zalo has no catch-up: people write while the listener is connected.
        assert!(self.sim.listening(Duration::from_secs(20)).await);
        let from = if bot { BOT } else { target.id.as_str() };
        let msg_id = self.sim.person_writes(from, text);
        self.sim.raw_event(&msg_id)
    }

    fn redeliver_pushed(&self) -> bool {
        // Zalo pushing every message again on the open listener.
        self.sim.redeliver() > 0
    }

    fn drop_connection(&self) -> bool {
        // A network fault: the socket is gone without a close frame; the listener connects
        // again.
        self.sim.drop_sockets() > 0
    }
}
