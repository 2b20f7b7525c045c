//! The receive side: one platform event → a normalized message and its ack policy.

use clawgate_types::{ChannelMessage, ReceiveAckPolicy};

use crate::ReceiveError;

/// Platform facts about an inbound event the core needs beyond the normalized message.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NormalizedInbound {
    /// The platform's id of the event (dedupe key across redeliveries).
    pub event_id: String,
    /// The message, direction inbound.
    pub message: ChannelMessage,
    /// The platform says a bot account wrote it.
    pub is_bot_author: bool,
}

impl NormalizedInbound {
    /// The event `event_id` carrying `message`, written by a person.
    pub fn new(event_id: impl Into<String>, message: ChannelMessage) -> NormalizedInbound {
        NormalizedInbound {
            event_id: event_id.into(),
            message,
            is_bot_author: false,
        }
    }

    /// Marks the author as a bot account (the platform says so).
    pub fn by_bot(mut self, is_bot: bool) -> NormalizedInbound {
        self.is_bot_author = is_bot;
        self
    }
}

/// The receive side: platform payload → normalized message + ack policy.
pub trait MessageReceiveAdapter: Send + Sync {
    /// Normalizes one platform event; malformed payloads are a typed error, never a panic.
    fn normalize(&self, raw: &serde_json::Value) -> Result<NormalizedInbound, ReceiveError>;

    /// When this event's transport (or polling) ack may be given.
    fn ack_policy(&self, _inbound: &NormalizedInbound) -> ReceiveAckPolicy {
        ReceiveAckPolicy::AfterRecord
    }
}
