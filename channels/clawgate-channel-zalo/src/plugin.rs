//! `[[channels]] kind = "zalo"`: the settings of one Zalo Official Account, checked at start
//! (a usable access token, then `GET /v2.0/oa/getoa` with it), and the plugin built from them.

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

use crate::adapter::ZaloAdapter;
use crate::client::OaApi;
use crate::echoes::EchoBook;
use crate::receive::ZaloReceiver;
use crate::source::{WebhookConfig, WebhookSource};
use crate::tokens::{TokenError, TokenStore};
use clawgate_channel_sdk::freshness;

/// Zalo's OA API endpoint.
pub const DEFAULT_API_BASE: &str = "https://openapi.zalo.me";
/// Zalo's OAuth endpoint (access tokens).
pub const DEFAULT_OAUTH_BASE: &str = "https://oauth.zaloapp.com";

/// `[channels.settings]` of a `zalo` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZaloSettings {
    /// The Zalo app's id (Zalo for Developers → your app).
    pub app_id: String,
    /// The environment variable holding the app's secret key (the token endpoint's
    /// `secret_key` header).
    pub app_secret_env: String,
    /// The environment variable holding the OA secret key (webhook signatures: your app →
    /// Webhook → OA Secret Key).
    pub oa_secret_key_env: String,
    /// The environment variable holding the refresh token of the OA's authorization. Read to
    /// seed the account's tokens in the gateway's store; afterwards the store holds the
    /// rotated one, and a different value here (a re-authorization) replaces it.
    pub refresh_token_env: String,
    /// The address the webhook listener binds; the app's webhook URL must reach it.
    pub webhook_listen: SocketAddr,
    /// The path the listener serves (the webhook URL's path).
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// The OA API endpoint: Zalo's, or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// The OAuth endpoint: Zalo's, or a simulator.
    #[serde(default = "default_oauth_base")]
    pub oauth_base: String,
    /// People answered (OA-scoped user ids); empty: everyone who writes.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Senders that are automated (a test account driven by a script, another business's
    /// bot), reported as bots so the entry's `allow_bots` decides whether they are answered.
    #[serde(default)]
    pub bot_senders: Vec<String>,
    /// Refresh the access token once it has less than this left (a refresh interrupted by a
    /// crash then still leaves a working token for that long).
    #[serde(default = "default_refresh_ahead_ms")]
    pub refresh_ahead_ms: u64,
    /// How long one Zalo call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a webhook delivery waits for the durable record before answering 500 (Zalo
    /// wants an answer within about 2 s).
    #[serde(default = "default_answer_deadline_ms")]
    pub answer_deadline_ms: u64,
    /// How far a delivery's signed `timestamp` may be from the gateway's clock, either way,
    /// before it is refused as a replay. A redelivery is expected to keep its first
    /// `timestamp`, so one retried later than this after the event is refused too.
    #[serde(default = "default_max_signature_age_secs")]
    pub max_signature_age_secs: u64,
}

fn default_webhook_path() -> String {
    "/zalo/webhook".into()
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_oauth_base() -> String {
    DEFAULT_OAUTH_BASE.into()
}
fn default_refresh_ahead_ms() -> u64 {
    12 * 3600 * 1000
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
/// Two hours, not the usual five minutes: Zalo signs the event's `timestamp` and a redelivery
/// carries the first attempt's body (reported schedule 30 s, 5 min, 15 min, 30 min, 1 h), so a
/// shorter window would refuse Zalo's own retries after an outage and lose those events. A
/// replay within the window is an event the engine still remembers (`inbound_days`).
fn default_max_signature_age_secs() -> u64 {
    2 * 60 * 60
}
fn default_answer_deadline_ms() -> u64 {
    1_500
}

/// The Official Account behind a channel, as `getoa` named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfficialAccount {
    /// The OA's id (`recipient.id` of what people send it).
    pub oa_id: String,
    /// The OA's name.
    pub name: Option<String>,
}

/// Builds `zalo` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZaloFactory;

#[async_trait]
impl ChannelFactory for ZaloFactory {
    fn kind(&self) -> &str {
        "zalo"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: ZaloSettings = setup.settings()?;
        let app_secret = setup.secret("app_secret_env", &settings.app_secret_env)?;
        let oa_secret_key = setup.secret("oa_secret_key_env", &settings.oa_secret_key_env)?;
        let refresh_token = setup.secret("refresh_token_env", &settings.refresh_token_env)?;
        self.build_with_secrets(&setup, app_secret, oa_secret_key, refresh_token)
            .await
    }
}

fn check_base(setup: &ChannelSetup, key: &str, base: &str) -> Result<(), SetupError> {
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(setup.invalid(key, format!("{base:?} is not an http(s) URL")));
    }
    if base.starts_with("https://") && !cfg!(feature = "rustls") {
        return Err(setup.invalid(
            key,
            "this build speaks plain HTTP only: build clawgate-channel-zalo with its `rustls` \
             feature (on by default) to reach Zalo over https",
        ));
    }
    Ok(())
}

/// Gets an access token and names the OA with it. A refused refresh token or access token
/// stops the start with an error naming the setting; an unreachable Zalo is only a warning
/// (the tokens are tried again on use).
async fn check_account(
    setup: &ChannelSetup,
    settings: &ZaloSettings,
    api: &OaApi,
    tokens: &TokenStore,
) -> Result<Option<OfficialAccount>, SetupError> {
    let token = match tokens.access_token().await {
        Ok(token) => token,
        Err(error @ (TokenError::Refused { .. } | TokenError::Stranded { .. })) => {
            return Err(setup.invalid("refresh_token_env", error.to_string()));
        }
        Err(error @ (TokenError::State(_) | TokenError::Legacy(_))) => {
            return Err(SetupError::new(setup.key(""), error.to_string()));
        }
        Err(error) => {
            warn!(channel = %setup.name, %error, "no access token yet; it is tried again on use");
            return Ok(None);
        }
    };
    let mut answer = api.oa_info(&token).await;
    if let Err(crate::client::CallError::Refused(error)) = &answer
        && error.is_token_refusal()
    {
        // Revoked or expired before its time: one refresh, as a send does.
        match tokens.after_refusal(&token).await {
            Ok(fresh) => answer = api.oa_info(&fresh).await,
            Err(error @ (TokenError::Refused { .. } | TokenError::Stranded { .. })) => {
                return Err(setup.invalid("refresh_token_env", error.to_string()));
            }
            Err(error) => {
                warn!(channel = %setup.name, %error, "no access token yet; it is tried again on use");
                return Ok(None);
            }
        }
    }
    match answer {
        Ok(info) => {
            let field = |key: &str| info.get(key).and_then(Value::as_str).map(str::to_owned);
            Ok(field("oa_id").map(|oa_id| OfficialAccount {
                oa_id,
                name: field("name"),
            }))
        }
        Err(crate::client::CallError::Refused(error)) if error.is_token_refusal() => Err(setup
            .invalid(
                "refresh_token_env",
                format!(
                    "Zalo refused the access token refreshed from {} (error {}: {}): check that \
                     app_id {} is the app the OA authorized, and api_base ({})",
                    settings.refresh_token_env,
                    error.code,
                    error.message,
                    settings.app_id,
                    api.api_base()
                ),
            )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "GET /v2.0/oa/getoa failed; the token is checked again on use");
            Ok(None)
        }
    }
}

impl ZaloFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name): the app's `app_secret`, the `oa_secret_key` webhooks are
    /// signed with, and the configured `refresh_token`.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        app_secret: Secret,
        oa_secret_key: Secret,
        refresh_token: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: ZaloSettings = setup.settings()?;
        check_base(setup, "api_base", &settings.api_base)?;
        check_base(setup, "oauth_base", &settings.oauth_base)?;
        if settings.app_id.is_empty() || !settings.app_id.chars().all(|c| c.is_ascii_digit()) {
            return Err(setup.invalid(
                "app_id",
                "the app id is the number shown in Zalo for Developers → your app",
            ));
        }
        if !settings.webhook_path.starts_with('/') {
            return Err(setup.invalid("webhook_path", "a path starts with /"));
        }
        for (key, secret) in [
            ("oa_secret_key_env", &oa_secret_key),
            ("refresh_token_env", &refresh_token),
        ] {
            if secret.expose().is_empty() {
                return Err(setup.invalid(key, "the variable is empty"));
            }
        }
        let max_signature_age = freshness::window(settings.max_signature_age_secs)
            .map_err(|why| setup.invalid("max_signature_age_secs", why))?;
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = OaApi::new(
            &settings.api_base,
            &settings.oauth_base,
            &settings.app_id,
            app_secret,
            timeout,
        );
        let tokens = TokenStore::open(
            setup.state.clone(),
            &setup.legacy,
            api.clone(),
            &settings.refresh_token_env,
            &refresh_token,
            Duration::from_millis(settings.refresh_ahead_ms),
        )
        .await
        .map_err(|e| SetupError::new(setup.key(""), e.to_string()))?;
        let account = check_account(setup, &settings, &api, &tokens).await?;
        let book = EchoBook::open(&setup.state)
            .await
            .map_err(|e| SetupError::new(setup.key(""), e.to_string()))?;
        book.import_legacy(&setup.legacy)
            .await
            .map_err(|e| SetupError::new(setup.key(""), e.to_string()))?;
        let adapter = Arc::new(ZaloAdapter::new(
            &setup.name,
            api.clone(),
            tokens.clone(),
            book.clone(),
            setup.clock().clone(),
        ));
        let receiver = Arc::new(ZaloReceiver::new(
            &setup.name,
            &settings.app_id,
            account.as_ref().map(|a| a.oa_id.clone()),
            settings.allowed_senders.iter().cloned(),
            settings.bot_senders.iter().cloned(),
        ));
        let source = InboundSource::Pushed(Arc::new(WebhookSource::new(
            WebhookConfig {
                listen: settings.webhook_listen,
                path: settings.webhook_path.clone(),
                app_id: settings.app_id.clone(),
                oa_secret_key,
                answer_deadline: Duration::from_millis(settings.answer_deadline_ms.max(1)),
                max_signature_age,
            },
            book,
            setup.clock().clone(),
        )));
        let who = account.as_ref().map_or_else(
            || format!("Zalo OA of app {}", settings.app_id),
            |a| format!("Zalo OA {}", a.name.as_deref().unwrap_or(&a.oa_id)),
        );
        let mut plugin = ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!("{who}, webhook on {}", settings.webhook_listen))
            .with_platform_url(settings.api_base.clone(), false);
        if let Some(account) = account {
            plugin = plugin.with_extension(Arc::new(account));
        }
        Ok(plugin)
    }
}
