//! The durable send protocol: one accepted inbound event whose turn records its final as a
//! durable intent, sends it unit by unit and commits it, with crashes at any step, recovery
//! (claim, reconcile, replay) and a second worker (another process sharing the database).
//!
//! Each action is one atomic step of the real code: one store operation (`insert_intent`,
//! `save_intent` guarded on status + claim + attempt, `record_partial_receipt`,
//! `claim_intent`, `record_inbound`, `finish_inbound`) or one platform call. Reads are folded
//! into the step that acts on them.

use std::fmt;

use crate::checker::Model;

/// The intent lifecycle (`clawgate_types::IntentStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Pending,
    Sending,
    Committing,
    UnknownAfterSend,
    Sent,
    Failed,
    Cancelled,
}

pub const ALL_STATUSES: [Status; 7] = [
    Status::Pending,
    Status::Sending,
    Status::Committing,
    Status::UnknownAfterSend,
    Status::Sent,
    Status::Failed,
    Status::Cancelled,
];

impl Status {
    /// The model's transition table: the store refuses any other move. A test compares it
    /// with `IntentStatus::can_transition_to`, pair by pair.
    pub fn can_transition_to(self, to: Status) -> bool {
        use Status::*;
        match self {
            Pending => matches!(to, Pending | Sending | Failed | Cancelled),
            Sending => matches!(to, Pending | Committing | UnknownAfterSend | Failed | Sent),
            Committing => matches!(to, Sent),
            UnknownAfterSend => {
                matches!(to, UnknownAfterSend | Sent | Pending | Failed | Cancelled)
            }
            Failed => matches!(to, Pending | Cancelled),
            Sent | Cancelled => false,
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Sent | Status::Cancelled)
    }

    fn is_recoverable(self) -> bool {
        matches!(
            self,
            Status::Pending | Status::Sending | Status::Committing | Status::UnknownAfterSend
        )
    }

    fn short(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Sending => "sending",
            Status::Committing => "committing",
            Status::UnknownAfterSend => "unknown",
            Status::Sent => "sent",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }
}

/// What the channel adapter declares about unknown outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adapter {
    /// `reconcile_unknown_send`: the platform can be asked whether a unit landed.
    Reconciles,
    /// `duplicates_acceptable`: at-least-once, an unknown outcome is replayed.
    DuplicatesAcceptable,
    /// Neither: an unknown outcome is parked for an operator, never replayed.
    Neither,
}

impl Adapter {
    fn recovers_unknown(self) -> bool {
        self != Adapter::Neither
    }
}

/// A deliberately broken engine, to show the checker catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The turn completes its inbound event once the platform took the last unit, before the
    /// receipt commit.
    CompleteInboundBeforeCommit,
    /// Recovery replays a `sending` or `unknown_after_send` intent without reconciling.
    ReplayUnknownWithoutReconciling,
    /// The claims of a process that died are never released (no `release_dead_claims`, no
    /// expiry): its intent waits forever.
    DeadClaimsKept,
}

/// The bounds and choices of one check.
#[derive(Debug, Clone)]
pub struct SendModel {
    pub adapter: Adapter,
    pub workers: u8,
    /// Units of the final's rendered batch.
    pub units: u8,
    /// Crashes (each one of a busy worker's process, which restarts at once).
    pub crashes: u8,
    /// The retry policy's `max_attempts` (a rejected attempt at this count fails).
    pub max_attempts: u8,
    /// The retry policy's `max_reconciliations`.
    pub max_reconciliations: u8,
    /// The receive options' `max_attempts` (inbound processing attempts).
    pub max_inbound_attempts: u8,
    /// The time-to-live, as the attempt a started attempt finds expired (time is abstracted:
    /// any scheduled retry may be due at once; the time-to-live ends every retry loop).
    pub expires_at_attempt: u8,
    /// Whether the failure notice is recorded in the same step as the dead letter (the real
    /// code records them in two steps).
    pub notice_with_dead_letter: bool,
    /// Whether a restarted worker tells of dead letters whose notice is missing
    /// (`tell_untold_dead_letters` when a gateway takes the account), as the real code does:
    /// what closes the crash between the two steps.
    pub sweep_untold_dead_letters: bool,
    /// Whether recovery marks a `sending` intent `unknown_after_send` before reconciling it,
    /// as the code once did: that write leaves `next_attempt_at` unset and releases the
    /// claim, so until the reconciliation's own write the intent looks parked for an
    /// operator. False, as the code now does: recovery reconciles from `sending`, under its
    /// claim, and writes what the answers lead to.
    pub unknown_before_reconcile: bool,
    pub bug: Option<Bug>,
}

impl SendModel {
    /// The bounds checked in CI for `adapter`, deepened by [`crate::depth`]: each step of
    /// depth adds a unit (up to 4) and a crash.
    pub fn new(adapter: Adapter) -> SendModel {
        let depth = crate::depth();
        SendModel {
            adapter,
            workers: 2,
            units: 2u8.saturating_add(depth).min(4),
            crashes: 2u8.saturating_add(depth),
            max_attempts: 2,
            max_reconciliations: 2,
            max_inbound_attempts: 2,
            expires_at_attempt: 3,
            notice_with_dead_letter: false,
            sweep_untold_dead_letters: true,
            unknown_before_reconcile: false,
            bug: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Claim {
    None,
    /// Held by a live worker.
    Live(u8),
    /// Held by a process that died: blocks others until released (or it expires).
    Dead,
}

/// The intent's columns a worker reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Row {
    pub status: Status,
    pub attempt: u8,
    /// Units whose receipt part is recorded (bit per unit).
    pub parts: u8,
    pub reconciliations: u8,
    /// `next_attempt_at` is set (a rescheduled or scheduled-reconciliation intent).
    pub scheduled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stored {
    pub row: Row,
    pub claim: Claim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Inbound {
    Received,
    Completed,
    DeadLettered,
}

/// What a worker is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Job {
    /// A turn's own `Messenger::send` of its final.
    Send,
    /// A turn waiting for a recorded final (`await_reply` driving `recover_intent`).
    Await,
    /// A recovery pass.
    Recover,
}

/// Reconciliation answers gathered so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Asked {
    /// Units still to ask about.
    pub left: u8,
    pub not_sent: u8,
    pub unresolved: bool,
    pub undecidable: bool,
}

/// The next step of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pc {
    Idle,
    /// `record_inbound` counted the attempt; next: `reply_for` and (for a new reply) the
    /// intent's insert. `settle`: the attempt is past the limit, nothing is dispatched.
    ReplyFor {
        settle: bool,
    },
    /// `start_attempt`: `pending → sending` from the worker's copy. `first`: this write is
    /// also how a recovery takes the intent (a refusal is contention, not an error).
    Start {
        first: bool,
    },
    /// The platform call for the lowest unit without a receipt.
    Call,
    /// The unit landed and more remain: `record_partial_receipt`.
    RecordPart,
    /// Every unit landed: the receipt commit (`save_intent` → `sent`).
    Commit,
    /// The platform refused with no side effect: `retry_or_fail`.
    Rejected,
    /// The platform may have acted: `unknown` (scheduled, or parked for an operator).
    Unknown,
    /// Recovery of a non-pending intent: `claim_intent`.
    Claim,
    /// Recovery found `sending` (a crash mid-send): save `unknown_after_send`.
    ToUnknown,
    /// Reconciliation: ask about the next unit.
    Ask(Asked),
    /// Reconciliation answered: write what the answers lead to.
    Decide(Asked),
    /// `duplicates_acceptable`: save `pending`, then deliver again.
    Replay,
    /// No way to settle it: park it (`unknown_until(None)`).
    Park,
    /// `await_reply`: read the intent and finish the turn or drive it.
    AwaitCheck,
    /// `finish_inbound(completed)`.
    Complete,
    /// The turn failed: `finish_inbound(received | dead_lettered)`.
    FailTurn,
    /// After a dead letter: the failure notice (`tell_of_failure`).
    TellFailure,
}

impl Pc {
    /// The step, as a trace shows it.
    fn step(self) -> &'static str {
        match self {
            Pc::Idle => "idle",
            Pc::ReplyFor { settle: true } => "settle: reply_for (nothing is dispatched)",
            Pc::ReplyFor { settle: false } => "reply_for, the agent's turn, insert_intent",
            Pc::Start { .. } => "start_attempt: save pending -> sending",
            Pc::Call => "platform call",
            Pc::RecordPart => "record_partial_receipt",
            Pc::Commit => "commit: save -> sent",
            Pc::Rejected => "retry_or_fail: save -> pending (rescheduled) or failed",
            Pc::Unknown => "unknown: save -> unknown_after_send",
            Pc::Claim => "claim_intent",
            Pc::ToUnknown => "recovery found sending: save -> unknown_after_send",
            Pc::Ask(_) => "reconcile_unknown_send",
            Pc::Decide(_) => "reconciled: save what the answers lead to",
            Pc::Replay => "replay: save -> pending",
            Pc::Park => "park for an operator: save unknown_after_send, unscheduled",
            Pc::AwaitCheck => "await_reply: load the intent",
            Pc::Complete => "finish_inbound(completed)",
            Pc::FailTurn => "the turn failed: finish_inbound(received or dead_lettered)",
            Pc::TellFailure => "tell_of_failure: the failure notice",
        }
    }

    /// The worker's state, as a trace shows it.
    fn short(self) -> String {
        match self {
            Pc::Ask(a) | Pc::Decide(a) => format!(
                "{}(not_sent={:b}{}{})",
                if matches!(self, Pc::Ask(_)) {
                    "Ask"
                } else {
                    "Decide"
                },
                a.not_sent,
                if a.unresolved { " unresolved" } else { "" },
                if a.undecidable { " undecidable" } else { "" },
            ),
            Pc::ReplyFor { settle } => format!("ReplyFor{}", if settle { "(settle)" } else { "" }),
            Pc::Start { .. } => "Start".into(),
            other => format!("{other:?}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Worker {
    pub pc: Pc,
    pub job: Job,
    /// The worker's copy of the intent (what it read or last wrote).
    pub copy: Row,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SendState {
    pub inbound: Inbound,
    pub inbound_attempts: u8,
    pub notice: bool,
    pub intent: Option<Stored>,
    /// Copies of each unit the platform holds (saturating at 3).
    pub delivered: [u8; 4],
    pub workers: Vec<Worker>,
    pub crashes_left: u8,
    /// A restart left the dead-letter sweep to run.
    pub sweep_due: bool,
    /// A write the engine asked for that the transition table refuses (an engine bug).
    pub illegal_write: Option<(Status, Status)>,
}

/// The platform's answer to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    Lands,
    /// Refused before any side effect (a retryable error).
    Rejected,
    /// Landed, but the answer was lost (a timeout after the platform acted).
    LandsAnswerLost,
    /// Did not land, and the worker cannot tell (a timeout before the platform acted).
    LostNotLanded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The platform's truth: sent (with the part) or not sent.
    Truth,
    /// Cannot tell yet (or unreachable): ask again later.
    Unresolved,
    /// Can never tell.
    Undecidable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendAction {
    /// A worker starts processing the inbound event (`record_inbound`).
    Receive(u8),
    /// A worker starts a recovery pass on the due intent.
    Recover(u8),
    /// A worker takes its next step.
    Step(u8, Pc),
    Call(u8, u8, CallResult),
    Ask(u8, u8, Answer),
    /// A dead process's claim is released (`release_dead_claims`), or an idle holder's expires.
    ReleaseClaim,
    /// A busy worker's process dies and restarts (everything in memory is lost).
    Crash(u8),
    /// The restarted gateway tells of a dead letter without its notice.
    SweepDeadLetters(u8),
}

impl fmt::Display for SendAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendAction::Receive(w) => write!(f, "w{w}: receive the inbound event (record_inbound)"),
            SendAction::Recover(w) => write!(f, "w{w}: recovery pass reads the due intent"),
            SendAction::Step(w, pc) => write!(f, "w{w}: {}", pc.step()),
            SendAction::Call(w, unit, result) => {
                write!(f, "w{w}: platform call for unit {unit}: {result:?}")
            }
            SendAction::Ask(w, unit, answer) => {
                write!(f, "w{w}: reconcile unit {unit}: {answer:?}")
            }
            SendAction::ReleaseClaim => write!(f, "the dead or idle holder's claim is released"),
            SendAction::Crash(w) => write!(f, "w{w}: CRASH and restart"),
            SendAction::SweepDeadLetters(w) => {
                write!(f, "w{w}: tell_untold_dead_letters after the restart")
            }
        }
    }
}

/// What a guarded write returns.
enum Write {
    Done,
    /// Another status, another live or dead holder's claim, or a stale attempt.
    Refused,
}

impl SendModel {
    fn all_units(&self) -> u8 {
        (1u8 << self.units) - 1
    }

    /// The lowest unit without a receipt part in `row`.
    fn missing(&self, row: &Row) -> Option<u8> {
        (0..self.units).find(|u| row.parts & (1 << u) == 0)
    }

    /// Whether recovery has work on it (`is_due`: time abstracted, anything scheduled is due).
    fn is_due(row: &Row) -> bool {
        row.status.is_recoverable() && (row.scheduled || row.status != Status::UnknownAfterSend)
    }

    /// `IntentStore::save_intent(copy, expected, Some(claim of w))`.
    fn save(&self, s: &mut SendState, w: u8, expected: Status, copy: Row) -> Write {
        let Some(stored) = s.intent.as_mut() else {
            return Write::Refused;
        };
        if stored.row.status != expected {
            return Write::Refused;
        }
        let ours = stored.claim == Claim::Live(w);
        if !ours && stored.claim != Claim::None {
            return Write::Refused;
        }
        let keeps = matches!(copy.status, Status::Sending | Status::Committing)
            || (copy.status == Status::Pending && !copy.scheduled);
        if keeps && expected == Status::Pending && !ours && stored.row.attempt >= copy.attempt {
            return Write::Refused;
        }
        if !expected.can_transition_to(copy.status) {
            s.illegal_write = Some((expected, copy.status));
            return Write::Refused;
        }
        stored.row = copy;
        stored.claim = if keeps { Claim::Live(w) } else { Claim::None };
        Write::Done
    }

    fn worker(s: &mut SendState, w: u8) -> &mut Worker {
        &mut s.workers[w as usize]
    }

    fn go(s: &mut SendState, w: u8, pc: Pc) {
        Self::worker(s, w).pc = pc;
    }

    /// The send or the recovery of one intent ended with `outcome` stored.
    fn finish(&self, s: &mut SendState, w: u8, sent: bool) {
        let worker = Self::worker(s, w);
        worker.pc = match worker.job {
            Job::Send if sent => Pc::Complete,
            Job::Send | Job::Await => Pc::AwaitCheck,
            Job::Recover => Pc::Idle,
        };
        if worker.job == Job::Send && !sent {
            worker.job = Job::Await;
        }
    }

    /// A guarded write was refused.
    fn refused(&self, s: &mut SendState, w: u8, contention: bool) {
        let worker = Self::worker(s, w);
        worker.pc = match (worker.job, contention) {
            (Job::Recover, _) => Pc::Idle,
            (Job::Await, true) => Pc::AwaitCheck,
            // An error out of `send` or `recover_intent`: the turn fails.
            (Job::Send | Job::Await, _) => Pc::FailTurn,
        };
    }

    /// `recover_one` on a due intent the worker just read as `row`.
    fn begin_recovery(&self, s: &mut SendState, w: u8, row: Row) {
        let worker = Self::worker(s, w);
        worker.copy = row;
        worker.pc = if row.status == Status::Pending {
            Pc::Start { first: true }
        } else {
            Pc::Claim
        };
    }

    /// `reconcile` on the claimed intent in the worker's copy.
    fn reconcile(&self, s: &mut SendState, w: u8) {
        let units = self.all_units();
        let worker = Self::worker(s, w);
        worker.pc = match (self.bug, self.adapter) {
            (Some(Bug::ReplayUnknownWithoutReconciling), _) => Pc::Replay,
            (_, Adapter::Neither) => Pc::Park,
            (_, Adapter::DuplicatesAcceptable) => Pc::Replay,
            (_, Adapter::Reconciles) => {
                if worker.copy.status == Status::Sending {
                    // A crashed send is a new unknown episode: its count starts here.
                    worker.copy.reconciliations = 0;
                }
                worker.copy.reconciliations = worker.copy.reconciliations.saturating_add(1);
                Pc::Ask(Asked {
                    left: units & !worker.copy.parts,
                    not_sent: 0,
                    unresolved: false,
                    undecidable: false,
                })
            }
        };
    }

    /// The turn's own step: whether a live worker is running the event's turn.
    fn turn_running(s: &SendState) -> bool {
        s.workers
            .iter()
            .any(|w| w.pc != Pc::Idle && w.job != Job::Recover)
    }

    fn step(&self, s: &mut SendState, w: u8) {
        let me = *Self::worker(s, w);
        let mut copy = me.copy;
        match me.pc {
            Pc::Idle | Pc::Call | Pc::Ask(_) => unreachable!("not a plain step"),
            Pc::ReplyFor { settle } => match s.intent {
                None if settle => Self::go(s, w, Pc::FailTurn),
                None => {
                    // The agent ran; the final is recorded before any platform I/O, its first
                    // attempt started in the same write when the adapter resolves unknown
                    // outcomes by itself.
                    let starts = self.adapter.recovers_unknown();
                    let row = Row {
                        status: if starts {
                            Status::Sending
                        } else {
                            Status::Pending
                        },
                        attempt: u8::from(starts),
                        parts: 0,
                        reconciliations: 0,
                        scheduled: false,
                    };
                    s.intent = Some(Stored {
                        row,
                        claim: Claim::Live(w),
                    });
                    let worker = Self::worker(s, w);
                    worker.copy = row;
                    worker.job = Job::Send;
                    worker.pc = if starts {
                        Pc::Call
                    } else {
                        Pc::Start { first: false }
                    };
                }
                Some(stored) if stored.row.status == Status::Sent => Self::go(s, w, Pc::Complete),
                Some(_) => {
                    Self::worker(s, w).job = Job::Await;
                    Self::go(s, w, Pc::AwaitCheck);
                }
            },
            Pc::Start { first } => {
                if copy.attempt + 1 >= self.expires_at_attempt {
                    // Past its time-to-live: `expire` fails it instead.
                    copy.status = Status::Failed;
                    copy.scheduled = false;
                    match self.save(s, w, Status::Pending, copy) {
                        Write::Done => {
                            Self::worker(s, w).copy = copy;
                            self.finish(s, w, false);
                        }
                        Write::Refused => self.refused(s, w, first),
                    }
                    return;
                }
                copy.attempt += 1;
                copy.scheduled = false;
                copy.status = Status::Sending;
                match self.save(s, w, Status::Pending, copy) {
                    Write::Done => {
                        let worker = Self::worker(s, w);
                        worker.copy = copy;
                        worker.pc = Pc::Call;
                    }
                    Write::Refused => self.refused(s, w, first),
                }
            }
            Pc::RecordPart => match s.intent.as_mut() {
                Some(stored) if stored.row.status == Status::Sending => {
                    stored.row.parts |= copy.parts;
                    Self::go(s, w, Pc::Call);
                }
                _ => self.refused(s, w, false),
            },
            Pc::Commit => {
                let expected = copy.status;
                copy.status = Status::Sent;
                copy.parts = self.all_units();
                copy.scheduled = false;
                match self.save(s, w, expected, copy) {
                    Write::Done => {
                        Self::worker(s, w).copy = copy;
                        self.finish(s, w, true);
                    }
                    Write::Refused => self.refused(s, w, false),
                }
            }
            Pc::Rejected => {
                let expected = copy.status;
                if copy.attempt >= self.max_attempts || copy.attempt + 1 >= self.expires_at_attempt
                {
                    copy.status = Status::Failed;
                    copy.scheduled = false;
                } else {
                    copy.status = Status::Pending;
                    copy.scheduled = true;
                }
                match self.save(s, w, expected, copy) {
                    Write::Done => {
                        Self::worker(s, w).copy = copy;
                        self.finish(s, w, false);
                    }
                    Write::Refused => self.refused(s, w, false),
                }
            }
            Pc::Unknown => {
                let expected = copy.status;
                if expected != Status::UnknownAfterSend {
                    copy.reconciliations = 0;
                }
                copy.status = Status::UnknownAfterSend;
                copy.scheduled = self.adapter.recovers_unknown();
                match self.save(s, w, expected, copy) {
                    Write::Done => {
                        Self::worker(s, w).copy = copy;
                        self.finish(s, w, false);
                    }
                    Write::Refused => self.refused(s, w, false),
                }
            }
            Pc::Claim => {
                let Some(stored) = s.intent.as_mut() else {
                    return self.refused(s, w, true);
                };
                if stored.claim != Claim::None && stored.claim != Claim::Live(w) {
                    return self.refused(s, w, true);
                }
                let fresh = stored.row;
                if !Self::is_due(&fresh) {
                    // Finished or rescheduled since it was read: the claim goes back.
                    stored.claim = Claim::None;
                    return self.refused(s, w, true);
                }
                stored.claim = Claim::Live(w);
                Self::worker(s, w).copy = fresh;
                match fresh.status {
                    Status::Pending => Self::go(s, w, Pc::Start { first: false }),
                    Status::Committing => Self::go(s, w, Pc::Commit),
                    Status::Sending => Self::go(s, w, Pc::ToUnknown),
                    Status::UnknownAfterSend => self.reconcile(s, w),
                    Status::Sent | Status::Failed | Status::Cancelled => {
                        unreachable!("not due")
                    }
                }
            }
            Pc::ToUnknown if !self.unknown_before_reconcile => self.reconcile(s, w),
            Pc::ToUnknown => {
                copy.status = Status::UnknownAfterSend;
                match self.save(s, w, Status::Sending, copy) {
                    Write::Done => {
                        Self::worker(s, w).copy = copy;
                        self.reconcile(s, w);
                    }
                    Write::Refused => self.refused(s, w, false),
                }
            }
            Pc::Decide(asked) => {
                let expected = copy.status;
                let next = if asked.unresolved && !asked.undecidable {
                    if copy.reconciliations >= self.max_reconciliations {
                        copy.status = Status::Failed;
                        copy.scheduled = false;
                    } else {
                        copy.status = Status::UnknownAfterSend;
                        copy.scheduled = true;
                    }
                    None
                } else if asked.unresolved {
                    copy.status = Status::UnknownAfterSend;
                    copy.scheduled = false;
                    None
                } else if asked.not_sent == 0 {
                    copy.status = Status::Sent;
                    copy.scheduled = false;
                    None
                } else {
                    // Only the units the platform proved missing go out again.
                    copy.status = Status::Pending;
                    Some(Pc::Start { first: false })
                };
                match self.save(s, w, expected, copy) {
                    Write::Done => {
                        Self::worker(s, w).copy = copy;
                        match next {
                            Some(pc) => Self::go(s, w, pc),
                            None => self.finish(s, w, copy.status == Status::Sent),
                        }
                    }
                    Write::Refused => self.refused(s, w, false),
                }
            }
            Pc::Replay => {
                let expected = copy.status;
                copy.status = Status::Pending;
                match self.save(s, w, expected, copy) {
                    Write::Done => {
                        let worker = Self::worker(s, w);
                        worker.copy = copy;
                        worker.pc = Pc::Start { first: false };
                    }
                    Write::Refused => self.refused(s, w, false),
                }
            }
            Pc::Park => {
                let expected = copy.status;
                copy.status = Status::UnknownAfterSend;
                copy.scheduled = false;
                match self.save(s, w, expected, copy) {
                    Write::Done => {
                        Self::worker(s, w).copy = copy;
                        self.finish(s, w, false);
                    }
                    Write::Refused => self.refused(s, w, false),
                }
            }
            Pc::AwaitCheck => {
                let Some(stored) = s.intent else {
                    return Self::go(s, w, Pc::FailTurn);
                };
                let row = stored.row;
                match row.status {
                    Status::Sent | Status::Cancelled => Self::complete(s, w),
                    Status::UnknownAfterSend if !row.scheduled => Self::complete(s, w),
                    Status::Failed => self.fail_turn(s, w),
                    _ => self.begin_recovery(s, w, row),
                }
            }
            Pc::Complete => Self::complete(s, w),
            Pc::FailTurn => self.fail_turn(s, w),
            Pc::TellFailure => {
                s.notice = true;
                Self::go(s, w, Pc::Idle);
            }
        }
    }

    fn complete(s: &mut SendState, w: u8) {
        s.inbound = Inbound::Completed;
        Self::go(s, w, Pc::Idle);
    }

    /// `finish_inbound`: retried while attempts remain, else dead-lettered (and the person
    /// told).
    fn fail_turn(&self, s: &mut SendState, w: u8) {
        if s.inbound_attempts >= self.max_inbound_attempts {
            s.inbound = Inbound::DeadLettered;
            if self.notice_with_dead_letter {
                s.notice = true;
                Self::go(s, w, Pc::Idle);
            } else {
                Self::go(s, w, Pc::TellFailure);
            }
        } else {
            s.inbound = Inbound::Received;
            Self::go(s, w, Pc::Idle);
        }
    }

    fn call(&self, s: &mut SendState, w: u8, unit: u8, result: CallResult) {
        let landed = matches!(result, CallResult::Lands | CallResult::LandsAnswerLost);
        if landed {
            let copies = &mut s.delivered[unit as usize];
            *copies = (*copies + 1).min(3);
        }
        let all = self.all_units();
        let worker = Self::worker(s, w);
        worker.pc = match result {
            CallResult::Lands => {
                worker.copy.parts |= 1 << unit;
                if worker.copy.parts == all {
                    Pc::Commit
                } else {
                    Pc::RecordPart
                }
            }
            CallResult::Rejected => Pc::Rejected,
            CallResult::LandsAnswerLost | CallResult::LostNotLanded => Pc::Unknown,
        };
        let last_landed = result == CallResult::Lands && worker.pc == Pc::Commit;
        if last_landed
            && self.bug == Some(Bug::CompleteInboundBeforeCommit)
            && worker.job == Job::Send
        {
            s.inbound = Inbound::Completed;
        }
    }

    fn ask(&self, s: &mut SendState, w: u8, unit: u8, answer: Answer) {
        let landed = s.delivered[unit as usize] > 0;
        let worker = Self::worker(s, w);
        let Pc::Ask(mut asked) = worker.pc else {
            unreachable!("asking outside a reconciliation")
        };
        asked.left &= !(1 << unit);
        match answer {
            Answer::Truth if landed => worker.copy.parts |= 1 << unit,
            Answer::Truth => asked.not_sent |= 1 << unit,
            Answer::Unresolved => asked.unresolved = true,
            Answer::Undecidable => {
                asked.unresolved = true;
                asked.undecidable = true;
            }
        }
        worker.pc = if asked.left == 0 {
            Pc::Decide(asked)
        } else {
            Pc::Ask(asked)
        };
    }
}

impl Model for SendModel {
    type State = SendState;
    type Action = SendAction;

    fn init(&self) -> Vec<SendState> {
        let idle = Worker {
            pc: Pc::Idle,
            job: Job::Recover,
            copy: Row {
                status: Status::Pending,
                attempt: 0,
                parts: 0,
                reconciliations: 0,
                scheduled: false,
            },
        };
        vec![SendState {
            // Accepted: durable, not yet processed.
            inbound: Inbound::Received,
            inbound_attempts: 0,
            notice: false,
            intent: None,
            delivered: [0; 4],
            workers: vec![idle; self.workers as usize],
            crashes_left: self.crashes,
            sweep_due: false,
            illegal_write: None,
        }]
    }

    fn next(&self, s: &SendState, out: &mut Vec<(SendAction, SendState)>) {
        let mut push = |action: SendAction, f: &dyn Fn(&mut SendState)| {
            let mut next = s.clone();
            f(&mut next);
            out.push((action, next));
        };
        for w in 0..self.workers {
            let me = s.workers[w as usize];
            match me.pc {
                Pc::Idle => {
                    // Unfinished inbound events are processed (again) by one live worker.
                    if s.inbound == Inbound::Received && !Self::turn_running(s) {
                        push(SendAction::Receive(w), &|n| {
                            n.inbound_attempts += 1;
                            let settle = n.inbound_attempts > self.max_inbound_attempts;
                            let worker = Self::worker(n, w);
                            worker.job = Job::Send;
                            worker.pc = Pc::ReplyFor { settle };
                        });
                    }
                    if let Some(stored) = s.intent
                        && Self::is_due(&stored.row)
                    {
                        push(SendAction::Recover(w), &|n| {
                            Self::worker(n, w).job = Job::Recover;
                            self.begin_recovery(n, w, stored.row);
                        });
                    }
                }
                Pc::Call => {
                    let unit = self.missing(&me.copy).expect("a call with a unit to send");
                    for result in [
                        CallResult::Lands,
                        CallResult::Rejected,
                        CallResult::LandsAnswerLost,
                        CallResult::LostNotLanded,
                    ] {
                        push(SendAction::Call(w, unit, result), &|n| {
                            self.call(n, w, unit, result)
                        });
                    }
                }
                Pc::Ask(asked) => {
                    let unit = asked.left.trailing_zeros() as u8;
                    for answer in [Answer::Truth, Answer::Unresolved, Answer::Undecidable] {
                        push(SendAction::Ask(w, unit, answer), &|n| {
                            self.ask(n, w, unit, answer)
                        });
                    }
                }
                pc => push(SendAction::Step(w, pc), &|n| self.step(n, w)),
            }
            if me.pc != Pc::Idle && s.crashes_left > 0 {
                push(SendAction::Crash(w), &|n| {
                    n.crashes_left -= 1;
                    if let Some(stored) = n.intent.as_mut()
                        && stored.claim == Claim::Live(w)
                    {
                        stored.claim = Claim::Dead;
                    }
                    let worker = Self::worker(n, w);
                    worker.pc = Pc::Idle;
                    worker.job = Job::Recover;
                    n.sweep_due = self.sweep_untold_dead_letters;
                });
            }
            if me.pc == Pc::Idle && s.sweep_due {
                push(SendAction::SweepDeadLetters(w), &|n| {
                    n.sweep_due = false;
                    if n.inbound == Inbound::DeadLettered {
                        n.notice = true;
                    }
                });
            }
        }
        if let Some(stored) = s.intent {
            let stale = match stored.claim {
                Claim::None => false,
                Claim::Dead => self.bug != Some(Bug::DeadClaimsKept),
                Claim::Live(w) => s.workers[w as usize].pc == Pc::Idle,
            };
            if stale {
                push(SendAction::ReleaseClaim, &|n| {
                    if let Some(stored) = n.intent.as_mut() {
                        stored.claim = Claim::None;
                    }
                });
            }
        }
    }

    fn check_state(&self, s: &SendState) -> Result<(), String> {
        if let Some((from, to)) = s.illegal_write {
            return Err(format!(
                "the engine asked for {} -> {}, which the transition table refuses",
                from.short(),
                to.short()
            ));
        }
        let units = &s.delivered[..self.units as usize];
        if self.adapter != Adapter::DuplicatesAcceptable
            && let Some(unit) = units.iter().position(|copies| *copies > 1)
        {
            return Err(format!(
                "at most once: unit {unit} of the final was delivered twice ({:?} adapter)",
                self.adapter
            ));
        }
        if let Some(stored) = s.intent
            && stored.row.status == Status::Sent
            && units.contains(&0)
        {
            return Err("a committed receipt covers a unit the platform never took".into());
        }
        if s.inbound == Inbound::Completed && !self.final_settled(s) {
            return Err(
                "the inbound event is completed while its final is neither committed nor \
                 handed to an operator"
                    .into(),
            );
        }
        Ok(())
    }

    fn check_step(&self, from: &SendState, _: &SendAction, to: &SendState) -> Result<(), String> {
        match (from.intent, to.intent) {
            (Some(a), Some(b)) if a.row.status.is_terminal() && a.row.status != b.row.status => {
                Err(format!(
                    "an intent left the terminal status {}",
                    a.row.status.short()
                ))
            }
            _ => Ok(()),
        }
    }

    fn check_end(&self, s: &SendState) -> Result<(), String> {
        let finished = matches!(s.inbound, Inbound::Completed | Inbound::DeadLettered);
        let delivered = s.intent.is_some_and(|i| i.row.status == Status::Sent);
        if finished && (delivered || s.notice || self.final_settled(s)) {
            return Ok(());
        }
        Err(format!(
            "the accepted event ended ({:?}) without a final or a failure notice",
            s.inbound
        ))
    }

    fn progress(&self) -> bool {
        true
    }

    fn describe(&self, s: &SendState) -> String {
        let intent = match s.intent {
            None => "none".to_owned(),
            Some(i) => format!(
                "{}#{} parts={:0w$b} rec={}{} claim={}",
                i.row.status.short(),
                i.row.attempt,
                i.row.parts,
                i.row.reconciliations,
                if i.row.scheduled { " scheduled" } else { "" },
                match i.claim {
                    Claim::None => "-".to_owned(),
                    Claim::Live(w) => format!("w{w}"),
                    Claim::Dead => "dead".to_owned(),
                },
                w = self.units as usize,
            ),
        };
        let workers: Vec<String> = s
            .workers
            .iter()
            .enumerate()
            .map(|(n, w)| match w.pc {
                Pc::Idle => format!("w{n}=idle"),
                pc => format!("w{n}={:?}/{}", w.job, pc.short()),
            })
            .collect();
        format!(
            "inbound={:?}#{}{} intent={intent} platform={:?} {}{}",
            s.inbound,
            s.inbound_attempts,
            if s.notice { " notice" } else { "" },
            &s.delivered[..self.units as usize],
            workers.join(" "),
            if s.sweep_due { " sweep-due" } else { "" }
        )
    }
}

impl SendModel {
    /// The final is committed, or the turn handed it to an operator: parked for an
    /// operator (an unknown outcome nothing can settle).
    fn final_settled(&self, s: &SendState) -> bool {
        s.intent.is_some_and(|i| match i.row.status {
            Status::Sent | Status::Cancelled => true,
            Status::UnknownAfterSend => !i.row.scheduled,
            _ => false,
        })
    }
}
