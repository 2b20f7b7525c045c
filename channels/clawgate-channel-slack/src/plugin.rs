//! `[[channels]] kind = "slack"`: the settings of one Slack app, checked at start (the token
//! with `auth.test`), and the plugin built from them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::warn;

use crate::adapter::{Recipients, SlackAdapter};
use crate::client::{CallError, WebApi};
use crate::receive::SlackReceiver;
use crate::source::{EventsConfig, EventsSource};

/// Slack's own Web API endpoint.
pub const DEFAULT_API_BASE: &str = "https://slack.com/api/";

/// `[channels.settings]` of a `slack` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlackSettings {
    /// The environment variable holding the Bot User OAuth Token (`xoxb-…`).
    pub token_env: String,
    /// The environment variable holding the app's Signing Secret (Basic Information).
    pub signing_secret_env: String,
    /// The address the Events API listener binds; the app's Request URL must reach it.
    pub events_listen: SocketAddr,
    /// The path the listener serves (the Request URL's path).
    #[serde(default = "default_events_path")]
    pub events_path: String,
    /// The Web API endpoint: Slack's, or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// Conversations answered (ids `C…`, `G…`, `D…`); empty: every one the app is in.
    #[serde(default)]
    pub allowed_channels: Vec<String>,
    /// Answer a top-level channel message in a thread under it (DMs answer at top level).
    #[serde(default = "default_true")]
    pub reply_in_thread: bool,
    /// Previews in threads as native streams (`chat.startStream`); otherwise, and in
    /// top-level DMs, a draft message edited in place.
    #[serde(default = "default_true")]
    pub native_streams: bool,
    /// A preview older than this is not turned into the final: a fresh final is sent and the
    /// preview removed.
    #[serde(default = "default_preview_stale_after_s")]
    pub preview_stale_after_s: u64,
    /// How long one Web API call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_events_path() -> String {
    "/slack/events".into()
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_true() -> bool {
    true
}
fn default_preview_stale_after_s() -> u64 {
    300
}
fn default_request_timeout_ms() -> u64 {
    10_000
}

/// The bot behind a channel, as `auth.test` named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The workspace (`T…`).
    pub team_id: String,
    /// The bot user (`U…`).
    pub user_id: String,
    /// The bot (`B…`).
    pub bot_id: Option<String>,
}

/// Builds `slack` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct SlackFactory;

/// Checks the token: `auth.test`. A refused token stops the start with an error naming the
/// setting; an unreachable Slack is only a warning (the token is checked again on use).
async fn check_token(
    setup: &ChannelSetup,
    settings: &SlackSettings,
    api: &WebApi,
) -> Result<Option<BotIdentity>, SetupError> {
    match api.call("auth.test", &json!({})).await {
        Ok(answer) => {
            let field = |key: &str| answer.get(key).and_then(Value::as_str).map(str::to_owned);
            Ok(field("team_id")
                .zip(field("user_id"))
                .map(|(team_id, user_id)| BotIdentity {
                    team_id,
                    user_id,
                    bot_id: field("bot_id"),
                }))
        }
        Err(CallError::Refused { error, .. }) => Err(setup.invalid(
            "token_env",
            format!(
                "Slack refused the token in {} ({error}): use the app's Bot User OAuth Token \
                 (xoxb-…, OAuth & Permissions), and check api_base ({})",
                settings.token_env,
                api.base()
            ),
        )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "auth.test failed; the token is checked again on use");
            Ok(None)
        }
    }
}

#[async_trait]
impl ChannelFactory for SlackFactory {
    fn kind(&self) -> &str {
        "slack"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: SlackSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        let signing_secret = setup.secret("signing_secret_env", &settings.signing_secret_env)?;
        self.build_with_secrets(&setup, token, signing_secret).await
    }
}

impl SlackFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name): the bot `token` and the app's `signing_secret`.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
        signing_secret: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: SlackSettings = setup.settings()?;
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
                "this build speaks plain HTTP only: build clawgate-channel-slack with its \
                 `rustls` feature (on by default) to reach https://slack.com",
            ));
        }
        if !settings.events_path.starts_with('/') {
            return Err(setup.invalid("events_path", "a path starts with /"));
        }
        if signing_secret.expose().is_empty() {
            return Err(setup.invalid(
                "signing_secret_env",
                "the signing secret is empty: copy it from the app's Basic Information page",
            ));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = WebApi::new(&settings.api_base, token, timeout);
        let bot = check_token(setup, &settings, &api).await?;
        let recipients = Recipients::default();
        let adapter = Arc::new(SlackAdapter::new(
            &setup.name,
            api,
            settings.native_streams,
            bot.as_ref().map(|b| b.team_id.clone()),
            bot.as_ref().and_then(|b| b.bot_id.clone()),
            recipients.clone(),
        ));
        let receiver = Arc::new(SlackReceiver::new(
            &setup.name,
            settings.allowed_channels.iter().cloned(),
            settings.reply_in_thread,
            bot.as_ref().map(|b| b.user_id.clone()),
            recipients,
        ));
        let source = InboundSource::Pushed(Arc::new(EventsSource::new(
            EventsConfig {
                listen: settings.events_listen,
                path: settings.events_path.clone(),
                signing_secret,
                // Slack waits 3 s for the answer.
                answer_deadline: Duration::from_millis(2_500),
            },
            setup.clock().clone(),
        )));
        let who = bot.as_ref().map_or_else(
            || "Slack app".to_owned(),
            |b| format!("Slack app {} in {}", b.user_id, b.team_id),
        );
        let mut plugin = ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!("{who}, Events API on {}", settings.events_listen))
            .with_platform_url(settings.api_base.clone(), false)
            .with_preview_stale_after(Duration::from_secs(settings.preview_stale_after_s));
        if let Some(bot) = bot {
            plugin = plugin.with_extension(Arc::new(bot));
        }
        Ok(plugin)
    }
}
