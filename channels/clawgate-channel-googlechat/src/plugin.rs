//! `[[channels]] kind = "googlechat"`: the settings of one Chat app, checked at start, and the
//! plugin built from them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;

use crate::adapter::GoogleChatAdapter;
use crate::auth::{ServiceAccountKey, TokenSource};
use crate::client::{ChatApi, Credentials, http_client};
use crate::receive::GoogleChatReceiver;
use crate::source::{EventsConfig, EventsFeed, EventsSource};

/// Google's Chat API endpoint.
pub const DEFAULT_API_BASE: &str = "https://chat.googleapis.com/";
/// The JWKS of the keys Google Chat signs its event tokens with.
pub const DEFAULT_CERTS_URL: &str =
    "https://www.googleapis.com/service_accounts/v1/jwk/chat@system.gserviceaccount.com";

/// `[channels.settings]` of a `googlechat` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoogleChatSettings {
    /// The environment variable holding the app's service account JSON key: access tokens are
    /// minted from it and renewed before they expire. Exactly one of this and `token_env`.
    #[serde(default)]
    pub service_account_key_env: Option<String>,
    /// The environment variable holding a ready OAuth access token (its service account's,
    /// scope `https://www.googleapis.com/auth/chat.bot`); it is never renewed here, and Google's
    /// last an hour.
    #[serde(default)]
    pub token_env: Option<String>,
    /// The address the events listener binds; the app's HTTP endpoint URL must reach it.
    pub events_listen: SocketAddr,
    /// The path the listener serves (the endpoint URL's path).
    #[serde(default = "default_events_path")]
    pub events_path: String,
    /// The `aud` of the event tokens: the Cloud project number (Chat API configuration →
    /// authentication audience "Project Number"), or the endpoint URL ("HTTP endpoint URL").
    pub audience: String,
    /// Where the signing keys of the event tokens are (a JWKS).
    #[serde(default = "default_certs_url")]
    pub certs_url: String,
    /// The Chat API endpoint: Google's, or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// The app's own user (`users/…`): its messages are never answered.
    #[serde(default)]
    pub app_user: Option<String>,
    /// Spaces answered (`spaces/…`); empty: every space the app is in.
    #[serde(default)]
    pub allowed_spaces: Vec<String>,
    /// Answer a message in a space in its thread (direct messages answer at top level).
    #[serde(default = "default_true")]
    pub reply_in_thread: bool,
    /// How long one API call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_events_path() -> String {
    "/googlechat/events".into()
}
fn default_certs_url() -> String {
    DEFAULT_CERTS_URL.into()
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_true() -> bool {
    true
}
fn default_request_timeout_ms() -> u64 {
    10_000
}

/// The secret a `googlechat` account authenticates with, as read from its variable.
#[derive(Debug, Clone)]
pub enum GoogleChatCredentials {
    /// The content of `service_account_key_env`: a service account's JSON key.
    ServiceAccountKey(Secret),
    /// The content of `token_env`: an OAuth access token.
    AccessToken(Secret),
}

/// Builds `googlechat` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct GoogleChatFactory;

#[async_trait]
impl ChannelFactory for GoogleChatFactory {
    fn kind(&self) -> &str {
        "googlechat"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: GoogleChatSettings = setup.settings()?;
        let credentials = match credential_setting(&setup, &settings)? {
            ("service_account_key_env", var) => GoogleChatCredentials::ServiceAccountKey(
                setup.secret("service_account_key_env", var)?,
            ),
            (_, var) => GoogleChatCredentials::AccessToken(setup.secret("token_env", var)?),
        };
        self.build_with_secrets(&setup, credentials).await
    }
}

/// The one credential setting given, and the variable it names.
fn credential_setting<'a>(
    setup: &ChannelSetup,
    settings: &'a GoogleChatSettings,
) -> Result<(&'static str, &'a str), SetupError> {
    match (&settings.service_account_key_env, &settings.token_env) {
        (Some(key), None) => Ok(("service_account_key_env", key)),
        (None, Some(token)) => Ok(("token_env", token)),
        (Some(_), Some(_)) => Err(setup.invalid(
            "token_env",
            "set one of service_account_key_env (a service account JSON key: tokens are minted \
             and renewed) and token_env (a ready access token), not both",
        )),
        (None, None) => Err(setup.invalid(
            "service_account_key_env",
            "the app's credentials are needed: service_account_key_env names the variable \
             holding its service account JSON key (or token_env one holding an access token)",
        )),
    }
}

fn check_url(setup: &ChannelSetup, key: &str, url: &str) -> Result<(), SetupError> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err(setup.invalid(key, format!("{url:?} is not an http(s) URL")));
    }
    if url.starts_with("https://") && !cfg!(feature = "rustls") {
        return Err(setup.invalid(
            key,
            "this build speaks plain HTTP only: build clawgate-channel-googlechat with its \
             `rustls` feature (on by default) to reach Google",
        ));
    }
    Ok(())
}

impl GoogleChatFactory {
    /// Builds the account of `setup` with its `credentials` given (the gateway reads them from
    /// the variable the settings name; they must be of the kind the settings name).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        credentials: GoogleChatCredentials,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: GoogleChatSettings = setup.settings()?;
        let (setting, var) = credential_setting(setup, &settings)?;
        check_url(setup, "api_base", &settings.api_base)?;
        check_url(setup, "certs_url", &settings.certs_url)?;
        if !settings.events_path.starts_with('/') {
            return Err(setup.invalid("events_path", "a path starts with /"));
        }
        if settings.audience.trim().is_empty() {
            return Err(setup.invalid(
                "audience",
                "the event tokens' audience is needed: the Cloud project number (or the \
                 endpoint URL, as the Chat API's connection settings say)",
            ));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let http = http_client();
        let credentials = match (setting, credentials) {
            ("token_env", GoogleChatCredentials::AccessToken(token)) => {
                if token.expose().is_empty() {
                    return Err(setup.invalid(
                        "token_env",
                        format!("{var} is empty: it holds the app's OAuth access token"),
                    ));
                }
                Credentials::Static(token)
            }
            ("service_account_key_env", GoogleChatCredentials::ServiceAccountKey(key)) => {
                let key = ServiceAccountKey::parse(key.expose())
                    .map_err(|e| setup.invalid("service_account_key_env", format!("{var} {e}")))?;
                check_url(setup, "service_account_key_env", &key.token_uri)?;
                Credentials::ServiceAccount(Arc::new(TokenSource::new(
                    key,
                    var,
                    http.clone(),
                    timeout,
                    setup.clock().clone(),
                )))
            }
            (setting, _) => {
                return Err(setup.invalid(
                    setting,
                    "the credentials given are not of the kind this setting names",
                ));
            }
        };
        let api = ChatApi::new(&settings.api_base, credentials, http, timeout);
        let adapter = Arc::new(GoogleChatAdapter::new(&setup.name, api));
        let receiver = Arc::new(GoogleChatReceiver::new(
            &setup.name,
            settings.allowed_spaces.iter().cloned(),
            settings.reply_in_thread,
            settings.app_user.clone(),
        ));
        let source = Arc::new(EventsSource::new(
            EventsConfig {
                listen: settings.events_listen,
                path: settings.events_path.clone(),
                audience: settings.audience.clone(),
                certs_url: settings.certs_url.clone(),
                // Chat's answer deadline for HTTP events is not documented in the material read;
                // a record takes milliseconds, so a short wait loses nothing.
                answer_deadline: Duration::from_secs(10),
            },
            setup.clock().clone(),
        ));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(
                receiver,
                InboundSource::Pushed(Arc::new(EventsFeed(source))),
            )
            .with_description(format!(
                "Google Chat app, events on {}{}",
                settings.events_listen, settings.events_path
            ))
            .with_platform_url(settings.api_base.clone(), false))
    }
}
