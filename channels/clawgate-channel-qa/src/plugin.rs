//! The `qa` channel kind: the factory the gateway's registry holds, the polling feed over the
//! platform's update API, and the handle the gateway's QA wiring (chat page, `/v1/qa/*`) reads.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, PollFrom, PollWait, PolledEvent,
    PollingFeed, SetupError, SourceError,
};
use serde::Deserialize;

use crate::{QaAdapter, QaPlatform, QaPlatformConfig};

/// `[channels.settings]` of a `qa` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QaSettings {
    /// Base URL of an already running QA platform. Unset: the platform runs inside the gateway
    /// on loopback, its state in `<gateway state directory>/<channel>-platform.json`.
    pub base_url: Option<String>,
    /// The environment variable holding the account's token (required with `base_url`; for an
    /// embedded platform a token is generated per run when unset).
    pub token_env: Option<String>,
    /// How long one long poll of the update feed waits.
    pub poll_timeout_ms: u64,
}

impl Default for QaSettings {
    fn default() -> Self {
        QaSettings {
            base_url: None,
            token_env: None,
            poll_timeout_ms: 10_000,
        }
    }
}

/// What the gateway's QA wiring needs of a QA channel: the adapter (it lists and writes
/// conversations) and the embedded platform, kept alive as long as the channel.
#[derive(Debug)]
pub struct QaHandle {
    /// The adapter of this channel (token inside, never printed).
    pub adapter: QaAdapter,
    /// The platform, when it runs in this process.
    pub platform: Option<QaPlatform>,
}

/// Polls the platform's update feed (Telegram's `getUpdates` rules: asking from an offset
/// confirms every update below it).
#[derive(Debug, Clone)]
pub struct QaFeed {
    adapter: QaAdapter,
    poll_timeout_ms: u64,
}

impl QaFeed {
    /// A feed over `adapter`'s platform; a long poll waits `poll_timeout`.
    pub fn new(adapter: QaAdapter, poll_timeout: Duration) -> QaFeed {
        QaFeed {
            adapter,
            poll_timeout_ms: u64::try_from(poll_timeout.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

#[async_trait]
impl PollingFeed for QaFeed {
    async fn poll(&self, from: &PollFrom, wait: PollWait) -> Result<Vec<PolledEvent>, SourceError> {
        let timeout = match wait {
            PollWait::Immediate => 0,
            _ => self.poll_timeout_ms,
        };
        let updates = self
            .adapter
            .get_updates(from.after + 1, timeout)
            .await
            .map_err(|e| {
                SourceError::new(e.kind, e.message).with_retry_after_ms(e.retry_after_ms)
            })?;
        updates
            .into_iter()
            .map(|update| {
                let raw = serde_json::to_value(&update.message).map_err(|e| {
                    SourceError::new(
                        clawgate_types::DeliveryFailureKind::Unknown,
                        format!("QA update {} not representable: {e}", update.update_id),
                    )
                })?;
                Ok(PolledEvent::new(update.update_id, raw))
            })
            .collect()
    }
}

/// Builds `qa` channels.
#[derive(Debug, Clone, Default)]
pub struct QaFactory {
    /// Where embedded platforms keep their state (the platform's record, which the crash
    /// matrices judge by); `None`: in memory only.
    platform_dir: Option<PathBuf>,
}

impl QaFactory {
    /// A factory whose embedded platforms keep their state in `dir` (the gateway's state
    /// directory), so it outlives a restart of the gateway.
    pub fn keeping_platforms_in(dir: impl Into<PathBuf>) -> QaFactory {
        QaFactory {
            platform_dir: Some(dir.into()),
        }
    }
}

/// 32 random bytes from the OS, hex: the token of an embedded platform.
fn random_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where an embedded platform of channel `name` keeps its state.
pub fn platform_state_file(dir: &std::path::Path, name: &str) -> PathBuf {
    dir.join(format!("{name}-platform.json"))
}

#[async_trait]
impl ChannelFactory for QaFactory {
    fn kind(&self) -> &str {
        "qa"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: QaSettings = setup.settings()?;
        let token = match &settings.token_env {
            Some(variable) => Some(setup.secret("token_env", variable)?),
            None => None,
        };
        let (platform, base_url, token) = match &settings.base_url {
            Some(url) => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(setup.invalid("base_url", format!("{url:?} is not an http(s) URL")));
                }
                let Some(token) = token else {
                    return Err(setup.invalid(
                        "token_env",
                        "an external platform needs the name of the environment variable \
                         holding its token",
                    ));
                };
                (None, url.clone(), token.expose().to_owned())
            }
            None => {
                let token = match token {
                    Some(token) => token.expose().to_owned(),
                    None => random_token().map_err(|e| {
                        setup.invalid("", format!("cannot read /dev/urandom for a token: {e}"))
                    })?,
                };
                let platform = QaPlatform::start(QaPlatformConfig {
                    token: token.clone(),
                    state_path: self
                        .platform_dir
                        .as_deref()
                        .map(|dir| platform_state_file(dir, &setup.name)),
                    ..QaPlatformConfig::default()
                })
                .await
                .map_err(|e| {
                    setup.invalid("", format!("cannot start the embedded QA platform: {e}"))
                })?;
                let url = platform.base_url();
                (Some(platform), url, token)
            }
        };
        let adapter = QaAdapter::new(&base_url, &token).with_channel(&setup.name);
        let feed = QaFeed::new(
            adapter.clone(),
            Duration::from_millis(settings.poll_timeout_ms),
        );
        let embedded = platform.is_some();
        let kind = if embedded { "embedded" } else { "external" };
        Ok(ChannelPlugin::new(Arc::new(adapter.clone()))
            .with_inbound(
                Arc::new(adapter.clone()),
                InboundSource::Polling(Arc::new(feed)),
            )
            .with_description(format!("{kind} QA platform at {base_url}"))
            .with_platform_url(base_url, embedded)
            .with_extension(Arc::new(QaHandle { adapter, platform })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(settings: serde_json::Value) -> ChannelSetup {
        clawgate_conformance::channel_setup_in_memory(1, "qa", "default", settings)
    }

    async fn error_of(settings: serde_json::Value) -> SetupError {
        QaFactory::default()
            .build(setup(settings))
            .await
            .expect_err("refused")
    }

    #[tokio::test]
    async fn bad_settings_name_their_key() {
        let e = error_of(serde_json::json!({ "base_url": "ftp://x", "token_env": "PATH" })).await;
        assert_eq!(e.key, "channels[1].settings.base_url", "{e}");
        let e = error_of(serde_json::json!({ "base_url": "http://127.0.0.1:1" })).await;
        assert_eq!(e.key, "channels[1].settings.token_env", "{e}");
        let e = error_of(serde_json::json!({
            "base_url": "http://127.0.0.1:1",
            "token_env": "CLAWGATE_QA_TEST_SURELY_UNSET",
        }))
        .await;
        assert_eq!(e.key, "channels[1].settings.token_env", "{e}");
        assert!(e.reason.contains("CLAWGATE_QA_TEST_SURELY_UNSET"), "{e}");
        let e = error_of(serde_json::json!({ "poll_timeout": 5 })).await;
        assert_eq!(e.key, "channels[1].settings.poll_timeout", "{e}");
    }

    #[tokio::test]
    async fn an_embedded_platform_starts_and_is_kept_by_the_channel() {
        let dir = tempfile::tempdir().expect("tempdir");
        let plugin = QaFactory::keeping_platforms_in(dir.path())
            .build(clawgate_conformance::channel_setup(
                0,
                "qa",
                "default",
                serde_json::Value::Null,
                dir.path(),
            ))
            .await
            .expect("built");
        assert!(plugin.embedded);
        let handle = plugin.extension::<QaHandle>().expect("QA handle");
        assert!(handle.platform.is_some());
        assert!(matches!(plugin.source, InboundSource::Polling(_)));
        assert_eq!(plugin.name(), "qa");
        assert!(
            !format!("{plugin:?}").contains(handle.platform.as_ref().map_or("", |p| p.token()))
        );
    }
}
