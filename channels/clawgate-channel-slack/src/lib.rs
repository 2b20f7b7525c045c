//! The Slack channel (layer 3): one Slack app's bot token as a clawgate channel plugin.
//!
//! [`SlackFactory`] builds `kind = "slack"` accounts from their settings ([`SlackSettings`]):
//! the sender ([`SlackAdapter`]: `chat.postMessage`, `chat.update`, `chat.delete`, previews as
//! native streams or draft messages, unknown sends settled from history by the unit's key in
//! message `metadata`), the receiver ([`SlackReceiver`]) and the source ([`EventsSource`]: the
//! Events API over signed HTTP). The crate README says which sends can be settled after a lost
//! answer. With the `simulator` feature, [`simulator`] is a Slack workspace on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod plugin;
mod receive;
pub mod signature;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{MAX_TEXT_CHARS, METADATA_EVENT_TYPE, SlackAdapter, SlackOrigin};
pub use plugin::{BotIdentity, DEFAULT_API_BASE, SlackFactory, SlackSettings};
pub use receive::SlackReceiver;
pub use source::{EventsConfig, EventsSource, MAX_BODY_BYTES};
