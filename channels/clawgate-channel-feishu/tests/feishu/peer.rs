//! A Feishu channel built by its factory against a fresh simulator, and the simulator's side of
//! what the tests need (people, faults, what is visible).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use clawgate_channel_feishu::simulator::{Fault, FaultKind, FeishuSimulator, SimulatorConfig};
use clawgate_channel_feishu::{FeishuFactory, FeishuSecrets};
use clawgate_channel_sdk::prelude::*;
use serde_json::{Value, json};

pub(crate) struct Peer {
    pub(crate) sim: FeishuSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) callback_url: String,
    chats: Mutex<HashMap<String, String>>,
    _state: tempfile::TempDir,
}

/// Quick re-pushes.
pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        redelivery_delays: vec![Duration::from_millis(50); 4],
        ..SimulatorConfig::default()
    }
}

/// The secrets of the simulator's app.
pub(crate) fn secrets(sim: &FeishuSimulator) -> FeishuSecrets {
    let c = sim.config();
    FeishuSecrets {
        app_secret: Secret::new(&c.app_secret),
        encrypt_key: Secret::new(&c.encrypt_key),
        verification_token: Secret::new(&c.verification_token),
    }
}

/// The channel the factory builds for `sim` with `settings` over the defaults, its listener on
/// `port`.
pub(crate) async fn build(
    sim: &FeishuSimulator,
    state: &std::path::Path,
    port: u16,
    settings: &Value,
    secrets: FeishuSecrets,
) -> Result<ChannelPlugin, SetupError> {
    let mut merged = json!({
        "app_id": sim.config().app_id,
        "app_secret_env": "FEISHU_SECRET_UNUSED_IN_TESTS",
        "encrypt_key_env": "FEISHU_ENCRYPT_KEY_UNUSED_IN_TESTS",
        "verification_token_env": "FEISHU_TOKEN_UNUSED_IN_TESTS",
        "api_base": sim.api_url(),
        "webhook_listen": format!("127.0.0.1:{port}"),
        "request_timeout_ms": 3000,
        "history_settle_ms": 0,
    });
    for (key, value) in settings.as_object().unwrap() {
        merged[key] = value.clone();
    }
    let setup = clawgate_conformance::channel_setup(0, "feishu", "default", merged, state);
    FeishuFactory.build_with_secrets(&setup, secrets).await
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quick(), json!({})).await
    }

    /// A channel with `settings` merged over the simulator's on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = FeishuSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let callback_url = format!("http://127.0.0.1:{port}/feishu/events");
        let plugin = build(&sim, state.path(), port, &settings, secrets(&sim))
            .await
            .unwrap();
        sim.set_callback_url(Some(&callback_url));
        Peer {
            sim,
            plugin,
            callback_url,
            chats: Mutex::new(HashMap::new()),
            _state: state,
        }
    }

    /// The same channel built again (a restart: nothing remembered in memory).
    pub(crate) async fn rebuilt(&self, settings: &Value) -> ChannelPlugin {
        build(
            &self.sim,
            self._state.path(),
            clawgate_conformance::ports::reserve_loopback_port(),
            settings,
            secrets(&self.sim),
        )
        .await
        .unwrap()
    }

    /// The texts the bot shows in `chat`, oldest first.
    pub(crate) fn texts(&self, chat: &str) -> Vec<String> {
        self.sim
            .bot_messages(chat)
            .into_iter()
            .map(|m| m.text)
            .collect()
    }

    /// Waits until the event listener accepts connections (its source was started).
    pub(crate) async fn listening(&self) {
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
                "the event listener never came up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The Feishu refusal a failure of `kind` is (the codes the Open Platform answers).
fn refusal(kind: DeliveryFailureKind) -> Option<(FaultKind, u32)> {
    Some(match kind {
        DeliveryFailureKind::Transient => (FaultKind::InternalError, 1),
        DeliveryFailureKind::RateLimit => (FaultKind::RateLimited(1), 1),
        // The channel fetches a fresh token once after a token refusal: a token refused again
        // (a revoked app) is the auth failure.
        DeliveryFailureKind::Auth => (
            FaultKind::Refuse(
                400,
                99_991_663,
                "Invalid access token for authorization.".into(),
            ),
            2,
        ),
        DeliveryFailureKind::Permission => (
            FaultKind::Refuse(400, 230_002, "Bot/User can NOT be out of the chat.".into()),
            1,
        ),
        DeliveryFailureKind::NotFound => (
            FaultKind::Refuse(400, 230_011, "The message was withdrawn.".into()),
            1,
        ),
        DeliveryFailureKind::InvalidPayload => (
            FaultKind::Refuse(
                400,
                230_001,
                "Your request contains an invalid request parameter.".into(),
            ),
            1,
        ),
        // Feishu's one conflict is a CardKit update after streaming closed, which the channel
        // settles itself (a full card update).
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
            .chats
            .lock()
            .unwrap()
            .entry(case.to_owned())
            .or_insert_with(|| self.sim.group(case, &["ada"]))
            .clone();
        MessageTarget::group(id)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some((fault, per_attempt)) = refusal(kind) else {
            return false;
        };
        self.sim
            .inject(Fault::once(fault).after(after).times(count * per_attempt));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::once(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let written = if bot {
            self.sim.other_bot_writes(&target.id, "helper-bot", text)
        } else {
            self.sim.writes(&target.id, "ada", text)
        };
        self.sim.event(&written.event_id)
    }

    fn redeliver_pushed(&self) -> bool {
        // Feishu's at-least-once delivery: every event again, answered ones too.
        for id in self.sim.event_ids() {
            self.sim.redeliver(&id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Callbacks are HTTP: the analogue is a push whose answer is never read, which Feishu
        // pushes again.
        self.sim.cut_next_delivery();
        true
    }
}
