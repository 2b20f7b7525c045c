//! The iMessage channel (layer 3): one Apple ID's Messages, through a BlueBubbles server (a
//! macOS app with a REST API and webhooks), as a clawgate channel plugin.
//!
//! [`ImessageFactory`] builds `kind = "imessage"` accounts from their settings
//! ([`ImessageSettings`]): the sender ([`ImessageAdapter`]: `POST /api/v1/message/text` with a
//! `tempGuid` derived from the unit key, the real `guid` as the receipt, edits and unsends
//! within Apple's windows when the server has the Private API), its [`SendJournal`] (attempts
//! written to the gateway's store before each request, so a send whose answer was lost is settled from the chat's own
//! rows, never sent twice), the [`EchoCache`] every sent unit is written to before it goes out
//! (the server hands our own messages back as `new-message` events: they are recognised and
//! never answered, after a restart too), the receiver ([`ImessageReceiver`]) and the source
//! ([`WebhookSource`]: a secret token in the webhook URL checked in constant time, answered
//! after the durable record). With the `simulator` feature, [`simulator`] is a BlueBubbles
//! server on loopback.

#![warn(missing_docs)]

mod adapter;
mod client;
mod echoes;
mod journal;
mod plugin;
mod receive;
#[cfg(feature = "simulator")]
pub mod simulator;
mod source;

pub use adapter::{
    EDIT_WINDOW_MS, ImessageAdapter, MAX_EDITS, MAX_TEXT_CHARS, UNSEND_WINDOW_MS, temp_guid_for,
};
pub use echoes::{CLOCK_SKEW_MS, EchoCache, EchoMatch, normalise};
pub use journal::{Attempt, JOURNAL_FILE, JournalError, RETENTION_MS, SendJournal};
pub use plugin::{ImessageAccount, ImessageFactory, ImessageSettings};
pub use receive::ImessageReceiver;
pub use source::{MAX_BODY_BYTES, SourceCounts, WebhookConfig, WebhookSource};
