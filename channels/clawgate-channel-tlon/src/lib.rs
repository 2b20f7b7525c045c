//! The Tlon channel (layer 3): Tlon Messenger on an Urbit ship as a clawgate channel plugin,
//! through Eyre's HTTP channel API.
//!
//! [`TlonFactory`] builds `kind = "tlon"` accounts from their settings ([`TlonSettings`]):
//! the sender ([`TlonAdapter`]: DMs as `chat-dm-action` pokes with a client-chosen writ id,
//! group channel posts and thread replies as `channel-action-1` pokes; a poke is sent on its
//! `ok` event, refused on its `err`; lost answers settled by scrying the ship), the render
//! adapter ([`TlonRenderer`]: the optional model signature on the model's replies), the
//! receiver ([`TlonReceiver`]: DMs, group posts that mention us or sit in a thread we take part
//! in ([`ParticipatedThreads`])), and the source ([`EyreSource`]: the `chat` and `channels`
//! subscriptions over one Eyre channel, acked after the durable record). With the `simulator`
//! feature, [`simulator`] is a loopback ship.

#![warn(missing_docs)]

mod adapter;
mod airlock;
pub mod aura;
mod eyre;
mod plugin;
mod receive;
mod render;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
pub mod story;
mod threads;

pub use adapter::{MAX_TEXT_CHARS, SCAN_POSTS, SendTuning, TlonAdapter, sent_of_writ_id};
pub use eyre::{ChannelEvent, EventStream, Eyre, EyreError};
pub use plugin::{TlonFactory, TlonSettings};
pub use receive::TlonReceiver;
pub use render::TlonRenderer;
pub use source::{
    CHANNEL_FILE, CHANNEL_VALUE, ChannelRecord, EyreSource, SUBSCRIPTIONS, import_channel_record,
};
pub use threads::{ParticipatedThreads, THREADS_BOOK, THREADS_FILE, ThreadsError};
