//! Recovery: resume every intent a crash, a restart or a failure left behind, oldest first,
//! under the per-intent claim, reconciling unknown outcomes before any replay.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use clawgate_channel_sdk::{ChannelMessageAdapter, Reconciliation};
use clawgate_store::{IntentCursor, StoreError};
use clawgate_types::{DurableSendIntent, IntentId, IntentStatus, MessageReceipt};
use tracing::{Instrument as _, info, info_span, warn};

use crate::engine::Inner;
use crate::{MessagesError, Messenger, RecoveryReport, SendOutcome};

/// How long [`Messenger::recover_intent`] waits for a pass of the same engine to finish the
/// intent (one intent's recovery: a few platform calls).
const IN_PROCESS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Due intents read per round trip to the store and worked on concurrently (recovery streams
/// the backlog page by page; it never loads everything).
const RECOVERY_PAGE: u32 = 256;

/// How a recovery pass paces itself, so a large backlog (after an outage, thousands of due
/// replies) neither floods a platform nor holds the gateway up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveryPace {
    /// Intents of one channel worked on at once.
    pub per_channel: usize,
    /// After this long the pass takes no further intent; the rest stays due for the next pass.
    pub time_budget: Option<std::time::Duration>,
}

impl Default for RecoveryPace {
    fn default() -> Self {
        RecoveryPace {
            per_channel: 16,
            time_budget: None,
        }
    }
}

impl Messenger {
    /// One recovery pass over every due intent, paced by [`RecoveryPace::default`] without a
    /// time budget. Safe to run concurrently with sends and with other passes, in this process
    /// or another one on the same database: claims keep each intent with one worker.
    pub async fn recover(&self) -> Result<RecoveryReport, MessagesError> {
        self.recover_paced(&RecoveryPace::default()).await
    }

    /// One recovery pass, paced: at most `pace.per_channel` intents of a channel at once; once
    /// a channel answers "rate limited", its other due intents wait for the next pass (a
    /// backlog meets one 429, not a storm of them); after `pace.time_budget` no further intent
    /// is taken. What is left is counted in [`RecoveryReport::deferred`] and stays due.
    pub async fn recover_paced(
        &self,
        pace: &RecoveryPace,
    ) -> Result<RecoveryReport, MessagesError> {
        let mut report = RecoveryReport::default();
        self.release_dead_claims().await?;
        let started = tokio::time::Instant::now();
        let per_channel = pace.per_channel.max(1);
        // Due intents are read page by page, off the writer and the next page while this one is
        // worked on; each is taken by its first guarded write. Up to a page of intents is worked
        // on at once and the window is refilled as each one finishes, so group commit batches
        // their writes and neither a page's slowest intent nor the next read idles the writer.
        let window = RECOVERY_PAGE as usize;
        let mut queued: VecDeque<DurableSendIntent> = VecDeque::new();
        // Read, but their channel had `per_channel` intents in flight.
        let mut held: VecDeque<DurableSendIntent> = VecDeque::new();
        let mut busy: HashMap<String, usize> = HashMap::new();
        let mut slowed: HashSet<String> = HashSet::new();
        let mut next_page = Some(self.read_due_page(None));
        let mut tasks = tokio::task::JoinSet::new();
        let mut out_of_time = false;
        loop {
            while tasks.len() < window {
                if pace
                    .time_budget
                    .is_some_and(|budget| started.elapsed() >= budget)
                {
                    out_of_time = true;
                    break;
                }
                let ready = held.iter().position(|i| {
                    slowed.contains(&i.channel)
                        || busy.get(&i.channel).copied().unwrap_or(0) < per_channel
                });
                let intent = match ready.and_then(|at| held.remove(at)) {
                    Some(intent) => intent,
                    None => {
                        // Every held intent waits for its channel: read no further ahead.
                        if held.len() >= window {
                            break;
                        }
                        if queued.is_empty() {
                            let Some(page) = next_page.take() else {
                                break;
                            };
                            let page = page.await.map_err(task_failed)??;
                            if let Some(last) = page.last() {
                                next_page = Some(self.read_due_page(Some(IntentCursor::of(last))));
                            }
                            queued.extend(page);
                        }
                        let Some(intent) = queued.pop_front() else {
                            break;
                        };
                        intent
                    }
                };
                if slowed.contains(&intent.channel) {
                    report.deferred += 1;
                    continue;
                }
                let in_flight = busy.entry(intent.channel.clone()).or_default();
                if *in_flight >= per_channel {
                    held.push_back(intent);
                    continue;
                }
                *in_flight += 1;
                let span = info_span!("recover", intent = %intent.id, status = %intent.status);
                let inner = self.inner.clone();
                tasks.spawn(
                    async move {
                        let channel = intent.channel.clone();
                        let mut one = RecoveryReport::default();
                        inner
                            .recover_one(intent, &mut one)
                            .await
                            .map(|()| (channel, one))
                    }
                    .instrument(span),
                );
            }
            let Some(done) = tasks.join_next().await else {
                break;
            };
            let (channel, one) = done.map_err(task_failed)??;
            if let Some(in_flight) = busy.get_mut(&channel) {
                *in_flight = in_flight.saturating_sub(1);
            }
            if one.rate_limited > 0 && slowed.insert(channel.clone()) {
                info!(%channel, "the platform asked to slow down: the channel's other due intents wait for the next pass");
            }
            report.add(&one);
        }
        // Read and not taken; pages not read yet stay due as well.
        report.deferred += (held.len() + queued.len()) as u64;
        if out_of_time {
            info!(
                deferred = report.deferred,
                "recovery pass reached its time budget; the rest is left for the next pass"
            );
        }
        if report.examined > 0 || report.deferred > 0 {
            info!(?report, "recovery pass finished");
        }
        Ok(report)
    }
}

impl Messenger {
    /// Releases the claims of processes that died (a crash, a kill -9): they would block
    /// their intents until the claims expire. A live peer's claims are left alone.
    async fn release_dead_claims(&self) -> Result<(), MessagesError> {
        let inner = &self.inner;
        for (holder, held) in inner.store.claim_holders().await? {
            if holder != inner.worker && crate::liveness::holder_is_dead(holder.as_str()) {
                let released = inner.store.release_claims_held_by(&holder).await?;
                info!(holder = %holder.as_str(), held, released, "released the claims of a dead process");
            }
        }
        Ok(())
    }

    /// Works on one intent now, as a recovery pass would when it is due and free (a reply
    /// without a final is ended, a recorded final delivered or reconciled), and returns it as
    /// stored afterwards. A turn uses it to finish what an earlier attempt of the same turn
    /// left behind before it completes its inbound event; an intent another live worker holds
    /// is left to it.
    pub async fn recover_intent(
        &self,
        id: &IntentId,
    ) -> Result<Option<DurableSendIntent>, MessagesError> {
        let inner = &self.inner;
        let deadline = tokio::time::Instant::now() + IN_PROCESS_WAIT;
        let mut released_dead_claims = false;
        loop {
            // A recovery pass of this engine may be working on it right now (passes run beside
            // the turns): its outcome is what the caller needs, so wait for it rather than
            // report the intent as it was before the pass (a stream about to be ended would
            // look still open).
            while self.recovering(id) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            let Some(intent) = inner.store.load_intent(id).await? else {
                return Ok(None);
            };
            if !is_due(&intent, inner.clock.now_ms()) {
                return Ok(Some(intent));
            }
            let mut report = RecoveryReport::default();
            inner.recover_one(intent, &mut report).await?;
            if report.contended == 0 || tokio::time::Instant::now() >= deadline {
                break;
            }
            // Held elsewhere. A pass of this engine may have taken it between the wait and
            // the try: wait for that one again. After a restart it is often the killed
            // process, whose claims this engine's first pass has not released yet: release
            // them (once) and try again rather than have the turn wait for the next pass. A
            // live worker's claim is left to it.
            if !released_dead_claims {
                self.release_dead_claims().await?;
                released_dead_claims = true;
            } else if !self.recovering(id) {
                break;
            }
        }
        Ok(inner.store.load_intent(id).await?)
    }

    /// Whether a recovery pass of this engine is working on `id`.
    fn recovering(&self, id: &IntentId) -> bool {
        self.inner
            .recovering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(id)
    }

    /// Starts reading the page of due intents after `after`.
    fn read_due_page(
        &self,
        after: Option<IntentCursor>,
    ) -> tokio::task::JoinHandle<Result<Vec<DurableSendIntent>, MessagesError>> {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let now = inner.clock.now_ms();
            Ok(inner
                .store
                .due_intents(now, after.as_ref(), RECOVERY_PAGE)
                .await?)
        })
    }
}

fn task_failed(error: tokio::task::JoinError) -> MessagesError {
    MessagesError::Store(StoreError::Backend(Box::new(error)))
}

fn count(report: &mut RecoveryReport, outcome: &SendOutcome) {
    match outcome {
        SendOutcome::Sent { .. }
        | SendOutcome::Partial { .. }
        | SendOutcome::AlreadySent { .. } => {
            report.committed += 1;
        }
        SendOutcome::RetryScheduled { failure, .. } => {
            report.rescheduled += 1;
            if failure.kind == clawgate_types::DeliveryFailureKind::RateLimit {
                report.rate_limited += 1;
            }
        }
        SendOutcome::Unknown { .. } => report.unknown += 1,
        SendOutcome::Failed { failure, .. } => {
            report.failed += 1;
            if failure.reason == Some(clawgate_types::FailureReason::Expired) {
                report.expired += 1;
            }
        }
        SendOutcome::InProgress { .. } => {}
    }
}

/// Whether recovery has work on an intent at `now` (what `IntentStore::due_intents` lists).
fn is_due(intent: &DurableSendIntent, now: i64) -> bool {
    let scheduled = match intent.next_attempt_at {
        Some(at) => at <= now,
        // An unknown outcome without a scheduled reconciliation is parked for an operator.
        None => intent.status != IntentStatus::UnknownAfterSend,
    };
    intent.status.is_recoverable() && scheduled
}

/// Marks an intent as being recovered by this engine until dropped.
struct InFlight<'a> {
    set: &'a Mutex<HashSet<IntentId>>,
    id: IntentId,
}

impl<'a> InFlight<'a> {
    fn enter(set: &'a Mutex<HashSet<IntentId>>, id: &IntentId) -> Option<InFlight<'a>> {
        let mut ids = set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        ids.insert(id.clone()).then(|| InFlight {
            set,
            id: id.clone(),
        })
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.id);
    }
}

impl Inner {
    async fn recover_one(
        &self,
        mut intent: DurableSendIntent,
        report: &mut RecoveryReport,
    ) -> Result<(), MessagesError> {
        let Ok(adapter) = self.adapter(&intent.channel) else {
            // Left alone (unclaimed): a gateway with the channel takes it.
            warn!(channel = %intent.channel, "no adapter for this channel; intent left for later");
            return Ok(());
        };
        // Two passes of this engine share its claim token: the in-flight set keeps them apart.
        let Some(_working) = InFlight::enter(&self.recovering, &intent.id) else {
            report.contended += 1;
            return Ok(());
        };
        // The common case, a pending intent with nothing live and a final recorded: its
        // attempt's first write (`sending`, guarded on the status, the claim and the attempt) is
        // also the claim.
        if intent.status == IntentStatus::Pending
            && intent.live_state.is_none()
            && intent.batch.is_some()
        {
            let started = match self.start_attempt(&mut intent, true).await {
                Err(MessagesError::Store(
                    StoreError::IntentStatusConflict { .. }
                    | StoreError::ClaimHeld { .. }
                    | StoreError::StaleIntent { .. },
                )) => {
                    report.contended += 1;
                    return Ok(());
                }
                other => other?,
            };
            report.examined += 1;
            let outcome = match started {
                Some(expired) => expired,
                None => self.send_units(&adapter, &mut intent, true).await?,
            };
            count(report, &outcome);
            return Ok(());
        }
        // Anything else starts with platform I/O or a write from the freshest copy: claim first.
        let now = self.clock.now_ms();
        let Some(fresh) = self
            .store
            .claim_intent(&intent.id, &self.claim(now))
            .await?
        else {
            report.contended += 1;
            return Ok(());
        };
        if !is_due(&fresh, now) {
            // Another worker finished or rescheduled it since it was read.
            self.store
                .release_intent_claim(&fresh.id, &self.worker)
                .await?;
            report.contended += 1;
            return Ok(());
        }
        intent = fresh;
        report.examined += 1;
        // A reply whose stream never produced its final is not sendable: its preview goes (the
        // recorded one, or the one the platform holds under the preview's key: a crash may have
        // come between the platform's answer and the record) and the intent is cancelled; the
        // unfinished inbound record replays the turn, which starts a fresh reply.
        if intent.awaits_final() {
            if self.end_unfinished_stream(&adapter, &mut intent).await? {
                report.abandoned += 1;
            } else {
                // The platform would not remove the preview now: ask again next pass.
                self.store
                    .release_intent_claim(&intent.id, &self.worker)
                    .await?;
                report.rescheduled += 1;
            }
            return Ok(());
        }
        // A final that was becoming its preview by an edit (a crash mid-finalize): the edit is
        // made again, as repeating an edit cannot duplicate anything — on a platform without
        // idempotency keys this is the one final whose unknown outcome can be settled.
        if let Some(outcome) = self.resume_in_place(&adapter, &mut intent).await? {
            count(report, &outcome);
            return Ok(());
        }
        // A recorded final with a preview still showing (a crash mid-finalize): the preview
        // goes, then the final is delivered normally. Delivered blocks and streamed media are
        // content, not a preview: only a preview is removed, and a recorded final already holds
        // the streamed media's receipt parts (it never sends them again).
        if intent.status != IntentStatus::Committing
            && let Some(state) = intent.live_state.clone()
        {
            let preview = state
                .receipt
                .as_ref()
                .filter(|_| state.mode != clawgate_types::LiveMode::Block)
                .and_then(|r| r.parts.first());
            if let Some(part) = preview {
                let ctx = self.context(&intent);
                if crate::live::remove_preview(
                    &adapter,
                    &ctx,
                    part,
                    clawgate_types::LiveCancelReason::Aborted,
                )
                .await
                .is_err()
                {
                    // Never a fresh final beside a preview still showing: try again later.
                    self.store
                        .release_intent_claim(&intent.id, &self.worker)
                        .await?;
                    report.rescheduled += 1;
                    return Ok(());
                }
                intent.live_state = None;
                let same = intent.status;
                if same == IntentStatus::Pending || same == IntentStatus::UnknownAfterSend {
                    self.save(&mut intent, same, true).await?;
                }
            }
        }
        let now = self.clock.now_ms();
        let expired = intent.expires_at.is_some_and(|at| at <= now);
        let outcome = match intent.status {
            // The platform returned and the receipt is stored: only the commit is missing.
            IntentStatus::Committing => self.commit(&adapter, &mut intent, true).await?,
            _ if expired => self.expire(&mut intent, true).await?,
            IntentStatus::Pending => self.deliver(&adapter, &mut intent, true).await?,
            // A crash mid-send: the units without receipts may or may not have landed. Asked
            // about from `sending`, under this pass's claim, and written once with the answer:
            // writing `unknown_after_send` first would release the claim with no reconciliation
            // scheduled, so until the answer's write the intent would look parked (a turn
            // waiting on it would end its message) and a crash there would park it for good.
            IntentStatus::Sending => self.reconcile(&adapter, &mut intent, report).await?,
            IntentStatus::UnknownAfterSend => self.reconcile(&adapter, &mut intent, report).await?,
            IntentStatus::Sent | IntentStatus::Failed | IntentStatus::Cancelled => return Ok(()),
        };
        count(report, &outcome);
        Ok(())
    }

    /// Finishes an in-place finalization a crash interrupted or a lost answer left unknown: the
    /// intent was `sending` its one unit as an edit of the recorded preview, or that edit is
    /// `unknown_after_send` (or it is `pending` with a preview that is not stale yet). `None`:
    /// not such an intent, or the platform refused the edit (the preview is then removed and
    /// the final delivered normally by the caller).
    async fn resume_in_place(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
    ) -> Result<Option<SendOutcome>, MessagesError> {
        let now = self.clock.now_ms();
        let Some(state) = intent.live_state.clone() else {
            return Ok(None);
        };
        let preview = state
            .receipt
            .as_ref()
            .filter(|_| {
                state.mode != clawgate_types::LiveMode::Block && state.can_finalize_in_place
            })
            .and_then(|r| r.parts.first())
            .cloned();
        let unit = intent
            .batch
            .as_ref()
            .filter(|b| b.units.len() == 1)
            .map(|b| b.units[0].clone());
        let (Some(preview), Some(unit)) = (preview, unit) else {
            return Ok(None);
        };
        // Only a final the live path itself would have put in the preview's place: text, no
        // media, answering what the preview answers (the platform's record of the preview).
        let final_reply_to = match &intent.message.relation {
            Some(clawgate_types::MessageRelation::Reply { reply_to_id, .. }) => reply_to_id.clone(),
            _ => None,
        };
        if unit.kind != clawgate_types::MessagePartKind::Text
            || !intent.message.attachments.is_empty()
            || preview.reply_to_id != final_reply_to
        {
            return Ok(None);
        }
        let delivered = intent
            .partial_receipt
            .as_ref()
            .is_some_and(|r| r.parts.iter().any(|p| p.index == 0));
        let resumable = match intent.status {
            // An edit into the preview was under way (a crash) or its answer was lost: the
            // preview may show the final already, stale or not, so the edit is made again.
            IntentStatus::Sending | IntentStatus::UnknownAfterSend => true,
            IntentStatus::Pending => !state.is_stale(now),
            _ => false,
        };
        let expired = intent.expires_at.is_some_and(|at| at <= now);
        if delivered || !resumable || expired || !crate::live::in_place_possible(adapter, &preview)
        {
            return Ok(None);
        }
        if intent.status == IntentStatus::Pending {
            intent.attempt += 1;
            self.save(intent, IntentStatus::Sending, true).await?;
        }
        if intent.status == IntentStatus::UnknownAfterSend {
            // Editing again is how an unknown edit is settled: it counts as a reconciliation.
            intent.reconciliations = intent.reconciliations.saturating_add(1);
        }
        let ctx = self.context(intent);
        match crate::live::finalize_in_place(adapter, &ctx, &preview, &unit).await {
            Ok(mut edited) => {
                edited.index = 0;
                let edited = MessageReceipt::from_parts(vec![edited], now);
                match &mut intent.partial_receipt {
                    Some(receipt) => receipt.merge(edited),
                    None => intent.partial_receipt = Some(edited),
                }
                info!(intent = %intent.id, "the final interrupted while replacing its preview was edited in again");
                Ok(Some(self.commit(adapter, intent, true).await?))
            }
            Err(error) if error.side_effect == clawgate_channel_sdk::SideEffect::Possible => {
                // Still an edit whose outcome is unknown: made again later, never turned into a
                // second message (not even once the preview is stale, as `pending` would be).
                // Past the reconciliation window it is parked for an operator; at the
                // reconciliation budget it fails.
                if intent.reconciliations >= self.policy.max_reconciliations {
                    return Ok(Some(self.reconciliations_spent(intent).await?));
                }
                let again = (!self.window_passed(intent)).then(|| {
                    self.policy
                        .next_reconciliation_at(now, intent.reconciliations)
                });
                Ok(Some(self.unknown_until(intent, &error, again, true).await?))
            }
            Err(error) => {
                warn!(intent = %intent.id, error = %error.message, "the preview cannot become the final; sending it fresh");
                self.save(intent, IntentStatus::Pending, true).await?;
                Ok(None)
            }
        }
    }

    /// Whether the platform has kept answering "cannot tell" for the reconciliation window,
    /// counted from when the outcome first became unknown (the failure keeps that time).
    fn window_passed(&self, intent: &DurableSendIntent) -> bool {
        intent.status == IntentStatus::UnknownAfterSend
            && intent.failure.as_ref().is_some_and(|failure| {
                self.clock.now_ms().saturating_sub(failure.at) >= self.policy.reconcile_window_ms
            })
    }

    /// The last reconciliation the budget allows left the outcome unknown: the intent fails
    /// (never resent: it may have landed), so whoever waits on it learns it ended.
    async fn reconciliations_spent(
        &self,
        intent: &mut DurableSendIntent,
    ) -> Result<SendOutcome, MessagesError> {
        let asked = intent.reconciliations;
        warn!(
            intent = %intent.id,
            asked,
            "the send's outcome is still unknown after its last reconciliation: failed, not resent"
        );
        let error = clawgate_channel_sdk::SendError::after_io(
            clawgate_types::DeliveryFailureKind::Unknown,
            format!(
                "the send's outcome is still unknown after {asked} reconciliations (the platform \
                 could not be reached or could not tell); it may have landed: check the \
                 conversation before `clawgate outbox retry`"
            ),
        );
        self.fail(
            intent,
            &error,
            clawgate_types::FailureReason::MaxAttemptsExceeded,
            true,
        )
        .await
    }

    /// Asks the platform about every unit without a receipt, then commits what landed and resends
    /// only what the platform proved missing.
    async fn reconcile(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
        report: &mut RecoveryReport,
    ) -> Result<SendOutcome, MessagesError> {
        let delivery = adapter.capabilities().delivery.clone().unwrap_or_default();
        let reason = clawgate_channel_sdk::SendError::after_io(
            clawgate_types::DeliveryFailureKind::Unknown,
            "send outcome unknown after a crash or a lost answer",
        );
        if !delivery.reconcile_unknown_send {
            if delivery.duplicates_acceptable {
                // Declared at-least-once: replay the units without receipts.
                self.save(intent, IntentStatus::Pending, true).await?;
                return self.deliver(adapter, intent, true).await;
            }
            // Never replay blindly: park it where operators see it.
            return self.unknown_until(intent, &reason, None, true).await;
        }
        // Counted before the platform is asked (saved with whatever the answers lead to). A
        // crashed `sending` intent starts a new unknown episode: an earlier one's count (it was
        // settled, or the intent would not have been sent again) does not carry over.
        let fresh = intent.status == IntentStatus::Sending;
        if fresh {
            intent.reconciliations = 0;
        }
        intent.reconciliations = intent.reconciliations.saturating_add(1);
        let ctx = self.context(intent);
        let mut not_sent = 0;
        let mut unresolved = false;
        let mut unreachable = false;
        let mut undecidable = false;
        let missing: Vec<_> = intent.missing_units().cloned().collect();
        for unit in &missing {
            match adapter.reconcile_unknown_send(&ctx, unit).await {
                Ok(Reconciliation::Sent(part)) => {
                    report.reconciled_sent += 1;
                    let single = clawgate_types::MessageReceipt::from_parts(
                        vec![*part],
                        self.clock.now_ms(),
                    );
                    match &mut intent.partial_receipt {
                        Some(existing) => existing.merge(single),
                        None => intent.partial_receipt = Some(single),
                    }
                }
                Ok(Reconciliation::NotSent) => not_sent += 1,
                Ok(Reconciliation::Undecidable) => {
                    unresolved = true;
                    undecidable = true;
                }
                // `Unresolved`, and any answer this engine does not know: never a resend.
                Ok(_) => unresolved = true,
                Err(error) => {
                    warn!(unit = unit.index, error = %error.message, "reconciliation failed; will ask again");
                    unresolved = true;
                    unreachable = true;
                }
            }
        }
        if unresolved {
            // A platform that could not be reached has not answered: never parked for that.
            let waited_out = !unreachable && (undecidable || self.window_passed(intent));
            if !waited_out {
                if intent.reconciliations >= self.policy.max_reconciliations {
                    return self.reconciliations_spent(intent).await;
                }
                let asked = if fresh { intent.reconciliations } else { 0 };
                return self
                    .unknown_asked(adapter, intent, &reason, true, asked)
                    .await;
            }
            if delivery.duplicates_acceptable {
                // Declared at-least-once: after the window, replay rather than park.
                self.save(intent, IntentStatus::Pending, true).await?;
                return self.deliver(adapter, intent, true).await;
            }
            warn!(
                intent = %intent.id,
                window_ms = self.policy.reconcile_window_ms,
                undecidable,
                "the platform cannot tell (or could not within the reconciliation window) \
                 whether the send landed: parked for an operator (clawgate outbox), so the \
                 conversation goes on"
            );
            return self.unknown_until(intent, &reason, None, true).await;
        }
        if not_sent == 0 {
            return self.commit(adapter, intent, true).await;
        }
        report.reconciled_not_sent += not_sent;
        // Only the units the platform proved missing go out again.
        self.save(intent, IntentStatus::Pending, true).await?;
        self.deliver(adapter, intent, true).await
    }
}
