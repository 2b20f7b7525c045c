//! `[[channels]] kind = "zalo-personal"`: the settings of one personal Zalo account, the login
//! at start, and the plugin built from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use serde_json::Value;
use tracing::warn;

use crate::account::Account;
use crate::adapter::ZaloPersonalAdapter;
use crate::book::{BookError, SendBook};
use crate::client::{Credentials, LoginError, WebClient};
use crate::receive::ZaloPersonalReceiver;
use crate::source::ZaloListener;

/// Zalo Web's login host (zca-js hard-codes it).
pub const DEFAULT_LOGIN_BASE: &str = "https://wpa.chat.zalo.me";

/// `[channels.settings]` of a `zalo-personal` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZaloPersonalSettings {
    /// The environment variable holding the cookies of a logged-in Zalo Web session: a
    /// `Cookie` header value (`name=value; …`) or the JSON a cookie-export extension writes
    /// (an array of `{name|key, value}`, or `{"cookies": [...]}`).
    pub cookie_env: String,
    /// The environment variable holding that session's IMEI (zca-js's `imei`: the
    /// `z_uuid` / `sh_z_uuid` of the browser's local storage).
    pub imei_env: String,
    /// The user agent of the browser the cookies come from (Zalo ties the session to it).
    pub user_agent: String,
    /// The login host: Zalo's, or a simulator. Every other host comes from the login.
    #[serde(default = "default_login_base")]
    pub login_base: String,
    /// People answered in direct chats (Zalo user ids); empty: everyone who writes.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Groups answered (group ids); empty: none (a personal account is in many groups).
    #[serde(default)]
    pub allowed_groups: Vec<String>,
    /// Senders that are automated, reported as bots so `allow_bots` decides.
    #[serde(default)]
    pub bot_senders: Vec<String>,
    /// How long one Zalo call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long after a send whose answer was lost its echo may still settle it; after that
    /// it is parked for an operator.
    #[serde(default = "default_echo_window_ms")]
    pub echo_window_ms: u64,
}

fn default_login_base() -> String {
    DEFAULT_LOGIN_BASE.into()
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_echo_window_ms() -> u64 {
    60_000
}

/// Builds `zalo-personal` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZaloPersonalFactory;

#[async_trait]
impl ChannelFactory for ZaloPersonalFactory {
    fn kind(&self) -> &str {
        "zalo-personal"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: ZaloPersonalSettings = setup.settings()?;
        let cookie = setup.secret("cookie_env", &settings.cookie_env)?;
        let imei = setup.secret("imei_env", &settings.imei_env)?;
        self.build_with_secrets(&setup, cookie, imei).await
    }
}

/// The `Cookie` header of a cookie setting: the header itself, or the JSON of an export.
pub fn cookie_header(value: &str) -> Result<String, String> {
    let trimmed = value.trim();
    if !(trimmed.starts_with('[') || trimmed.starts_with('{')) {
        return Ok(trimmed.to_owned());
    }
    let json: Value = serde_json::from_str(trimmed)
        .map_err(|e| format!("the cookie JSON does not parse: {e}"))?;
    let list = json
        .get("cookies")
        .unwrap_or(&json)
        .as_array()
        .ok_or("the cookie JSON is neither an array nor {\"cookies\": [...]}")?;
    let pairs: Vec<String> = list
        .iter()
        .filter_map(|c| {
            let name = c.get("name").or_else(|| c.get("key"))?.as_str()?;
            let value = c.get("value")?.as_str()?;
            Some(format!("{name}={value}"))
        })
        .collect();
    if pairs.is_empty() {
        return Err("the cookie JSON holds no {name, value} cookies".into());
    }
    Ok(pairs.join("; "))
}

impl ZaloPersonalFactory {
    /// Builds the account of `setup` with its secrets given (the gateway reads them from the
    /// variables the settings name).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        cookie: Secret,
        imei: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: ZaloPersonalSettings = setup.settings()?;
        let base = &settings.login_base;
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(setup.invalid("login_base", format!("{base:?} is not an http(s) URL")));
        }
        if base.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "login_base",
                "this build speaks plain HTTP only: build clawgate-channel-zalo-personal with \
                 its `rustls` feature (on by default) to reach Zalo over https",
            ));
        }
        if settings.user_agent.trim().is_empty() {
            return Err(setup.invalid(
                "user_agent",
                "the user agent of the browser the cookies were exported from",
            ));
        }
        let header = cookie_header(cookie.expose()).map_err(|e| setup.invalid("cookie_env", e))?;
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let client = WebClient::new(
            base,
            Credentials {
                cookie: Secret::new(header),
                imei,
                user_agent: settings.user_agent.clone(),
            },
            timeout,
            setup.clock().clone(),
        );
        let account = Account::new(&setup.name, client);
        let uid = match account.session().await {
            Ok(session) => Some(session.uid),
            Err(error @ LoginError::Refused(_)) => {
                return Err(setup.invalid("cookie_env", error.to_string()));
            }
            Err(error) => {
                warn!(channel = %setup.name, %error, "not logged in yet; the login is tried again on use");
                None
            }
        };
        // The evidence lives in the gateway's store; an earlier release's file is imported once.
        let book_error = |e: BookError| SetupError::new(setup.key(""), e.to_string());
        let book = SendBook::open(&setup.state).await.map_err(book_error)?;
        book.import_legacy(&setup.legacy)
            .await
            .map_err(book_error)?;
        let adapter = Arc::new(ZaloPersonalAdapter::new(
            &setup.name,
            account.clone(),
            book.clone(),
            Duration::from_millis(settings.echo_window_ms),
        ));
        let receiver = Arc::new(ZaloPersonalReceiver::new(
            &setup.name,
            settings.allowed_senders.iter().cloned(),
            settings.allowed_groups.iter().cloned(),
            settings.bot_senders.iter().cloned(),
        ));
        let source = InboundSource::Pushed(Arc::new(ZaloListener::new(
            &setup.name,
            account.clone(),
            book,
            timeout,
        )));
        let who = uid.map_or_else(
            || "Zalo Personal account (not logged in yet)".to_owned(),
            |uid| format!("Zalo Personal account {uid}"),
        );
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!(
                "{who} (experimental: unofficial Zalo Web protocol, one session per account)"
            ))
            .with_platform_url(settings.login_base.clone(), false)
            .with_extension(Arc::new(account)))
    }
}
