//! A Teams channel built by its factory against a fresh simulator, and the simulator's side of
//! what the tests need (conversations, faults, what is visible).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_teams::TeamsFactory;
use clawgate_channel_teams::simulator::{
    ConversationKind, Fault, FaultKind, Op, SimUser, SimulatorConfig, TeamsSimulator,
};
use serde_json::{Value, json};

pub(crate) struct Peer {
    pub(crate) sim: TeamsSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) endpoint: String,
    pub(crate) person: SimUser,
    personal: bool,
    conversations: Mutex<HashMap<String, String>>,
    pub(crate) state: tempfile::TempDir,
}

/// No send limits (the contract cases send bursts; the limits have tests of their own), quick
/// redeliveries.
pub(crate) fn quiet() -> SimulatorConfig {
    SimulatorConfig {
        rate_limits: false,
        answer_deadline: Duration::from_secs(5),
        retry_delays: vec![Duration::from_millis(50); 3],
        ..SimulatorConfig::default()
    }
}

impl Peer {
    /// Conversations are group chats.
    pub(crate) async fn start() -> Peer {
        Peer::with(quiet(), json!({})).await
    }

    /// Conversations are one-on-one chats.
    pub(crate) async fn start_personal() -> Peer {
        let mut peer = Peer::with(quiet(), json!({})).await;
        peer.personal = true;
        peer
    }

    /// A channel with `settings` merged over the simulator's (`null` removes one), on a
    /// simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = TeamsSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let endpoint = format!("http://127.0.0.1:{port}/api/messages");
        let mut merged = json!({
            "app_id": sim.app_id(),
            "app_password_env": "UNUSED_IN_TESTS",
            "listen": format!("127.0.0.1:{port}"),
            "token_url": sim.token_url(),
            "openid_url": sim.openid_url(),
            "service_url": sim.service_url(),
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
        let setup =
            clawgate_conformance::channel_setup(0, "teams", "default", merged, state.path());
        let plugin = TeamsFactory
            .build_with_secrets(&setup, Secret::new(sim.app_password()))
            .await
            .unwrap();
        sim.set_endpoint(Some(&endpoint));
        let person = sim.person("ada");
        Peer {
            sim,
            plugin,
            endpoint,
            person,
            personal: false,
            conversations: Mutex::new(HashMap::new()),
            state,
        }
    }

    /// A group chat with the person and the bot.
    pub(crate) fn group_chat(&self, name: &str) -> String {
        self.sim.conversation(
            ConversationKind::GroupChat,
            name,
            std::slice::from_ref(&self.person),
        )
    }

    /// A team channel the bot was added to.
    pub(crate) fn channel(&self, name: &str) -> String {
        self.sim.conversation(
            ConversationKind::Channel,
            name,
            std::slice::from_ref(&self.person),
        )
    }

    /// The texts of the bot people see in `conversation` (messages and streams), oldest first.
    pub(crate) fn texts(&self, conversation: &str) -> Vec<String> {
        self.sim
            .bot_visible(conversation)
            .into_iter()
            .map(|a| a.text)
            .collect()
    }

    /// Waits until the messaging endpoint accepts connections (its source was started).
    pub(crate) async fn listening(&self) {
        let addr = self
            .endpoint
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the messaging endpoint never came up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The connector refusal a failure of `kind` is, and how many calls it must strike (a 401 is
/// retried once with a fresh token).
fn refusal(kind: DeliveryFailureKind) -> Option<(FaultKind, u32)> {
    Some(match kind {
        DeliveryFailureKind::Transient => (FaultKind::ServerError(503), 1),
        // `Retry-After: 0`: the case's next refusal goes to the same conversation, which the
        // adapter would otherwise hold back for the wait asked.
        DeliveryFailureKind::RateLimit => (FaultKind::RateLimited(0), 1),
        DeliveryFailureKind::Auth => (
            FaultKind::error(
                401,
                "Unauthorized",
                "Authorization has been denied for this request.",
            ),
            2,
        ),
        DeliveryFailureKind::Permission => (
            FaultKind::error(
                403,
                "BotNotInConversationRoster",
                "The bot is not part of the conversation roster.",
            ),
            1,
        ),
        DeliveryFailureKind::NotFound => (
            FaultKind::error(404, "ConversationNotFound", "Conversation not found."),
            1,
        ),
        DeliveryFailureKind::InvalidPayload => (
            FaultKind::error(400, "BadArgument", "Unknown activity type \"x\"."),
            1,
        ),
        // A send has no conflict class on Teams (no idempotency key, no ids of ours).
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
                if self.personal {
                    self.sim.personal_chat(&self.person)
                } else {
                    self.group_chat(case)
                }
            })
            .clone();
        if self.personal {
            MessageTarget::direct(id)
        } else {
            MessageTarget::group(id)
        }
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some((fault, strikes)) = refusal(kind) else {
            return false;
        };
        self.sim.inject(
            Fault::on(Op::Send, fault)
                .after(after)
                .times(count * strikes),
        );
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::on(Op::Send, FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let written = if bot {
            let other = self.sim.other_bot("helper");
            self.sim.bot_writes(&target.id, &other, text)?
        } else {
            self.sim
                .person_writes(&target.id, &self.person, text, None)?
        };
        self.sim.event_of(&written)
    }

    fn redeliver_pushed(&self) -> bool {
        for id in self.sim.event_ids() {
            self.sim.redeliver(&id);
        }
        true
    }

    fn drop_connection(&self) -> bool {
        // Activities come over HTTP: the analogue is a delivery whose answer is never read,
        // which the Bot Framework sends again.
        self.sim.cut_next_delivery();
        true
    }
}
