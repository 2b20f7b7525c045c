//! The Zalo Official Account channel (layer 3): one Zalo OA as a clawgate channel plugin.
//!
//! [`ZaloFactory`] builds `kind = "zalo"` accounts from their settings ([`ZaloSettings`]):
//! the sender ([`ZaloAdapter`]: consultation messages `POST /v3.0/oa/message/cs`, text in
//! 2000-character chunks), its access tokens ([`TokenStore`]: refreshed with the rotating
//! refresh token, the new pair written to the gateway's store with compare-and-set before
//! use, so gateways sharing the store spend each refresh token once), the receiver
//! ([`ZaloReceiver`]) and the source ([`WebhookSource`]: `X-ZEvent-Signature` and the
//! freshness of the `timestamp` it covers checked before anything else, answered 200 after the
//! durable record; the OA's `oa_send_text` echoes of our
//! own sends written to the [`EchoBook`] that settles sends whose answer was lost). The crate
//! README says which sends can be settled. With the `simulator` feature, [`simulator`] is the
//! OA API, the OAuth token endpoint and the webhook sender on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod echoes;
mod plugin;
mod receive;
pub mod signature;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
mod tokens;

pub use adapter::{MAX_TEXT_CHARS, ZaloAdapter};
pub use echoes::{BOOK_FILE, BookError, CLOCK_SKEW_MS, EchoBook, SENDS_BOOK, SendEvidence};
pub use plugin::{
    DEFAULT_API_BASE, DEFAULT_OAUTH_BASE, OfficialAccount, ZaloFactory, ZaloSettings,
};
pub use receive::ZaloReceiver;
pub use source::{MAX_BODY_BYTES, WebhookConfig, WebhookSource};
pub use tokens::{TOKEN_FILE, TOKENS_VALUE, TokenError, TokenStore};
