//! `[[channels]] kind = "line"`: the settings of one LINE Official Account's Messaging API
//! channel, checked at start (the token with `GET /v2/bot/info`), and the plugin built from
//! them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use serde_json::Value;
use tracing::warn;

use crate::adapter::{AfterUnknownReply, LineAdapter};
use crate::client::{CallError, MessagingApi};
use crate::journal::ReplyJournal;
use crate::receive::LineReceiver;
use crate::reply::{LINE_REPLY, LineRenderer, ReplyTokens};
use crate::source::{WebhookConfig, WebhookSource};

/// LINE's own Messaging API endpoint.
pub const DEFAULT_API_BASE: &str = "https://api.line.me";

/// `[channels.settings]` of a `line` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineSettings {
    /// The environment variable holding the channel access token (long-lived, or v2.1).
    pub token_env: String,
    /// The environment variable holding the channel secret (webhook signatures).
    pub channel_secret_env: String,
    /// The address the webhook listener binds; the channel's Webhook URL must reach it.
    pub webhook_listen: SocketAddr,
    /// The path the listener serves (the Webhook URL's path).
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// The Messaging API endpoint: LINE's, or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// Answer with a push when the reply token cannot be used (expired, used, absent). Pushes
    /// count against the monthly message quota; replies do not.
    #[serde(default = "default_true")]
    pub push: bool,
    /// A reply whose outcome is unknown: `"park"` (an operator decides; never a duplicate) or
    /// `"push"` (always an answer; a duplicate when the lost reply landed).
    #[serde(default)]
    pub after_unknown_reply: AfterUnknownReply,
    /// A reply token is used only this long after its webhook arrived (LINE guarantees one
    /// minute; the margin covers the call's own travel).
    #[serde(default = "default_reply_within_ms")]
    pub reply_within_ms: u64,
    /// How long one Messaging API call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a webhook delivery waits for the durable record before answering 500.
    #[serde(default = "default_answer_deadline_ms")]
    pub answer_deadline_ms: u64,
}

fn default_webhook_path() -> String {
    "/line/webhook".into()
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_true() -> bool {
    true
}
fn default_reply_within_ms() -> u64 {
    50_000
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_answer_deadline_ms() -> u64 {
    2_000
}

/// The bot behind a channel, as `GET /v2/bot/info` named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    /// The bot's user id (`U…`): the webhook's `destination`.
    pub user_id: String,
    /// The bot's basic id (`@…`).
    pub basic_id: Option<String>,
}

/// Builds `line` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct LineFactory;

/// Checks the token. A refused token stops the start with an error naming the setting; an
/// unreachable LINE is only a warning (the token is checked again on use).
async fn check_token(
    setup: &ChannelSetup,
    settings: &LineSettings,
    api: &MessagingApi,
) -> Result<Option<BotIdentity>, SetupError> {
    match api.bot_info().await {
        Ok(info) => {
            let field = |key: &str| info.get(key).and_then(Value::as_str).map(str::to_owned);
            Ok(field("userId").map(|user_id| BotIdentity {
                user_id,
                basic_id: field("basicId"),
            }))
        }
        Err(error @ CallError::Refused { status: 401, .. }) => Err(setup.invalid(
            "token_env",
            format!(
                "LINE refused the channel access token in {}: {} (issue one in the LINE \
                 Developers console → Messaging API → Channel access token; api_base is {})",
                settings.token_env,
                error.into_send_error("bot info").message,
                api.base()
            ),
        )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "GET /v2/bot/info failed; the token is checked again on use");
            Ok(None)
        }
    }
}

#[async_trait]
impl ChannelFactory for LineFactory {
    fn kind(&self) -> &str {
        "line"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: LineSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        let secret = setup.secret("channel_secret_env", &settings.channel_secret_env)?;
        self.build_with_secrets(&setup, token, secret).await
    }
}

impl LineFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name): the channel access `token` and the `channel_secret`.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
        channel_secret: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: LineSettings = setup.settings()?;
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
                "this build speaks plain HTTP only: build clawgate-channel-line with its \
                 `rustls` feature (on by default) to reach https://api.line.me",
            ));
        }
        if !settings.webhook_path.starts_with('/') {
            return Err(setup.invalid("webhook_path", "a path starts with /"));
        }
        if channel_secret.expose().is_empty() {
            return Err(setup.invalid(
                "channel_secret_env",
                "the channel secret is empty: copy it from the LINE Developers console → \
                 Basic settings → Channel secret",
            ));
        }
        if settings.reply_within_ms > LINE_REPLY.valid_for_ms {
            return Err(setup.invalid(
                "reply_within_ms",
                format!(
                    "LINE guarantees a reply token for {} ms only",
                    LINE_REPLY.valid_for_ms
                ),
            ));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = MessagingApi::new(&settings.api_base, token, timeout);
        let bot = check_token(setup, &settings, &api).await?;
        let journal = ReplyJournal::open(&setup.state)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        journal
            .import_legacy(&setup.legacy, &setup.name)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let tokens = ReplyTokens::new(setup.clock().clone());
        let adapter = Arc::new(LineAdapter::new(
            &setup.name,
            api,
            LineRenderer::new(tokens.clone()),
            settings.push,
            settings.after_unknown_reply,
            journal,
            setup.clock().clone(),
        ));
        let receiver = Arc::new(LineReceiver::new(
            &setup.name,
            tokens.clone(),
            settings.reply_within_ms,
        ));
        let source = InboundSource::Pushed(Arc::new(WebhookSource::new(
            WebhookConfig {
                listen: settings.webhook_listen,
                path: settings.webhook_path.clone(),
                channel_secret,
                answer_deadline: Duration::from_millis(settings.answer_deadline_ms.max(1)),
            },
            setup.clock().clone(),
        )));
        let who = bot.as_ref().map_or_else(
            || "LINE bot".to_owned(),
            |b| format!("LINE bot {}", b.basic_id.as_deref().unwrap_or(&b.user_id)),
        );
        let mut plugin = ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!("{who}, webhook on {}", settings.webhook_listen))
            .with_platform_url(settings.api_base.clone(), false)
            // The reply relation's constraints, for whoever plans replies on this channel.
            .with_extension(Arc::new(LINE_REPLY))
            .with_extension(Arc::new(tokens));
        if let Some(bot) = bot {
            plugin = plugin.with_extension(Arc::new(bot));
        }
        Ok(plugin)
    }
}
