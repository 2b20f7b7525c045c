//! A Google Chat channel built by its factory against a fresh simulator, and the simulator's
//! side of what the tests need (spaces, faults, what is visible).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_googlechat::simulator::{
    Fault, FaultKind, GoogleChatSimulator, Op, SimUser, SimulatorConfig, SpaceKind,
};
use clawgate_channel_googlechat::{GoogleChatCredentials, GoogleChatFactory};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{ChannelSetup, ChannelState};
use clawgate_types::clock::Clock;
use serde_json::{Value, json};

pub(crate) struct Peer {
    pub(crate) sim: GoogleChatSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) events_url: String,
    pub(crate) person: SimUser,
    spaces: Mutex<HashMap<String, String>>,
    _state: tempfile::TempDir,
}

/// The service account of [`Peer::with_service_account`].
pub(crate) const SERVICE_ACCOUNT: &str = "clawgate-app@clawgate-simulator.iam.gserviceaccount.com";
/// The variable its settings name (the key is handed over directly in these tests).
pub(crate) const KEY_ENV: &str = "GOOGLE_CHAT_SERVICE_ACCOUNT_KEY";

/// No write quota (the contract cases send bursts; the quota has tests of its own), quick
/// event retries.
pub(crate) fn quiet() -> SimulatorConfig {
    SimulatorConfig {
        rate_limits: false,
        answer_deadline: Duration::from_secs(5),
        retry_delays: vec![Duration::from_millis(50); 3],
        ..SimulatorConfig::default()
    }
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quiet(), json!({})).await
    }

    /// A channel with `settings` merged over the simulator's, on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = GoogleChatSimulator::start(config).await.unwrap();
        let token = GoogleChatCredentials::AccessToken(Secret::new(sim.access_token()));
        Peer::built(sim, token, settings).await
    }

    /// A channel authenticating as service account [`SERVICE_ACCOUNT`] (its key registered
    /// with the simulator's token endpoint), `settings` merged over the simulator's.
    pub(crate) async fn with_service_account(config: SimulatorConfig, settings: Value) -> Peer {
        Peer::with_service_account_on(config, settings, None).await
    }

    /// [`Peer::with_service_account`] on a gateway whose clock is `clock` (the system's when
    /// `None`).
    pub(crate) async fn with_service_account_on(
        config: SimulatorConfig,
        settings: Value,
        clock: Option<Arc<dyn Clock>>,
    ) -> Peer {
        let sim = GoogleChatSimulator::start(config).await.unwrap();
        let key = sim.add_test_service_account(SERVICE_ACCOUNT);
        let mut settings = settings;
        settings["token_env"] = Value::Null;
        settings["service_account_key_env"] = json!(KEY_ENV);
        Peer::built_on(
            sim,
            GoogleChatCredentials::ServiceAccountKey(Secret::new(key)),
            settings,
            clock,
        )
        .await
    }

    async fn built(
        sim: GoogleChatSimulator,
        credentials: GoogleChatCredentials,
        settings: Value,
    ) -> Peer {
        Peer::built_on(sim, credentials, settings, None).await
    }

    async fn built_on(
        sim: GoogleChatSimulator,
        credentials: GoogleChatCredentials,
        settings: Value,
        clock: Option<Arc<dyn Clock>>,
    ) -> Peer {
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let events_url = format!("http://127.0.0.1:{port}/googlechat/events");
        let mut merged = json!({
            "token_env": "UNUSED_IN_TESTS",
            "api_base": sim.api_url(),
            "certs_url": sim.jwks_url(),
            "audience": sim.audience(),
            "app_user": sim.app().name,
            "events_listen": format!("127.0.0.1:{port}"),
            "request_timeout_ms": 3000,
        });
        for (key, value) in settings.as_object().unwrap() {
            match value {
                Value::Null => merged.as_object_mut().unwrap().remove(key),
                value => merged
                    .as_object_mut()
                    .unwrap()
                    .insert(key.clone(), value.clone()),
            };
        }
        let setup = match clock {
            None => clawgate_conformance::channel_setup(
                0,
                "googlechat",
                "default",
                merged,
                state.path(),
            ),
            Some(clock) => ChannelSetup::new(
                0,
                "googlechat",
                "default",
                merged,
                ChannelState::new(
                    Arc::new(clawgate_store_sqlite::testing::open_store(state.path())),
                    clawgate_store::ChannelScope::new("googlechat", "default"),
                    clock,
                ),
            ),
        };
        let plugin = GoogleChatFactory
            .build_with_secrets(&setup, credentials)
            .await
            .unwrap();
        sim.set_endpoint_url(Some(&events_url));
        let person = sim.person("ada");
        Peer {
            sim,
            plugin,
            events_url,
            person,
            spaces: Mutex::new(HashMap::new()),
            _state: state,
        }
    }

    /// A room the app was added to.
    pub(crate) fn room(&self, name: &str) -> String {
        self.sim
            .create_space(name, SpaceKind::Room, Some(&self.person))
    }

    /// The texts the app shows in `space`, oldest first.
    pub(crate) fn texts(&self, space: &str) -> Vec<String> {
        self.sim
            .messages(space)
            .into_iter()
            .filter(|m| m.from_app)
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
}

/// The Google refusal a failure of `kind` is.
fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    Some(match kind {
        DeliveryFailureKind::Transient => FaultKind::ServerError(503),
        DeliveryFailureKind::RateLimit => FaultKind::RateLimited,
        DeliveryFailureKind::Auth => FaultKind::error(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials.",
        ),
        DeliveryFailureKind::Permission => FaultKind::error(
            403,
            "PERMISSION_DENIED",
            "The caller does not have permission",
        ),
        DeliveryFailureKind::NotFound => {
            FaultKind::error(404, "NOT_FOUND", "Requested entity was not found.")
        }
        DeliveryFailureKind::InvalidPayload => FaultKind::error(
            400,
            "INVALID_ARGUMENT",
            "Invalid JSON payload received. Unknown name \"x\" at 'message': Cannot find field.",
        ),
        // A create's only conflict is ALREADY_EXISTS of our own id, which the adapter settles
        // by reading the message (a test of its own).
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
            .spaces
            .lock()
            .unwrap()
            .entry(case.to_owned())
            .or_insert_with(|| self.room(case))
            .clone();
        MessageTarget::group(id)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(fault) = refusal(kind) else {
            return false;
        };
        self.sim
            .inject(Fault::on(Op::Create, fault).after(after).times(count));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::on(Op::Create, FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let message = if bot {
            let other = self.sim.other_bot("helper");
            self.sim.bot_writes(&target.id, &other, text, None)?
        } else {
            self.sim
                .person_writes(&target.id, &self.person, text, None)?
        };
        self.sim.event(&message.name)
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        self.sim
            .messages(&target.id)
            .iter()
            .map(|m| self.sim.resource(m))
            .collect()
    }

    fn redeliver_pushed(&self) -> bool {
        for id in self.sim.event_ids() {
            self.sim.redeliver(&id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Events come over HTTP: the analogue is a delivery whose answer is never read, which
        // the platform sends again.
        self.sim.cut_next_delivery();
        true
    }
}
