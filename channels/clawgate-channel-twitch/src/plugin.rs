//! `[[channels]] kind = "twitch"`: the settings of one bot account in Twitch chat, and the
//! plugin built from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;

use crate::adapter::{Transport, TwitchAdapter};
use crate::client::Helix;
use crate::connection::{Connection, ConnectionConfig, LinkState};
use crate::receive::TwitchReceiver;
use crate::source::TwitchFeed;

/// How replies go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SendVia {
    /// Helix `POST /helix/chat/messages` (drops answered with a reason; Twitch's advice for bots).
    #[default]
    Helix,
    /// `PRIVMSG` on the chat connection.
    Irc,
}

/// `[channels.settings]` of a `twitch` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TwitchSettings {
    /// The bot's login (its IRC nick), lowercase.
    pub login: String,
    /// The environment variable holding the bot's user access token (`chat:read`, `chat:edit`,
    /// `user:write:chat`; an `oauth:` prefix is accepted).
    pub token_env: String,
    /// The bot's user id (Helix `sender_id`); needed with `send_via = "helix"`.
    #[serde(default)]
    pub user_id: Option<String>,
    /// The token's application client id (Helix `Client-Id`); needed with `send_via = "helix"`.
    #[serde(default)]
    pub client_id: Option<String>,
    /// Channels joined (broadcaster logins, `#` optional).
    pub channels: Vec<String>,
    /// `helix` (default) or `irc`.
    #[serde(default)]
    pub send_via: SendVia,
    /// The chat server (plain TCP).
    #[serde(default = "default_irc_server")]
    pub irc_server: String,
    /// Its port.
    #[serde(default = "default_irc_port")]
    pub irc_port: u16,
    /// Helix's base URL.
    #[serde(default = "default_helix_base")]
    pub helix_base: String,
    /// Answer every message in a channel, not only those mentioning the bot.
    #[serde(default)]
    pub answer_all: bool,
    /// Channels answered; empty: every joined channel.
    #[serde(default)]
    pub allowed_channels: Vec<String>,
    /// Logins reported as bot authors.
    #[serde(default)]
    pub bot_logins: Vec<String>,
    /// Keep Twitch's 20 (100 as moderator) messages per 30 s on our side.
    #[serde(default = "default_true")]
    pub rate_limit: bool,
    /// How long a Helix call may take before its outcome counts as unknown.
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
    /// How long connecting may take.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long an IRC message waits for Twitch's answer before its outcome counts as unknown.
    #[serde(default = "default_answer_timeout_ms")]
    pub answer_timeout_ms: u64,
    /// A send waits this long (connection, rate-limit slot) before it fails as not sent.
    #[serde(default = "default_send_wait_ms")]
    pub send_wait_ms: u64,
    /// Our `PING` after this much silence.
    #[serde(default = "default_keepalive_s")]
    pub keepalive_s: u64,
    /// The first reconnect waits this long, doubling up to `reconnect_max_ms`.
    #[serde(default = "default_reconnect_min_ms")]
    pub reconnect_min_ms: u64,
    /// The longest wait between reconnects.
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
}

fn default_irc_server() -> String {
    "irc.chat.twitch.tv".into()
}
fn default_irc_port() -> u16 {
    6667
}
fn default_helix_base() -> String {
    "https://api.twitch.tv/helix".into()
}
fn default_true() -> bool {
    true
}
fn default_request_timeout_ms() -> u64 {
    10_000
}
fn default_connect_timeout_ms() -> u64 {
    10_000
}
fn default_answer_timeout_ms() -> u64 {
    30_000
}
fn default_send_wait_ms() -> u64 {
    20_000
}
fn default_keepalive_s() -> u64 {
    120
}
fn default_reconnect_min_ms() -> u64 {
    1_000
}
fn default_reconnect_max_ms() -> u64 {
    60_000
}

/// Builds `twitch` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct TwitchFactory;

/// The chat link of a Twitch channel, for operators and tests (the plugin's extension).
#[derive(Debug, Clone)]
pub struct TwitchLink {
    connection: Connection,
}

impl TwitchLink {
    /// Connects now and waits up to `timeout` until every configured channel's room id is
    /// known (joined); returns the connection's number.
    pub async fn wait_joined(&self, channels: &[&str], timeout: Duration) -> Option<u64> {
        let channels: Vec<String> = channels
            .iter()
            .map(|c| c.trim_start_matches('#').to_ascii_lowercase())
            .collect();
        self.connection.wait_joined(&channels, timeout).await
    }

    /// The connection's number while logged in.
    pub fn session(&self) -> Option<u64> {
        match &*self.connection.state().borrow() {
            LinkState::Up { session } => Some(*session),
            _ => None,
        }
    }

    /// Whether the bot counts as broadcaster, moderator or VIP in `channel` (its limit is 100).
    pub fn elevated(&self, channel: &str) -> bool {
        self.connection
            .facts(&channel.trim_start_matches('#').to_ascii_lowercase())
            .elevated
    }

    /// The reason Twitch refused the login, if it did.
    pub fn refused(&self) -> Option<String> {
        match &*self.connection.state().borrow() {
            LinkState::Refused(reason) => Some(reason.clone()),
            _ => None,
        }
    }
}

fn valid_login(login: &str) -> bool {
    (1..=25).contains(&login.len())
        && login
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[async_trait]
impl ChannelFactory for TwitchFactory {
    fn kind(&self) -> &str {
        "twitch"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: TwitchSettings = setup.settings()?;
        let token = setup.secret("token_env", &settings.token_env)?;
        self.build_with_secrets(&setup, token).await
    }
}

impl TwitchFactory {
    /// Builds the account of `setup` with its token given (the gateway reads it from the
    /// variable `token_env` names). Nothing connects until the first send or the feed runs.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        token: Secret,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: TwitchSettings = setup.settings()?;
        if !valid_login(&settings.login) {
            return Err(setup.invalid(
                "login",
                format!(
                    "{:?} is not a Twitch login (lowercase letters, digits, _)",
                    settings.login
                ),
            ));
        }
        let token = Secret::new(
            token
                .expose()
                .trim()
                .strip_prefix("oauth:")
                .unwrap_or(token.expose().trim()),
        );
        if token.expose().is_empty() {
            return Err(setup.invalid("token_env", "the token variable is empty"));
        }
        let mut channels = Vec::new();
        for channel in &settings.channels {
            let name = channel.trim_start_matches('#').to_ascii_lowercase();
            if !valid_login(&name) {
                return Err(setup.invalid(
                    "channels",
                    format!("{channel:?} is not a Twitch channel (a broadcaster's login)"),
                ));
            }
            channels.push(name);
        }
        if channels.is_empty() {
            return Err(setup.invalid("channels", "join at least one channel"));
        }
        let transport = match settings.send_via {
            SendVia::Irc => Transport::Irc,
            SendVia::Helix => {
                let (Some(user_id), Some(client_id)) =
                    (settings.user_id.clone(), settings.client_id.clone())
                else {
                    return Err(setup.invalid(
                        "user_id",
                        "send_via = \"helix\" needs user_id (the bot's user id) and client_id \
                         (the token's application); or set send_via = \"irc\"",
                    ));
                };
                if settings.helix_base.starts_with("https://") && !cfg!(feature = "rustls") {
                    return Err(setup.invalid(
                        "helix_base",
                        "this build has no TLS (feature `rustls`): Helix over https is not possible",
                    ));
                }
                Transport::Helix {
                    helix: Helix::new(
                        &settings.helix_base,
                        &client_id,
                        token.clone(),
                        Duration::from_millis(settings.request_timeout_ms.max(1)),
                        setup.clock().clone(),
                    ),
                    sender_id: user_id,
                }
            }
        };
        let config = ConnectionConfig {
            host: settings.irc_server.clone(),
            port: settings.irc_port,
            login: settings.login.clone(),
            token,
            channels,
            connect_timeout: Duration::from_millis(settings.connect_timeout_ms.max(1)),
            answer_timeout: Duration::from_millis(settings.answer_timeout_ms.max(1)),
            keepalive: Duration::from_secs(settings.keepalive_s.max(1)),
            backoff_min: Duration::from_millis(settings.reconnect_min_ms.max(1)),
            backoff_max: Duration::from_millis(
                settings
                    .reconnect_max_ms
                    .max(settings.reconnect_min_ms.max(1)),
            ),
        };
        let connection = Connection::new(config, setup.clock().as_ref());
        let adapter = Arc::new(TwitchAdapter::new(
            &setup.name,
            connection.clone(),
            transport,
            Duration::from_millis(settings.send_wait_ms),
            settings.rate_limit,
        ));
        let receiver = Arc::new(TwitchReceiver::new(
            &setup.name,
            settings.answer_all,
            settings.allowed_channels.clone(),
            settings.bot_logins.clone(),
        ));
        let feed = Arc::new(TwitchFeed::new(connection.clone()));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, InboundSource::Pushed(feed))
            .with_description(format!(
                "Twitch {} in {}",
                settings.login,
                settings
                    .channels
                    .iter()
                    .map(|c| format!("#{}", c.trim_start_matches('#')))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .with_platform_url("https://www.twitch.tv", false)
            .with_extension(Arc::new(TwitchLink { connection })))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn setup(settings: serde_json::Value) -> ChannelSetup {
        clawgate_conformance::channel_setup_in_memory(1, "twitch", "default", settings)
    }

    async fn build(settings: serde_json::Value) -> Result<ChannelPlugin, SetupError> {
        TwitchFactory
            .build_with_secrets(&setup(settings), Secret::new("oauth:abc"))
            .await
    }

    #[tokio::test]
    async fn settings_are_checked_and_errors_name_the_key() {
        let ok = json!({ "login": "claw_bot", "token_env": "T", "user_id": "1", "client_id": "c",
                         "channels": ["#ClawChan"] });
        let plugin = build(ok).await.expect("valid settings build");
        assert_eq!(plugin.description, "Twitch claw_bot in #ClawChan");
        let irc =
            json!({ "login": "claw_bot", "token_env": "T", "channels": ["c"], "send_via": "irc" });
        build(irc).await.expect("IRC sending needs no Helix ids");
        for (settings, key) in [
            (
                json!({ "login": "Claw Bot", "token_env": "T", "channels": ["c"], "send_via": "irc" }),
                "channels[1].settings.login",
            ),
            (
                json!({ "login": "claw", "token_env": "T", "channels": [], "send_via": "irc" }),
                "channels[1].settings.channels",
            ),
            (
                json!({ "login": "claw", "token_env": "T", "channels": ["c"] }),
                "channels[1].settings.user_id",
            ),
            (
                json!({ "login": "claw", "token_env": "T", "channels": ["c"], "typo": 1 }),
                "channels[1].settings.typo",
            ),
            (
                json!({ "login": "claw", "token_env": "T", "channels": ["c"], "send_via": "smoke" }),
                "channels[1].settings.send_via",
            ),
        ] {
            let error = build(settings).await.expect_err("refused");
            assert_eq!(error.key, key, "{error}");
        }
    }
}
