//! `[[channels]] kind = "qq"`: the settings of one QQ bot, checked at start (an access token
//! for the app id and secret), and the plugin built from them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use tracing::warn;

use crate::adapter::{AdapterConfig, QqAdapter};
use crate::client::{OpenApi, TokenError};
use crate::journal::ActiveJournal;
use crate::receive::{QqReceiver, RecentInbound};
use crate::source::{CallbackConfig, CallbackSource};
use crate::tts::Tts;
use clawgate_channel_sdk::freshness;

/// QQ's bot API endpoint.
pub const DEFAULT_API_BASE: &str = "https://api.sgroup.qq.com";
/// QQ's sandbox API endpoint.
pub const SANDBOX_API_BASE: &str = "https://sandbox.api.sgroup.qq.com";
/// QQ's access-token endpoint host.
pub const DEFAULT_TOKEN_BASE: &str = "https://bots.qq.com";
/// Active messages QQ allows per user (C2C) or group a month, as its documentation states.
pub const PLATFORM_ACTIVE_QUOTA: u32 = 4;

/// `[channels.settings]` of a `qq` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QqSettings {
    /// The bot's AppID (QQ open platform → your bot → development settings).
    pub app_id: String,
    /// The environment variable holding the bot's AppSecret (the token endpoint's
    /// `clientSecret`, and the seed of the callback signing key).
    pub secret_env: String,
    /// The address the callback listener binds; the bot's callback URL must reach it.
    pub callback_listen: SocketAddr,
    /// The path the listener serves (the callback URL's path).
    #[serde(default = "default_callback_path")]
    pub callback_path: String,
    /// The bot API endpoint: QQ's, its sandbox, or a simulator.
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// The token endpoint: QQ's, or a simulator.
    #[serde(default = "default_token_base")]
    pub token_base: String,
    /// Active messages (without `msg_id`) to send to one user or group a month, once a
    /// reply's passive window is closed; 0 turns them off (such replies then fail, typed).
    #[serde(default = "default_active_quota")]
    pub active_quota_per_month: u32,
    /// Stream previews in C2C chats.
    #[serde(default = "default_true")]
    pub c2c_streaming: bool,
    /// The accumulator timeout: a stream idle longer than this is not continued, and the
    /// reply's text arrives as one plain final.
    #[serde(default = "default_stream_idle_timeout_ms")]
    pub stream_idle_timeout_ms: u64,
    /// Every text is spoken (voice messages by `tts_command`), not only messages whose body
    /// format is `voice`.
    #[serde(default)]
    pub text_as_voice: bool,
    /// The text-to-speech command (argv, no shell): text on stdin, audio (SILK) on stdout.
    #[serde(default)]
    pub tts_command: Vec<String>,
    /// How long the TTS command may take per text.
    #[serde(default = "default_tts_timeout_ms")]
    pub tts_timeout_ms: u64,
    /// People answered (`user_openid`s); empty: everyone who writes.
    #[serde(default)]
    pub allowed_users: Vec<String>,
    /// Groups answered (`group_openid`s); empty: every group the bot is in.
    #[serde(default)]
    pub allowed_groups: Vec<String>,
    /// Senders that are automated (reported as bots, so the entry's `allow_bots` decides).
    #[serde(default)]
    pub bot_senders: Vec<String>,
    /// Fetch a new access token once the cached one has less than this left.
    #[serde(default = "default_refresh_ahead_ms")]
    pub refresh_ahead_ms: u64,
    /// How long one QQ call may take before its outcome counts as unknown (QQ asks for ≥ 5 s).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a callback waits for the durable record before asking QQ to push it again.
    #[serde(default = "default_answer_deadline_ms")]
    pub answer_deadline_ms: u64,
    /// How far a callback's signed `X-Signature-Timestamp` may be from the gateway's clock,
    /// either way, before it is refused as a replay.
    #[serde(default = "default_max_signature_age_secs")]
    pub max_signature_age_secs: u64,
}

fn default_callback_path() -> String {
    "/qq/callback".into()
}
fn default_api_base() -> String {
    DEFAULT_API_BASE.into()
}
fn default_token_base() -> String {
    DEFAULT_TOKEN_BASE.into()
}
fn default_active_quota() -> u32 {
    PLATFORM_ACTIVE_QUOTA
}
fn default_true() -> bool {
    true
}
fn default_stream_idle_timeout_ms() -> u64 {
    10_000
}
fn default_tts_timeout_ms() -> u64 {
    20_000
}
fn default_refresh_ahead_ms() -> u64 {
    // QQ hands out a new token only in the last 60 s of the old one's life.
    50_000
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_max_signature_age_secs() -> u64 {
    freshness::DEFAULT_MAX_SIGNATURE_AGE_SECS
}
fn default_answer_deadline_ms() -> u64 {
    2_500
}

/// Builds `qq` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct QqFactory;

fn check_base(setup: &ChannelSetup, key: &str, base: &str) -> Result<(), SetupError> {
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        return Err(setup.invalid(key, format!("{base:?} is not an http(s) URL")));
    }
    if base.starts_with("https://") && !cfg!(feature = "rustls") {
        return Err(setup.invalid(
            key,
            "this build speaks plain HTTP only: build clawgate-channel-qq with its `rustls` \
             feature (on by default) to reach QQ over https",
        ));
    }
    Ok(())
}

#[async_trait]
impl ChannelFactory for QqFactory {
    fn kind(&self) -> &str {
        "qq"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: QqSettings = setup.settings()?;
        let secret = setup.secret("secret_env", &settings.secret_env)?;
        self.build_with_secret(&setup, secret).await
    }
}

impl QqFactory {
    /// Builds the bot of `setup` with its secret given (the gateway reads it from the variable
    /// `secret_env` names).
    pub async fn build_with_secret(
        &self,
        setup: &ChannelSetup,
        secret: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: QqSettings = setup.settings()?;
        check_base(setup, "api_base", &settings.api_base)?;
        check_base(setup, "token_base", &settings.token_base)?;
        if settings.app_id.is_empty() || !settings.app_id.chars().all(|c| c.is_ascii_digit()) {
            return Err(setup.invalid(
                "app_id",
                "the AppID is the number shown in the QQ open platform → your bot → development \
                 settings",
            ));
        }
        if !settings.callback_path.starts_with('/') {
            return Err(setup.invalid("callback_path", "a path starts with /"));
        }
        if secret.expose().is_empty() {
            return Err(setup.invalid("secret_env", "the variable is empty"));
        }
        let max_signature_age = freshness::window(settings.max_signature_age_secs)
            .map_err(|why| setup.invalid("max_signature_age_secs", why))?;
        let api = OpenApi::new(
            &settings.api_base,
            &settings.token_base,
            &settings.app_id,
            secret.clone(),
            Duration::from_millis(settings.request_timeout_ms.max(1)),
            Duration::from_millis(settings.refresh_ahead_ms),
        );
        match api.access_token().await {
            Ok(_) => {}
            Err(error @ TokenError::Refused { .. }) => {
                return Err(setup.invalid("secret_env", error.to_string()));
            }
            Err(error) => {
                warn!(channel = %setup.name, %error, "no QQ access token yet; it is fetched again on use");
            }
        }
        // The journal lives in the gateway's store; an earlier release's file is imported once.
        let journal_error =
            |e: crate::journal::JournalError| SetupError::new(setup.key(""), e.to_string());
        let journal = ActiveJournal::open(&setup.state)
            .await
            .map_err(journal_error)?;
        journal
            .import_legacy(&setup.legacy)
            .await
            .map_err(journal_error)?;
        let tts = Tts::new(
            settings.tts_command.clone(),
            Duration::from_millis(settings.tts_timeout_ms.max(1)),
        );
        if settings.text_as_voice && tts.is_none() {
            return Err(setup.invalid(
                "text_as_voice",
                "text as voice needs a tts_command (text on stdin, SILK audio on stdout)",
            ));
        }
        let recent = Arc::new(RecentInbound::default());
        let adapter = Arc::new(QqAdapter::new(
            &setup.name,
            api,
            journal,
            AdapterConfig {
                active_quota: settings.active_quota_per_month,
                c2c_streaming: settings.c2c_streaming,
                stream_idle: Duration::from_millis(settings.stream_idle_timeout_ms.max(1)),
                text_as_voice: settings.text_as_voice,
                tts,
                recent: recent.clone(),
                clock: setup.clock().clone(),
            },
        ));
        let receiver = Arc::new(QqReceiver::new(
            &setup.name,
            recent,
            settings.allowed_users.iter().cloned(),
            settings.allowed_groups.iter().cloned(),
            settings.bot_senders.iter().cloned(),
        ));
        let source = InboundSource::Pushed(Arc::new(CallbackSource::new(
            CallbackConfig {
                listen: settings.callback_listen,
                path: settings.callback_path.clone(),
                secret,
                answer_deadline: Duration::from_millis(settings.answer_deadline_ms.max(1)),
                max_signature_age,
            },
            setup.clock().clone(),
        )));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!(
                "QQ bot {}, callbacks on {}",
                settings.app_id, settings.callback_listen
            ))
            .with_platform_url(settings.api_base.clone(), false))
    }
}
