//! `[[channels]] kind = "signal"`: the settings of one Signal account on a signal-cli daemon,
//! checked at start (`listAccounts`), and the plugin built from them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelFactory, ChannelPlugin, ChannelSetup, InboundSource, SetupError,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::warn;

use crate::adapter::SignalAdapter;
use crate::client::{CallError, Daemon};
use crate::receive::SignalReceiver;
use crate::source::ReceiveSource;

/// `[channels.settings]` of a `signal` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalSettings {
    /// The account's number as registered or linked in signal-cli (`+4915112345678`).
    pub account: String,
    /// The daemon's JSON-RPC socket (`signal-cli daemon --tcp 127.0.0.1:7583
    /// --receive-mode=manual`). It has no authentication: keep it on loopback.
    #[serde(default = "default_daemon")]
    pub daemon: String,
    /// People answered (numbers or ACIs); empty: everyone who writes.
    #[serde(default)]
    pub allowed_senders: Vec<String>,
    /// Senders that are automated (another bot, a notifier), reported as bots so the entry's
    /// `allow_bots` decides whether they are answered.
    #[serde(default)]
    pub bot_senders: Vec<String>,
    /// How long one call may take before its outcome counts as unknown (a send to a large
    /// group encrypts for every member).
    #[serde(default = "default_request_timeout_ms")]
    pub request_timeout_ms: u64,
}

fn default_daemon() -> String {
    "127.0.0.1:7583".into()
}
fn default_request_timeout_ms() -> u64 {
    30_000
}

/// Builds `signal` channels. signal-cli keeps the account's keys itself: there is no secret
/// in the settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct SignalFactory;

/// Checks that the daemon holds the account. A daemon that answers without it stops the start
/// naming the setting; an unreachable daemon is only a warning (sends then fail as transient
/// and the source keeps dialling).
async fn check_account(
    setup: &ChannelSetup,
    settings: &SignalSettings,
    daemon: &Daemon,
) -> Result<(), SetupError> {
    match daemon.call("listAccounts", json!({})).await {
        Ok(Value::Array(accounts)) => {
            let held = accounts.iter().any(|a| {
                a.get("number").and_then(Value::as_str) == Some(settings.account.as_str())
            });
            if held {
                return Ok(());
            }
            let numbers: Vec<&str> = accounts
                .iter()
                .filter_map(|a| a.get("number").and_then(Value::as_str))
                .collect();
            Err(setup.invalid(
                "account",
                format!(
                    "the signal-cli daemon at {} holds {numbers:?}, not {}: register or link the \
                     account there (`signal-cli -a {} register` or `link`), or fix the number",
                    daemon.addr(),
                    settings.account,
                    settings.account
                ),
            ))
        }
        Ok(other) => {
            warn!(channel = %setup.name, answer = %other, "listAccounts answered no list; the account is checked on use");
            Ok(())
        }
        Err(CallError::Refused(error)) => {
            warn!(channel = %setup.name, code = error.code, message = %error.message, "listAccounts was refused (a single-account daemon?); the account is checked on use");
            Ok(())
        }
        Err(error) => {
            warn!(channel = %setup.name, error = ?error, "the signal-cli daemon did not answer; it is dialled again on use");
            Ok(())
        }
    }
}

#[async_trait]
impl ChannelFactory for SignalFactory {
    fn kind(&self) -> &str {
        "signal"
    }

    async fn build(&self, setup: ChannelSetup) -> Result<ChannelPlugin, SetupError> {
        let settings: SignalSettings = setup.settings()?;
        let valid_number = settings.account.starts_with('+')
            && settings.account.len() > 4
            && settings.account[1..].chars().all(|c| c.is_ascii_digit());
        if !valid_number {
            return Err(setup.invalid(
                "account",
                format!(
                    "{:?} is not a phone number in international form (+4915112345678)",
                    settings.account
                ),
            ));
        }
        if settings.daemon.parse::<std::net::SocketAddr>().is_err()
            && !settings.daemon.contains(':')
        {
            return Err(setup.invalid(
                "daemon",
                format!(
                    "{:?} is not host:port (the daemon's --tcp address)",
                    settings.daemon
                ),
            ));
        }
        let timeout = Duration::from_millis(settings.request_timeout_ms.max(1));
        let daemon = Daemon::new(&settings.daemon, &settings.account, timeout);
        check_account(&setup, &settings, &daemon).await?;
        let adapter = Arc::new(SignalAdapter::new(&setup.name, daemon));
        let receiver = Arc::new(SignalReceiver::new(
            &setup.name,
            &settings.account,
            settings.allowed_senders.iter().cloned(),
            settings.bot_senders.iter().cloned(),
        ));
        let source = InboundSource::Pushed(Arc::new(ReceiveSource::new(
            &setup.name,
            &settings.daemon,
            &settings.account,
        )));
        Ok(ChannelPlugin::new(adapter)
            .with_inbound(receiver, source)
            .with_description(format!(
                "Signal account {} on signal-cli at {}",
                settings.account, settings.daemon
            )))
    }
}
