//! A Matrix channel built by its factory against a fresh Synapse (through the fault proxy), and
//! the homeserver's side of what the tests need: rooms, a person and another bot writing, what
//! the room history shows.

use std::collections::HashMap;
use std::sync::Mutex;

use clawgate_channel_matrix::MatrixFactory;
use clawgate_channel_sdk::prelude::*;
use reqwest::Method;
use serde_json::{Value, json};

use crate::proxy::{FaultKind, FaultProxy};
use clawgate_channel_matrix::testing::{MessageLimit, Synapse, User, enc};

pub(crate) struct Peer {
    pub(crate) synapse: Synapse,
    pub(crate) proxy: FaultProxy,
    pub(crate) plugin: ChannelPlugin,
    /// The account the channel runs as.
    pub(crate) gateway: User,
    /// A person in every room.
    pub(crate) ada: User,
    /// Another bot account in every room (named in `bot_users`).
    pub(crate) otherbot: User,
    rooms: Mutex<HashMap<String, String>>,
    pub(crate) state: tempfile::TempDir,
}

impl Peer {
    pub(crate) async fn start() -> Peer {
        Peer::start_with(MessageLimit::RAISED, json!({})).await
    }

    /// A peer on a Synapse limited by `limit`, the channel built with `settings` merged over
    /// the defaults.
    pub(crate) async fn start_with(limit: MessageLimit, settings: Value) -> Peer {
        let synapse = Synapse::start_with(limit).await;
        let gateway = synapse.register("clawgate").await;
        let ada = synapse.register("ada").await;
        let otherbot = synapse.register("otherbot").await;
        let proxy = FaultProxy::start(&synapse.base).await;
        let state = tempfile::tempdir().unwrap();
        let plugin = build(&proxy.base, &gateway, &otherbot, state.path(), settings)
            .await
            .unwrap();
        // The account starts listening now: later messages are answered.
        if let InboundSource::Polling(feed) = &plugin.source {
            feed.poll(&PollFrom::new(0, None), PollWait::Immediate)
                .await
                .unwrap();
        }
        Peer {
            synapse,
            proxy,
            plugin,
            gateway,
            ada,
            otherbot,
            rooms: Mutex::new(HashMap::new()),
            state,
        }
    }

    /// A room the gateway created, Ada and the other bot joined.
    pub(crate) async fn room(&self, extra: Value) -> String {
        let mut body = json!({
            "preset": "private_chat",
            "invite": [self.ada.user_id, self.otherbot.user_id],
        });
        for (key, value) in extra.as_object().unwrap() {
            body[key] = value.clone();
        }
        let created = self
            .synapse
            .call(&self.gateway, Method::POST, "createRoom", Some(body))
            .await;
        let room = created["room_id"].as_str().unwrap().to_owned();
        for user in [&self.ada, &self.otherbot] {
            self.synapse
                .call(
                    user,
                    Method::POST,
                    &format!("join/{}", enc(&room)),
                    Some(json!({})),
                )
                .await;
        }
        room
    }

    /// `user` writes `content` into `room`; the event as `/sync` shows it (with its room id).
    pub(crate) async fn write(&self, user: &User, room: &str, content: Value) -> Value {
        let txn = format!(
            "t{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        );
        let sent = self
            .synapse
            .call(
                user,
                Method::PUT,
                &format!("rooms/{}/send/m.room.message/{txn}", enc(room)),
                Some(content),
            )
            .await;
        let id = sent["event_id"].as_str().unwrap();
        let mut event = self
            .synapse
            .call(
                user,
                Method::GET,
                &format!("rooms/{}/event/{}", enc(room), enc(id)),
                None,
            )
            .await;
        event["room_id"] = json!(room);
        event
    }

    /// Every event of `room`, oldest first, as the gateway's account sees them.
    pub(crate) async fn history(&self, room: &str) -> Vec<Value> {
        let page = self
            .synapse
            .call(
                &self.gateway,
                Method::GET,
                &format!("rooms/{}/messages?dir=b&limit=1000", enc(room)),
                None,
            )
            .await;
        let mut events: Vec<Value> = page["chunk"].as_array().cloned().unwrap_or_default();
        events.reverse();
        events
    }

    /// The gateway's messages in `room` (not edits), oldest first, with whether each is
    /// redacted.
    pub(crate) async fn gateway_messages(&self, room: &str) -> Vec<Value> {
        self.history(room)
            .await
            .into_iter()
            .filter(|e| {
                e["type"] == "m.room.message"
                    && e["sender"] == self.gateway.user_id.as_str()
                    && e.pointer("/content/m.relates_to/rel_type") != Some(&json!("m.replace"))
            })
            .collect()
    }

    /// What a person sees of the gateway's messages: each unredacted one with its latest edit.
    pub(crate) async fn texts(&self, room: &str) -> Vec<String> {
        let history = self.history(room).await;
        let mut latest: HashMap<String, String> = HashMap::new();
        for event in &history {
            if event.pointer("/content/m.relates_to/rel_type") == Some(&json!("m.replace"))
                && event["sender"] == self.gateway.user_id.as_str()
                && let (Some(original), Some(body)) = (
                    event
                        .pointer("/content/m.relates_to/event_id")
                        .and_then(Value::as_str),
                    event
                        .pointer("/content/m.new_content/body")
                        .and_then(Value::as_str),
                )
            {
                latest.insert(original.to_owned(), body.to_owned());
            }
        }
        self.gateway_messages(room)
            .await
            .into_iter()
            .filter_map(|e| {
                let body = e.pointer("/content/body").and_then(Value::as_str)?;
                let id = e["event_id"].as_str().unwrap_or_default();
                Some(latest.get(id).cloned().unwrap_or_else(|| body.to_owned()))
            })
            .collect()
    }
}

/// The channel the factory builds against the homeserver at `base` as `gateway` (account
/// `default`).
pub(crate) async fn build(
    base: &str,
    gateway: &User,
    otherbot: &User,
    state_dir: &std::path::Path,
    settings: Value,
) -> Result<ChannelPlugin, SetupError> {
    let setup = setup(base, gateway, otherbot, state_dir, "default", settings);
    build_from(&setup, gateway).await
}

/// The setup the gateway gives account `account`, run as `gateway`, with its state in the
/// store of `state_dir`.
pub(crate) fn setup(
    base: &str,
    gateway: &User,
    otherbot: &User,
    state_dir: &std::path::Path,
    account: &str,
    settings: Value,
) -> ChannelSetup {
    let mut merged = json!({
        "homeserver_url": base,
        "user_id": gateway.user_id,
        "token_env": "UNUSED_IN_TESTS",
        "bot_users": [otherbot.user_id],
        "poll_timeout_s": 1,
        "request_timeout_ms": 5000,
    });
    for (key, value) in settings.as_object().unwrap() {
        merged[key] = value.clone();
    }
    clawgate_conformance::channel_setup(0, "matrix", account, merged, state_dir)
}

/// The channel the factory builds from `setup`, with `gateway`'s access token.
pub(crate) async fn build_from(
    setup: &ChannelSetup,
    gateway: &User,
) -> Result<ChannelPlugin, SetupError> {
    MatrixFactory
        .build_with_secrets(setup, Secret::new(gateway.token.clone()))
        .await
}

/// The Matrix error a refusal of `kind` is on Synapse.
fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    Some(match kind {
        DeliveryFailureKind::Transient => {
            FaultKind::matrix(500, "M_UNKNOWN", "Internal server error")
        }
        DeliveryFailureKind::RateLimit => FaultKind::Refuse(
            429,
            json!({ "errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests", "retry_after_ms": 1500 }),
        ),
        DeliveryFailureKind::Auth => {
            FaultKind::matrix(401, "M_UNKNOWN_TOKEN", "Invalid access token passed.")
        }
        DeliveryFailureKind::Permission => {
            FaultKind::matrix(403, "M_FORBIDDEN", "User not in room")
        }
        DeliveryFailureKind::NotFound => FaultKind::matrix(404, "M_NOT_FOUND", "Unknown room"),
        DeliveryFailureKind::InvalidPayload => {
            FaultKind::matrix(413, "M_TOO_LARGE", "event too large")
        }
        // No send is answered with a conflict.
        _ => return None,
    })
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, case: &str) -> MessageTarget {
        if let Some(room) = self.rooms.lock().unwrap().get(case) {
            return MessageTarget::group(room.clone());
        }
        // The suite asks synchronously; the room is made on the homeserver meanwhile.
        let room = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(self.room(json!({})))
        });
        self.rooms
            .lock()
            .unwrap()
            .insert(case.to_owned(), room.clone());
        MessageTarget::group(room)
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(fault) = refusal(kind) else {
            return false;
        };
        self.proxy.inject(after, count, fault);
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.proxy.inject(after, 1, FaultKind::LoseAnswer);
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(&target.id).await
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let user = if bot { &self.otherbot } else { &self.ada };
        let msgtype = if bot { "m.notice" } else { "m.text" };
        Some(
            self.write(
                user,
                &target.id,
                json!({ "msgtype": msgtype, "body": text }),
            )
            .await,
        )
    }

    async fn visible_raw(&self, target: &MessageTarget) -> Vec<Value> {
        self.gateway_messages(&target.id)
            .await
            .into_iter()
            .filter(|e| e.pointer("/content/body").is_some())
            .collect()
    }
}
