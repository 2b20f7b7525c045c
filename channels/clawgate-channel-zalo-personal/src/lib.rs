//! The Zalo Personal channel (layer 3, **experimental**): a personal Zalo account as a clawgate
//! channel plugin, over the unofficial Zalo Web protocol that zca-js implements.
//!
//! [`ZaloPersonalFactory`] builds `kind = "zalo-personal"` accounts from their settings
//! ([`ZaloPersonalSettings`]): an [`Account`] logged in with a browser session's saved cookies,
//! IMEI and user agent; the sender ([`ZaloPersonalAdapter`]: plain durable text finals, each
//! request's `clientId` written to the [`SendBook`], in the gateway's store, before it goes
//! out); the receiver ([`ZaloPersonalReceiver`]) and the source ([`ZaloListener`]: the account's one WebSocket
//! listener, whose echoes of our own messages settle sends whose answer was lost, and which
//! stays down when another session takes the account over). [`wire`] holds the protocol's
//! encodings. The crate README says why the channel is experimental. With the `simulator`
//! feature, [`simulator`] is Zalo Web on loopback.

#![warn(missing_docs)]

mod account;
mod adapter;
mod book;
mod client;
mod plugin;
mod receive;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
pub mod wire;

pub use account::{Account, SessionState, Takeover};
pub use adapter::{MAX_TEXT_CHARS, ZaloPersonalAdapter};
pub use book::{BOOK_FILE, BookError, Evidence, SendBook};
pub use client::{CallError, Credentials, LoginError, Session, ThreadKind, WebClient};
pub use plugin::{DEFAULT_LOGIN_BASE, ZaloPersonalFactory, ZaloPersonalSettings, cookie_header};
pub use receive::ZaloPersonalReceiver;
pub use source::ZaloListener;
