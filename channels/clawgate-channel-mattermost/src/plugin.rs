//! `[[channels]] kind = "mattermost"`: the settings of one bot account, checked at start (the
//! token with `GET /api/v4/users/me`), and the plugin built from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use reqwest::Method;
use serde::Deserialize;
use tracing::warn;

use crate::adapter::{BotCell, MattermostAdapter};
use crate::client::{Api, CallError};
use crate::receive::MattermostReceiver;
use crate::source::{SocketSource, import_legacy_record};

/// `[channels.settings]` of a `mattermost` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MattermostSettings {
    /// The server URL (`https://chat.example.com`).
    pub url: String,
    /// The environment variable holding the bot access token.
    pub token_env: String,
    /// In channels, answer only posts mentioning `@<bot username>` (DMs are always answered).
    #[serde(default = "default_true")]
    pub require_mention: bool,
    /// Channels answered (ids); empty: every channel the bot is a member of.
    #[serde(default)]
    pub allowed_channels: Vec<String>,
    /// How long a resend is trusted to be deduped by its `pending_post_id` (the server keeps it
    /// 30 s in memory; this stays below it).
    #[serde(default = "default_pending_window_s")]
    pub pending_window_s: u64,
    /// How far back a reconciliation lists a channel's posts when it knows nothing else.
    #[serde(default = "default_reconcile_lookback_s")]
    pub reconcile_lookback_s: u64,
    /// How long one REST call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// The longest rate-limit wait inside one send; longer ones are retried later.
    #[serde(default = "default_max_rate_limit_wait_ms")]
    pub max_rate_limit_wait_ms: u64,
    /// A draft older than this gets a fresh final (so the answer lands at the bottom).
    #[serde(default = "default_preview_stale_after_s")]
    pub preview_stale_after_s: u64,
}

fn default_true() -> bool {
    true
}
fn default_pending_window_s() -> u64 {
    20
}
fn default_reconcile_lookback_s() -> u64 {
    86_400
}
fn default_request_timeout_ms() -> u64 {
    15_000
}
fn default_max_rate_limit_wait_ms() -> u64 {
    5_000
}
fn default_preview_stale_after_s() -> u64 {
    300
}

/// Builds `mattermost` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct MattermostFactory;

impl MattermostFactory {
    /// Builds the account of `setup` with its bot `token` given (the gateway reads it from the
    /// variable `token_env` names).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: MattermostSettings = setup.settings()?;
        let url = settings.url.trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(setup.invalid(
                "url",
                format!(
                    "{:?} is not an http(s) URL of a Mattermost server",
                    settings.url
                ),
            ));
        }
        if url.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "url",
                "this build speaks plain HTTP only: build clawgate-channel-mattermost with its \
                 `rustls` feature (on by default) to reach an https:// server",
            ));
        }
        if settings.pending_window_s == 0 || settings.pending_window_s >= 30 {
            return Err(setup.invalid(
                "pending_window_s",
                "must be 1-29 seconds: the server forgets a pending_post_id after 30 s",
            ));
        }
        let api = Api::new(
            url,
            token,
            Duration::from_millis(settings.request_timeout_ms.max(1)),
            Duration::from_millis(settings.max_rate_limit_wait_ms),
        );
        let bot = Arc::new(BotCell::default());
        let who = check_token(setup, &settings, &api, &bot).await?;
        let adapter = Arc::new(MattermostAdapter::new(
            &setup.name,
            api.clone(),
            bot.clone(),
            Duration::from_secs(settings.pending_window_s),
            Duration::from_secs(settings.reconcile_lookback_s.max(60)),
            setup.state.clone(),
        ));
        let receiver = Arc::new(MattermostReceiver::new(
            &setup.name,
            bot.clone(),
            settings.require_mention,
            settings.allowed_channels.clone(),
        ));
        import_legacy_record(&setup.state, &setup.legacy, &setup.name)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let feed = SocketSource::new(&setup.name, api, bot, setup.state.clone())
            .await
            .map_err(|e| {
                setup.invalid(
                    "",
                    format!(
                        "the Mattermost WebSocket record cannot be read: {e}; check the store and \
                         start again"
                    ),
                )
            })?;
        let source = InboundSource::Pushed(Arc::new(feed));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(who.map_or_else(
                || "Mattermost bot".to_owned(),
                |n| format!("Mattermost bot @{n}"),
            ))
            .with_platform_url(url.to_owned(), false)
            .with_preview_stale_after(Duration::from_secs(settings.preview_stale_after_s)))
    }
}

/// `GET /api/v4/users/me`: a refused token stops the start naming the setting; an unreachable
/// server is a warning (the WebSocket feed retries on its own).
async fn check_token(
    setup: &ChannelSetup,
    settings: &MattermostSettings,
    api: &Api,
    bot: &BotCell,
) -> Result<Option<String>, SetupError> {
    match api.call(Method::GET, "/users/me", None).await {
        Ok(me) => {
            let name = me["username"].as_str().map(str::to_owned);
            if let (Some(id), Some(name)) = (me["id"].as_str(), &name) {
                bot.set(id, name);
            }
            Ok(name)
        }
        Err(error @ CallError::Refused { .. }) if error.status() == Some(401) => Err(setup
            .invalid(
                "token_env",
                format!(
                    "Mattermost refused the token in {} (401): create a bot access token \
                     (Integrations → Bot Accounts → Create New Token), and check url ({})",
                    settings.token_env,
                    api.server()
                ),
            )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "GET /users/me failed; the token is checked again on use");
            Ok(None)
        }
    }
}

#[async_trait]
impl ChannelFactory for MattermostFactory {
    fn kind(&self) -> &str {
        "mattermost"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: MattermostSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        self.build_with_secrets(&setup, token).await
    }
}
