//! Helpers shared by the end-to-end tests.

use clawgate_types::{ChannelMessage, MessageBody, MessageDirection, MessageTarget, TargetKind};

/// An outbound QA message with this id and text, to the room `room-1`.
pub fn qa_message(id: &str, text: &str) -> ChannelMessage {
    ChannelMessage {
        id: id.into(),
        channel: "qa".into(),
        account_id: Some("bot".into()),
        direction: MessageDirection::Outbound,
        target: MessageTarget {
            kind: TargetKind::Group,
            id: "room-1".into(),
            label: None,
            space_id: None,
            parent_id: None,
            thread_id: None,
            native_channel_id: None,
        },
        sender: None,
        body: Some(MessageBody {
            text: text.into(),
            format: None,
        }),
        attachments: vec![],
        relation: None,
        origin: None,
        timestamp: None,
        raw: None,
    }
}
