//! The QQ Bot channel (layer 3): one bot of the QQ open platform (bot.q.qq.com) as a clawgate
//! channel plugin, for C2C (one-to-one) chats and groups that @-mention it.
//!
//! [`QqFactory`] builds `kind = "qq"` bots from their settings ([`QqSettings`]): the sender
//! ([`QqAdapter`]: passive replies under a `(msg_id, msg_seq)` pair derived from the unit's
//! durable key, so QQ's 40054005 "deduplicated" answer settles a resend; active messages within
//! a monthly quota, journaled in the [`ActiveJournal`] in the gateway's store; C2C stream previews with an accumulator
//! timeout), the renderer ([`QqRenderer`]: media tags and text as voice through a
//! [`Tts`] command), the receiver ([`QqReceiver`]) and the source ([`CallbackSource`]: HTTP
//! callbacks whose Ed25519 signature and its timestamp's freshness are checked before anything
//! else, answered after the durable record). The crate README says which sends can be settled after a lost answer. With
//! the `simulator` feature, [`simulator`] is the QQ Bot API, its token endpoint and its callback
//! sender on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod journal;
mod passive;
mod plugin;
mod receive;
mod render;
pub mod signature;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;
mod tts;

pub use adapter::{PROBE_TEXT, QqAdapter};
pub use client::{
    CODE_ACTIVE_QUOTA, CODE_DEDUPLICATED, CODE_MESSAGE_GONE, CODE_MUTED, CODE_NO_ACTIVE_PERMISSION,
    CODE_NOT_MEMBER, CODE_PASSIVE_EXPIRED, CODE_PASSIVE_EXPIRED_GROUP, CODE_REPLY_LIMIT,
    CODE_STREAM_CLOSED, CODE_TOKEN_INVALID, TRACE_HEADER, TokenError,
};
pub use journal::{ActiveAttempt, ActiveJournal, JOURNAL_FILE, JournalError};
pub use passive::{answered_msg_id, answered_of, msg_seq_of};
pub use plugin::{
    DEFAULT_API_BASE, DEFAULT_TOKEN_BASE, PLATFORM_ACTIVE_QUOTA, QqFactory, QqSettings,
    SANDBOX_API_BASE,
};
pub use receive::{C2C_MESSAGE_CREATE, GROUP_AT_MESSAGE_CREATE, QqReceiver, RecentInbound};
pub use render::{FILE_IMAGE, FILE_VIDEO, FILE_VOICE, MAX_TEXT_CHARS, MAX_VOICE_CHARS, QqRenderer};
pub use source::{CallbackConfig, CallbackSource, MAX_BODY_BYTES};
pub use tts::{MAX_AUDIO_BYTES, Tts};
