//! The Microsoft Teams channel (layer 3): one Bot Framework bot as a clawgate channel plugin.
//!
//! [`TeamsFactory`] builds `kind = "teams"` accounts from their settings ([`TeamsSettings`];
//! credentials: the app id and its client secret, whose access tokens are fetched and renewed
//! here): the sender ([`TeamsAdapter`]: activities sent, replied in channel threads, updated and
//! deleted; previews in one-on-one chats as a Teams stream whose final message is the answer),
//! the receiver ([`TeamsReceiver`]) and the source (the messaging endpoint, each request's Bot
//! Framework JWT checked before its body is read; the service URL of every conversation kept for
//! later sends). The crate README says which sends can be settled after a lost answer. With the
//! `simulator` feature, [`simulator`] is a Teams on loopback.

#![warn(missing_docs)]

mod adapter;
mod auth;
mod client;
mod plugin;
mod receive;
mod references;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{MAX_TEXT_CHARS, TeamsAdapter};
pub use auth::BOT_FRAMEWORK_SCOPE;
pub use plugin::{DEFAULT_OPENID_URL, DEFAULT_TOKEN_URL, TeamsFactory, TeamsSettings};
pub use receive::TeamsReceiver;
pub use references::{ConversationReference, REFERENCES_FILE};
pub use source::{
    BOT_FRAMEWORK_ISSUER, EndpointConfig, MAX_BODY_BYTES, MessagesEndpoint, TokenError, Verified,
};
