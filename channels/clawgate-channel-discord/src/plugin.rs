//! `[[channels]] kind = "discord"`: the settings of one bot account, checked at start (the token
//! with `GET /users/@me`), and the plugin built from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use reqwest::Method;
use serde::Deserialize;
use tracing::warn;

use crate::adapter::{BotCell, DiscordAdapter};
use crate::client::{CallError, LimiterConfig, Rest};
use crate::echo::EchoRegistry;
use crate::receive::DiscordReceiver;
use crate::source::{GatewaySource, import_legacy_session};

/// Discord's REST base.
pub const DEFAULT_API_BASE: &str = "https://discord.com/api/v10";

/// `[channels.settings]` of a `discord` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscordSettings {
    /// The environment variable holding the bot token (Developer Portal → Bot → Token).
    pub token_env: String,
    /// The REST base: Discord's, or a simulator's.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// Guilds answered (ids); empty: every guild the bot is in.
    #[serde(default)]
    pub allowed_guilds: Vec<String>,
    /// Channels (and threads) answered; empty: every channel.
    #[serde(default)]
    pub allowed_channels: Vec<String>,
    /// How long a nonce is trusted to dedupe a resend (Discord: "a few minutes"; this stays
    /// below it).
    #[serde(default = "default_nonce_window_s")]
    pub nonce_window_s: u64,
    /// How long one REST call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The longest wait for a rate limit inside one send; longer ones are retried later.
    #[serde(default = "default_max_rate_limit_wait_ms")]
    pub max_rate_limit_wait_ms: u64,
    /// 401/403/429 answers per 10 minutes after which calls pause (Discord bans at 10,000).
    #[serde(default = "default_invalid_request_budget")]
    pub invalid_request_budget: u32,
    /// A preview older than this gets a fresh final (so the answer lands at the bottom).
    #[serde(default = "default_preview_stale_after_s")]
    pub preview_stale_after_s: u64,
}

fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_nonce_window_s() -> u64 {
    120
}
fn default_request_timeout_ms() -> u64 {
    15_000
}
fn default_max_rate_limit_wait_ms() -> u64 {
    5_000
}
fn default_invalid_request_budget() -> u32 {
    1_000
}
fn default_preview_stale_after_s() -> u64 {
    300
}

/// Builds `discord` channels. Its accounts share one [`EchoRegistry`], so one account
/// recognises another's gateway-failure notices in a shared room.
#[derive(Debug, Clone, Default)]
pub struct DiscordFactory {
    echo: Arc<EchoRegistry>,
}

impl DiscordFactory {
    /// A factory whose accounts share `echo`.
    pub fn with_echo_registry(echo: Arc<EchoRegistry>) -> DiscordFactory {
        DiscordFactory { echo }
    }

    /// The shared echo registry.
    pub fn echo_registry(&self) -> Arc<EchoRegistry> {
        self.echo.clone()
    }

    /// Builds the account of `setup` with its bot `token` given (the gateway reads it from the
    /// variable `token_env` names).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: DiscordSettings = setup.settings()?;
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
                "this build speaks plain HTTP only: build clawgate-channel-discord with its \
                 `rustls` feature (on by default) to reach https://discord.com",
            ));
        }
        if settings.nonce_window_s == 0 {
            return Err(setup.invalid("nonce_window_s", "must be at least 1 second"));
        }
        let rest = Rest::new(
            &settings.api_base,
            token,
            Duration::from_millis(settings.request_timeout_ms.max(1)),
            LimiterConfig {
                max_wait: Duration::from_millis(settings.max_rate_limit_wait_ms),
                invalid_budget: settings.invalid_request_budget.max(1),
            },
        );
        let bot = Arc::new(BotCell::default());
        let who = check_token(setup, &settings, &rest, &bot).await?;
        let adapter = Arc::new(DiscordAdapter::new(
            &setup.name,
            rest.clone(),
            self.echo.clone(),
            bot.clone(),
            Duration::from_secs(settings.nonce_window_s),
            setup.state.clone(),
        ));
        let receiver = Arc::new(DiscordReceiver::new(
            &setup.name,
            bot.clone(),
            settings.allowed_guilds.clone(),
            settings.allowed_channels.clone(),
        ));
        import_legacy_session(&setup.state, &setup.legacy, &setup.name)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let feed = GatewaySource::new(&setup.name, rest, bot, setup.state.clone())
            .await
            .map_err(|e| {
                setup.invalid(
                    "",
                    format!(
                        "the Discord session cannot be read: {e}; check the store and start again"
                    ),
                )
            })?;
        let source = InboundSource::Pushed(Arc::new(feed));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(
                who.map_or_else(|| "Discord bot".to_owned(), |n| format!("Discord bot {n}")),
            )
            .with_platform_url(settings.api_base.clone(), false)
            .with_preview_stale_after(Duration::from_secs(settings.preview_stale_after_s)))
    }
}

/// `GET /users/@me`: a refused token stops the start naming the setting; an unreachable API is
/// a warning (the Gateway feed retries on its own).
async fn check_token(
    setup: &ChannelSetup,
    settings: &DiscordSettings,
    rest: &Rest,
    bot: &BotCell,
) -> Result<Option<String>, SetupError> {
    match rest
        .call(Method::GET, "GET /users/@me", "", "/users/@me", None)
        .await
    {
        Ok(Some(me)) => {
            if let Some(id) = me["id"].as_str() {
                bot.set(id);
            }
            Ok(me["username"].as_str().map(str::to_owned))
        }
        Ok(None) => Ok(None),
        Err(error @ CallError::Refused { .. }) if error.status() == Some(401) => Err(setup
            .invalid(
                "token_env",
                format!(
                    "Discord refused the token in {} (401): copy the bot token from the Developer \
                 Portal (Bot → Reset Token), and check api_base ({})",
                    settings.token_env,
                    rest.base()
                ),
            )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "GET /users/@me failed; the token is checked again on use");
            Ok(None)
        }
    }
}

#[async_trait]
impl ChannelFactory for DiscordFactory {
    fn kind(&self) -> &str {
        "discord"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: DiscordSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        self.build_with_secrets(&setup, token).await
    }
}
