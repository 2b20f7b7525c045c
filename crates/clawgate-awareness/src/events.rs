//! The changes callers report into the signal log: typed, with an actor and a one-line summary.
//!
//! Constructors take metadata, never message content: `human_direct_message` takes the channel
//! the human used, not what they wrote.

use clawgate_types::{ActorType, RunOutcome, SessionKey, SessionStateEventKind};

/// Longest summary kept, in characters: a summary names a change, it does not carry it.
pub const MAX_SUMMARY_CHARS: usize = 200;

/// Who caused a change. The id is what self-suppression compares against a watcher's key, so
/// an agent acting from a session should be identified by that session key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub actor_type: ActorType,
    pub id: Option<String>,
}

impl Actor {
    /// A human (user id on the platform, if known).
    pub fn human(id: impl Into<String>) -> Actor {
        Actor {
            actor_type: ActorType::Human,
            id: Some(id.into()),
        }
    }

    /// An agent acting from `session`.
    pub fn agent(session: &SessionKey) -> Actor {
        Actor {
            actor_type: ActorType::Agent,
            id: Some(session.as_str().to_owned()),
        }
    }

    /// A gateway subsystem (`cron`, `compaction`, …).
    pub fn system(name: impl Into<String>) -> Actor {
        Actor {
            actor_type: ActorType::System,
            id: Some(name.into()),
        }
    }
}

/// One change to append to a session's signal log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    pub kind: SessionStateEventKind,
    pub actor: Actor,
    pub summary: String,
    pub outcome: Option<RunOutcome>,
    pub child_session_key: Option<SessionKey>,
    /// A second append with the same key returns the first row (retried hooks, replays).
    pub dedupe_key: Option<String>,
}

impl StateChange {
    fn new(kind: SessionStateEventKind, actor: Actor, summary: impl Into<String>) -> StateChange {
        StateChange {
            kind,
            actor,
            summary: one_line(&summary.into()),
            outcome: None,
            child_session_key: None,
            dedupe_key: None,
        }
    }

    /// The session was created (log only).
    pub fn created(actor: Actor) -> StateChange {
        StateChange::new(SessionStateEventKind::Created, actor, "session created")
    }

    /// A human sent a turn straight into the session (notifies watchers).
    pub fn human_direct_message(actor: Actor, channel: &str) -> StateChange {
        StateChange::new(
            SessionStateEventKind::HumanDirectMessage,
            actor,
            format!("human message via {channel}"),
        )
    }

    /// The session's goal was created, updated or cleared (notifies watchers).
    pub fn goal_changed(actor: Actor, summary: impl Into<String>) -> StateChange {
        StateChange::new(SessionStateEventKind::GoalChanged, actor, summary)
    }

    /// A child session was spawned (log only; the spawn edge sets the parent's cursor).
    pub fn child_spawned(actor: Actor, child: &SessionKey) -> StateChange {
        let mut change = StateChange::new(
            SessionStateEventKind::ChildSpawned,
            actor,
            format!("spawned {child}"),
        );
        change.child_session_key = Some(child.clone());
        change
    }

    /// A child run ended successfully (log only: subagent announcements deliver completions).
    pub fn run_completed(actor: Actor, summary: impl Into<String>) -> StateChange {
        StateChange::new(SessionStateEventKind::RunCompleted, actor, summary)
    }

    /// A child run failed; cancelled and timed-out runs are failures with their exact outcome.
    pub fn run_failed(
        actor: Actor,
        outcome: RunOutcome,
        summary: impl Into<String>,
    ) -> StateChange {
        let mut change = StateChange::new(SessionStateEventKind::RunFailed, actor, summary);
        change.outcome = Some(outcome);
        change
    }

    /// The session's history was compacted (log only).
    pub fn compacted(actor: Actor, summary: impl Into<String>) -> StateChange {
        StateChange::new(SessionStateEventKind::Compacted, actor, summary)
    }

    pub fn with_dedupe_key(mut self, key: impl Into<String>) -> StateChange {
        self.dedupe_key = Some(key.into());
        self
    }
}

/// Makes any text a safe summary: one line (the store refuses line breaks, and a refused append
/// would lose the event), no control characters, at most [`MAX_SUMMARY_CHARS`].
pub fn one_line(text: &str) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let words: Vec<&str> = flat.split_whitespace().collect();
    let joined = words.join(" ");
    if joined.chars().count() <= MAX_SUMMARY_CHARS {
        return joined;
    }
    let mut cut: String = joined.chars().take(MAX_SUMMARY_CHARS - 1).collect();
    cut.push('…');
    cut
}
