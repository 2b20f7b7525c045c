//! A Slack channel built by its factory against a fresh simulator, and the simulator's side of
//! what the tests need (conversations, faults, what is visible).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{ChannelSetup, ChannelState};
use clawgate_channel_slack::SlackFactory;
use clawgate_channel_slack::simulator::{
    ConversationKind, Fault, FaultKind, SimulatorConfig, SlackSimulator,
};
use clawgate_types::clock::Clock;
use serde_json::{Value, json};

pub(crate) struct Peer {
    pub(crate) sim: SlackSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) events_url: String,
    pub(crate) person: String,
    conversations: Mutex<HashMap<String, String>>,
    _state: tempfile::TempDir,
}

/// No posting limit (the contract cases send bursts; the limit has tests of its own), quick
/// event retries.
pub(crate) fn quiet() -> SimulatorConfig {
    SimulatorConfig {
        rate_limits: false,
        ack_deadline: Duration::from_secs(3),
        retry_delays: [Duration::from_millis(50); 3],
        ..SimulatorConfig::default()
    }
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quiet(), json!({})).await
    }

    /// A channel with `settings` merged over the simulator's on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        Peer::with_on(config, settings, None).await
    }

    /// [`Peer::with`] on a gateway whose clock is `clock` (the system's when `None`).
    pub(crate) async fn with_on(
        config: SimulatorConfig,
        settings: Value,
        clock: Option<Arc<dyn Clock>>,
    ) -> Peer {
        let sim = SlackSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let events_url = format!("http://127.0.0.1:{port}/slack/events");
        let mut merged = json!({
            "token_env": "UNUSED_IN_TESTS",
            "signing_secret_env": "UNUSED_IN_TESTS",
            "api_base": sim.api_url(),
            "events_listen": format!("127.0.0.1:{port}"),
            "request_timeout_ms": 3000,
        });
        for (key, value) in settings.as_object().unwrap() {
            merged[key] = value.clone();
        }
        let setup = match clock {
            None => {
                clawgate_conformance::channel_setup(0, "slack", "default", merged, state.path())
            }
            Some(clock) => ChannelSetup::new(
                0,
                "slack",
                "default",
                merged,
                ChannelState::new(
                    Arc::new(clawgate_store_sqlite::testing::open_store(state.path())),
                    clawgate_store::ChannelScope::new("slack", "default"),
                    clock,
                ),
            ),
        };
        let plugin = SlackFactory
            .build_with_secrets(
                &setup,
                Secret::new(sim.token()),
                Secret::new(sim.signing_secret()),
            )
            .await
            .unwrap();
        sim.set_request_url(Some(&events_url));
        let person = sim.person("ada");
        Peer {
            sim,
            plugin,
            events_url,
            person,
            conversations: Mutex::new(HashMap::new()),
            _state: state,
        }
    }

    /// The texts the bot shows in `channel`, oldest first.
    pub(crate) fn texts(&self, channel: &str) -> Vec<String> {
        self.sim
            .messages(channel)
            .into_iter()
            .filter(|m| m.from_self)
            .map(|m| m.text)
            .collect()
    }

    /// Waits until the events listener accepts connections (its source was started).
    pub(crate) async fn listening(&self) {
        let addr = self
            .events_url
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the events listener never came up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The envelope of the newest event.
    pub(crate) fn last_event(&self) -> Value {
        let id = self.sim.event_ids().pop().unwrap();
        self.sim.event(&id).unwrap()
    }
}

/// The Slack error a refusal of `kind` is.
fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    Some(match kind {
        DeliveryFailureKind::Transient => FaultKind::Error("service_unavailable".into()),
        DeliveryFailureKind::RateLimit => FaultKind::RateLimited(3),
        DeliveryFailureKind::Auth => FaultKind::Error("invalid_auth".into()),
        DeliveryFailureKind::Permission => FaultKind::Error("not_in_channel".into()),
        DeliveryFailureKind::NotFound => FaultKind::Error("channel_not_found".into()),
        DeliveryFailureKind::InvalidPayload => FaultKind::Error("invalid_blocks".into()),
        // chat.postMessage answers no conflict.
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
            .conversations
            .lock()
            .unwrap()
            .entry(case.to_owned())
            .or_insert_with(|| {
                self.sim
                    .create_conversation(case, ConversationKind::Public, true)
            })
            .clone();
        MessageTarget::group(id)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(fault) = refusal(kind) else {
            return false;
        };
        self.sim.inject(
            Fault::on("chat.postMessage", fault)
                .after(after)
                .times(count),
        );
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::on("chat.postMessage", FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        if bot {
            let other = self.sim.other_bot("helper");
            self.sim.bot_writes(&target.id, &other, text, None, None);
        } else {
            self.sim.person_writes(&target.id, &self.person, text, None);
        }
        Some(self.last_event())
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        // The messages as the Web API shows them, metadata included.
        self.sim
            .messages(&target.id)
            .into_iter()
            .map(|m| json!({ "ts": m.ts, "text": m.text, "metadata": m.metadata }))
            .collect()
    }

    fn redeliver_pushed(&self) -> bool {
        // Slack retrying deliveries whose answer it never saw, and resending one message under
        // a new event_id.
        let ids = self.sim.event_ids();
        for id in &ids {
            self.sim.redeliver(id);
        }
        if let Some(first) = ids.first() {
            self.sim.resend_event(first);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Events come over HTTP: the analogue is a delivery whose answer is never read, which
        // Slack retries.
        self.sim.cut_next_delivery();
        true
    }
}
