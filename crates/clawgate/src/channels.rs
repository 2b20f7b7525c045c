//! The channel kinds this build knows — one line per channel crate, each behind its cargo
//! feature (`channel-<kind>`, all on by default) — and the configured channel accounts built
//! from them. A configuration entry's `kind` picks the factory; nothing else in the gateway
//! knows a platform.

use clawgate_channel_sdk::{ChannelPlugin, ChannelRegistry};

/// Every channel kind compiled into this build.
pub fn registry() -> ChannelRegistry {
    #[cfg_attr(not(feature = "channel-qa"), allow(unused_mut))]
    let mut registry = ChannelRegistry::new();
    #[cfg(feature = "channel-qa")]
    registry.register(std::sync::Arc::new(clawgate_channel_qa::QaFactory));
    registry
}

/// One configured chat account: its channel plugin (built by the channel kind's factory) and
/// the agent that answers on it.
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
    pub(crate) max_turn_attempts: u32,
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
