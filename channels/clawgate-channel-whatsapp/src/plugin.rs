//! `[[channels]] kind = "whatsapp"`: the settings of one WhatsApp Business phone number,
//! checked at start (the token with `GET /<phone-number-id>`), and the plugin built from them.

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

use crate::adapter::WhatsAppAdapter;
use crate::client::{CallError, GraphApi};
use crate::receive::WhatsAppReceiver;
use crate::source::{WebhookConfig, WebhookSource};
use crate::status::StatusBook;

/// Meta's Graph API endpoint.
pub const DEFAULT_API_BASE: &str = "https://graph.facebook.com";
/// The Graph API version the channel speaks.
pub const DEFAULT_API_VERSION: &str = "v23.0";

/// `[channels.settings]` of a `whatsapp` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhatsAppSettings {
    /// The environment variable holding the access token (a System User token with
    /// `whatsapp_business_messaging`).
    pub token_env: String,
    /// The environment variable holding the Meta app's App Secret (it signs the webhooks).
    pub app_secret_env: String,
    /// The environment variable holding the verify token typed into the webhook configuration.
    pub verify_token_env: String,
    /// The business phone number's id (WhatsApp Manager → API Setup), not the number itself.
    pub phone_number_id: String,
    /// The address the webhook listener binds; the app's callback URL must reach it.
    pub webhook_listen: SocketAddr,
    /// The path the listener serves (the callback URL's path).
    #[serde(default = "default_webhook_path")]
    pub webhook_path: String,
    /// The Graph API endpoint: Meta's, or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// The Graph API version (`v23.0`).
    #[serde(default = "default_api_version")]
    pub api_version: String,
    /// People answered (`wa_id`s, digits only); empty: everyone who writes.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Senders that are automated (another business's bot, a notifier), reported as bots so
    /// the entry's `allow_bots` decides whether they are answered.
    #[serde(default)]
    pub bot_senders: Vec<String>,
    /// Let WhatsApp render a preview of the first link in a reply.
    #[serde(default)]
    pub preview_url: bool,
    /// Mark each message read (blue ticks) once it is recorded.
    #[serde(default)]
    pub mark_read: bool,
    /// How long one Graph call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_webhook_path() -> String {
    "/whatsapp/webhook".into()
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_api_version() -> String {
    DEFAULT_API_VERSION.into()
}
fn default_request_timeout_ms() -> u64 {
    10_000
}

/// The business phone number behind a channel, as Graph names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusinessNumber {
    /// The phone number id.
    pub id: String,
    /// The number as shown (`+1 555-000-1111`).
    pub display_phone_number: Option<String>,
    /// The approved business name.
    pub verified_name: Option<String>,
}

/// Builds `whatsapp` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct WhatsAppFactory;

/// Checks the token on the number. A refused token or unknown number stops the start with an
/// error naming the setting; an unreachable Graph API is only a warning (checked again on use).
async fn check_number(
    setup: &ChannelSetup,
    settings: &WhatsAppSettings,
    api: &GraphApi,
) -> Result<Option<BusinessNumber>, SetupError> {
    match api.number().await {
        Ok(answer) => {
            let field = |key: &str| answer.get(key).and_then(Value::as_str).map(str::to_owned);
            Ok(Some(BusinessNumber {
                id: field("id").unwrap_or_else(|| settings.phone_number_id.clone()),
                display_phone_number: field("display_phone_number"),
                verified_name: field("verified_name"),
            }))
        }
        Err(CallError::Refused(error))
            if error.kind() == clawgate_types::DeliveryFailureKind::Auth =>
        {
            Err(setup.invalid(
                "token_env",
                format!(
                    "Meta refused the token in {} ({}, code {}): use a System User access token \
                     with whatsapp_business_messaging, and check api_base ({})",
                    settings.token_env,
                    error.message,
                    error.code,
                    api.number_url()
                ),
            ))
        }
        Err(CallError::Refused(error)) => Err(setup.invalid(
            "phone_number_id",
            format!(
                "Graph refused {} ({}, code {}): use the phone number id from WhatsApp Manager \
                 → API Setup (not the number itself), reachable by the token",
                settings.phone_number_id, error.message, error.code
            ),
        )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "the number check failed; the token is checked again on use");
            Ok(None)
        }
    }
}

#[async_trait]
impl ChannelFactory for WhatsAppFactory {
    fn kind(&self) -> &str {
        "whatsapp"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: WhatsAppSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        let app_secret = setup.secret("app_secret_env", &settings.app_secret_env)?;
        let verify_token = setup.secret("verify_token_env", &settings.verify_token_env)?;
        self.build_with_secrets(&setup, token, app_secret, verify_token)
            .await
    }
}

impl WhatsAppFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name): the access `token`, the app's `app_secret` and the
    /// webhook's `verify_token`.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
        app_secret: Secret,
        verify_token: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: WhatsAppSettings = setup.settings()?;
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
                "this build speaks plain HTTP only: build clawgate-channel-whatsapp with its \
                 `rustls` feature (on by default) to reach https://graph.facebook.com",
            ));
        }
        if settings.phone_number_id.is_empty()
            || !settings
                .phone_number_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric())
        {
            return Err(setup.invalid(
                "phone_number_id",
                "the phone number id is the numeric id from WhatsApp Manager → API Setup",
            ));
        }
        if !settings.webhook_path.starts_with('/') {
            return Err(setup.invalid("webhook_path", "a path starts with /"));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = GraphApi::new(
            &settings.api_base,
            &settings.api_version,
            &settings.phone_number_id,
            token,
            timeout,
        );
        let number = check_number(setup, &settings, &api).await?;
        let book = StatusBook::open(&setup.state)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        book.import_legacy(&setup.legacy)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let adapter = Arc::new(WhatsAppAdapter::new(
            &setup.name,
            api.clone(),
            book.clone(),
            settings.preview_url,
        ));
        let receiver = Arc::new(WhatsAppReceiver::new(
            &setup.name,
            &settings.phone_number_id,
            settings.allowed_senders.iter().cloned(),
            settings.bot_senders.iter().cloned(),
        ));
        let source = InboundSource::Pushed(Arc::new(WebhookSource::new(
            WebhookConfig {
                listen: settings.webhook_listen,
                path: settings.webhook_path.clone(),
                app_secret,
                verify_token,
                answer_deadline: Duration::from_secs(5),
            },
            book,
            settings.mark_read.then(|| api.clone()),
        )));
        let who = number
            .as_ref()
            .and_then(|n| n.display_phone_number.clone())
            .map_or_else(
                || format!("WhatsApp number {}", settings.phone_number_id),
                |shown| format!("WhatsApp number {shown}"),
            );
        let mut plugin = ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!("{who}, webhook on {}", settings.webhook_listen))
            .with_platform_url(api.number_url().to_owned(), false);
        if let Some(number) = number {
            plugin = plugin.with_extension(Arc::new(number));
        }
        Ok(plugin)
    }
}
