//! `[[channels]] kind = "telegram"`: the settings of one bot account, checked at start (the
//! token with `getMe`), and the plugin built from them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use tracing::warn;

use crate::adapter::TelegramAdapter;
use crate::client::{BotApi, CallError};
use crate::migrations::{self, Migrations};
use crate::receive::TelegramReceiver;
use crate::source::{MAX_POLL_TIMEOUT_S, PollingSource, WebhookConfig, WebhookSource};
use crate::wire::BotUser;

/// Telegram's own Bot API endpoint.
pub const DEFAULT_API_BASE: &str = "https://api.telegram.org";

/// How updates arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `getUpdates` long polling (no public address needed).
    #[default]
    Polling,
    /// Telegram posts to a webhook.
    Webhook,
}

/// `[channels.settings]` of a `telegram` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelegramSettings {
    /// The environment variable holding the bot token (from @BotFather).
    pub token_env: String,
    /// The Bot API endpoint: Telegram's, a local Bot API server, or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// `polling` (default) or `webhook`.
    #[serde(default)]
    pub mode: Mode,
    /// Long-poll wait in seconds (at most 50).
    #[serde(default = "default_poll_timeout_s")]
    pub poll_timeout_s: u64,
    /// Webhook mode: the address the listener binds.
    #[serde(default)]
    pub webhook_listen: Option<SocketAddr>,
    /// Webhook mode: the public HTTPS URL Telegram posts to (it must reach `webhook_listen`).
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// Webhook mode: the path the listener serves.
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// Webhook mode: the environment variable holding the secret token Telegram echoes in
    /// `X-Telegram-Bot-Api-Secret-Token` (1-256 of `A-Z a-z 0-9 _ -`).
    #[serde(default)]
    pub webhook_secret_env: Option<String>,
    /// A preview older than this is not turned into the final: a fresh final is sent and the
    /// preview deleted (so the answer shows at the bottom of the chat).
    #[serde(default = "default_preview_stale_after_s")]
    pub preview_stale_after_s: u64,
    /// Previews in private chats as native drafts (`sendMessageDraft`) when Telegram allows.
    #[serde(default = "default_true")]
    pub drafts: bool,
    /// Show "typing…" while the agent works.
    #[serde(default = "default_true")]
    pub typing: bool,
    /// Chats answered (ids); empty: every chat the bot is in.
    #[serde(default)]
    pub allowed_chats: Vec<i64>,
    /// How long one Bot API call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_poll_timeout_s() -> u64 {
    30
}
fn default_webhook_path() -> String {
    "/telegram".into()
}
fn default_preview_stale_after_s() -> u64 {
    60
}
fn default_true() -> bool {
    true
}
fn default_request_timeout_ms() -> u64 {
    15_000
}

/// The shortest webhook secret accepted: Telegram takes one character, but the secret is all
/// that tells Telegram's deliveries from anyone's POST, so it must not be guessable.
const MIN_WEBHOOK_SECRET: usize = 16;

/// Whether `secret` is a valid `secret_token` (Telegram's alphabet, 1-256 characters) long
/// enough to be one.
fn valid_webhook_secret(secret: &str) -> bool {
    (MIN_WEBHOOK_SECRET..=256).contains(&secret.len())
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Builds `telegram` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct TelegramFactory;

/// The bot behind a channel, as `getMe` named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The bot's user id.
    pub id: i64,
    /// Its `@username`.
    pub username: Option<String>,
}

/// Checks the token: `getMe`. A refused token stops the start with an error naming the
/// setting; an unreachable Bot API is only a warning (the gateway retries on its own).
async fn check_token(
    setup: &ChannelSetup,
    settings: &TelegramSettings,
    api: &BotApi,
) -> Result<Option<BotIdentity>, SetupError> {
    match api
        .call::<BotUser>("getMe", &serde_json::json!({}), Duration::ZERO)
        .await
    {
        Ok(bot) => Ok(Some(BotIdentity {
            id: bot.id,
            username: bot.username,
        })),
        Err(CallError::Refused {
            status: status @ (401 | 404),
            description,
            ..
        }) => Err(setup.invalid(
            "token_env",
            format!(
                "Telegram refused the token in {} ({status} {description}): check the \
                 token from @BotFather, and api_base ({})",
                settings.token_env,
                api.base()
            ),
        )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "getMe failed; the bot's token is checked again on use");
            Ok(None)
        }
    }
}

#[async_trait]
impl ChannelFactory for TelegramFactory {
    fn kind(&self) -> &str {
        "telegram"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: TelegramSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        let webhook_secret = match (settings.mode, settings.webhook_secret_env.as_deref()) {
            (Mode::Webhook, Some(variable)) => Some(setup.secret("webhook_secret_env", variable)?),
            _ => None,
        };
        self.build_with_secrets(&setup, token, webhook_secret).await
    }
}

impl TelegramFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name): the bot `token`, and the webhook's `secret_token` in
    /// webhook mode.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
        webhook_secret: Option<Secret>,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: TelegramSettings = setup.settings()?;
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
                "this build speaks plain HTTP only: build clawgate-channel-telegram with its \
                 `rustls` feature (on by default) to reach an https:// Bot API",
            ));
        }
        if settings.poll_timeout_s > MAX_POLL_TIMEOUT_S {
            return Err(setup.invalid(
                "poll_timeout_s",
                format!("Telegram holds a long poll at most {MAX_POLL_TIMEOUT_S} s"),
            ));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = BotApi::new(&settings.api_base, token, timeout);
        let source = match settings.mode {
            Mode::Polling => InboundSource::Polling(Arc::new(PollingSource::new(
                api.clone(),
                settings.poll_timeout_s,
            ))),
            Mode::Webhook => InboundSource::Pushed(Arc::new(WebhookSource::new(
                api.clone(),
                webhook_config(setup, &settings, webhook_secret)?,
            ))),
        };
        migrations::import_legacy(&setup.state.book(migrations::BOOK), &setup.legacy)
            .await
            .map_err(|reason| setup.invalid("", reason))?;
        let migrations = Migrations::load(&setup.state).await.map_err(|e| {
            setup.invalid(
                "",
                format!("the chat migrations cannot be read: {e}; check the store and start again"),
            )
        })?;
        let bot = check_token(setup, &settings, &api).await?;
        let adapter = Arc::new(
            TelegramAdapter::new(&setup.name, api, Arc::new(migrations), settings.drafts)
                .with_typing(settings.typing),
        );
        let receiver = Arc::new(TelegramReceiver::new(
            &setup.name,
            settings.allowed_chats.iter().copied(),
        ));
        let who = bot.as_ref().and_then(|b| b.username.clone()).map_or_else(
            || "Telegram bot".to_owned(),
            |u| format!("Telegram bot @{u}"),
        );
        let mut plugin = ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(match settings.mode {
                Mode::Polling => format!("{who}, long polling"),
                Mode::Webhook => format!("{who}, webhook"),
            })
            .with_platform_url(settings.api_base.clone(), false)
            .with_preview_stale_after(Duration::from_secs(settings.preview_stale_after_s));
        if let Some(bot) = bot {
            plugin = plugin.with_extension(Arc::new(bot));
        }
        Ok(plugin)
    }
}

fn webhook_config(
    setup: &ChannelSetup,
    settings: &TelegramSettings,
    secret: Option<Secret>,
) -> Result<WebhookConfig, SetupError> {
    let needed = |key: &str| {
        setup.invalid(
            key,
            format!("mode = \"webhook\" needs {key} (see the Telegram channel's README)"),
        )
    };
    let listen = settings
        .webhook_listen
        .ok_or_else(|| needed("webhook_listen"))?;
    let url = settings
        .webhook_url
        .clone()
        .ok_or_else(|| needed("webhook_url"))?;
    let secret = secret.ok_or_else(|| needed("webhook_secret_env"))?;
    if !valid_webhook_secret(secret.expose()) {
        return Err(setup.invalid(
            "webhook_secret_env",
            "the webhook secret must be 16-256 characters of A-Z a-z 0-9 _ - (e.g. `openssl \
             rand -hex 16`)",
        ));
    }
    if !settings.webhook_path.starts_with('/') {
        return Err(setup.invalid("webhook_path", "a path starts with /"));
    }
    Ok(WebhookConfig {
        listen,
        path: settings.webhook_path.clone(),
        url,
        secret,
        answer_deadline: Duration::from_secs(10),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_secrets_follow_telegrams_alphabet() {
        assert!(valid_webhook_secret("abc_DEF-123_4567"));
        assert!(!valid_webhook_secret(""));
        assert!(
            !valid_webhook_secret("abc_DEF-123_456"),
            "15 characters are too few"
        );
        assert!(!valid_webhook_secret("has space"));
        assert!(!valid_webhook_secret(&"a".repeat(257)));
    }
}
