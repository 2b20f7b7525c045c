//! The Google Chat channel (layer 3): one Chat app as a clawgate channel plugin.
//!
//! [`GoogleChatFactory`] builds `kind = "googlechat"` accounts from their settings
//! ([`GoogleChatSettings`]; credentials: a service account key, whose access tokens are minted
//! and renewed here, or a ready token): the sender ([`GoogleChatAdapter`]: `spaces.messages.create` with a
//! `requestId` and a client-assigned `messageId` derived from the unit key, `patch` with
//! `updateMask`, `delete`; an unknown send settled by `GET spaces/*/messages/client-…`), the
//! receiver ([`GoogleChatReceiver`]) and the source ([`EventsSource`]: interaction events over
//! HTTP, each request's bearer JWT checked before its body is read). The crate README says which
//! sends can be settled after a lost answer. With the `simulator` feature, [`simulator`] is a
//! Google Chat on loopback.

#![warn(missing_docs)]

mod adapter;
mod auth;
mod client;
mod plugin;
mod receive;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{GoogleChatAdapter, GoogleChatOrigin, MAX_TEXT_CHARS, message_id_for};
pub use auth::{CHAT_BOT_SCOPE, KeyError};
pub use plugin::{
    DEFAULT_API_BASE, DEFAULT_CERTS_URL, GoogleChatCredentials, GoogleChatFactory,
    GoogleChatSettings,
};
pub use receive::GoogleChatReceiver;
pub use source::{CHAT_ISSUER, EventsConfig, EventsSource, MAX_BODY_BYTES, TokenError};
