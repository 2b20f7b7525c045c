//! `[[channels]] kind = "feishu"`: the settings of one Feishu / Lark app, checked at start (a
//! tenant access token is fetched, the bot's identity read), and the plugin built from them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use tracing::warn;

use crate::adapter::FeishuAdapter;
use crate::client::{CallError, OpenApi};
use crate::receive::FeishuReceiver;
use crate::source::{WebhookConfig, WebhookSource};
use clawgate_channel_sdk::freshness;

/// Feishu's Open Platform (mainland China).
pub const DEFAULT_API_BASE: &str = "https://open.feishu.cn";
/// Lark's Open Platform (international).
pub const LARK_API_BASE: &str = "https://open.larksuite.com";
/// How long Feishu dedupes a `uuid`.
pub const UUID_DEDUPE_MS: u64 = 60 * 60 * 1_000;
/// How long Feishu waits for a callback's answer before it counts as failed.
pub const CALLBACK_TIMEOUT_MS: u64 = 3_000;

/// `[channels.settings]` of a `feishu` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeishuSettings {
    /// The app's App ID (`cli_…`).
    pub app_id: String,
    /// The environment variable holding the App Secret.
    pub app_secret_env: String,
    /// The environment variable holding the Encrypt Key (event bodies and signatures).
    pub encrypt_key_env: String,
    /// The environment variable holding the Verification Token.
    pub verification_token_env: String,
    /// The address the event listener binds; the app's request URL must reach it.
    pub webhook_listen: SocketAddr,
    /// The path the listener serves (the request URL's path).
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// The Open Platform: Feishu's, Lark's (`https://open.larksuite.com`), or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// Previews as CardKit streaming cards (the card becomes the final); `false`: a text
    /// message edited in place.
    #[serde(default = "default_true")]
    pub streaming_cards: bool,
    /// How long after its render a unit's `uuid` is trusted to dedupe a resend (Feishu: one
    /// hour; the margin covers clock skew and the resend's travel). Past it, history is read.
    #[serde(default = "default_uuid_window_ms")]
    pub uuid_window_ms: u64,
    /// How long after a send its absence from history proves it did not land.
    #[serde(default = "default_history_settle_ms")]
    pub history_settle_ms: u64,
    /// How long one Open Platform call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a callback waits for the durable record before answering 503 (under 3 s).
    #[serde(default = "default_answer_deadline_ms")]
    pub answer_deadline_ms: u64,
    /// How far a callback's signed `X-Lark-Request-Timestamp` may be from the gateway's clock,
    /// either way, before it is refused as a replay.
    #[serde(default = "default_max_signature_age_secs")]
    pub max_signature_age_secs: u64,
}

fn default_webhook_path() -> String {
    "/feishu/events".into()
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_true() -> bool {
    true
}
fn default_uuid_window_ms() -> u64 {
    55 * 60 * 1_000
}
fn default_history_settle_ms() -> u64 {
    15_000
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_answer_deadline_ms() -> u64 {
    2_500
}
fn default_max_signature_age_secs() -> u64 {
    freshness::DEFAULT_MAX_SIGNATURE_AGE_SECS
}

/// The bot behind a channel, as `GET /open-apis/bot/v3/info` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The bot's open id (`ou_…`).
    pub open_id: String,
    /// The app's name.
    pub app_name: Option<String>,
}

/// The secrets of one app, read from the variables its settings name.
#[derive(Debug, Clone)]
pub struct FeishuSecrets {
    /// The App Secret.
    pub app_secret: Secret,
    /// The Encrypt Key.
    pub encrypt_key: Secret,
    /// The Verification Token.
    pub verification_token: Secret,
}

/// Builds `feishu` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct FeishuFactory;

/// Checks the credentials. A refused secret stops the start with an error naming the setting;
/// an unreachable platform is only a warning (the token is fetched again on use).
async fn check_app(
    setup: &ChannelSetup,
    settings: &FeishuSettings,
    api: &OpenApi,
) -> Result<Option<BotIdentity>, SetupError> {
    match api.tenant_token().await {
        Ok(_) => {}
        Err(error @ CallError::Refused { .. }) => {
            return Err(setup.invalid(
                "app_secret_env",
                format!(
                    "Feishu refused app {}'s credentials ({}): {} (api_base is {})",
                    settings.app_id,
                    settings.app_secret_env,
                    error.into_send_error("tenant token").message,
                    api.base()
                ),
            ));
        }
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "no tenant access token yet; it is fetched again on use");
            return Ok(None);
        }
    }
    Ok(api.bot_info().await.ok().and_then(|bot| {
        Some(BotIdentity {
            open_id: bot["open_id"].as_str()?.to_owned(),
            app_name: bot["app_name"].as_str().map(str::to_owned),
        })
    }))
}

#[async_trait]
impl ChannelFactory for FeishuFactory {
    fn kind(&self) -> &str {
        "feishu"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: FeishuSettings = setup.settings()?;
        let secrets = FeishuSecrets {
            app_secret: setup.secret("app_secret_env", &settings.app_secret_env)?,
            encrypt_key: setup.secret("encrypt_key_env", &settings.encrypt_key_env)?,
            verification_token: setup
                .secret("verification_token_env", &settings.verification_token_env)?,
        };
        self.build_with_secrets(&setup, secrets).await
    }
}

impl FeishuFactory {
    /// Builds the app of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        secrets: FeishuSecrets,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: FeishuSettings = setup.settings()?;
        if !(settings.api_base.starts_with("http://") || settings.api_base.starts_with("https://"))
        {
            return Err(setup.invalid(
                "api_base",
                format!("{:?} is not an http(s) URL", settings.api_base),
            ));
        }
        if settings.api_base.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "api_base",
                "this build speaks plain HTTP only: build clawgate-channel-feishu with its \
                 `rustls` feature (on by default) to reach the Open Platform",
            ));
        }
        if !settings.webhook_path.starts_with('/') {
            return Err(setup.invalid("webhook_path", "a path starts with /"));
        }
        if !settings.app_id.starts_with("cli_") {
            return Err(setup.invalid(
                "app_id",
                format!(
                    "{:?} is not an App ID (cli_…: Developer Console → Credentials & Basic Info)",
                    settings.app_id
                ),
            ));
        }
        for (key, secret) in [
            ("encrypt_key_env", &secrets.encrypt_key),
            ("verification_token_env", &secrets.verification_token),
        ] {
            if secret.expose().is_empty() {
                return Err(setup.invalid(
                    key,
                    "empty: copy it from the Developer Console → Events & Callbacks → \
                     Encryption strategy",
                ));
            }
        }
        if settings.uuid_window_ms > UUID_DEDUPE_MS {
            return Err(setup.invalid(
                "uuid_window_ms",
                format!("Feishu dedupes a uuid for {UUID_DEDUPE_MS} ms only"),
            ));
        }
        if settings.answer_deadline_ms >= CALLBACK_TIMEOUT_MS {
            return Err(setup.invalid(
                "answer_deadline_ms",
                format!("Feishu waits {CALLBACK_TIMEOUT_MS} ms for a callback's answer"),
            ));
        }
        let max_signature_age = freshness::window(settings.max_signature_age_secs)
            .map_err(|why| setup.invalid("max_signature_age_secs", why))?;
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = OpenApi::new(
            &settings.api_base,
            &settings.app_id,
            secrets.app_secret,
            timeout,
        );
        let bot = check_app(setup, &settings, &api).await?;
        let adapter = Arc::new(FeishuAdapter::new(
            &setup.name,
            api,
            &settings.app_id,
            settings.streaming_cards,
            settings.uuid_window_ms,
            Duration::from_millis(settings.history_settle_ms),
            setup.clock().clone(),
        ));
        let receiver = Arc::new(FeishuReceiver::new(
            &setup.name,
            &settings.app_id,
            bot.as_ref().map(|b| b.open_id.clone()),
        ));
        let source = InboundSource::Pushed(Arc::new(WebhookSource::new(
            WebhookConfig {
                listen: settings.webhook_listen,
                path: settings.webhook_path.clone(),
                encrypt_key: secrets.encrypt_key,
                verification_token: secrets.verification_token,
                answer_deadline: Duration::from_millis(settings.answer_deadline_ms.max(1)),
                max_signature_age,
            },
            setup.clock().clone(),
        )));
        let who = bot
            .as_ref()
            .and_then(|b| b.app_name.clone())
            .unwrap_or_else(|| settings.app_id.clone());
        let mut plugin = ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!(
                "Feishu app {who}, events on {}",
                settings.webhook_listen
            ))
            .with_platform_url(settings.api_base.clone(), false);
        if let Some(bot) = bot {
            plugin = plugin.with_extension(Arc::new(bot));
        }
        Ok(plugin)
    }
}
