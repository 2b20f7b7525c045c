//! The WhatsApp channel (layer 3): one WhatsApp Business phone number on the Cloud API as a
//! clawgate channel plugin.
//!
//! [`WhatsAppFactory`] builds `kind = "whatsapp"` accounts from their settings
//! ([`WhatsAppSettings`]): the sender ([`WhatsAppAdapter`]: `POST /<phone-number-id>/messages`,
//! text in 4096-character chunks, quoted replies, the unit's key in
//! `biz_opaque_callback_data`), the receiver ([`WhatsAppReceiver`]) and the source
//! ([`WebhookSource`]: signed webhooks, the verification handshake, statuses written to the
//! [`StatusBook`] that settles sends whose answer was lost). The crate README says which sends
//! can be settled. With the `simulator` feature, [`simulator`] is the Cloud API on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod plugin;
mod receive;
pub mod signature;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
mod status;

pub use adapter::{MAX_CALLBACK_DATA, MAX_TEXT_CHARS, WhatsAppAdapter};
pub use plugin::{
    BusinessNumber, DEFAULT_API_BASE, DEFAULT_API_VERSION, WhatsAppFactory, WhatsAppSettings,
};
pub use receive::WhatsAppReceiver;
pub use source::{MAX_BODY_BYTES, WebhookConfig, WebhookSource};
pub use status::{BOOK_FILE, BookError, STATUS_BOOK, StatusBook, StatusEvidence};
