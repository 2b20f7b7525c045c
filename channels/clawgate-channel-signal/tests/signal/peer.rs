//! A Signal channel built by its factory against a fresh simulator, and the simulator's side
//! of what the tests need (people, faults, what landed).

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_signal::SignalFactory;
use clawgate_channel_signal::simulator::{Fault, FaultKind, SignalSimulator, SimulatorConfig};
use serde_json::{Value, json};

/// The automated number the channel's settings list in `bot_senders`.
pub(crate) const BOT: &str = "+4917000000001";

pub(crate) struct Peer {
    pub(crate) sim: SignalSimulator,
    pub(crate) plugin: ChannelPlugin,
    _state: tempfile::TempDir,
}

/// A person's number for a conversation name.
pub(crate) fn number_for(name: &str) -> String {
    let mut hash: u64 = 1469598103934665603;
    for byte in name.bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(1099511628211);
    }
    format!("+49151{:08}", hash % 100_000_000)
}

/// The settings a test channel starts from, for `sim`.
pub(crate) fn settings_for(sim: &SignalSimulator) -> Value {
    json!({
        "account": sim.account(),
        "daemon": sim.tcp_addr().to_string(),
        "bot_senders": [BOT],
        "request_timeout_ms": 5000,
    })
}

/// Builds a channel with `settings` (a full settings table).
pub(crate) async fn build(
    settings: Value,
    state: &std::path::Path,
) -> Result<ChannelPlugin, SetupError> {
    let setup = clawgate_conformance::channel_setup(0, "signal", "default", settings, state);
    SignalFactory.build(setup).await
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(SimulatorConfig::default(), json!({})).await
    }

    /// A channel with `settings` merged over the defaults, on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = SignalSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let mut merged = settings_for(&sim);
        for (key, value) in settings.as_object().unwrap() {
            merged[key] = value.clone();
        }
        let plugin = build(merged, state.path()).await.unwrap();
        Peer {
            sim,
            plugin,
            _state: state,
        }
    }

    /// The texts that landed in a conversation (a number or a group id), oldest first.
    pub(crate) fn texts(&self, conversation: &str) -> Vec<String> {
        self.sim
            .landed_in(conversation)
            .into_iter()
            .map(|l| l.text().to_owned())
            .collect()
    }
}

/// The daemon's answer a refusal of `kind` is.
fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    Some(match kind {
        DeliveryFailureKind::Transient => FaultKind::NetworkFailure,
        DeliveryFailureKind::RateLimit => FaultKind::RateLimit {
            retry_after_seconds: 3,
        },
        // A daemon that does not hold the account (removed, or never registered there).
        DeliveryFailureKind::Auth => FaultKind::Error {
            code: -32602,
            message: "Specified account does not exist".into(),
        },
        DeliveryFailureKind::Permission => FaultKind::UntrustedIdentity,
        DeliveryFailureKind::NotFound => FaultKind::Unregistered,
        DeliveryFailureKind::InvalidPayload => FaultKind::Error {
            code: -1,
            message: "Invalid mention syntax (x) expected 'start:length:recipientNumber'".into(),
        },
        // signal-cli answers no conflict.
        _ => return None,
    })
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, case: &str) -> MessageTarget {
        MessageTarget::direct(number_for(case))
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(fault) = refusal(kind) else {
            return false;
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
        self.texts(&target.id)
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let account = self.sim.account();
        let from = if bot { BOT } else { target.id.as_str() };
        Some(match target.kind {
            clawgate_types::TargetKind::Group => self
                .sim
                .person_writes_in_group(&account, from, &target.id, text),
            _ => self.sim.person_writes(&account, from, text),
        })
    }

    fn redeliver_pushed(&self) -> bool {
        self.sim.redeliver_all() > 0
    }

    fn drop_connection(&self) -> bool {
        self.sim.drop_subscribers() > 0
    }
}
