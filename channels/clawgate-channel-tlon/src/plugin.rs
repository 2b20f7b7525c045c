//! `[[channels]] kind = "tlon"`: the settings of one Urbit ship's Tlon account, checked at
//! start (a login with the `+code`), and the plugin built from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;
use tracing::{info, warn};

use crate::adapter::{SendTuning, TlonAdapter};
use crate::aura::ship;
use crate::eyre::{Eyre, EyreError};
use crate::receive::TlonReceiver;
use crate::render::TlonRenderer;
use crate::source::{EyreSource, import_channel_record};
use crate::threads::ParticipatedThreads;

/// `[channels.settings]` of a `tlon` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlonSettings {
    /// The ship's URL (`https://sampel-palnet.tlon.network`, `http://localhost:8080`).
    pub url: String,
    /// The ship (`~sampel-palnet`): the bot's own identity.
    pub ship: String,
    /// The environment variable holding the ship's `+code` (its web login code).
    pub code_env: String,
    /// A line appended to the model's replies (`— claude-sonnet-4`); none when unset.
    #[serde(default)]
    pub signature: Option<String>,
    /// Group channels (nests `chat/~host/name`) where every post is answered, not only
    /// mentions and posts in threads we take part in.
    #[serde(default)]
    pub open_channels: Vec<String>,
    /// How long one HTTP call may take.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long a poke's result may take on the event stream before its outcome is unknown.
    #[serde(default = "default_poke_timeout_ms")]
    pub poke_timeout_ms: u64,
    /// How long after a message's `sent` time its absence on the ship proves it was not sent.
    #[serde(default = "default_settle_window_ms")]
    pub settle_window_ms: u64,
}

fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_poke_timeout_ms() -> u64 {
    15_000
}
fn default_settle_window_ms() -> u64 {
    30_000
}

/// Builds `tlon` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct TlonFactory;

#[async_trait]
impl ChannelFactory for TlonFactory {
    fn kind(&self) -> &str {
        "tlon"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: TlonSettings = setup.settings()?;
        let code = setup.secret("code_env", &settings.code_env)?;
        self.build_with_code(&setup, code).await
    }
}

impl TlonFactory {
    /// Builds the account of `setup` with its `+code` given (the gateway reads it from the
    /// variable `code_env` names).
    pub async fn build_with_code(
        &self,
        setup: &ChannelSetup,
        code: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: TlonSettings = setup.settings()?;
        let url = settings.url.trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(setup.invalid("url", format!("{url:?} is not an http(s) URL")));
        }
        if url.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "url",
                "this build speaks plain HTTP only: build clawgate-channel-tlon with its `rustls` \
                 feature (on by default) to reach an https:// ship",
            ));
        }
        let our = ship(&settings.ship);
        if our.len() < 2 || our[1..].contains(|c: char| !(c.is_ascii_lowercase() || c == '-')) {
            return Err(setup.invalid(
                "ship",
                format!("{:?} is not a ship name (~sampel-palnet)", settings.ship),
            ));
        }
        for (i, nest) in settings.open_channels.iter().enumerate() {
            if !nest.starts_with("chat/~") || nest.split('/').count() != 3 {
                return Err(setup.invalid(
                    &format!("open_channels[{i}]"),
                    format!("{nest:?} is not a chat channel nest (chat/~host/name)"),
                ));
            }
        }
        let tuning = SendTuning {
            request_timeout: Duration::from_millis(settings.request_timeout_ms.max(1)),
            poke_timeout: Duration::from_millis(settings.poke_timeout_ms.max(1)),
            settle_window: Duration::from_millis(settings.settle_window_ms),
        };
        let eyre = Arc::new(Eyre::new(url, &our, code, tuning.request_timeout));
        match eyre.login(tuning.request_timeout).await {
            Ok(()) => info!(channel = %setup.name, ship = %our, "logged in to the ship"),
            Err(error @ EyreError::LoginRefused { .. }) => {
                return Err(setup.invalid(
                    "code_env",
                    format!("{error} (the variable is {})", settings.code_env),
                ));
            }
            Err(error) => {
                warn!(channel = %setup.name, %error, "the ship is not reachable now; logging in again on use");
            }
        }
        let threads = ParticipatedThreads::open(&setup.state)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        threads
            .import_legacy(&setup.legacy)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let threads = Arc::new(threads);
        import_channel_record(&setup.state, &setup.legacy)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let adapter = TlonAdapter::new(
            &setup.name,
            &our,
            eyre.clone(),
            TlonRenderer::new(settings.signature.clone()),
            threads.clone(),
            tuning.clone(),
            setup.clock().clone(),
        );
        let receiver = Arc::new(TlonReceiver::new(
            &setup.name,
            &our,
            settings.open_channels.clone(),
            threads.clone(),
        ));
        let source = InboundSource::Pushed(Arc::new(
            EyreSource::new(
                &setup.name,
                eyre.clone(),
                Some(setup.state.clone()),
                setup.clock().clone(),
                tuning.request_timeout,
            )
            .with_threads(threads),
        ));
        Ok(ChannelPlugin::new(Arc::new(adapter))
            .with_inbound(receiver, source)
            .with_description(format!("Tlon as {our} on {url}"))
            .with_platform_url(url.to_owned(), false))
    }
}
