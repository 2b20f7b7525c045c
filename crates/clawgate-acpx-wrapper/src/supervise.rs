//! The wrapper's policy as a pure state machine: events in, group signals out.
//!
//! Invariants:
//! * parent death, a TERM from outside, or the adapter's own exit all start a drain: TERM to the
//!   group, then KILL to the group once the grace period has passed — unless the group is empty
//!   first;
//! * INT and HUP are forwarded and change nothing else (the adapter decides what they mean);
//! * the wrapper exits only after the group is empty or the KILL fallback has run.
//!
//! The machine decides no session policy: it only ends its own adapter group.

use std::time::{Duration, Instant};

/// A signal the wrapper sends to the adapter group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupSignal {
    Term,
    Int,
    Hup,
    Kill,
}

/// What the wrapper observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// TERM, INT or HUP arrived for the wrapper.
    Forward(GroupSignal),
    /// The parent that started the wrapper is gone (death signal, reparenting, or the reader of
    /// the adapter's stdout went away).
    ParentGone,
    /// The adapter (the group leader) exited.
    AdapterExited,
    /// Periodic check: `group_alive` says whether any process is left in the group.
    Tick { group_alive: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Signal(GroupSignal),
    Exit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Draining { kill_at: Instant },
    Done,
}

#[derive(Debug)]
pub(crate) struct Supervisor {
    grace: Duration,
    state: State,
}

impl Supervisor {
    pub(crate) fn new(grace: Duration) -> Supervisor {
        Supervisor {
            grace,
            state: State::Running,
        }
    }

    pub(crate) fn draining(&self) -> bool {
        matches!(self.state, State::Draining { .. })
    }

    pub(crate) fn on_event(&mut self, event: Event, now: Instant) -> Vec<Action> {
        match (self.state, event) {
            (State::Done, _) => vec![],
            (State::Running, Event::Forward(GroupSignal::Term))
            | (State::Running, Event::ParentGone)
            | (State::Running, Event::AdapterExited) => {
                self.state = State::Draining {
                    kill_at: now + self.grace,
                };
                vec![Action::Signal(GroupSignal::Term)]
            }
            (_, Event::Forward(signal)) => vec![Action::Signal(signal)],
            (State::Running, Event::Tick { .. }) => vec![],
            (State::Draining { .. }, Event::ParentGone | Event::AdapterExited) => vec![],
            (State::Draining { .. }, Event::Tick { group_alive: false }) => {
                self.state = State::Done;
                vec![Action::Exit]
            }
            (State::Draining { kill_at }, Event::Tick { group_alive: true }) => {
                if now >= kill_at {
                    self.state = State::Done;
                    vec![Action::Signal(GroupSignal::Kill), Action::Exit]
                } else {
                    vec![]
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_millis(100);

    /// One row per scenario: (name, [(milliseconds since start, event)], expected actions).
    #[test]
    fn fallback_table() {
        use Action::*;
        use Event::*;
        use GroupSignal::*;
        let alive = Tick { group_alive: true };
        let empty = Tick { group_alive: false };
        type Row = (&'static str, Vec<(u64, Event)>, Vec<Action>);
        let rows: Vec<Row> = vec![
            (
                "running ticks do nothing",
                vec![(0, alive), (500, alive)],
                vec![],
            ),
            (
                "parent death: TERM, group survives the grace, KILL",
                vec![(0, ParentGone), (50, alive), (100, alive), (150, alive)],
                vec![Signal(Term), Signal(Kill), Exit],
            ),
            (
                "parent death: TERM suffices, no KILL",
                vec![(0, ParentGone), (20, empty), (200, alive)],
                vec![Signal(Term), Exit],
            ),
            (
                "adapter exits, grandchild ignores TERM: KILL",
                vec![(0, AdapterExited), (99, alive), (100, alive)],
                vec![Signal(Term), Signal(Kill), Exit],
            ),
            (
                "forwarded TERM drains too",
                vec![(0, Forward(Term)), (10, AdapterExited), (100, alive)],
                vec![Signal(Term), Signal(Kill), Exit],
            ),
            (
                "INT and HUP are only forwarded",
                vec![(0, Forward(Int)), (1, Forward(Hup)), (500, alive)],
                vec![Signal(Int), Signal(Hup)],
            ),
            (
                "a second parent-death event does not restart the grace",
                vec![(0, ParentGone), (90, ParentGone), (100, alive)],
                vec![Signal(Term), Signal(Kill), Exit],
            ),
            (
                "signals during the drain are still forwarded",
                vec![(0, ParentGone), (10, Forward(Hup)), (20, empty)],
                vec![Signal(Term), Signal(Hup), Exit],
            ),
            (
                "nothing after exit",
                vec![(0, ParentGone), (1, empty), (2, Forward(Term)), (3, alive)],
                vec![Signal(Term), Exit],
            ),
        ];
        for (name, events, expected) in rows {
            let start = Instant::now();
            let mut machine = Supervisor::new(GRACE);
            let actions: Vec<Action> = events
                .into_iter()
                .flat_map(|(ms, event)| machine.on_event(event, start + Duration::from_millis(ms)))
                .collect();
            assert_eq!(actions, expected, "case {name}");
        }
    }
}
