//! One configured chat account: the channel plugin a channel kind's factory built, and the
//! agent that answers on it.

use clawgate_channel_sdk::ChannelPlugin;

/// One configured chat account: its channel plugin (built by the channel kind's factory) and
/// the agent that answers on it.
#[non_exhaustive]
pub struct Channel {
    /// The channel name messages carry (`<kind>`, or `<kind>-<account>` for further accounts).
    pub name: String,
    /// The channel kind (`qa`, `telegram`…).
    pub kind: String,
    /// The account id.
    pub account: String,
    /// The agent that answers.
    pub agent_id: String,
    /// Send, receive and source of the channel.
    pub plugin: ChannelPlugin,
    /// How many attempts an inbound event gets before it is dead-lettered.
    pub max_turn_attempts: u32,
    /// Whether messages other bots write are answered (after the echo gate; the bot-loop guard
    /// still applies). Off unless the channel entry turns it on.
    pub allow_bots: bool,
    /// Whether `/stop` and `/new` from a person are commands (cancel the running turn; begin
    /// a fresh agent session) rather than prompts. On unless the channel entry turns it off.
    pub commands: bool,
}

impl Channel {
    /// The account `account` of kind `kind`, named `name`, answered by `agent_id`, whose events
    /// get `max_turn_attempts` attempts each.
    pub fn new(
        name: impl Into<String>,
        kind: impl Into<String>,
        account: impl Into<String>,
        agent_id: impl Into<String>,
        plugin: ChannelPlugin,
        max_turn_attempts: u32,
    ) -> Channel {
        Channel {
            name: name.into(),
            kind: kind.into(),
            account: account.into(),
            agent_id: agent_id.into(),
            plugin,
            max_turn_attempts,
            allow_bots: false,
            commands: true,
        }
    }

    /// The same channel, taking `/stop` and `/new` as commands when `on` is set.
    #[must_use]
    pub fn with_commands(mut self, on: bool) -> Channel {
        self.commands = on;
        self
    }

    /// The same channel, answering other bots' messages when `allow` is set.
    #[must_use]
    pub fn with_allow_bots(mut self, allow: bool) -> Channel {
        self.allow_bots = allow;
        self
    }
}

/// The plugin's `Debug` prints no secret (adapters redact their tokens).
impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("account", &self.account)
            .field("agent_id", &self.agent_id)
            .field("plugin", &self.plugin)
            .finish_non_exhaustive()
    }
}
