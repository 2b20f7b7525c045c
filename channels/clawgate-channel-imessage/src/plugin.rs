//! `[[channels]] kind = "imessage"`: the settings of one iMessage account behind a BlueBubbles
//! server, checked at start (`GET /api/v1/server/info` with the password), and the plugin
//! built from them.

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

use crate::adapter::{EDIT_WINDOW_MS, ImessageAdapter, now_ms};
use crate::client::{BlueBubbles, CallError};
use crate::echoes::EchoCache;
use crate::journal::{JournalError, SendJournal};
use crate::receive::ImessageReceiver;
use crate::source::{SourceCounts, WebhookConfig, WebhookSource};

/// `[channels.settings]` of an `imessage` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImessageSettings {
    /// The BlueBubbles server's address (`http://mac.local:1234`, its proxy URL), or a
    /// simulator.
    pub server_url: String,
    /// The environment variable holding the server password.
    pub password_env: String,
    /// The address the webhook listener binds; the webhook URL registered in the server must
    /// reach it.
    pub webhook_listen: SocketAddr,
    /// The path the listener serves.
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// The environment variable holding the secret the registered webhook URL carries as its
    /// `token` parameter (`…/bluebubbles/webhook?token=<secret>`).
    pub webhook_token_env: String,
    /// Whether the server has the Private API (its helper bundle): edits and unsends are
    /// declared, and sends use `method: "private-api"`.
    #[serde(default)]
    pub private_api: bool,
    /// The account is the person's own Apple ID (they write from their other devices, so
    /// their messages arrive with `isFromMe: true`): own-account messages that are not
    /// echoes of our sends are answered.
    #[serde(default)]
    pub from_me_is_inbound: bool,
    /// How long a sent unit stays in the sent-echo cache.
    #[serde(default = "default_echo_ttl_ms")]
    pub echo_ttl_ms: u64,
    /// How many sent units the sent-echo cache keeps at most.
    #[serde(default = "default_echo_capacity")]
    pub echo_capacity: usize,
    /// Handles answered (`+15551234567`, `someone@icloud.com`); empty: everyone who writes.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Handles that are automated, reported as bots so the entry's `allow_bots` decides.
    #[serde(default)]
    pub bot_senders: Vec<String>,
    /// How long one call may take before its outcome counts as unknown (a text send is
    /// answered once its chat.db row exists: up to 2 minutes).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a webhook delivery waits for the durable record before answering 500.
    #[serde(default = "default_answer_deadline_ms")]
    pub answer_deadline_ms: u64,
}

fn default_webhook_path() -> String {
    "/bluebubbles/webhook".into()
}
fn default_echo_ttl_ms() -> u64 {
    120_000
}
fn default_echo_capacity() -> usize {
    512
}
fn default_request_timeout_ms() -> u64 {
    150_000
}
fn default_answer_deadline_ms() -> u64 {
    5_000
}

/// What the running account exposes to its wiring and tests: the echo cache, the journal and
/// the webhook listener's counts.
#[derive(Debug, Clone)]
pub struct ImessageAccount {
    /// The sent-echo cache.
    pub echoes: EchoCache,
    /// The send journal.
    pub journal: SendJournal,
    /// What the webhook listener dropped.
    pub counts: Arc<SourceCounts>,
    /// `server/info`'s `data`, when the server answered at start.
    pub server: Option<Value>,
}

/// Builds `imessage` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct ImessageFactory;

#[async_trait]
impl ChannelFactory for ImessageFactory {
    fn kind(&self) -> &str {
        "imessage"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: ImessageSettings = setup.settings()?;
        let password = setup.secret("password_env", &settings.password_env)?;
        let token = setup.secret("webhook_token_env", &settings.webhook_token_env)?;
        self.build_with_secrets(&setup, password, token).await
    }
}

impl ImessageFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name): the server `password` and the webhook URL's `token`.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        password: Secret,
        token: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: ImessageSettings = setup.settings()?;
        let base = settings.server_url.as_str();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(setup.invalid("server_url", format!("{base:?} is not an http(s) URL")));
        }
        if base.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "server_url",
                "this build speaks plain HTTP only: build clawgate-channel-imessage with its \
                 `rustls` feature (on by default) to reach the server over https",
            ));
        }
        if !settings.webhook_path.starts_with('/') {
            return Err(setup.invalid("webhook_path", "a path starts with /"));
        }
        if token.expose().len() < 16 {
            return Err(setup.invalid(
                "webhook_token_env",
                "the webhook token is the only proof a POST comes from the server: use at least \
                 16 random characters",
            ));
        }
        let api = BlueBubbles::new(
            base,
            password,
            Duration::from_millis(settings.request_timeout_ms.max(1)),
        );
        let server = match api.server_info().await {
            Ok(info) => {
                if settings.private_api
                    && info.get("private_api").and_then(Value::as_bool) == Some(false)
                {
                    warn!(channel = %setup.name, "private_api is set, but the server says its Private API is off: edits and unsends will be refused");
                }
                Some(info)
            }
            Err(CallError::Refused { status: 401, .. }) => {
                return Err(setup.invalid(
                    "password_env",
                    format!(
                        "the BlueBubbles server at {base} refused the password in {} (401): copy \
                         it again from the server's settings",
                        settings.password_env
                    ),
                ));
            }
            Err(error) => {
                warn!(channel = %setup.name, error = %error.describe(), "the BlueBubbles server did not answer server/info; it is tried again on use");
                None
            }
        };
        let clock = setup.clock().clone();
        let now = now_ms(clock.as_ref());
        // The journal lives in the gateway's store; an earlier release's file is imported once.
        let journal_error = |e: JournalError| SetupError::new(setup.key(""), e.to_string());
        let journal = SendJournal::open(&setup.state)
            .await
            .map_err(journal_error)?;
        journal
            .import_legacy(&setup.legacy, now)
            .await
            .map_err(journal_error)?;
        let echoes = EchoCache::new(settings.echo_ttl_ms, settings.echo_capacity);
        // Echoes of sends made before a restart are still ours.
        journal.feed(&echoes, now).await.map_err(journal_error)?;
        let counts = Arc::new(SourceCounts::default());
        let adapter = Arc::new(ImessageAdapter::new(
            &setup.name,
            api,
            journal.clone(),
            echoes.clone(),
            clock.clone(),
            settings.private_api,
        ));
        let receiver = Arc::new(ImessageReceiver::new(
            &setup.name,
            settings.from_me_is_inbound,
            settings.allowed_senders.iter().cloned(),
            settings.bot_senders.iter().cloned(),
        ));
        let source = InboundSource::Pushed(Arc::new(WebhookSource::new(
            WebhookConfig {
                listen: settings.webhook_listen,
                path: settings.webhook_path.clone(),
                token,
                from_me_is_inbound: settings.from_me_is_inbound,
                answer_deadline: Duration::from_millis(settings.answer_deadline_ms.max(1)),
            },
            echoes.clone(),
            journal.clone(),
            clock,
            counts.clone(),
        )));
        let account = ImessageAccount {
            echoes,
            journal,
            counts,
            server,
        };
        let mut plugin = ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!(
                "iMessage through BlueBubbles at {base}, webhook on {}",
                settings.webhook_listen
            ))
            .with_platform_url(base.to_owned(), false)
            .with_extension(Arc::new(account));
        if settings.private_api {
            // A preview older than the edit window cannot become the final.
            plugin =
                plugin.with_preview_stale_after(Duration::from_millis(EDIT_WINDOW_MS - 60_000));
        }
        Ok(plugin)
    }
}
