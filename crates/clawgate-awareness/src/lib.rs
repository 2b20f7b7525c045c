//! Session state awareness for clawgate (layer 2).
//!
//! When another actor changes a session — a human stepping in, a goal update — the sessions
//! that hold assumptions about it learn so **once** and reconcile cheaply before acting:
//!
//! 1. [`Awareness::record`] appends a typed event to the durable signal log (best effort: a
//!    failure is logged, never fails the turn) and advances the session's `stateVersion`;
//! 2. watchers (implicit on [`Awareness::spawn_child`], explicit through `sessions_send
//!    watch: true`) hold durable cursors; a notifying event opens one [`Notice`] per lagging
//!    watcher, byte-identical while pending, with a frozen watermark;
//!    [`Awareness::consume_notices`] acks, and work interleaved before consumption opens
//!    exactly one more; main sessions are woken through a [`HeartbeatHook`];
//! 3. [`SessionTools::session_status`] with `changes_since` returns the exact delta.
//!
//! Invariants: the durable cursor is the truth and the in-memory queue is rebuilt from it
//! ([`Awareness::rebuild_notices`]: restart, another process's commit through
//! [`Awareness::follow_external_changes`], retention); a watcher is never notified of its own
//! events; global-scope sessions get the log and `changesSince` but no notices; visibility is
//! the pure [`can_see_session_row`] for every tool. Storage is reached only through the
//! `clawgate-store` ports (`Arc<dyn Store>`); time only through a
//! [`Clock`](clawgate_types::clock::Clock).

// The README's example is compiled and run as a doctest, so the packaged README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExample;

mod engine;
mod error;
mod events;
mod notice;
mod registry;
mod tools;
mod visibility;

pub use engine::{Awareness, AwarenessBuilder, AwarenessConfig, RetentionPolicy, ServesWatcher};
pub use error::{AwarenessError, AwarenessResult};
pub use events::{Actor, MAX_SUMMARY_CHARS, StateChange, one_line};
pub use notice::{HeartbeatHook, NoHeartbeat, Notice};
pub use registry::{NewSession, Registered, SpawnChild, Spawned};
pub use tools::{
    Requester, SendStatus, SessionDelivery, SessionListEntry, SessionStatusParams,
    SessionStatusResult, SessionTools, SessionsHistoryParams, SessionsHistoryResult,
    SessionsListParams, SessionsListResult, SessionsSendParams, SessionsSendResult, StateChanges,
};
pub use visibility::{
    agent_allowed, can_see_session_row, effective_visibility, pattern_matches, visibility_row,
};
