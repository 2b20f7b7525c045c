//! The channel kinds this build knows: one line per channel crate, each behind its cargo
//! feature (`channel-<kind>`, all on by default). A configuration entry's `kind` picks the
//! factory; nothing else in the gateway knows a platform.

use std::sync::Arc;

use clawgate_channel_sdk::ChannelRegistry;

/// Every channel kind compiled into this build.
pub fn registry() -> ChannelRegistry {
    let mut registry = ChannelRegistry::new();
    #[cfg(feature = "channel-qa")]
    registry.register(Arc::new(clawgate_channel_qa::QaFactory));
    let _ = &mut registry;
    registry
}
