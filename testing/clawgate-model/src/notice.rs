//! The stale-state notice protocol: watchers keep a watch cursor on a target session; a
//! material event by another actor opens one notice with a frozen watermark; the watcher's
//! turn consumes it and acks it durably, which reopens exactly one notice when material work
//! of another actor came after the watermark; the in-memory queue of the process serving the
//! watchers mirrors the durable cursors and is rebuilt by the restart sweep.
//!
//! Durable steps are one store operation each (`append_event_opening_notices`,
//! `consume_notice`, `cursors_with_pending_notice`); the queue's steps are the engine's
//! (`insert_opened` after an append, `take` at consume, the requeue and `consumed` after an
//! ack, `rebuild` with its generation check).

use std::fmt;

use crate::checker::Model;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A kind that notifies (`SessionStateEventKind::notifies`).
    Material,
    /// Logged, never notifies.
    LogOnly,
}

/// Who wrote an event: one of the watchers, or someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Actor {
    Watcher(u8),
    Other,
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Actor::Watcher(w) => write!(f, "watcher {w}"),
            Actor::Other => f.write_str("another actor"),
        }
    }
}

/// A deliberately broken protocol, to show the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The ack reopens at the newest event of another actor, log-only ones included.
    ReopenOnLogOnly,
    /// An append opens a notice on the actor's own cursor too.
    NoSelfSuppression,
    /// The ack never reopens: material work after the watermark is dropped.
    AckWithoutReopen,
    /// The rebuild applies a read taken before a concurrent consume (no generation check).
    RebuildWithoutGenerationCheck,
    /// `record` queues its append's notices even those taken for a turn since the append.
    EnqueueTakenNotice,
}

#[derive(Debug, Clone)]
pub struct NoticeModel {
    pub watchers: u8,
    /// Events appended to the target, at most.
    pub events: u8,
    /// Crashes of the process serving the watchers (each restarts with the sweep to run).
    pub crashes: u8,
    /// Whether an append's notices are queued in a step after its write, as the real code
    /// does (`record` → `queue_notices` → `insert_opened`): a notice taken for a turn in
    /// between (a rebuild found it first) was shown already and is not queued again. False
    /// queues them in the append's step.
    pub enqueue_after_append: bool,
    pub bug: Option<Bug>,
}

impl NoticeModel {
    /// The bounds checked in CI, deepened by [`crate::depth`]: each step of depth adds an
    /// event and a crash.
    pub fn new() -> NoticeModel {
        let depth = crate::depth();
        NoticeModel {
            watchers: 2,
            events: 3u8.saturating_add(depth),
            crashes: 2u8.saturating_add(depth),
            enqueue_after_append: true,
            bug: None,
        }
    }
}

impl Default for NoticeModel {
    fn default() -> Self {
        NoticeModel::new()
    }
}

/// A watch cursor of one watcher on the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cursor {
    pub acked: u8,
    /// The frozen watermark of the pending notice.
    pub notified: Option<u8>,
}

/// A watcher's consume in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Consume {
    /// Taken from the queue (shown to the agent), its durable ack not made yet.
    Taken(u8),
    /// Acked durably; the reopened notice (its `changes_since`), if any, is queued next.
    Acked(Option<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NoticeState {
    /// The target's signal log: event `n` has sequence `n + 1`.
    pub log: Vec<(Kind, Actor)>,
    pub cursors: Vec<Cursor>,
    /// The in-memory queue: the pending notice of each watcher, by its `changes_since`.
    pub queue: Vec<Option<u8>>,
    pub consuming: Vec<Option<Consume>>,
    /// An append's opened notices (by watcher, its `changes_since`), not yet queued, each
    /// with whether a turn took that very notice since the append.
    pub opened: Option<Vec<Option<(u8, bool)>>>,
    /// A rebuild's read of the durable pending notices, and whether the queue changed since.
    pub rebuild: Option<(Vec<Option<u8>>, bool)>,
    /// A restart left the sweep to run.
    pub sweep_due: bool,
    pub crashes_left: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeAction {
    Append(Actor, Kind),
    /// The append's opened notices are queued.
    Enqueue,
    /// A watcher's turn takes its queued notice.
    Consume(u8),
    /// The durable ack of the taken notice.
    Ack(u8),
    /// The reopened notice (if any) is queued and the consume is over.
    Requeue(u8),
    RebuildRead,
    RebuildApply,
    Crash,
}

impl fmt::Display for NoticeAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NoticeAction::Append(actor, kind) => {
                write!(
                    f,
                    "{actor} appends a {kind:?} event (append_event_opening_notices)"
                )
            }
            NoticeAction::Enqueue => f.write_str(
                "insert_opened: the opened notices are queued (but those a turn took since)",
            ),
            NoticeAction::Consume(w) => write!(f, "watcher {w}'s turn takes its notice"),
            NoticeAction::Ack(w) => write!(f, "watcher {w}: consume_notice (the durable ack)"),
            NoticeAction::Requeue(w) => {
                write!(f, "watcher {w}: the reopened notice is queued; consumed")
            }
            NoticeAction::RebuildRead => f.write_str("rebuild: cursors_with_pending_notice"),
            NoticeAction::RebuildApply => f.write_str("rebuild: applied to the queue"),
            NoticeAction::Crash => f.write_str("CRASH and restart (the queue is lost)"),
        }
    }
}

impl NoticeModel {
    fn notifies(&self, kind: Kind) -> bool {
        kind == Kind::Material
    }

    /// The durable pending notices, by watcher.
    fn durable(s: &NoticeState) -> Vec<Option<u8>> {
        s.cursors
            .iter()
            .map(|c| c.notified.map(|_| c.acked))
            .collect()
    }

    fn append(&self, s: &mut NoticeState, actor: Actor, kind: Kind) {
        s.log.push((kind, actor));
        let sequence = s.log.len() as u8;
        let notifies = self.notifies(kind);
        let mut opened = vec![None; self.watchers as usize];
        for (w, cursor) in s.cursors.iter_mut().enumerate() {
            let own = actor == Actor::Watcher(w as u8) && self.bug != Some(Bug::NoSelfSuppression);
            if notifies && cursor.notified.is_none() && sequence > cursor.acked && !own {
                cursor.notified = Some(sequence);
                opened[w] = Some((cursor.acked, false));
            }
        }
        if opened.iter().any(Option::is_some) {
            s.opened = Some(opened);
            if !self.enqueue_after_append {
                self.enqueue(s);
            }
        }
    }

    /// `insert_opened` of an append's opened notices, but those taken since.
    fn enqueue(&self, s: &mut NoticeState) {
        let opened = s.opened.take().unwrap_or_default();
        for (w, notice) in opened.into_iter().enumerate() {
            match notice {
                Some((_, true)) if self.bug != Some(Bug::EnqueueTakenNotice) => {}
                Some((since, _)) => s.queue[w] = Some(since),
                None => {}
            }
        }
        Self::touch(s);
    }

    fn touch(s: &mut NoticeState) {
        if let Some((_, stale)) = s.rebuild.as_mut() {
            *stale = true;
        }
    }

    /// `consume_notice(watcher, target, seen)`: ack at the frozen watermark, reopen once.
    fn ack(&self, s: &mut NoticeState, w: u8, seen: u8) -> Option<u8> {
        let cursor = &mut s.cursors[w as usize];
        let frozen = cursor.notified?;
        if cursor.acked != seen {
            // Consumed elsewhere: nothing to ack.
            return None;
        }
        cursor.acked = frozen;
        let after = s
            .log
            .iter()
            .enumerate()
            .map(|(n, event)| (n as u8 + 1, *event))
            .filter(|(seq, (kind, actor))| {
                *seq > frozen
                    && *actor != Actor::Watcher(w)
                    && (self.notifies(*kind) || self.bug == Some(Bug::ReopenOnLogOnly))
            })
            .map(|(seq, _)| seq)
            .max();
        cursor.notified = match self.bug {
            Some(Bug::AckWithoutReopen) => None,
            _ => after,
        };
        cursor.notified.map(|_| frozen)
    }
}

impl Model for NoticeModel {
    type State = NoticeState;
    type Action = NoticeAction;

    fn init(&self) -> Vec<NoticeState> {
        let n = self.watchers as usize;
        vec![NoticeState {
            log: Vec::new(),
            cursors: vec![
                Cursor {
                    acked: 0,
                    notified: None
                };
                n
            ],
            queue: vec![None; n],
            consuming: vec![None; n],
            opened: None,
            rebuild: None,
            sweep_due: false,
            crashes_left: self.crashes,
        }]
    }

    fn next(&self, s: &NoticeState, out: &mut Vec<(NoticeAction, NoticeState)>) {
        let mut push = |action: NoticeAction, f: &dyn Fn(&mut NoticeState)| {
            let mut next = s.clone();
            f(&mut next);
            out.push((action, next));
        };
        if s.log.len() < self.events as usize && s.opened.is_none() {
            let actors = (0..self.watchers).map(Actor::Watcher).chain([Actor::Other]);
            for actor in actors {
                for kind in [Kind::Material, Kind::LogOnly] {
                    push(NoticeAction::Append(actor, kind), &|n| {
                        self.append(n, actor, kind)
                    });
                }
            }
        }
        if s.opened.is_some() {
            push(NoticeAction::Enqueue, &|n| self.enqueue(n));
        }
        for w in 0..self.watchers {
            let at = w as usize;
            match s.consuming[at] {
                None if s.queue[at].is_some() => push(NoticeAction::Consume(w), &|n| {
                    let taken = n.queue[at].take().unwrap_or_default();
                    n.consuming[at] = Some(Consume::Taken(taken));
                    if let Some(Some((since, shown))) =
                        n.opened.as_mut().map(|opened| &mut opened[at])
                        && *since == taken
                    {
                        *shown = true;
                    }
                    Self::touch(n);
                }),
                None => {}
                Some(Consume::Taken(seen)) => push(NoticeAction::Ack(w), &|n| {
                    let reopened = self.ack(n, w, seen);
                    n.consuming[at] = Some(Consume::Acked(reopened));
                }),
                Some(Consume::Acked(reopened)) => push(NoticeAction::Requeue(w), &|n| {
                    if reopened.is_some() {
                        n.queue[at] = reopened;
                    }
                    n.consuming[at] = None;
                    Self::touch(n);
                }),
            }
        }
        match &s.rebuild {
            None => push(NoticeAction::RebuildRead, &|n| {
                n.rebuild = Some((Self::durable(n), false));
            }),
            Some((read, stale)) => push(NoticeAction::RebuildApply, &|n| {
                n.rebuild = None;
                if *stale && self.bug != Some(Bug::RebuildWithoutGenerationCheck) {
                    // A stale read is not applied; the sweep (if due) reads again.
                    return;
                }
                for (w, durable) in read.iter().enumerate() {
                    match durable {
                        None => n.queue[w] = None,
                        Some(_) if n.consuming[w].is_some() => {}
                        Some(_) => n.queue[w] = *durable,
                    }
                }
                n.sweep_due = false;
            }),
        }
        if s.crashes_left > 0 {
            push(NoticeAction::Crash, &|n| {
                n.crashes_left -= 1;
                n.queue.iter_mut().for_each(|q| *q = None);
                n.consuming.iter_mut().for_each(|c| *c = None);
                n.opened = None;
                n.rebuild = None;
                n.sweep_due = true;
            });
        }
    }

    fn check_state(&self, s: &NoticeState) -> Result<(), String> {
        for (w, cursor) in s.cursors.iter().enumerate() {
            if let Some(v) = cursor.notified {
                let (kind, actor) = s.log[v as usize - 1];
                if actor == Actor::Watcher(w as u8) {
                    return Err(format!("watcher {w} has a notice for its own event {v}"));
                }
                if !self.notifies(kind) {
                    return Err(format!(
                        "watcher {w}'s notice was opened at the log-only event {v}"
                    ));
                }
            }
            let lost = s.log.iter().enumerate().any(|(n, (kind, actor))| {
                n as u8 + 1 > cursor.acked
                    && self.notifies(*kind)
                    && *actor != Actor::Watcher(w as u8)
            });
            if lost && cursor.notified.is_none() {
                return Err(format!(
                    "a material event after watcher {w}'s acknowledged version {} left no \
                     pending notice",
                    cursor.acked
                ));
            }
            if let Some(queued) = s.queue[w]
                && (cursor.notified.is_none() || cursor.acked != queued)
            {
                return Err(format!(
                    "one notice per pair: watcher {w}'s queue holds a notice (changes since {queued}) \
                     that is not its pending durable one ({cursor:?})"
                ));
            }
        }
        let settled = s.opened.is_none()
            && s.rebuild.is_none()
            && !s.sweep_due
            && s.consuming.iter().all(Option::is_none);
        if settled && Self::durable(s) != s.queue {
            return Err(
                "with nothing in flight, the queue does not hold every pending notice".into(),
            );
        }
        Ok(())
    }

    fn check_step(
        &self,
        from: &NoticeState,
        action: &NoticeAction,
        to: &NoticeState,
    ) -> Result<(), String> {
        if let NoticeAction::Append(_, kind) = action {
            for (w, (a, b)) in from.cursors.iter().zip(&to.cursors).enumerate() {
                if a.notified.is_some() && a != b {
                    return Err(format!(
                        "watcher {w}'s pending notice changed while pending"
                    ));
                }
                if *kind == Kind::LogOnly && a != b {
                    return Err(format!("a log-only event opened a notice for watcher {w}"));
                }
            }
        }
        Ok(())
    }

    fn check_end(&self, s: &NoticeState) -> Result<(), String> {
        // Nothing can happen only once the log is full and every notice is consumed; the
        // rebuild and the crash are always possible, so an end is never reached.
        self.check_state(s)
    }

    fn describe(&self, s: &NoticeState) -> String {
        let log: Vec<String> = s
            .log
            .iter()
            .enumerate()
            .map(|(n, (kind, actor))| {
                let who = match actor {
                    Actor::Watcher(w) => format!("w{w}"),
                    Actor::Other => "o".into(),
                };
                let what = if *kind == Kind::Material { "M" } else { "l" };
                format!("{}{what}{who}", n + 1)
            })
            .collect();
        let cursors: Vec<String> = s
            .cursors
            .iter()
            .enumerate()
            .map(|(w, c)| {
                format!(
                    "w{w}[acked {} notice {} queued {} {}]",
                    c.acked,
                    c.notified.map_or("-".into(), |v| format!("@{v}")),
                    s.queue[w].map_or("-".into(), |v| format!("since {v}")),
                    match s.consuming[w] {
                        None => String::new(),
                        Some(Consume::Taken(v)) => format!("taken(since {v})"),
                        Some(Consume::Acked(r)) => format!("acked(reopened {r:?})"),
                    }
                )
            })
            .collect();
        format!(
            "log=[{}] {}{}{}",
            log.join(" "),
            cursors.join(" "),
            match &s.rebuild {
                None => String::new(),
                Some((read, stale)) => format!(
                    " rebuild-read={read:?}{}",
                    if *stale { " stale" } else { "" }
                ),
            },
            if s.sweep_due { " sweep-due" } else { "" }
        )
    }
}
