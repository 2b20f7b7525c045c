//! Platform-neutral messages: target, actor, body, attachments and relation.

use serde::{Deserialize, Serialize};

use crate::{MessageOrigin, UnixMillis};

/// Whether a message came from a platform or is going to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MessageDirection {
    /// Received from a platform.
    Inbound,
    /// Going to a platform.
    Outbound,
}

/// A normalized message, neutral with respect to the platform it lives on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct ChannelMessage {
    /// The message's id: the platform's for inbound messages, a stable gateway-chosen one for
    /// outbound messages (the intent and its idempotency key follow it).
    pub id: String,
    /// The channel (platform plugin) name, e.g. `qa`, `telegram`.
    pub channel: String,
    /// The platform account the message was received on or is sent from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    /// Whether the message came from the platform or goes to it.
    pub direction: MessageDirection,
    /// Where the message lives.
    pub target: MessageTarget,
    /// Who wrote it, when the platform says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<MessageActor>,
    /// Its visible text, if it has any (a media-only message has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<MessageBody>,
    /// Files, images, voice notes or cards carried with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<MessageAttachment>,
    /// How it relates to earlier messages (a reply, a follow-up…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relation: Option<MessageRelation>,
    /// Who produced it, as decoded from the platform's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<MessageOrigin>,
    /// When the platform says it was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<UnixMillis>,
    /// The platform's own payload, kept opaque for adapters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<serde_json::Value>,
}

impl ChannelMessage {
    fn new(
        id: impl Into<String>,
        channel: impl Into<String>,
        direction: MessageDirection,
        target: MessageTarget,
    ) -> Self {
        ChannelMessage {
            id: id.into(),
            channel: channel.into(),
            account_id: None,
            direction,
            target,
            sender: None,
            body: None,
            attachments: Vec::new(),
            relation: None,
            origin: None,
            timestamp: None,
            raw: None,
        }
    }

    /// An outbound message with this id and plain text to `target` on `channel`.
    pub fn outbound(
        id: impl Into<String>,
        channel: impl Into<String>,
        target: MessageTarget,
        text: impl Into<String>,
    ) -> Self {
        Self::new(id, channel, MessageDirection::Outbound, target).with_text(text)
    }

    /// An inbound message with the platform's id, found at `target` on `channel`, with no
    /// sender, body or attachments yet (add them with the `with_*` setters).
    pub fn inbound(
        id: impl Into<String>,
        channel: impl Into<String>,
        target: MessageTarget,
    ) -> Self {
        Self::new(id, channel, MessageDirection::Inbound, target)
    }

    /// Sets the body to this plain text (no format).
    #[must_use]
    pub fn with_text(self, text: impl Into<String>) -> Self {
        self.with_body(MessageBody::new(text))
    }

    /// Appends one attachment.
    #[must_use]
    pub fn with_attachment(mut self, attachment: MessageAttachment) -> Self {
        self.attachments.push(attachment);
        self
    }

    setters! {
        /// Replaces every attachment.
        with_attachments => attachments: Vec<MessageAttachment>;
    }

    setters! { opt into
        /// Sets the platform account.
        with_account_id => account_id: String;
    }

    setters! { opt
        /// Sets who wrote it.
        with_sender => sender: MessageActor;
        /// Sets the body (text with its format).
        with_body => body: MessageBody;
        /// Sets how it relates to earlier messages.
        with_relation => relation: MessageRelation;
        /// Sets who produced it.
        with_origin => origin: MessageOrigin;
        /// Sets the platform's timestamp.
        with_timestamp => timestamp: UnixMillis;
        /// Sets the platform's own payload.
        with_raw => raw: serde_json::Value;
    }
}

/// The shape of the place a message lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TargetKind {
    /// A one-to-one chat.
    Direct,
    /// A group chat or room.
    Group,
    /// A broadcast-style channel.
    Channel,
    /// A thread inside another conversation.
    Thread,
}

known_variants!(TargetKind {
    Direct,
    Group,
    Channel,
    Thread
});

impl TargetKind {
    /// Rooms shared by several participants ("room-like"): where bot echoes can loop.
    pub fn is_roomish(self) -> bool {
        !matches!(self, TargetKind::Direct)
    }
}

/// Where a message lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageTarget {
    /// The shape of the place.
    pub kind: TargetKind,
    /// The platform's id of the conversation.
    pub id: String,
    /// A human-readable name, for logs and the operator's views.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The workspace, server or guild the conversation belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space_id: Option<String>,
    /// The conversation a thread or sub-channel hangs off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// The thread inside the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
    /// The platform's own channel id when it differs from `id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_channel_id: Option<String>,
}

impl MessageTarget {
    /// A target of this kind and platform id, with nothing else set.
    pub fn new(kind: TargetKind, id: impl Into<String>) -> Self {
        MessageTarget {
            kind,
            id: id.into(),
            label: None,
            space_id: None,
            parent_id: None,
            thread_id: None,
            native_channel_id: None,
        }
    }

    /// A one-to-one chat.
    pub fn direct(id: impl Into<String>) -> Self {
        Self::new(TargetKind::Direct, id)
    }

    /// A group chat or room.
    pub fn group(id: impl Into<String>) -> Self {
        Self::new(TargetKind::Group, id)
    }

    /// A broadcast-style channel.
    pub fn channel(id: impl Into<String>) -> Self {
        Self::new(TargetKind::Channel, id)
    }

    /// A thread (its own conversation id; add the parent with [`MessageTarget::with_parent_id`]).
    pub fn thread(id: impl Into<String>) -> Self {
        Self::new(TargetKind::Thread, id)
    }

    /// Sets the thread inside the conversation, or clears it with `None`.
    #[must_use]
    pub fn with_thread_id(mut self, thread_id: Option<impl Into<String>>) -> Self {
        self.thread_id = thread_id.map(Into::into);
        self
    }

    setters! { opt into
        /// Sets the human-readable name.
        with_label => label: String;
        /// Sets the workspace, server or guild.
        with_space_id => space_id: String;
        /// Sets the parent conversation.
        with_parent_id => parent_id: String;
        /// Sets the platform's own channel id.
        with_native_channel_id => native_channel_id: String;
    }
}

/// Who wrote a message, as far as the platform tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageActor {
    /// The platform's id of the author.
    pub id: String,
    /// The name the platform shows for the author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    /// Set when the platform says the author is a bot account.
    #[serde(default)]
    pub is_bot: bool,
}

impl MessageActor {
    /// A human author with this platform id.
    pub fn new(id: impl Into<String>) -> Self {
        MessageActor {
            id: id.into(),
            display_name: None,
            is_bot: false,
        }
    }

    /// A bot account with this platform id.
    pub fn bot(id: impl Into<String>) -> Self {
        Self::new(id).with_is_bot(true)
    }

    setters! {
        /// Sets whether the platform says the author is a bot account.
        with_is_bot => is_bot: bool;
    }

    setters! { opt into
        /// Sets the shown name.
        with_display_name => display_name: String;
    }
}

/// The visible content of a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageBody {
    /// The text.
    pub text: String,
    /// Formatting the text is written in (`plain`, `markdown`, `html`, …); adapters render it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

impl MessageBody {
    /// A body of this text with no declared format.
    pub fn new(text: impl Into<String>) -> Self {
        MessageBody {
            text: text.into(),
            format: None,
        }
    }

    setters! { opt into
        /// Sets the format the text is written in.
        with_format => format: String;
    }
}

/// A file, image, voice note or card carried with a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageAttachment {
    /// What it is (media, voice, card…).
    pub kind: crate::MessagePartKind,
    /// Where it can be fetched; also its identity when streamed ahead of the final.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its MIME type, e.g. `image/png`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Its file name; the identity of an attachment without a URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
    /// Its size, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

impl MessageAttachment {
    /// An attachment of this kind with nothing else known yet.
    pub fn new(kind: crate::MessagePartKind) -> Self {
        MessageAttachment {
            kind,
            url: None,
            mime_type: None,
            file_name: None,
            size_bytes: None,
        }
    }

    setters! { opt into
        /// Sets where it can be fetched.
        with_url => url: String;
        /// Sets its MIME type.
        with_mime_type => mime_type: String;
        /// Sets its file name.
        with_file_name => file_name: String;
    }

    setters! { opt
        /// Sets its size in bytes.
        with_size_bytes => size_bytes: u64;
    }
}

/// A quoted excerpt of the message being replied to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct MessageQuote {
    /// The quoted text.
    pub text: String,
    /// The platform id of the quoted message's author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author_id: Option<String>,
}

impl MessageQuote {
    /// A quote of this text with no author.
    pub fn new(text: impl Into<String>) -> Self {
        MessageQuote {
            text: text.into(),
            author_id: None,
        }
    }

    setters! { opt into
        /// Sets the quoted message's author.
        with_author_id => author_id: String;
    }
}

/// Why the gateway itself is sending a message that is not a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SystemReason {
    /// An approval request.
    Approval,
    /// A task's progress or result.
    Task,
    /// A hook's output.
    Hook,
    /// A scheduled job's output.
    Cron,
    /// A subagent's output.
    Subagent,
    /// An agent's explicit message tool call.
    MessageTool,
    /// Sent from the command line.
    Cli,
    /// Sent from the control UI.
    ControlUi,
    /// Another automation.
    Automation,
    /// A gateway error notice.
    Error,
}

known_variants!(SystemReason {
    Approval,
    Task,
    Hook,
    Cron,
    Subagent,
    MessageTool,
    Cli,
    ControlUi,
    Automation,
    Error,
});

/// How an outbound message relates to what came before. A reply is a relation, not an API root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(
    tag = "kind",
    rename_all = "snake_case",
    rename_all_fields = "camelCase"
)]
#[non_exhaustive]
pub enum MessageRelation {
    /// An answer to an earlier message.
    #[non_exhaustive]
    Reply {
        /// The inbound message whose turn produced this reply.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inbound_message_id: Option<String>,
        /// The platform message the reply answers (the platform's reply-to).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to_id: Option<String>,
        /// The thread the reply belongs in.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<String>,
        /// An excerpt of the answered message to show with the reply.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        quote: Option<MessageQuote>,
    },
    /// A later message of the same session, not answering one message.
    #[non_exhaustive]
    Followup {
        /// The session it continues.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_key: Option<String>,
        /// The message it follows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_message_id: Option<String>,
    },
    /// A message to many, answering no one.
    #[non_exhaustive]
    Broadcast {
        /// Why it is sent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Output of the gateway itself.
    #[non_exhaustive]
    System {
        /// Why the gateway sends it.
        reason: SystemReason,
    },
}

impl MessageRelation {
    /// A reply that names nothing yet (set what it answers with the `with_*` setters).
    pub fn reply() -> Self {
        MessageRelation::Reply {
            inbound_message_id: None,
            reply_to_id: None,
            thread_id: None,
            quote: None,
        }
    }

    /// A reply to this platform message.
    pub fn reply_to(reply_to_id: impl Into<String>) -> Self {
        MessageRelation::Reply {
            inbound_message_id: None,
            reply_to_id: Some(reply_to_id.into()),
            thread_id: None,
            quote: None,
        }
    }

    /// A reply to an inbound message: the platform reply-to and the answered inbound id are both
    /// that message's id.
    pub fn reply_to_inbound(inbound_message_id: impl Into<String>) -> Self {
        let id = inbound_message_id.into();
        MessageRelation::Reply {
            inbound_message_id: Some(id.clone()),
            reply_to_id: Some(id),
            thread_id: None,
            quote: None,
        }
    }

    /// A follow-up in a session, after a previous message when there is one.
    pub fn followup(session_key: Option<String>, previous_message_id: Option<String>) -> Self {
        MessageRelation::Followup {
            session_key,
            previous_message_id,
        }
    }

    /// A broadcast, with its reason when there is one.
    pub fn broadcast(reason: Option<String>) -> Self {
        MessageRelation::Broadcast { reason }
    }

    /// Gateway output sent for `reason`.
    pub fn system(reason: SystemReason) -> Self {
        MessageRelation::System { reason }
    }

    /// Sets (or with `None` clears) the thread of a reply.
    ///
    /// # Panics
    ///
    /// In debug builds, when the relation is not a reply: only replies carry a thread, and
    /// silently dropping it would send the message to the wrong place.
    #[must_use]
    pub fn with_thread_id(mut self, value: Option<impl Into<String>>) -> Self {
        if let MessageRelation::Reply { thread_id, .. } = &mut self {
            *thread_id = value.map(Into::into);
        } else {
            debug_assert!(value.is_none(), "only a reply relation carries a thread id");
        }
        self
    }

    /// Sets the answered inbound message of a reply.
    ///
    /// # Panics
    ///
    /// In debug builds, when the relation is not a reply.
    #[must_use]
    pub fn with_inbound_message_id(mut self, value: impl Into<String>) -> Self {
        debug_assert!(
            matches!(self, MessageRelation::Reply { .. }),
            "only a reply relation answers an inbound message"
        );
        if let MessageRelation::Reply {
            inbound_message_id, ..
        } = &mut self
        {
            *inbound_message_id = Some(value.into());
        }
        self
    }

    /// Sets the platform message a reply answers.
    ///
    /// # Panics
    ///
    /// In debug builds, when the relation is not a reply.
    #[must_use]
    pub fn with_reply_to_id(mut self, value: impl Into<String>) -> Self {
        debug_assert!(
            matches!(self, MessageRelation::Reply { .. }),
            "only a reply relation answers a platform message"
        );
        if let MessageRelation::Reply { reply_to_id, .. } = &mut self {
            *reply_to_id = Some(value.into());
        }
        self
    }

    /// Sets the quote shown with a reply.
    ///
    /// # Panics
    ///
    /// In debug builds, when the relation is not a reply.
    #[must_use]
    pub fn with_quote(mut self, value: MessageQuote) -> Self {
        debug_assert!(
            matches!(self, MessageRelation::Reply { .. }),
            "only a reply relation carries a quote"
        );
        if let MessageRelation::Reply { quote, .. } = &mut self {
            *quote = Some(value);
        }
        self
    }

    /// The platform message this one answers, if any (used for reply-target checks).
    pub fn reply_to_id(&self) -> Option<&str> {
        match self {
            MessageRelation::Reply { reply_to_id, .. } => reply_to_id.as_deref(),
            _ => None,
        }
    }

    /// The thread the message belongs in, when the relation pins one.
    pub fn thread_id(&self) -> Option<&str> {
        match self {
            MessageRelation::Reply { thread_id, .. } => thread_id.as_deref(),
            _ => None,
        }
    }
}
