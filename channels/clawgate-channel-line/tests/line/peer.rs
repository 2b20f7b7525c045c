//! A LINE channel built by its factory against a fresh simulator, and the simulator's side of
//! what the tests need (people, faults, what is visible).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use clawgate_channel_line::LineFactory;
use clawgate_channel_line::simulator::{
    Fault, FaultKind, LineSimulator, PUSH_PATH, SimulatorConfig, Written,
};
use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

pub(crate) struct Peer {
    pub(crate) sim: LineSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) webhook_url: String,
    users: Mutex<HashMap<String, String>>,
    _state: tempfile::TempDir,
}

/// Quick redeliveries.
pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        redelivery_delays: vec![Duration::from_millis(50); 3],
        ..SimulatorConfig::default()
    }
}

/// The envelope the channel's source hands the engine for one webhook event.
pub(crate) fn envelope(sim: &LineSimulator, event: Value) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    json!({ "destination": sim.bot_user_id(), "event": event, "receivedAtMs": now })
}

/// The channel the factory builds for `sim` with `settings` over the defaults, its webhook on
/// `port`, with the access token `token`.
pub(crate) async fn build(
    sim: &LineSimulator,
    state: &std::path::Path,
    port: u16,
    settings: &Value,
    token: &str,
) -> Result<ChannelPlugin, SetupError> {
    build_with(
        sim,
        state,
        port,
        settings,
        token,
        "default",
        LegacyFiles::none(),
    )
    .await
}

/// [`build`] for `account`, with `legacy` files to import.
pub(crate) async fn build_with(
    sim: &LineSimulator,
    state: &std::path::Path,
    port: u16,
    settings: &Value,
    token: &str,
    account: &str,
    legacy: LegacyFiles,
) -> Result<ChannelPlugin, SetupError> {
    let mut merged = json!({
        "token_env": "LINE_TOKEN_UNUSED_IN_TESTS",
        "channel_secret_env": "LINE_SECRET_UNUSED_IN_TESTS",
        "api_base": sim.api_url(),
        "webhook_listen": format!("127.0.0.1:{port}"),
        "request_timeout_ms": 3000,
    });
    for (key, value) in settings.as_object().unwrap() {
        merged[key] = value.clone();
    }
    let setup = clawgate_conformance::channel_setup(0, "line", account, merged, state)
        .with_legacy_files(legacy);
    LineFactory
        .build_with_secrets(
            &setup,
            Secret::new(token),
            Secret::new(sim.channel_secret()),
        )
        .await
}

impl Peer {
    /// The same channel built again (a restart: nothing remembered in memory).
    pub(crate) async fn rebuilt(&self, settings: &Value) -> ChannelPlugin {
        build(
            &self.sim,
            self._state.path(),
            clawgate_conformance::ports::reserve_loopback_port(),
            settings,
            &self.sim.access_token(),
        )
        .await
        .unwrap()
    }

    /// The channel's state directory (its store).
    pub(crate) fn state_dir(&self) -> &std::path::Path {
        self._state.path()
    }

    pub(crate) async fn start() -> Peer {
        Peer::with(quick(), json!({})).await
    }

    /// A channel with `settings` merged over the simulator's on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = LineSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let webhook_url = format!("http://127.0.0.1:{port}/line/webhook");
        let plugin = build(&sim, state.path(), port, &settings, &sim.access_token())
            .await
            .unwrap();
        sim.set_webhook_url(Some(&webhook_url));
        Peer {
            sim,
            plugin,
            webhook_url,
            users: Mutex::new(HashMap::new()),
            _state: state,
        }
    }

    /// The texts the bot shows in `chat`, oldest first.
    pub(crate) fn texts(&self, chat: &str) -> Vec<String> {
        self.sim
            .bot_messages(chat)
            .into_iter()
            .map(|m| m.text)
            .collect()
    }

    /// The envelope of a person's message, as the source hands it over.
    pub(crate) fn envelope_of(&self, written: &Written) -> Value {
        envelope(&self.sim, self.sim.event(&written.event_id).unwrap())
    }

    /// Waits until the webhook listener accepts connections (its source was started).
    pub(crate) async fn listening(&self) {
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
}

/// The LINE refusal a failure of `kind` is.
fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    Some(match kind {
        DeliveryFailureKind::Transient => FaultKind::InternalError(500),
        DeliveryFailureKind::RateLimit => FaultKind::RateLimited,
        DeliveryFailureKind::Auth => FaultKind::Refuse(
            401,
            "Authentication failed. Confirm that the access token in the authorization header is valid.".into(),
        ),
        DeliveryFailureKind::Permission => FaultKind::Refuse(
            403,
            "Access to this API is not available for your account".into(),
        ),
        DeliveryFailureKind::NotFound => FaultKind::Refuse(404, "Not found".into()),
        DeliveryFailureKind::InvalidPayload => {
            FaultKind::Refuse(400, "The request body has 1 error(s)".into())
        }
        // A 409 on push means an accepted retry key, which is a success.
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
            .users
            .lock()
            .unwrap()
            .entry(case.to_owned())
            .or_insert_with(|| self.sim.user(case))
            .clone();
        MessageTarget::direct(id)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(fault) = refusal(kind) else {
            return false;
        };
        self.sim
            .inject(Fault::on(PUSH_PATH, fault).after(after).times(count));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::on(PUSH_PATH, FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        // LINE delivers no other bot's messages to a webhook: there is no bot author to write.
        if bot {
            return None;
        }
        let written = self.sim.user_writes(&target.id, text);
        Some(self.envelope_of(&written))
    }

    fn redeliver_pushed(&self) -> bool {
        // LINE's redelivery of every event (acked ones too: an answer it never saw).
        for id in self.sim.event_ids() {
            self.sim.redeliver(&id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Webhooks are HTTP: the analogue is a delivery whose answer is never read, which LINE
        // redelivers.
        self.sim.cut_next_delivery();
        true
    }
}
