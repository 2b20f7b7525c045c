//! `[[channels]] kind = "irc"`: the settings of one nick on one server, and the plugin built
//! from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, Secret, SetupError,
};
use serde::Deserialize;

use crate::adapter::IrcAdapter;
use crate::connection::{Connection, ConnectionConfig, LinkState};
use crate::flood::FloodPolicy;
use crate::line::valid_target;
use crate::receive::{IrcReceiver, is_channel};
use crate::register::Auth;
use crate::source::IrcFeed;

/// `[channels.settings]` of an `irc` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IrcSettings {
    /// The server's host name or address.
    pub server: String,
    /// Its port (plain TCP; put a TLS tunnel in front for TLS).
    #[serde(default = "default_port")]
    pub port: u16,
    /// The nick.
    pub nick: String,
    /// Nicks tried in order when the nick is taken (433); default: the nick with `_`, `__`.
    #[serde(default)]
    pub alternate_nicks: Vec<String>,
    /// The user name (`USER`); default: the nick.
    #[serde(default)]
    pub user: Option<String>,
    /// The real name shown in `WHOIS`.
    #[serde(default = "default_realname")]
    pub realname: String,
    /// Channels joined (and joined again after a reconnect or a kick).
    #[serde(default)]
    pub channels: Vec<String>,
    /// The environment variable holding the password: the server password (`PASS`), or the
    /// SASL password when `sasl_account` is set.
    #[serde(default)]
    pub password_env: Option<String>,
    /// Log in with SASL PLAIN as this account (the server must offer `sasl`).
    #[serde(default)]
    pub sasl_account: Option<String>,
    /// Answer every line in a channel, not only those addressed `nick: …`.
    #[serde(default)]
    pub answer_all: bool,
    /// Channels answered; empty: every joined channel.
    #[serde(default)]
    pub allowed_channels: Vec<String>,
    /// Nicks reported as bot authors (plain IRC does not say).
    #[serde(default)]
    pub bot_nicks: Vec<String>,
    /// Flood control: bytes that may go out at once.
    #[serde(default = "default_burst")]
    pub flood_burst_bytes: u32,
    /// Flood control: bytes a second sustained.
    #[serde(default = "default_rate")]
    pub flood_bytes_per_second: u32,
    /// Flood control: what the shortest line costs, in bytes.
    #[serde(default = "default_min_cost")]
    pub flood_min_line_bytes: u32,
    /// How long connecting may take.
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// How long a written line waits for the server before its outcome counts as unknown.
    #[serde(default = "default_answer_timeout_ms")]
    pub answer_timeout_ms: u64,
    /// A send waits this long for the connection before it fails as not sent.
    #[serde(default = "default_send_wait_ms")]
    pub send_wait_ms: u64,
    /// Our `PING` after this much silence; the link counts as dead after twice as much.
    #[serde(default = "default_keepalive_s")]
    pub keepalive_s: u64,
    /// The first reconnect waits this long, doubling up to `reconnect_max_ms`.
    #[serde(default = "default_reconnect_min_ms")]
    pub reconnect_min_ms: u64,
    /// The longest wait between reconnects.
    #[serde(default = "default_reconnect_max_ms")]
    pub reconnect_max_ms: u64,
}

fn default_port() -> u16 {
    6667
}
fn default_realname() -> String {
    "clawgate".into()
}
// ngircd starts delaying a client past about 1 KB or 3 commands a second; RFC 1459 §8.10's
// 2 s a message is stricter still for long lines. Half a KB a second stays clear of both.
fn default_burst() -> u32 {
    1024
}
fn default_rate() -> u32 {
    512
}
fn default_min_cost() -> u32 {
    192
}
fn default_connect_timeout_ms() -> u64 {
    10_000
}
fn default_answer_timeout_ms() -> u64 {
    30_000
}
fn default_send_wait_ms() -> u64 {
    10_000
}
fn default_keepalive_s() -> u64 {
    90
}
fn default_reconnect_min_ms() -> u64 {
    1_000
}
fn default_reconnect_max_ms() -> u64 {
    60_000
}

/// Builds `irc` channels.
#[derive(Debug, Clone, Copy, Default)]
pub struct IrcFactory;

/// The link of an IRC channel, for operators and tests (the plugin's extension).
#[derive(Debug, Clone)]
pub struct IrcLink {
    connection: Connection,
}

impl IrcLink {
    /// Our nick and the connection's number while registered (`None` while down).
    pub fn current(&self) -> Option<(String, u64)> {
        match &*self.connection.state().borrow() {
            LinkState::Up { session, nick } => Some((nick.clone(), *session)),
            _ => None,
        }
    }

    /// Connects now (a send or the feed would otherwise) and waits up to `timeout` for the
    /// link; returns our nick and the connection's number.
    pub async fn wait_up(&self, timeout: Duration) -> Option<(String, u64)> {
        self.connection.ensure_started();
        let mut state = self.connection.state();
        tokio::time::timeout(
            timeout,
            state.wait_for(|s| matches!(s, LinkState::Up { .. })),
        )
        .await
        .ok()?
        .ok()?;
        self.current()
    }

    /// Our `nick!user@host` as the server relays it (seen in our own `JOIN`): lines are split
    /// for it, and for the longest possible host before it is known.
    pub fn relayed_prefix(&self) -> Option<String> {
        self.connection.prefix()
    }

    /// The IRCv3 capabilities granted on the current connection (empty while down, and on a
    /// server that offers none of those the channel asks for).
    pub fn capabilities(&self) -> Vec<String> {
        self.connection.capabilities()
    }

    /// The channels we are in now (lowercase), as the server confirmed our `JOIN`s; empty while
    /// the link is down.
    pub fn joined(&self) -> Vec<String> {
        self.connection.joined()
    }

    /// The reason the server refused the account, if it did.
    pub fn refused(&self) -> Option<String> {
        match &*self.connection.state().borrow() {
            LinkState::Refused(reason) => Some(reason.clone()),
            _ => None,
        }
    }
}

fn valid_nick(nick: &str) -> bool {
    valid_target(nick) && !is_channel(nick) && !nick.contains(['!', '@', ':'])
}

#[async_trait]
impl ChannelFactory for IrcFactory {
    fn kind(&self) -> &str {
        "irc"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: IrcSettings = setup.settings()?;
        let password = match settings.password_env.as_deref() {
            Some(variable) => Some(setup.secret("password_env", variable)?),
            None => None,
        };
        self.build_with_secrets(&setup, password).await
    }
}

impl IrcFactory {
    /// Builds the account of `setup` with its password given (the gateway reads it from the
    /// variable `password_env` names). Nothing connects until the first send or the feed runs.
    pub async fn build_with_secrets(
        &self,
        setup: &ChannelSetup,
        password: Option<Secret>,
    ) -> Result<ChannelPlugin, SetupError> {
        let settings: IrcSettings = setup.settings()?;
        if settings.server.trim().is_empty() {
            return Err(setup.invalid("server", "name the IRC server's host"));
        }
        if settings.port == 0 {
            return Err(setup.invalid("port", "0 is not a port"));
        }
        if !valid_nick(&settings.nick) {
            return Err(setup.invalid(
                "nick",
                format!("{:?} is not a valid IRC nick", settings.nick),
            ));
        }
        let mut nicks = vec![settings.nick.clone()];
        if settings.alternate_nicks.is_empty() {
            nicks.push(format!("{}_", settings.nick));
            nicks.push(format!("{}__", settings.nick));
        }
        for nick in &settings.alternate_nicks {
            if !valid_nick(nick) {
                return Err(setup.invalid(
                    "alternate_nicks",
                    format!("{nick:?} is not a valid IRC nick"),
                ));
            }
            nicks.push(nick.clone());
        }
        for channel in settings.channels.iter().chain(&settings.allowed_channels) {
            if !is_channel(channel) || !valid_target(channel) {
                return Err(setup.invalid(
                    "channels",
                    format!("{channel:?} is not a channel name (#name)"),
                ));
            }
        }
        let user = settings
            .user
            .clone()
            .unwrap_or_else(|| settings.nick.clone());
        if !valid_target(&user) {
            return Err(setup.invalid("user", format!("{user:?} is not a valid user name")));
        }
        let auth = match (settings.sasl_account.clone(), password) {
            (Some(account), Some(password)) => Auth::SaslPlain { account, password },
            (Some(_), None) => {
                return Err(setup.invalid(
                    "sasl_account",
                    "SASL needs a password: set password_env to the variable holding it",
                ));
            }
            (None, Some(password)) => Auth::ServerPassword(password),
            (None, None) => Auth::None,
        };
        if settings.flood_bytes_per_second == 0 || settings.flood_burst_bytes < 512 {
            return Err(setup.invalid(
                "flood_burst_bytes",
                "flood control needs a rate above 0 and a burst of at least one line (512)",
            ));
        }
        let config = ConnectionConfig {
            host: settings.server.clone(),
            port: settings.port,
            nicks,
            user,
            realname: settings.realname.clone(),
            auth,
            channels: settings.channels.clone(),
            flood: FloodPolicy {
                burst_bytes: settings.flood_burst_bytes,
                bytes_per_second: settings.flood_bytes_per_second,
                min_cost: settings.flood_min_line_bytes,
            },
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
        let adapter = Arc::new(IrcAdapter::new(
            &setup.name,
            connection.clone(),
            Duration::from_millis(settings.send_wait_ms),
        ));
        let receiver = Arc::new(IrcReceiver::new(
            &setup.name,
            settings.answer_all,
            settings.allowed_channels.clone(),
            settings.bot_nicks.clone(),
        ));
        let feed = Arc::new(IrcFeed::new(connection.clone()));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, InboundSource::Pushed(feed))
            .with_description(format!(
                "IRC {} on {}:{}",
                settings.nick, settings.server, settings.port
            ))
            .with_platform_url(
                format!("irc://{}:{}", settings.server, settings.port),
                false,
            )
            .with_extension(Arc::new(IrcLink { connection })))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn setup(settings: serde_json::Value) -> ChannelSetup {
        clawgate_conformance::channel_setup_in_memory(1, "irc", "default", settings)
    }

    async fn build(settings: serde_json::Value) -> Result<ChannelPlugin, SetupError> {
        IrcFactory.build_with_secrets(&setup(settings), None).await
    }

    #[tokio::test]
    async fn settings_are_checked_and_errors_name_the_key() {
        let ok = json!({ "server": "127.0.0.1", "nick": "claw", "channels": ["#room"] });
        let plugin = build(ok).await.expect("valid settings build");
        assert_eq!(plugin.description, "IRC claw on 127.0.0.1:6667");
        for (settings, key) in [
            (
                json!({ "server": "h", "nick": "a b" }),
                "channels[1].settings.nick",
            ),
            (
                json!({ "server": "h", "nick": "claw", "channels": ["room"] }),
                "channels[1].settings.channels",
            ),
            (
                json!({ "server": "h", "nick": "claw", "sasl_account": "claw" }),
                "channels[1].settings.sasl_account",
            ),
            (
                json!({ "server": "h", "nick": "claw", "typo": 1 }),
                "channels[1].settings.typo",
            ),
            (
                json!({ "server": "", "nick": "claw" }),
                "channels[1].settings.server",
            ),
        ] {
            let error = build(settings).await.expect_err("refused");
            assert_eq!(error.key, key, "{error}");
        }
    }
}
