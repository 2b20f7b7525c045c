//! The Feishu / Lark channel (layer 3): one Feishu (or Lark) app's bot as a clawgate channel
//! plugin.
//!
//! [`FeishuFactory`] builds `kind = "feishu"` apps from their settings ([`FeishuSettings`]):
//! the sender ([`FeishuAdapter`]: `im/v1/messages` create and reply under a `uuid` derived from
//! the unit's key, previews as CardKit streaming cards that become the final), the renderer
//! ([`FeishuRenderer`]: text, post, card or raw), the receiver ([`FeishuReceiver`]) and the
//! source ([`WebhookSource`]: signed, encrypted event callbacks, refused alike when stale or
//! forged, answered after the durable record). The crate README says which sends can be settled after a lost answer. With the
//! `simulator` feature, [`simulator`] is the Open Platform and its event sender on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
pub mod crypto;
mod plugin;
mod receive;
mod render;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{FeishuAdapter, uuid_of};
pub use client::{
    CODE_APP_SECRET_INVALID, CODE_BOT_NOT_IN_CHAT, CODE_CHAT_RATE_LIMITED, CODE_INVALID_PARAM,
    CODE_MESSAGE_GONE, CODE_RATE_LIMITED, CODE_STREAMING_CLOSED, CODE_TOKEN_INVALID,
    CODE_TOKEN_MISSING, RATELIMIT_RESET_HEADER,
};
pub use plugin::{
    BotIdentity, CALLBACK_TIMEOUT_MS, DEFAULT_API_BASE, FeishuFactory, FeishuSecrets,
    FeishuSettings, LARK_API_BASE, UUID_DEDUPE_MS,
};
pub use receive::{FeishuReceiver, MESSAGE_RECEIVED};
pub use render::{CARD_ELEMENT_ID, FeishuRenderer, MAX_TEXT_CHARS, card_json, content_of};
pub use source::{MAX_BODY_BYTES, UNSIGNED_BURST, UNSIGNED_REFILL, WebhookConfig, WebhookSource};
