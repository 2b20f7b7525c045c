//! `[[channels]] kind = "teams"`: the settings of one Teams bot, checked at start, and the
//! plugin built from them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;

use crate::adapter::TeamsAdapter;
use crate::auth::TokenSource;
use crate::client::{ConnectorApi, http_client};
use crate::receive::TeamsReceiver;
use crate::references::References;
use crate::source::{EndpointConfig, MessagesEndpoint, MessagesFeed};

/// The Bot Framework's token endpoint (multi-tenant bots).
pub const DEFAULT_TOKEN_URL: &str =
    "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token";
/// The OpenID configuration of the keys the Bot Framework signs activities with.
pub const DEFAULT_OPENID_URL: &str =
    "https://login.botframework.com/v1/.well-known/openidconfiguration";

/// `[channels.settings]` of a `teams` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamsSettings {
    /// The bot's Microsoft App ID (its Entra app registration's client id).
    pub app_id: String,
    /// The environment variable holding the app's client secret.
    pub app_password_env: String,
    /// The address the messaging endpoint binds; the bot's messaging endpoint URL must reach it.
    pub listen: SocketAddr,
    /// The path the endpoint serves (the messaging endpoint URL's path).
    #[serde(default = "default_path")]
    pub path: String,
    /// Where access tokens come from. A single-tenant bot uses its tenant's:
    /// `https://login.microsoftonline.com/<tenant id>/oauth2/v2.0/token`.
    #[serde(default = "default_token_url")]
    pub token_url: String,
    /// The OpenID configuration naming the activity signing keys.
    #[serde(default = "default_openid_url")]
    pub openid_url: String,
    /// The service URL for a conversation no activity has come from yet (proactive sends);
    /// without it the bot sends only where Teams wrote to it first.
    #[serde(default)]
    pub service_url: Option<String>,
    /// Conversations answered (`a:…`, `19:…`); empty: every conversation the bot is in.
    #[serde(default)]
    pub allowed_conversations: Vec<String>,
    /// Previews in one-on-one chats as Teams streams (else as a message updated in place).
    #[serde(default = "default_true")]
    pub streaming: bool,
    /// How long one call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_path() -> String {
    "/api/messages".into()
}
fn default_token_url() -> String {
    DEFAULT_TOKEN_URL.into()
}
fn default_openid_url() -> String {
    DEFAULT_OPENID_URL.into()
}
fn default_true() -> bool {
    true
}
fn default_request_timeout_ms() -> u64 {
    10_000
}

/// Builds `teams` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct TeamsFactory;

#[async_trait]
impl ChannelFactory for TeamsFactory {
    fn kind(&self) -> &str {
        "teams"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: TeamsSettings = setup.settings()?;
        let password = setup.secret("app_password_env", &settings.app_password_env)?;
        self.build_with_secrets(&setup, password).await
    }
}

fn check_url(setup: &ChannelSetup, key: &str, url: &str) -> Result<(), SetupError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(setup.invalid(key, format!("{url:?} is not an http(s) URL")));
    }
    if url.starts_with("https://") && !cfg!(feature = "rustls") {
        return Err(setup.invalid(
            key,
            "this build speaks plain HTTP only: build clawgate-channel-teams with its `rustls` \
             feature (on by default) to reach Microsoft",
        ));
    }
    Ok(())
}

impl TeamsFactory {
    /// Builds the account of `setup` with its client secret given (the gateway reads it from
    /// the variable `app_password_env` names).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        password: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: TeamsSettings = setup.settings()?;
        if settings.app_id.trim().is_empty() {
            return Err(setup.invalid(
                "app_id",
                "the bot's Microsoft App ID is needed (Azure portal → the Azure Bot → \
                 Configuration)",
            ));
        }
        if password.expose().is_empty() {
            return Err(setup.invalid(
                "app_password_env",
                format!(
                    "{} is empty: it holds the app's client secret",
                    settings.app_password_env
                ),
            ));
        }
        check_url(setup, "token_url", &settings.token_url)?;
        check_url(setup, "openid_url", &settings.openid_url)?;
        if let Some(url) = &settings.service_url {
            check_url(setup, "service_url", url)?;
        }
        if !settings.path.starts_with('/') {
            return Err(setup.invalid("path", "a path starts with /"));
        }
        let references = References::open(setup.state.clone(), &setup.legacy)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let http = http_client();
        let tokens = Arc::new(TokenSource::new(
            &settings.token_url,
            &settings.app_id,
            password,
            &settings.app_password_env,
            http.clone(),
            timeout,
        ));
        // A wrong secret or app id stops the start, naming the setting, not the first reply.
        if let Err(failure) = tokens.token().await {
            let error = failure.into_send_error(&settings.app_password_env);
            if error.kind == clawgate_types::DeliveryFailureKind::Auth {
                return Err(setup.invalid("app_password_env", error.message));
            }
        }
        let api = ConnectorApi::new(tokens, http, timeout);
        let adapter = Arc::new(TeamsAdapter::new(
            &setup.name,
            api,
            references.clone(),
            settings.service_url.clone(),
            settings.streaming,
        ));
        let receiver = Arc::new(TeamsReceiver::new(
            &setup.name,
            &settings.app_id,
            settings.allowed_conversations.iter().cloned(),
        ));
        let endpoint = Arc::new(MessagesEndpoint::new(
            EndpointConfig {
                listen: settings.listen,
                path: settings.path.clone(),
                app_id: settings.app_id.clone(),
                openid_url: settings.openid_url.clone(),
                // A record takes milliseconds; the Bot Framework's own wait is not in the
                // material read.
                answer_deadline: Duration::from_secs(10),
            },
            references,
        ));
        let plugin = ChannelPlugin::new(adapter)
            .with_inbound(
                receiver,
                InboundSource::Pushed(Arc::new(MessagesFeed(endpoint))),
            )
            .with_description(format!(
                "Teams bot {}, messaging endpoint on {}{}",
                settings.app_id, settings.listen, settings.path
            ));
        // Each conversation has its own service URL; only a configured one names a place.
        Ok(match &settings.service_url {
            Some(url) => plugin.with_platform_url(url.clone(), false),
            None => plugin,
        })
    }
}
