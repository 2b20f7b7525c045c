//! Why a turn, or a session message's relay, did not end as asked.

use clawgate_types::IntentId;

/// Why a turn did not end with its reply delivered. The event stays unfinished and is tried
/// again (or dead-lettered once its attempts are spent).
#[derive(Debug, thiserror::Error)]
pub enum TurnError {
    /// The state database failed.
    #[error("state database: {0}")]
    Store(#[from] clawgate_store::StoreError),
    /// The conversation's session could not be keyed, read or created.
    #[error("session registry: {0}")]
    Session(String),
    /// The channel names an agent the host gave no command for.
    #[error("no agent {0:?} is configured for this channel")]
    NoAgent(String),
    /// The agent could not be started or its prompt failed.
    #[error("agent turn failed: {0}")]
    Agent(Box<clawgate_acpx::AcpxError>),
    /// The reply's durable intent (its live preview) could not be recorded.
    #[error("the reply's intent could not be recorded: {0}")]
    Recording(clawgate_messages::MessagesError),
    /// The final could not be recorded or sent.
    #[error("the final could not be recorded or sent: {0}")]
    Final(clawgate_messages::MessagesError),
    /// A recorded reply could not be read or driven.
    #[error("the reply's intent could not be read or worked on: {0}")]
    Recovery(clawgate_messages::MessagesError),
    /// A recorded reply's intent disappeared while it was waited for.
    #[error("the reply's intent {0} is gone")]
    IntentGone(IntentId),
    /// The final failed for good (the failure the intent records).
    #[error("the reply could not be delivered: {0}")]
    Undelivered(String),
    /// An earlier generation's stream is still open: it is not replaced while it may be live.
    #[error(
        "an earlier reply to event {event} (intent {intent}) is still streaming elsewhere or its \
         preview could not be removed yet"
    )]
    StreamStillOpen {
        /// The inbound event.
        event: String,
        /// The open stream's intent.
        intent: IntentId,
    },
    /// Every generation of the event's reply key is used up.
    #[error("event {0} had 1000 abandoned replies; giving up")]
    TooManyReplies(String),
    /// The host is stopping.
    #[error("stopping before the reply was delivered")]
    Stopping,
    /// The agent's prompt ran past its `turn_timeout` and was cancelled (its session closed
    /// when it did not end the turn within the grace).
    #[error(
        "the agent did not finish its turn within {seconds} s (turn_timeout_secs); the turn was \
         cancelled{closed}"
    )]
    Deadline {
        /// The deadline, in seconds.
        seconds: u64,
        /// ", and its session closed" when the agent ignored the cancel.
        closed: &'static str,
    },
}

impl TurnError {
    /// Whether another attempt at the event can only fail the same way: the reply failed for
    /// good (its intent is `failed`, and a retry finds it so), every reply generation is used
    /// up, or no agent answers this channel. Such an event is dead-lettered at once.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            TurnError::Undelivered(_) | TurnError::TooManyReplies(_) | TurnError::NoAgent(_)
        ) || self.is_agent_auth()
    }

    /// Whether the agent refused because it is not logged in: not retried (a new process would
    /// be refused the same way), and the person is told so.
    pub fn is_agent_auth(&self) -> bool {
        matches!(self, TurnError::Agent(error) if error.is_auth())
    }
}

impl From<clawgate_acpx::AcpxError> for TurnError {
    fn from(error: clawgate_acpx::AcpxError) -> TurnError {
        TurnError::Agent(Box::new(error))
    }
}

/// Why a session message could not be delivered into a conversation
/// ([`Turns::deliver_to_session`](crate::Turns::deliver_to_session)).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The message's key needs random bytes and the OS gave none.
    #[error("cannot read random bytes for the message's key: {0}")]
    Random(std::io::Error),
    /// The channel's send path refused or failed the message.
    #[error("the message could not be sent into {conversation}: {source}")]
    Send {
        /// The target conversation.
        conversation: String,
        /// What the send engine said.
        source: clawgate_messages::MessagesError,
    },
}
