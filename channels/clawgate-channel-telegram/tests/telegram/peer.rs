//! A Telegram channel built by its factory against a fresh simulator, and the simulator's side
//! of what the tests need (chats, faults, what is visible).

use std::collections::HashMap;
use std::sync::Mutex;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_telegram::TelegramFactory;
use clawgate_channel_telegram::simulator::{
    BotApiSimulator, Fault, FaultKind, SimUser, SimulatorConfig, WriteOptions,
};
use serde_json::{Value, json};

/// The webhook secret the webhook-mode peer sets.
pub(crate) const WEBHOOK_SECRET: &str = "peer-webhook-secret_1";

pub(crate) struct Peer {
    pub(crate) sim: BotApiSimulator,
    pub(crate) plugin: ChannelPlugin,
    pub(crate) webhook_url: Option<String>,
    /// A loopback file server the simulator can fetch attachments from.
    files: String,
    chats: Mutex<HashMap<String, i64>>,
    /// Every update the peer made, for webhook redeliveries.
    updates: Mutex<Vec<Value>>,
    _state: tempfile::TempDir,
}

impl Peer {
    /// A polling channel on a simulator without flood control (the contract cases send bursts;
    /// the 429 behaviour has tests of its own).
    pub(crate) async fn polling() -> Peer {
        Peer::start(quiet(), json!({})).await
    }

    /// A webhook channel on a simulator that retries deliveries quickly.
    pub(crate) async fn webhook() -> Peer {
        let port = clawgate_conformance::ports::reserve_loopback_port();
        let url = format!("http://127.0.0.1:{port}/telegram");
        Peer::start(
            quiet(),
            json!({
                "mode": "webhook",
                "webhook_listen": format!("127.0.0.1:{port}"),
                "webhook_url": url,
                "webhook_secret_env": "UNUSED_IN_TESTS",
            }),
        )
        .await
    }

    /// A channel with `settings` (merged over the simulator's `api_base` and token) on a
    /// simulator set up with `config`.
    pub(crate) async fn start(config: SimulatorConfig, settings: Value) -> Peer {
        let sim = BotApiSimulator::start(config).await.unwrap();
        let state = tempfile::tempdir().unwrap();
        let plugin = build(&sim, state.path(), settings.clone()).await.unwrap();
        let files = serve_files().await;
        Peer {
            files,
            webhook_url: settings["webhook_url"].as_str().map(str::to_owned),
            sim,
            plugin,
            chats: Mutex::new(HashMap::new()),
            updates: Mutex::new(Vec::new()),
            _state: state,
        }
    }

    pub(crate) fn chat(&self, target: &MessageTarget) -> i64 {
        target.id.parse().unwrap()
    }

    pub(crate) fn texts(&self, chat: i64) -> Vec<String> {
        self.sim
            .messages(chat)
            .into_iter()
            .filter(|m| m.from_bot_self)
            .map(|m| m.text.or(m.caption).unwrap_or_default())
            .collect()
    }
}

/// A loopback server answering every GET with a small PNG (what Telegram fetches by URL).
async fn serve_files() -> String {
    // The 8-byte PNG signature and an empty IHDR-less body: the simulator checks only that the
    // URL answers 200.
    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(|| async { PNG });
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

pub(crate) fn quiet() -> SimulatorConfig {
    SimulatorConfig {
        rate_limits: false,
        webhook_retry_base: std::time::Duration::from_millis(50),
        ..SimulatorConfig::default()
    }
}

/// The channel the factory builds for `settings` against `sim` (account `default`).
pub(crate) async fn build(
    sim: &BotApiSimulator,
    state_dir: &std::path::Path,
    settings: Value,
) -> Result<ChannelPlugin, SetupError> {
    build_from(sim, &setup(sim, state_dir, "default", settings)).await
}

/// The setup the gateway gives account `account` against `sim`, with its state in the store
/// of `state_dir`.
pub(crate) fn setup(
    sim: &BotApiSimulator,
    state_dir: &std::path::Path,
    account: &str,
    settings: Value,
) -> ChannelSetup {
    let mut merged = json!({
        "token_env": "UNUSED_IN_TESTS",
        "api_base": sim.base_url(),
        "poll_timeout_s": 1,
        "request_timeout_ms": 3000,
    });
    for (key, value) in settings.as_object().unwrap() {
        merged[key] = value.clone();
    }
    clawgate_conformance::channel_setup(0, "telegram", account, merged, state_dir)
}

/// The channel the factory builds from `setup` with the simulator's secrets.
pub(crate) async fn build_from(
    sim: &BotApiSimulator,
    setup: &ChannelSetup,
) -> Result<ChannelPlugin, SetupError> {
    let webhook = setup.settings.get("mode") == Some(&json!("webhook"));
    TelegramFactory
        .build_with_secrets(
            setup,
            Secret::new(sim.token()),
            webhook.then(|| Secret::new(WEBHOOK_SECRET)),
        )
        .await
}

/// The Bot API error a refusal of `kind` is on Telegram.
fn refusal(kind: DeliveryFailureKind) -> Option<FaultKind> {
    Some(match kind {
        DeliveryFailureKind::Transient => {
            FaultKind::error(500, "Internal Server Error: restart the request")
        }
        DeliveryFailureKind::RateLimit => FaultKind::too_many_requests(3),
        DeliveryFailureKind::Auth => FaultKind::error(401, "Unauthorized"),
        DeliveryFailureKind::Permission => {
            FaultKind::error(403, "Forbidden: bot was blocked by the user")
        }
        DeliveryFailureKind::NotFound => FaultKind::error(400, "Bad Request: chat not found"),
        DeliveryFailureKind::InvalidPayload => {
            FaultKind::error(400, "Bad Request: message text is empty")
        }
        // Telegram answers no send with a conflict.
        _ => return None,
    })
}

#[clawgate_conformance::async_trait]
impl clawgate_conformance::ConformancePeer for Peer {
    fn plugin(&self) -> ChannelPlugin {
        self.plugin.clone()
    }

    fn target(&self, case: &str) -> MessageTarget {
        let id = *self
            .chats
            .lock()
            .unwrap()
            .entry(case.to_owned())
            .or_insert_with(|| self.sim.supergroup(case, false));
        MessageTarget::group(id.to_string())
    }

    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool {
        let Some(fault) = refusal(kind) else {
            return false;
        };
        self.sim
            .inject(Fault::once(fault).after(after).times(count));
        true
    }

    fn inject_lost_answer(&self, after: u32) -> bool {
        self.sim
            .inject(Fault::once(FaultKind::LoseAnswer).after(after));
        true
    }

    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String> {
        self.texts(self.chat(target))
    }

    async fn inject_inbound(&self, target: &MessageTarget, text: &str, bot: bool) -> Option<Value> {
        let chat = self.chat(target);
        let from = if bot {
            SimUser::bot(700, "Other")
        } else {
            SimUser::person(500, "Ada")
        };
        let update = self
            .sim
            .user_writes(chat, &from, text, WriteOptions::default());
        if update.is_null() {
            // Telegram delivers no update for another bot's message; the message itself is
            // what one would carry.
            let written = self.sim.messages(chat).pop()?;
            return Some(json!({ "update_id": 1, "message": written.raw }));
        }
        self.updates.lock().unwrap().push(update.clone());
        Some(update)
    }

    fn attachment_url(&self) -> String {
        format!("{}/conformance.png", self.files)
    }

    fn drop_connection(&self) -> bool {
        // A webhook keeps no connection: the analogue is a delivery cut off before its answer
        // was read, which Telegram delivers again.
        if self.webhook_url.is_none() {
            return false;
        }
        self.sim.cut_next_webhook_delivery();
        true
    }

    fn redeliver_pushed(&self) -> bool {
        // Telegram retrying deliveries it never saw answered: the same updates posted again,
        // with the secret, to the webhook.
        let Some(url) = self.webhook_url.clone() else {
            return false;
        };
        let updates = self.updates.lock().unwrap().clone();
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            for update in updates {
                let _ = client
                    .post(&url)
                    .header(clawgate_channel_telegram::SECRET_HEADER, WEBHOOK_SECRET)
                    .json(&update)
                    .send()
                    .await;
            }
        });
        true
    }
}
