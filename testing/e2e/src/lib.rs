//! Helpers shared by the end-to-end tests.

use clawgate_types::{ChannelMessage, MessageTarget};

/// An outbound QA message with this id and text, to the room `room-1`.
pub fn qa_message(id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "qa", MessageTarget::group("room-1"), text).with_account_id("bot")
}
