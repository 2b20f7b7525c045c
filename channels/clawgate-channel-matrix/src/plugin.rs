//! `[[channels]] kind = "matrix"`: the settings of one Matrix account, checked at start (the
//! token with `whoami`), and the plugin built from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use reqwest::Method;
use ruma::{OwnedUserId, RoomId, UserId};
use serde::Deserialize;
use tracing::warn;

use crate::adapter::{EncryptedRooms, MatrixAdapter};
use crate::client::{CallError, MatrixApi};
use crate::receive::MatrixReceiver;
use crate::source::{JoinPolicy, SyncSource, import_legacy_sync_start};

/// The longest `/sync` wait accepted (homeservers and proxies cut longer requests).
pub const MAX_POLL_TIMEOUT_S: u64 = 60;

/// `[channels.settings]` of a `matrix` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixSettings {
    /// The homeserver's client-server API base URL (`https://matrix.example.org`).
    pub homeserver_url: String,
    /// The account's full user id (`@clawgate:example.org`).
    pub user_id: String,
    /// The environment variable holding the account's access token.
    pub token_env: String,
    /// Rooms answered (room ids, `!…`); empty: every room the account is in.
    #[serde(default)]
    pub allowed_rooms: Vec<String>,
    /// Join rooms the account is invited to (only allowed ones when `allowed_rooms` is set).
    #[serde(default = "default_true")]
    pub auto_join: bool,
    /// Other accounts that are bots (Matrix has no bot flag): their messages go through the
    /// gateway's echo and bot authorization.
    #[serde(default)]
    pub bot_users: Vec<String>,
    /// `/sync` long-poll wait in seconds.
    #[serde(default = "default_poll_timeout_s")]
    pub poll_timeout_s: u64,
    /// How long one call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// A preview older than this is not turned into the final: a fresh final is sent and the
    /// preview redacted (so the answer shows at the bottom of the room).
    #[serde(default = "default_preview_stale_after_s")]
    pub preview_stale_after_s: u64,
}

fn default_true() -> bool {
    true
}
fn default_poll_timeout_s() -> u64 {
    30
}
fn default_request_timeout_ms() -> u64 {
    15_000
}
fn default_preview_stale_after_s() -> u64 {
    300
}

/// Builds `matrix` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct MatrixFactory;

#[derive(Deserialize)]
struct WhoAmI {
    user_id: String,
}

/// Checks the token: `whoami`. A refused token, or one of another account, stops the start
/// with an error naming the setting; an unreachable homeserver is only a warning.
async fn check_token(
    setup: &ChannelSetup,
    settings: &MatrixSettings,
    api: &MatrixApi,
) -> Result<(), SetupError> {
    match api
        .call::<WhoAmI>(Method::GET, "account/whoami", None, Duration::ZERO)
        .await
    {
        Ok(who) if who.user_id == settings.user_id => Ok(()),
        Ok(who) => Err(setup.invalid(
            "token_env",
            format!(
                "the access token in {} belongs to {}, not to user_id {}",
                settings.token_env, who.user_id, settings.user_id
            ),
        )),
        Err(error @ CallError::Refused { status: 401, .. }) => Err(setup.invalid(
            "token_env",
            format!(
                "the homeserver refused the access token in {} ({}): log in again and export \
                 the new token",
                settings.token_env,
                error.errcode().unwrap_or("401")
            ),
        )),
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "whoami failed; the access token is checked again on use");
            Ok(())
        }
    }
}

#[async_trait]
impl ChannelFactory for MatrixFactory {
    fn kind(&self) -> &str {
        "matrix"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: MatrixSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        self.build_with_secrets(&setup, token).await
    }
}

impl MatrixFactory {
    /// Builds the account of `setup` with its access token given (the gateway reads it from
    /// the variable `token_env` names).
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: MatrixSettings = setup.settings()?;
        let url = &settings.homeserver_url;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(setup.invalid("homeserver_url", format!("{url:?} is not an http(s) URL")));
        }
        if url.starts_with("https://") && !cfg!(feature = "rustls") {
            return Err(setup.invalid(
                "homeserver_url",
                "this build speaks plain HTTP only: build the gateway with the Matrix channel's \
                 `rustls` feature for an https:// homeserver, or reach the homeserver through a \
                 local TLS proxy at an http:// URL",
            ));
        }
        let user_id: OwnedUserId = UserId::parse(&settings.user_id).map_err(|e| {
            setup.invalid(
                "user_id",
                format!(
                    "{:?} is not a Matrix user id (@name:server): {e}",
                    settings.user_id
                ),
            )
        })?;
        for (i, room) in settings.allowed_rooms.iter().enumerate() {
            RoomId::parse(room).map_err(|e| {
                setup.invalid(
                    &format!("allowed_rooms[{i}]"),
                    format!("{room:?} is not a room id (!…; aliases are not resolved): {e}"),
                )
            })?;
        }
        for (i, bot) in settings.bot_users.iter().enumerate() {
            UserId::parse(bot).map_err(|e| {
                setup.invalid(
                    &format!("bot_users[{i}]"),
                    format!("{bot:?} is not a user id: {e}"),
                )
            })?;
        }
        if settings.poll_timeout_s > MAX_POLL_TIMEOUT_S {
            return Err(setup.invalid("poll_timeout_s", format!("at most {MAX_POLL_TIMEOUT_S} s")));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let api = MatrixApi::new(url, token, timeout);
        check_token(setup, &settings, &api).await?;
        import_legacy_sync_start(&setup.state, &setup.legacy)
            .await
            .map_err(|e| setup.invalid("", e.to_string()))?;
        let encrypted = EncryptedRooms::default();
        let source = SyncSource::new(
            api.clone(),
            user_id.as_str(),
            settings.poll_timeout_s,
            JoinPolicy {
                auto_join: settings.auto_join,
                allowed_rooms: settings.allowed_rooms.clone(),
            },
            encrypted.clone(),
            setup.state.clone(),
        );
        let receiver = MatrixReceiver::new(
            &setup.name,
            user_id.as_str(),
            settings.allowed_rooms.iter().cloned(),
            settings.bot_users.iter().cloned(),
        );
        let adapter = Arc::new(MatrixAdapter::new(
            &setup.name,
            api.clone(),
            user_id.clone(),
            encrypted,
        ));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(Arc::new(receiver), InboundSource::Polling(Arc::new(source)))
            .with_description(format!("Matrix account {user_id}, /sync polling"))
            .with_platform_url(api.base().to_owned(), false)
            .with_preview_stale_after(Duration::from_secs(settings.preview_stale_after_s)))
    }
}
