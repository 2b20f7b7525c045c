//! A Synology Chat channel built by its factory against a fresh simulator, and the
//! simulator's side of what the tests need (people, channels, faults, what landed).
//!
//! The peer runs the real [`WebhookSource`](clawgate_channel_synology::WebhookSource) for its
//! whole life and hands the cases a source that attaches the case's event sink to it; while
//! no case listens, events are answered 500 (and, Synology not retrying, lost).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_synology::simulator::{
    Conversation, Fault, FaultKind, SimChannel, SimulatorConfig, SynologySimulator,
};
use clawgate_channel_synology::{SynologyFactory, SynologySecrets};
use serde_json::{Value, json};

/// A bot the operator lists in `bot_usernames`.
pub(crate) const OTHER_BOT: &str = "ci-bot";
/// The name the peer's incoming webhook posts under (in `own_usernames`).
pub(crate) const HOOK_NAME: &str = "clawgate-hook";
/// The peer channel's trigger word.
pub(crate) const TRIGGER: &str = "!ask";

pub(crate) struct Peer {
    pub(crate) sim: SynologySimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) webhook_url: String,
    pub(crate) channel: SimChannel,
    relay: Arc<Relay>,
    listener: tokio::task::JoinHandle<()>,
    _state: tempfile::TempDir,
}

/// A quick platform: 20 ms between posts of a token (the channel keeps 25).
pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        min_send_interval: Duration::from_millis(20),
        answer_deadline: Duration::from_secs(5),
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
        // Synology does not deliver an event twice: a case that is still attaching its sink is
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

/// A DSM user name for a conversation name.
pub(crate) fn username_for(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("u-{clean}")
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::with(quick(), json!({})).await
    }

    /// A channel with `settings` merged over the defaults, on a simulator set up by `config`.
    pub(crate) async fn with(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = SynologySimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let webhook_url = format!("http://127.0.0.1:{port}/synology/webhook");
        let channel = sim.add_channel("general", HOOK_NAME);
        let outgoing = sim
            .set_outgoing_webhook(channel.channel_id, &[TRIGGER], &webhook_url)
            .unwrap();
        let channel = sim.channel(channel.channel_id).unwrap();
        sim.set_bot_url(Some(&webhook_url));
        sim.add_user(OTHER_BOT, "CI");
        let mut merged = json!({
            "base_url": sim.base_url(),
            "bot_token_env": "UNUSED_IN_TESTS",
            "channels": [{
                "channel_id": channel.channel_id.to_string(),
                "incoming_token_env": "UNUSED_IN_TESTS",
                "outgoing_token_env": "UNUSED_IN_TESTS",
            }],
            "webhook_listen": format!("127.0.0.1:{port}"),
            "own_usernames": [HOOK_NAME],
            "bot_usernames": [OTHER_BOT],
            "send_interval_ms": 25,
            "request_timeout_ms": 3000,
        });
        for (key, value) in settings.as_object().unwrap() {
            merged[key] = value.clone();
        }
        let setup =
            clawgate_conformance::channel_setup(0, "synology", "default", merged, state.path());
        let mut secrets = SynologySecrets {
            bot_token: Some(Secret::new(sim.bot_token())),
            ..SynologySecrets::default()
        };
        secrets.channels.insert(
            channel.channel_id.to_string(),
            (
                Some(Secret::new(channel.incoming_token.clone())),
                Some(Secret::new(outgoing)),
            ),
        );
        let plugin = SynologyFactory
            .build_with_secrets(&setup, secrets)
            .await
            .unwrap();
        let relay = Arc::new(Relay::default());
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("the Synology Chat source is pushed");
        };
        let sink: Arc<dyn EventSink> = relay.clone();
        let listener = tokio::spawn(async move {
            let _ = feed.run(sink).await;
        });
        let peer = Peer {
            sim,
            plugin,
            webhook_url,
            channel,
            relay,
            listener,
            _state: state,
        };
        peer.listening().await;
        peer
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

    /// A person with a Chat account, for conversation `name`: a DM target.
    pub(crate) fn person(&self, name: &str) -> MessageTarget {
        let username = username_for(name);
        self.sim.add_user(&username, name);
        MessageTarget::direct(username)
    }

    /// The peer's Chat channel as a target.
    pub(crate) fn channel_target(&self) -> MessageTarget {
        MessageTarget::group(self.channel.channel_id.to_string())
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The Synology refusal a failure of `kind` is (`success:false` codes).
fn refusal(kind: DeliveryFailureKind) -> Option<i64> {
    Some(match kind {
        // The Chat package stopped: DSM no longer knows the API.
        DeliveryFailureKind::Transient => 102,
        DeliveryFailureKind::RateLimit => 411,
        DeliveryFailureKind::Auth => 404,
        DeliveryFailureKind::Permission => 105,
        DeliveryFailureKind::InvalidPayload => 117,
        // A conflict or a missing conversation has no code we know (a DM to an unknown user
        // name is refused by the channel itself, before any post).
        _ => return None,
    })
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
        let Some(code) = refusal(kind) else {
            return false;
        };
        self.sim.inject(
            Fault::new(FaultKind::Refuse(code))
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
        match target.kind {
            TargetKind::Direct => self.sim.bot_texts_to(&target.id),
            _ => self.sim.integration_texts_in(target.id.parse().unwrap()),
        }
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        let Some(user) = self.sim.user(&target.id) else {
            return Vec::new();
        };
        self.sim
            .posts()
            .into_iter()
            .filter(|p| p.conversation == Conversation::Direct(user.user_id))
            .map(|p| json!({ "post_id": p.post_id, "text": p.text, "file_url": p.file_url }))
            .collect()
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let from = if bot { OTHER_BOT } else { target.id.as_str() };
        self.sim.person_dms_bot(from, text);
        // The delivery's fields are recorded as it starts.
        let delivery = self.sim.deliveries().pop()?;
        // The event as the channel's source hands it on (the token checked and left out).
        let fields: serde_json::Map<String, Value> = delivery
            .fields
            .iter()
            .filter(|(k, _)| k != "token")
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        Some(json!({ "via": "bot", "fields": fields }))
    }

    fn redeliver_pushed(&self) -> bool {
        // Synology is not known to retry; a copy (a proxy's retry) must still be dropped.
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
