//! `[[channels]] kind = "synology"`: the settings of one Synology Chat server's integrations —
//! a bot (DMs) and any number of channels (an outgoing webhook in, an incoming webhook out) —
//! checked at start (the bot token with `user_list`), and the plugin built from them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use tracing::{info, warn};

use crate::adapter::{ChannelRoute, SynologyAdapter};
use crate::client::{CallError, ChatApi};
use crate::receive::SynologyReceiver;
use crate::source::{InboundTokens, WebhookConfig, WebhookSource};

/// `[channels.settings]` of a `synology` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SynologySettings {
    /// The NAS's DSM address (`https://nas.example:5001`), or a simulator.
    pub base_url: String,
    /// The environment variable holding the bot integration's token (DMs in and out).
    #[serde(default)]
    pub bot_token_env: Option<String>,
    /// The Chat channels this account answers in.
    #[serde(default)]
    pub channels: Vec<ChannelSettings>,
    /// The address the webhook listener binds; the integrations' outgoing URL must reach it.
    pub webhook_listen: SocketAddr,
    /// The path the listener serves (bot and outgoing webhooks alike).
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// User names whose posts are never answered: the names this account's incoming webhooks
    /// post under (their posts can start with a trigger word too).
    #[serde(default)]
    pub own_usernames: Vec<String>,
    /// User names of other bots and integrations: their posts are reported as bot authors
    /// (answered only where the gateway's bot policy allows).
    #[serde(default)]
    pub bot_usernames: Vec<String>,
    /// The least time between two posts of one token (Synology answers 411 to posts that come
    /// too fast; clients keep 500 ms).
    #[serde(default = "default_send_interval_ms")]
    pub send_interval_ms: u64,
    /// How long one API call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a webhook delivery waits for the durable record before answering 500.
    #[serde(default = "default_answer_deadline_ms")]
    pub answer_deadline_ms: u64,
}

/// One Chat channel of a `synology` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelSettings {
    /// The channel's id (`channel_id` of its outgoing webhook's events).
    pub channel_id: String,
    /// The environment variable holding its incoming webhook's token (answers go there).
    #[serde(default)]
    pub incoming_token_env: Option<String>,
    /// The environment variable holding its outgoing webhook's token (prompts come with it).
    #[serde(default)]
    pub outgoing_token_env: Option<String>,
}

fn default_webhook_path() -> String {
    "/synology/webhook".into()
}
fn default_send_interval_ms() -> u64 {
    500
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_answer_deadline_ms() -> u64 {
    2_000
}

/// The secrets of one account, as the variables the settings name hold them.
#[derive(Clone, Default)]
pub struct SynologySecrets {
    /// The bot's token.
    pub bot_token: Option<Secret>,
    /// Per Chat channel id: its incoming and outgoing webhook's tokens.
    pub channels: HashMap<String, (Option<Secret>, Option<Secret>)>,
}

impl std::fmt::Debug for SynologySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SynologySecrets")
            .field("bot_token", &self.bot_token.is_some())
            .field("channels", &self.channels.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Builds `synology` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct SynologyFactory;

#[async_trait]
impl ChannelFactory for SynologyFactory {
    fn kind(&self) -> &str {
        "synology"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: SynologySettings = setup.settings()?;
        let mut secrets = SynologySecrets::default();
        if let Some(env) = &settings.bot_token_env {
            secrets.bot_token = Some(setup.secret("bot_token_env", env)?);
        }
        for (i, channel) in settings.channels.iter().enumerate() {
            let read = |key: &str, env: &Option<String>| {
                env.as_ref()
                    .map(|env| setup.secret(&format!("channels[{i}].{key}"), env))
                    .transpose()
            };
            secrets.channels.insert(
                channel.channel_id.clone(),
                (
                    read("incoming_token_env", &channel.incoming_token_env)?,
                    read("outgoing_token_env", &channel.outgoing_token_env)?,
                ),
            );
        }
        self.build_with_secrets(&setup, secrets).await
    }
}

impl SynologyFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        secrets: SynologySecrets,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: SynologySettings = setup.settings()?;
        let base = settings.base_url.as_str();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(setup.invalid("base_url", format!("{base:?} is not an http(s) URL")));
        }
        if base.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "base_url",
                "this build speaks plain HTTP only: build clawgate-channel-synology with its \
                 `rustls` feature (on by default) to reach an https:// NAS",
            ));
        }
        if !settings.webhook_path.starts_with('/') {
            return Err(setup.invalid("webhook_path", "a path starts with /"));
        }
        if secrets.bot_token.is_none() && settings.channels.is_empty() {
            return Err(setup.invalid(
                "bot_token_env",
                "neither a bot nor a channel is set up: set bot_token_env (DMs) or list \
                 channels with their webhook tokens",
            ));
        }
        let mut tokens = InboundTokens::default();
        let mut routes = HashMap::new();
        if let Some(bot) = &secrets.bot_token {
            if bot.expose().is_empty() {
                return Err(setup.invalid("bot_token_env", "the bot token is empty"));
            }
            tokens = tokens.with_bot(bot.clone());
        }
        for (i, channel) in settings.channels.iter().enumerate() {
            let (incoming, outgoing) = secrets
                .channels
                .get(&channel.channel_id)
                .cloned()
                .unwrap_or_default();
            if let Some(outgoing) = outgoing.filter(|t| !t.expose().is_empty()) {
                tokens = tokens.with_channel(&channel.channel_id, outgoing);
            }
            match incoming.filter(|t| !t.expose().is_empty()) {
                Some(incoming_token) => {
                    routes.insert(channel.channel_id.clone(), ChannelRoute { incoming_token });
                }
                None => warn!(
                    channel = %setup.name,
                    chat_channel = %channel.channel_id,
                    key = %setup.key(&format!("channels[{i}].incoming_token_env")),
                    "no incoming webhook token: prompts from this Chat channel cannot be answered"
                ),
            }
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = ChatApi::new(base, timeout);
        let adapter = SynologyAdapter::new(
            &setup.name,
            api.clone(),
            secrets.bot_token.clone(),
            routes,
            Duration::from_millis(settings.send_interval_ms),
        );
        if let Some(bot) = &secrets.bot_token {
            check_bot(setup, &settings, &adapter, bot).await?;
        }
        let receiver = Arc::new(SynologyReceiver::new(
            &setup.name,
            settings.own_usernames.clone(),
            settings.bot_usernames.clone(),
        ));
        let source = InboundSource::Pushed(Arc::new(WebhookSource::new(WebhookConfig {
            listen: settings.webhook_listen,
            path: settings.webhook_path.clone(),
            tokens,
            answer_deadline: Duration::from_millis(settings.answer_deadline_ms.max(1)),
        })));
        Ok(ChannelPlugin::new(Arc::new(adapter))
            .with_inbound(receiver, source)
            .with_description(format!(
                "Synology Chat on {}, webhook on {}",
                api.base(),
                settings.webhook_listen
            ))
            .with_platform_url(api.base().to_owned(), false))
    }
}

/// Checks the bot's token with `user_list`. A refused token stops the start with an error
/// naming the setting; an unreachable NAS is only a warning (the token is used again later).
async fn check_bot(
    setup: &ChannelSetup,
    settings: &SynologySettings,
    adapter: &SynologyAdapter,
    token: &Secret,
) -> Result<(), SetupError> {
    match adapter.user_list(token).await {
        Ok(users) => {
            info!(channel = %setup.name, users = users.len(), "Synology Chat bot token accepted");
            Ok(())
        }
        Err(error @ CallError::Refused { .. }) => Err(setup.invalid(
            "bot_token_env",
            format!(
                "Synology Chat refused the bot token in {}: {} (base_url is {})",
                settings.bot_token_env.as_deref().unwrap_or_default(),
                error.into_send_error("user_list", 0).message,
                settings.base_url
            ),
        )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "user_list failed; the bot token is checked again on use");
            Ok(())
        }
    }
}
