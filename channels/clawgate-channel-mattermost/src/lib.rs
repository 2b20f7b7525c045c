//! The Mattermost channel (layer 3): one bot account of a Mattermost server's REST v4 API and
//! WebSocket as a clawgate channel plugin.
//!
//! [`MattermostFactory`] builds `kind = "mattermost"` accounts from their settings
//! ([`MattermostSettings`]): the sender ([`MattermostAdapter`]: create with a `pending_post_id`
//! from the unit's key and the key in `props`, patch, delete, draft-post previews finalized in
//! place, lost answers settled by the same `pending_post_id` or from the channel's posts), the
//! receiver ([`MattermostReceiver`]) and the WebSocket feed (resume by `connection_id` +
//! `sequence_number`, re-fetch over REST when the server starts a fresh connection). With the
//! `simulator` feature, [`simulator`] is a Mattermost server on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod draft;
mod plugin;
mod receive;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
pub mod wire;

pub use adapter::{
    BotCell, KEY_PROP, MAX_MESSAGE_RUNES, MattermostAdapter, MattermostOrigin, ORIGIN_PROP,
    pending_post_id_of,
};
pub use draft::render_draft;
pub use plugin::{MattermostFactory, MattermostSettings};
pub use receive::MattermostReceiver;
pub use source::SocketRecord;
