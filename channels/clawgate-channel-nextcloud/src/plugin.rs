//! `[[channels]] kind = "nextcloud"`: the settings of one Talk account — a webhook bot
//! (`mode = "bot"`) or a Talk user (`mode = "user"`) — checked at start, and the plugin built
//! from them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;
use tracing::{info, warn};

use crate::adapter::{MAX_MESSAGE_CHARS, Mode, TalkAdapter};
use crate::journal::{Journal, import_legacy};
use crate::ocs::{CallError, TalkApi};
use crate::poll::{ChatPoller, PollConfig};
use crate::receive::TalkReceiver;
use crate::webhook::{WebhookConfig, WebhookSource};

/// Which Talk API an account speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TalkMode {
    /// A webhook bot (`occ talk:bot:install`): signed webhooks in, signed bot messages out.
    Bot,
    /// A Talk user with an app password: the chat long poll in, chat messages out.
    User,
}

/// `[channels.settings]` of a `nextcloud` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextcloudSettings {
    /// The Nextcloud server (`https://cloud.example`), or a simulator.
    pub base_url: String,
    /// `bot` or `user`.
    pub mode: TalkMode,
    /// Bot mode: the environment variable holding the bot's shared secret (40-128 characters,
    /// as given to `occ talk:bot:install`).
    #[serde(default)]
    pub bot_secret_env: Option<String>,
    /// Bot mode: the address the webhook listener binds; the bot's URL must reach it.
    #[serde(default)]
    pub webhook_listen: Option<SocketAddr>,
    /// Bot mode: the path the listener serves.
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// Bot mode: how long a webhook waits for the durable record before answering 503 (Talk
    /// waits 5 s and never retries).
    #[serde(default = "default_answer_deadline_ms")]
    pub answer_deadline_ms: u64,
    /// User mode: the Nextcloud user id.
    #[serde(default)]
    pub user: Option<String>,
    /// User mode: the environment variable holding the user's app password.
    #[serde(default)]
    pub app_password_env: Option<String>,
    /// User mode: the conversation tokens to answer in; empty: every conversation the user is
    /// in.
    #[serde(default)]
    pub conversations: Vec<String>,
    /// User mode: the long poll's `timeout` in seconds (Talk allows up to 60).
    #[serde(default = "default_poll_timeout_s")]
    pub poll_timeout_s: u64,
    /// User mode: messages per poll (`limit`, Talk allows up to 200).
    #[serde(default = "default_poll_limit")]
    pub poll_limit: u32,
    /// User mode: how far this machine's clock and the server's may differ (a lost answer's
    /// absence is proven only by history older than the attempt less this).
    #[serde(default = "default_clock_slack_ms")]
    pub clock_slack_ms: u64,
    /// User mode: how many pages of 200 messages a lost answer is looked for in.
    #[serde(default = "default_history_pages")]
    pub history_pages: u32,
    /// The longest message sent; longer replies are split (Talk's limit is 32000).
    #[serde(default = "default_max_message_chars")]
    pub max_message_chars: u32,
    /// How long one API call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_webhook_path() -> String {
    "/nextcloud/webhook".into()
}
fn default_answer_deadline_ms() -> u64 {
    4_000
}
fn default_poll_timeout_s() -> u64 {
    30
}
fn default_poll_limit() -> u32 {
    100
}
fn default_clock_slack_ms() -> u64 {
    300_000
}
fn default_history_pages() -> u32 {
    10
}
fn default_max_message_chars() -> u32 {
    MAX_MESSAGE_CHARS
}
fn default_request_timeout_ms() -> u64 {
    10_000
}

/// The secret of one account, as the variable the settings name holds it.
#[derive(Clone)]
pub enum NextcloudSecret {
    /// Bot mode: the shared secret.
    BotSecret(Secret),
    /// User mode: the app password.
    AppPassword(Secret),
}

impl std::fmt::Debug for NextcloudSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NextcloudSecret::BotSecret(_) => "BotSecret(..)",
            NextcloudSecret::AppPassword(_) => "AppPassword(..)",
        })
    }
}

/// Builds `nextcloud` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct NextcloudFactory;

#[async_trait]
impl ChannelFactory for NextcloudFactory {
    fn kind(&self) -> &str {
        "nextcloud"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: NextcloudSettings = setup.settings()?;
        let secret = match settings.mode {
            TalkMode::Bot => {
                let env = settings.bot_secret_env.as_deref().ok_or_else(|| {
                    setup.invalid("bot_secret_env", "bot mode needs the bot's shared secret")
                })?;
                NextcloudSecret::BotSecret(setup.secret("bot_secret_env", env)?)
            }
            TalkMode::User => {
                let env = settings.app_password_env.as_deref().ok_or_else(|| {
                    setup.invalid("app_password_env", "user mode needs an app password")
                })?;
                NextcloudSecret::AppPassword(setup.secret("app_password_env", env)?)
            }
        };
        self.build_with_secret(&setup, secret).await
    }
}

impl NextcloudFactory {
    /// Builds the account of `setup` with its secret given (the gateway reads it from the
    /// variable the settings name).
    pub async fn build_with_secret(
        &self,
        setup: &ChannelSetup,
        secret: NextcloudSecret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: NextcloudSettings = setup.settings()?;
        let base = settings.base_url.as_str();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(setup.invalid("base_url", format!("{base:?} is not an http(s) URL")));
        }
        if base.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "base_url",
                "this build speaks plain HTTP only: build clawgate-channel-nextcloud with its \
                 `rustls` feature (on by default) to reach an https:// server",
            ));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        match (settings.mode, secret) {
            (TalkMode::Bot, NextcloudSecret::BotSecret(secret)) => {
                bot(setup, &settings, secret, timeout)
            }
            (TalkMode::User, NextcloudSecret::AppPassword(password)) => {
                user(setup, &settings, password, timeout).await
            }
            (mode, _) => Err(setup.invalid(
                "mode",
                format!("the secret given does not belong to mode {mode:?}"),
            )),
        }
    }
}

fn bot(
    setup: &ChannelSetup,
    settings: &NextcloudSettings,
    secret: Secret,
    timeout: Duration,
) -> Result<ChannelPlugin, SetupError> {
    let length = secret.expose().chars().count();
    if !(40..=128).contains(&length) {
        return Err(setup.invalid(
            "bot_secret_env",
            format!(
                "a Talk bot secret is 40 to 128 characters (occ talk:bot:install), this one is \
                 {length}"
            ),
        ));
    }
    let listen = settings.webhook_listen.ok_or_else(|| {
        setup.invalid(
            "webhook_listen",
            "bot mode needs the address Talk's webhooks reach",
        )
    })?;
    if !settings.webhook_path.starts_with('/') {
        return Err(setup.invalid("webhook_path", "a path starts with /"));
    }
    if settings.answer_deadline_ms >= 5_000 {
        return Err(setup.invalid(
            "answer_deadline_ms",
            "Talk waits 5000 ms for a webhook's answer: the deadline must be shorter",
        ));
    }
    let api = TalkApi::new(&settings.base_url, timeout, None);
    let adapter = TalkAdapter::new(
        &setup.name,
        api.clone(),
        Mode::Bot {
            secret: secret.clone(),
        },
        settings.max_message_chars,
        setup.clock().clone(),
    );
    let source = InboundSource::Pushed(Arc::new(WebhookSource::new(WebhookConfig {
        listen,
        path: settings.webhook_path.clone(),
        secret,
        answer_deadline: Duration::from_millis(settings.answer_deadline_ms.max(1)),
    })));
    Ok(ChannelPlugin::new(Arc::new(adapter))
        .with_inbound(Arc::new(TalkReceiver::new(&setup.name, None)), source)
        .with_description(format!(
            "Nextcloud Talk bot on {}, webhook on {listen}",
            api.base()
        ))
        .with_platform_url(api.base().to_owned(), false))
}

async fn user(
    setup: &ChannelSetup,
    settings: &NextcloudSettings,
    password: Secret,
    timeout: Duration,
) -> Result<ChannelPlugin, SetupError> {
    let user = settings
        .user
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| setup.invalid("user", "user mode needs the Nextcloud user id"))?;
    if !(1..=60).contains(&settings.poll_timeout_s) {
        return Err(setup.invalid("poll_timeout_s", "Talk long-polls 1 to 60 seconds"));
    }
    if !(1..=200).contains(&settings.poll_limit) {
        return Err(setup.invalid("poll_limit", "Talk pages 1 to 200 messages"));
    }
    // The attempt journal and the kept start of the chat live in the gateway's store; the
    // directory an earlier release kept them in (named after the channel) is imported once.
    let journal = Journal::open(&setup.state)
        .await
        .map_err(|e| setup.invalid("", e.to_string()))?;
    import_legacy(
        &format!("{}.talk", setup.name),
        &setup.legacy,
        &setup.state,
        &journal,
        setup.clock().now_ms(),
    )
    .await
    .map_err(|e| setup.invalid("", e.to_string()))?;
    let api = TalkApi::new(&settings.base_url, timeout, Some((user.clone(), password)));
    check_user(setup, settings, &api, &user).await?;
    let adapter = TalkAdapter::new(
        &setup.name,
        api.clone(),
        Mode::User {
            user: user.clone(),
            journal: Arc::new(journal),
            clock_slack: Duration::from_millis(settings.clock_slack_ms),
            history_pages: settings.history_pages.max(1),
        },
        settings.max_message_chars,
        setup.clock().clone(),
    );
    let poller = ChatPoller::new(
        api.clone(),
        PollConfig {
            conversations: settings.conversations.clone(),
            timeout_s: settings.poll_timeout_s,
            limit: settings.poll_limit,
            state: setup.state.clone(),
        },
    );
    if let Err(error) = poller.start_at_present().await {
        warn!(channel = %setup.name, error = ?error, "where the chat starts could not be read; read again on the first poll");
    }
    Ok(ChannelPlugin::new(Arc::new(adapter))
        .with_inbound(
            Arc::new(TalkReceiver::new(&setup.name, Some(user.clone()))),
            InboundSource::Polling(Arc::new(poller)),
        )
        .with_description(format!("Nextcloud Talk user {user} on {}", api.base()))
        .with_platform_url(api.base().to_owned(), false))
}

/// Checks the app password with `GET /ocs/v2.php/cloud/user`. A refusal stops the start
/// naming the setting; an unreachable server is only a warning (checked again on use).
async fn check_user(
    setup: &ChannelSetup,
    settings: &NextcloudSettings,
    api: &TalkApi,
    user: &str,
) -> Result<(), SetupError> {
    match api
        .call(Method::GET, "/ocs/v2.php/cloud/user", &[], None, &[], None)
        .await
    {
        Ok(answer) => {
            let id = answer
                .data
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if !id.eq_ignore_ascii_case(user) {
                return Err(setup.invalid(
                    "user",
                    format!("the app password belongs to {id:?}, not {user:?}"),
                ));
            }
            info!(channel = %setup.name, user, "Nextcloud Talk app password accepted");
            Ok(())
        }
        Err(CallError::Refused { status, .. }) if status == 401 || status == 403 => Err(setup
            .invalid(
                "app_password_env",
                format!(
                    "Nextcloud refused the app password in {} for user {user} (HTTP {status}; \
                     base_url is {}): create a new app password under Settings → Security",
                    settings.app_password_env.as_deref().unwrap_or_default(),
                    settings.base_url
                ),
            )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "the app password could not be checked; it is used again later");
            Ok(())
        }
    }
}
