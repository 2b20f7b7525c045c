//! The clawgate turn engine (layer 3): one inbound chat event → the conversation's session and
//! signal log → the agent's prompt through the leased ACP runtime → live preview edits → the
//! durable final → receipt. It knows no platform and no configuration file: a host (the
//! `clawgate` binary, or any other) builds the engines, the configured [`Channel`]s and the
//! agents' commands, composes a [`Turns`], and gives each channel's `SourceRunner` a
//! [`TurnHandler`].
//!
//! Invariants:
//! * every reply is keyed by its event ([`reply_key`]: `<channel>:reply:<event>:<generation>`),
//!   so a replayed event finds the reply an earlier attempt recorded or delivered and never
//!   produces a second one;
//! * a stream an earlier attempt left without a final is ended (its preview removed) before a
//!   new generation starts;
//! * the inbound event is completed only after its final's commit (or once an unknown outcome
//!   is parked for an operator);
//! * a dead-lettered event gets one failure notice, keyed by the event ([`failure_key`]);
//! * the session's pending stale-state notices open the prompt (one line each, linking to the
//!   changed session's status once the host set its control URL) and are acknowledged only
//!   after the agent answered: a turn that dies first shows them again;
//! * a message an agent session relays (`sessions_send`) is logged as that session, so it
//!   opens no notice for its own sender.
//!
//! The crate README's example composes the engine over a state directory and the SDK's
//! in-memory channel.

#![warn(missing_docs)]

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod channel;
mod commands;
mod dead_letters;
mod engine;
mod error;
mod handler;
mod keys;
mod relay;

pub use channel::Channel;
pub use commands::Command;
pub use engine::{
    AgentCommand, Counters, DEFAULT_BUSY_NOTICE_AFTER, DEFAULT_CANCEL_GRACE,
    DEFAULT_PROGRESS_NOTICE_AFTER, DEFAULT_TURN_TIMEOUT, Turns,
};
pub use error::{RelayError, TurnError};
pub use handler::TurnHandler;
pub use keys::{busy_key, failure_key, progress_key, reply_key, reply_message, session_key_for};
