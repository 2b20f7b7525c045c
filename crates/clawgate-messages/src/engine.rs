//! Send contexts: intent before I/O, unit-by-unit delivery, receipt commit, failure policy.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use clawgate_channel_sdk::{
    ChannelMessageAdapter, DefaultRenderer, MessageRenderAdapter, Reconciliation, SendContext,
    SendError, SideEffect,
};
use clawgate_store::{Claim, ClaimToken, InsertIntentOutcome, IntentStore};
use clawgate_types::{
    BatchAtomicity, ChannelMessage, DeliveryFailure, DurableSendIntent, FailureReason, IntentId,
    IntentStatus, MessageDurabilityPolicy, MessageReceipt, MessageReceiptPart,
    RenderedMessageBatch, UnixMillis,
};
use tracing::{Instrument as _, info, info_span, warn};

use crate::policy::{Disposition, RetryPolicy, disposition};
use crate::{Clock, MessagesError, SendOutcome, SendReport};

/// Per-send choices.
#[derive(Debug, Clone)]
pub struct SendOptions {
    pub durability: MessageDurabilityPolicy,
    /// Stable key for this logical message; a second send with the same key is a duplicate.
    /// Defaults to `<channel>:<message id>`.
    pub idempotency_key: Option<String>,
    /// Overrides the policy's time-to-live for this message.
    pub time_to_live_ms: Option<i64>,
}

impl Default for SendOptions {
    /// The message lifecycle is durable by default: fail closed when the intent cannot be written.
    fn default() -> Self {
        SendOptions {
            durability: MessageDurabilityPolicy::Required,
            idempotency_key: None,
            time_to_live_ms: None,
        }
    }
}

/// When a new intent's first attempt starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Recorded `pending`; the attempt is a later write (the caller may look or cancel first).
    Later,
    /// At once: in the intent's own write when the adapter resolves an unknown outcome by
    /// itself, else in the write right after it.
    Now,
    /// A live reply whose final is produced later: recorded `pending` with no batch and an
    /// empty live state in one write, so from its first durable instant the intent says it
    /// has nothing to send yet (recovery never delivers it; see `live.rs`).
    Live,
}

/// Whether recovery resolves a `sending` intent of this adapter without an operator: by asking
/// the platform, or by replaying where duplicates are declared acceptable.
fn recovers_unknown_outcomes(adapter: &Arc<dyn ChannelMessageAdapter>) -> bool {
    adapter
        .capabilities()
        .delivery
        .as_ref()
        .is_some_and(|d| d.reconcile_unknown_send || d.duplicates_acceptable)
}

/// The lifecycle boundaries a [`LifecycleProbe`] observes: the places a crash is most
/// interesting (crash tests stop the process exactly there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// The intent is committed; no platform I/O yet. (For [`Messenger::send`] of a `pending`
    /// intent it is durable once the `sending` write after it is.)
    IntentRecorded,
    /// One unit landed and (when more remain) its receipt part is recorded.
    UnitDelivered { index: u32 },
    /// Every unit landed; nothing about it is committed yet (the receipt commit is next).
    PlatformAccepted,
}

/// Observes lifecycle boundaries (tests and diagnostics; production engines have none).
pub trait LifecycleProbe: Send + Sync {
    fn reached(&self, boundary: Boundary, intent: &IntentId);
}

pub(crate) struct Inner {
    pub(crate) probe: Option<Arc<dyn LifecycleProbe>>,
    pub(crate) store: Arc<dyn IntentStore>,
    pub(crate) adapters: HashMap<String, Arc<dyn ChannelMessageAdapter>>,
    pub(crate) policy: RetryPolicy,
    pub(crate) clock: Arc<dyn Clock>,
    /// This engine's claim token: the per-intent idempotency lock is held under it.
    pub(crate) worker: ClaimToken,
    /// Intents a recovery pass under this claim token is working on.
    pub(crate) recovering: Arc<std::sync::Mutex<std::collections::HashSet<IntentId>>>,
}

/// The send engine. Cheap to clone.
#[derive(Clone)]
pub struct Messenger {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Messenger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messenger")
            .field("channels", &self.inner.adapters.keys().collect::<Vec<_>>())
            .field("worker", &self.inner.worker)
            .finish()
    }
}

impl Messenger {
    /// An engine over `store` with the given adapters. `worker` names this process in claims
    /// (e.g. the gateway instance id); a unique suffix is added.
    pub fn new(
        store: Arc<dyn IntentStore>,
        adapters: Vec<Arc<dyn ChannelMessageAdapter>>,
        policy: RetryPolicy,
        clock: Arc<dyn Clock>,
        worker: &str,
    ) -> Messenger {
        let adapters = adapters
            .into_iter()
            .map(|a| (a.channel().to_owned(), a))
            .collect();
        // `<worker>/<pid>/<start>/<unique>`: a restarted gateway can see this holder died.
        let worker = ClaimToken(format!(
            "{worker}/{}/{}",
            crate::liveness::own_identity(),
            clawgate_store::ids::new_id()
        ));
        Messenger {
            inner: Arc::new(Inner {
                probe: None,
                store,
                adapters,
                policy,
                clock,
                worker,
                recovering: Arc::default(),
            }),
        }
    }

    /// Installs a probe that observes every lifecycle boundary (call before sharing the engine).
    pub fn with_probe(self, probe: Arc<dyn LifecycleProbe>) -> Messenger {
        let shared = &self.inner;
        Messenger {
            inner: Arc::new(Inner {
                probe: Some(probe),
                store: shared.store.clone(),
                adapters: shared.adapters.clone(),
                policy: shared.policy.clone(),
                clock: shared.clock.clone(),
                worker: shared.worker.clone(),
                // Same claim token, same passes: they must keep apart from each other too.
                recovering: shared.recovering.clone(),
            }),
        }
    }

    /// Sends a message: begin the context, deliver, commit. The report says what happened.
    pub async fn send(
        &self,
        message: ChannelMessage,
        options: SendOptions,
    ) -> Result<SendReport, MessagesError> {
        self.open(message, options, Start::Now).await?.send().await
    }

    /// Opens a send context and hands it to `body`, which decides how to finish it (send it,
    /// inspect the rendered batch first, or cancel it).
    pub async fn with_send_context<F, Fut>(
        &self,
        message: ChannelMessage,
        options: SendOptions,
        body: F,
    ) -> Result<SendReport, MessagesError>
    where
        F: FnOnce(OutboundContext) -> Fut,
        Fut: Future<Output = Result<SendReport, MessagesError>>,
    {
        let ctx = self.begin(message, options).await?;
        body(ctx).await
    }

    /// Renders the message and records the durable intent (per the durability policy, status
    /// `pending`) before any platform I/O.
    pub async fn begin(
        &self,
        message: ChannelMessage,
        options: SendOptions,
    ) -> Result<OutboundContext, MessagesError> {
        self.open(message, options, Start::Later).await
    }

    async fn open(
        &self,
        message: ChannelMessage,
        options: SendOptions,
        start: Start,
    ) -> Result<OutboundContext, MessagesError> {
        let inner = &self.inner;
        let adapter = inner.adapter(&message.channel)?;
        let now = inner.clock.now_ms();
        let key = options
            .idempotency_key
            .clone()
            .unwrap_or_else(|| format!("{}:{}", message.channel, message.id));
        let batch = match start {
            Start::Live => None,
            Start::Later | Start::Now => Some(inner.render(&adapter, &message, &key)?),
        };
        let id = IntentId::parse(clawgate_store::ids::new_id()).map_err(|e| {
            MessagesError::Store(clawgate_store::StoreError::InvalidInput(e.to_string()))
        })?;
        let mut intent = DurableSendIntent::new(id, key, message, now);
        intent.batch = batch;
        if start == Start::Live {
            intent.live_state = Some(clawgate_types::LiveMessageState::empty(
                clawgate_types::LiveMode::Partial,
            ));
        }
        intent.expires_at = Some(
            now.saturating_add(
                options
                    .time_to_live_ms
                    .unwrap_or(inner.policy.time_to_live_ms),
            ),
        );
        if start == Start::Now
            && recovers_unknown_outcomes(&adapter)
            && intent.expires_at.is_some_and(|at| at > now)
        {
            // The first attempt starts in the intent's own write: `sending` is durable before
            // any platform I/O, as `pending` would be, and a crash before that I/O leaves an
            // unknown outcome the adapter resolves (not sent → sent once) rather than a parked
            // one. Without that capability `pending` and `sending` stay two writes, since only
            // `pending` may be sent again blindly.
            intent.status = IntentStatus::Sending;
            intent.attempt = 1;
        }

        let mut durable = false;
        let mut existing = None;
        if options.durability != MessageDurabilityPolicy::Disabled {
            let claim = inner.claim(now);
            // A `pending` intent started at once is followed by the durable `sending` write
            // before any platform I/O (or by `failed`, when already expired), and that write
            // makes the insert durable too: the insert need only be ordered before it, which
            // spares the send one wait for the disk.
            let inserted = if start == Start::Now && intent.status == IntentStatus::Pending {
                inner
                    .store
                    .insert_intent_ordered(&intent, Some(&claim))
                    .await
            } else {
                inner.store.insert_intent(&intent, Some(&claim)).await
            };
            match inserted {
                Ok(InsertIntentOutcome::Inserted) => {
                    durable = true;
                    inner.reached(Boundary::IntentRecorded, &intent.id);
                }
                Ok(InsertIntentOutcome::Duplicate(found)) => existing = Some(*found),
                Err(e) if options.durability == MessageDurabilityPolicy::Required => {
                    warn!(intent = %intent.id, error = %e, "durable intent not written; send refused");
                    return Err(MessagesError::DurabilityUnavailable(e));
                }
                Err(e) => {
                    warn!(intent = %intent.id, error = %e, "durable intent not written; sending without durability (best_effort)");
                }
            }
        }
        Ok(OutboundContext {
            messenger: self.clone(),
            adapter,
            intent,
            durable,
            existing,
        })
    }

    /// Records a live reply's intent (no final yet) before any preview is shown.
    pub(crate) async fn begin_stream(
        &self,
        message: ChannelMessage,
        options: SendOptions,
    ) -> Result<OutboundContext, MessagesError> {
        self.open(message, options, Start::Live).await
    }

    /// The engine's claim token (for operators and tests).
    pub fn worker(&self) -> &ClaimToken {
        &self.inner.worker
    }
}

/// One outbound message between `begin` and its outcome.
pub struct OutboundContext {
    messenger: Messenger,
    adapter: Arc<dyn ChannelMessageAdapter>,
    intent: DurableSendIntent,
    durable: bool,
    /// Set when the idempotency key belonged to an earlier intent.
    existing: Option<DurableSendIntent>,
}

impl std::fmt::Debug for OutboundContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundContext")
            .field("intent", &self.intent.id)
            .field("durable", &self.durable)
            .finish()
    }
}

impl OutboundContext {
    /// The intent as recorded (status `pending`: a context from [`Messenger::begin`] has not
    /// started its attempt).
    pub fn intent(&self) -> &DurableSendIntent {
        &self.intent
    }

    /// The whole projected batch this send will deliver.
    pub fn rendered(&self) -> Option<&RenderedMessageBatch> {
        self.intent.batch.as_ref()
    }

    /// Whether the intent was recorded durably.
    pub fn is_durable(&self) -> bool {
        self.durable
    }

    /// Delivers the batch and commits the receipt.
    pub async fn send(mut self) -> Result<SendReport, MessagesError> {
        let inner = self.messenger.inner.clone();
        if let Some(existing) = self.existing.take() {
            let outcome = match (&existing.status, &existing.receipt) {
                (IntentStatus::Sent, Some(receipt)) => SendOutcome::AlreadySent {
                    receipt: receipt.clone(),
                },
                (status, _) => SendOutcome::InProgress { status: *status },
            };
            return Ok(SendReport {
                intent_id: Some(existing.id),
                durable: true,
                outcome,
            });
        }
        let span = info_span!("send", intent = %self.intent.id, channel = %self.intent.channel);
        let outcome = if self.intent.status == IntentStatus::Sending {
            // Recorded with its first attempt started (see `Messenger::send`).
            inner
                .send_units(&self.adapter, &mut self.intent, self.durable)
                .instrument(span)
                .await?
        } else {
            inner
                .deliver(&self.adapter, &mut self.intent, self.durable)
                .instrument(span)
                .await?
        };
        Ok(SendReport {
            intent_id: self.durable.then(|| self.intent.id.clone()),
            durable: self.durable,
            outcome,
        })
    }

    /// The adapter, the intent and whether it is durable (for the live preview path).
    pub(crate) fn into_parts(self) -> (Arc<dyn ChannelMessageAdapter>, DurableSendIntent, bool) {
        (self.adapter, self.intent, self.durable)
    }

    /// Abandons a recorded send before any I/O (status `cancelled`).
    pub async fn cancel(mut self) -> Result<(), MessagesError> {
        if self.durable {
            self.messenger
                .inner
                .save(&mut self.intent, IntentStatus::Cancelled, true)
                .await?;
        }
        Ok(())
    }
}

fn failure(error: &SendError, reason: Option<FailureReason>, at: i64) -> DeliveryFailure {
    DeliveryFailure {
        kind: error.kind,
        message: error.message.clone(),
        reason,
        retry_after_ms: error.retry_after_ms,
        platform_code: error.platform_code.clone(),
        at,
    }
}

impl Inner {
    fn reached(&self, boundary: Boundary, intent: &IntentId) {
        if let Some(probe) = &self.probe {
            probe.reached(boundary, intent);
        }
    }

    pub(crate) fn adapter(
        &self,
        channel: &str,
    ) -> Result<Arc<dyn ChannelMessageAdapter>, MessagesError> {
        self.adapters
            .get(channel)
            .cloned()
            .ok_or_else(|| MessagesError::NoAdapter(channel.to_owned()))
    }

    pub(crate) fn claim(&self, now: i64) -> Claim {
        Claim {
            token: self.worker.clone(),
            now,
            ttl_ms: self.policy.claim_ttl_ms,
        }
    }

    pub(crate) fn render(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        message: &ChannelMessage,
        key: &str,
    ) -> Result<RenderedMessageBatch, MessagesError> {
        let renderer: &dyn MessageRenderAdapter = adapter.render().unwrap_or(&DefaultRenderer);
        renderer
            .render(message, adapter.capabilities(), key)
            .map_err(|source| MessagesError::Render {
                channel: message.channel.clone(),
                source,
            })
    }

    /// The adapter's view of an intent: everything comes from the stored intent alone.
    /// The adapter's view of the send, rebuilt from the stored intent. The origin marker is
    /// encoded here, by the channel's origin adapter, so every unit of every attempt carries it.
    pub(crate) fn context(&self, intent: &DurableSendIntent) -> SendContext {
        let mut ctx = SendContext::new(intent.message.clone(), intent.idempotency_key.clone());
        ctx.intent_id = Some(intent.id.clone());
        intent.channel.clone_into(&mut ctx.channel);
        ctx.account_id.clone_from(&intent.account_id);
        ctx.attempt = intent.attempt;
        ctx.previous_receipt.clone_from(&intent.partial_receipt);
        ctx.origin_metadata = intent
            .message
            .origin
            .as_ref()
            .and_then(|origin| self.adapters.get(&intent.channel)?.origin()?.encode(origin));
        ctx
    }

    /// Moves the intent to `to` (compare-and-set on its current status when durable).
    pub(crate) async fn save(
        &self,
        intent: &mut DurableSendIntent,
        to: IntentStatus,
        durable: bool,
    ) -> Result<(), MessagesError> {
        let from = intent.status;
        intent.status = to;
        intent.updated_at = self.clock.now_ms();
        if durable {
            self.store
                .save_intent(intent, from, Some(&self.claim(intent.updated_at)))
                .await?;
        }
        Ok(())
    }

    /// Records a landed unit: in memory always, durably when more units remain (the last one's
    /// part travels with the commit).
    async fn add_part(
        &self,
        intent: &mut DurableSendIntent,
        part: MessageReceiptPart,
        durable: bool,
        more: bool,
    ) -> Result<(), MessagesError> {
        let now = self.clock.now_ms();
        let single = MessageReceipt::from_parts(vec![part], now);
        if durable && more {
            self.store
                .record_partial_receipt(&intent.id, &single, now)
                .await?;
        }
        match &mut intent.partial_receipt {
            Some(existing) => existing.merge(single),
            None => intent.partial_receipt = Some(single),
        }
        Ok(())
    }

    /// Delivers the missing units of a pending intent and commits, or applies the failure policy.
    pub(crate) async fn deliver(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        match self.start_attempt(intent, durable).await? {
            Some(expired) => Ok(expired),
            None => self.send_units(adapter, intent, durable).await,
        }
    }

    /// The first write of an attempt on a pending intent: `sending` (or `failed` when it outlived
    /// its time-to-live, returned as the outcome). Guarded like every save, it is also this
    /// worker's claim: when another worker moved the intent first, it fails and nothing is sent.
    pub(crate) async fn start_attempt(
        &self,
        intent: &mut DurableSendIntent,
        durable: bool,
    ) -> Result<Option<SendOutcome>, MessagesError> {
        let now = self.clock.now_ms();
        if intent.expires_at.is_some_and(|at| at <= now) {
            return self.expire(intent, durable).await.map(Some);
        }
        intent.attempt += 1;
        intent.next_attempt_at = None;
        self.save(intent, IntentStatus::Sending, durable).await?;
        Ok(None)
    }

    /// Sends the units of a `sending` intent that have no receipt yet, then commits or applies
    /// the failure policy.
    pub(crate) async fn send_units(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        let mut fallback_used = false;
        loop {
            let ctx = self.context(intent);
            let missing: Vec<_> = intent.missing_units().cloned().collect();
            let mut failed = None;
            for (n, unit) in missing.iter().enumerate() {
                match adapter.send_unit(&ctx, unit).await {
                    Ok(part) => {
                        self.add_part(intent, part, durable, n + 1 < missing.len())
                            .await?;
                        self.reached(Boundary::UnitDelivered { index: unit.index }, &intent.id);
                    }
                    Err(error) => {
                        failed = Some((n, unit.clone(), error));
                        break;
                    }
                }
            }
            let Some((position, unit, error)) = failed else {
                self.reached(Boundary::PlatformAccepted, &intent.id);
                return self.commit(adapter, intent, durable).await;
            };
            warn!(unit = unit.index, kind = ?error.kind, side_effect = ?error.side_effect, error = %error.message, "unit send failed");
            let rule = disposition(error.kind);
            if rule == Disposition::Reconcile && adapter.capabilities().reconciles_unknown_sends() {
                // A conflict means the platform may already hold this unit: ask it.
                if let Ok(Reconciliation::Sent(part)) =
                    adapter.reconcile_unknown_send(&ctx, &unit).await
                {
                    let more = position + 1 < missing.len();
                    self.add_part(intent, *part, durable, more).await?;
                    continue;
                }
            }
            if error.side_effect == SideEffect::Possible || rule == Disposition::Reconcile {
                return self.unknown(adapter, intent, &error, durable).await;
            }
            let delivered_some = intent.partial_receipt.is_some();
            let best_effort = intent
                .batch
                .as_ref()
                .is_some_and(|b| b.atomicity == BatchAtomicity::BestEffortParts);
            if best_effort && delivered_some {
                return self.commit_partial(adapter, intent, &error, durable).await;
            }
            match rule {
                Disposition::Retry => return self.retry_or_fail(intent, &error, durable).await,
                Disposition::RenderFallback if !fallback_used && !delivered_some => {
                    let renderer: &dyn MessageRenderAdapter =
                        adapter.render().unwrap_or(&DefaultRenderer);
                    let Some(fallback) = renderer.render_fallback(
                        &intent.message,
                        adapter.capabilities(),
                        &intent.idempotency_key,
                    ) else {
                        return self
                            .fail(intent, &error, FailureReason::Permanent, durable)
                            .await;
                    };
                    fallback_used = true;
                    info!("payload rejected; retrying once with the fallback rendering");
                    // Record the new batch before sending it: back to pending, then sending.
                    intent.batch = Some(fallback);
                    self.save(intent, IntentStatus::Pending, durable).await?;
                    self.save(intent, IntentStatus::Sending, durable).await?;
                }
                Disposition::AwaitConfiguration => {
                    return self
                        .fail(
                            intent,
                            &error,
                            FailureReason::AwaitingConfiguration,
                            durable,
                        )
                        .await;
                }
                Disposition::Fail(reason) => {
                    return self.fail(intent, &error, reason, durable).await;
                }
                Disposition::RenderFallback | Disposition::Reconcile => {
                    return self
                        .fail(intent, &error, FailureReason::Permanent, durable)
                        .await;
                }
            }
        }
    }

    /// Records the raw receipt and commits it, then runs the post-send hooks.
    ///
    /// Marking `committing` and committing the receipt are one transaction: the dangerous window
    /// is between the platform's answer and the first durable write after it, and a separate
    /// `committing` write would not narrow it — a crash there leaves `sending` either way, which
    /// recovery reconciles before any replay — while it would cost every send one more fsync.
    pub(crate) async fn commit(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        let now = self.clock.now_ms();
        let receipt = match intent
            .partial_receipt
            .take()
            .or_else(|| intent.receipt.clone())
        {
            Some(receipt) => receipt,
            None => MessageReceipt::from_parts(Vec::new(), now),
        };
        // What `IntentStore::commit_receipt` writes, from the copy this worker holds under its
        // claim: encoded here, so the store's writer only stores it (a compare-and-set on the
        // status, like every save).
        intent.receipt = Some(receipt.clone());
        intent.failure = None;
        intent.next_attempt_at = None;
        self.save(intent, IntentStatus::Sent, durable).await?;
        info!(parts = receipt.parts.len(), "receipt committed");
        self.after_commit(adapter, intent, &receipt).await;
        Ok(SendOutcome::Sent { receipt })
    }

    async fn after_commit(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &DurableSendIntent,
        receipt: &MessageReceipt,
    ) {
        adapter.after_commit(&self.context(intent), receipt).await;
    }

    async fn commit_partial(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
        error: &SendError,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        let now = self.clock.now_ms();
        intent.failure = Some(failure(error, Some(FailureReason::Permanent), now));
        match self.commit(adapter, intent, durable).await? {
            SendOutcome::Sent { receipt } => Ok(SendOutcome::Partial {
                delivered: receipt,
                failure: failure(error, Some(FailureReason::Permanent), now),
            }),
            other => Ok(other),
        }
    }

    pub(crate) async fn retry_or_fail(
        &self,
        intent: &mut DurableSendIntent,
        error: &SendError,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        let now = self.clock.now_ms();
        let next = self
            .policy
            .next_attempt_at(now, intent.attempt, error.retry_after_ms);
        let expired = intent.expires_at.is_some_and(|at| next >= at);
        if intent.attempt >= self.policy.max_attempts || expired || !durable {
            let reason = if expired {
                FailureReason::Expired
            } else if durable {
                FailureReason::MaxAttemptsExceeded
            } else {
                // Nobody would come back to a non-durable send.
                FailureReason::Permanent
            };
            return self.fail(intent, error, reason, durable).await;
        }
        intent.next_attempt_at = Some(next);
        intent.failure = Some(failure(error, None, now));
        self.save(intent, IntentStatus::Pending, durable).await?;
        Ok(SendOutcome::RetryScheduled {
            next_attempt_at: next,
            failure: failure(error, None, now),
            delivered: intent.partial_receipt.clone(),
        })
    }

    /// The platform may have acted: record the unknown outcome and schedule a reconciliation
    /// (or park it for an operator when the adapter cannot reconcile).
    pub(crate) async fn unknown(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
        error: &SendError,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        self.unknown_asked(adapter, intent, error, durable, 0).await
    }

    /// [`Self::unknown`] where a fresh unknown outcome (the intent still `sending`) was already
    /// asked about `asked_fresh` times: recovery reconciles a crashed send before it writes it
    /// unknown, and that reconciliation counts in the new episode.
    pub(crate) async fn unknown_asked(
        &self,
        adapter: &Arc<dyn ChannelMessageAdapter>,
        intent: &mut DurableSendIntent,
        error: &SendError,
        durable: bool,
        asked_fresh: u32,
    ) -> Result<SendOutcome, MessagesError> {
        let delivery = adapter.capabilities().delivery.clone().unwrap_or_default();
        let asked = match intent.status {
            IntentStatus::UnknownAfterSend => intent.reconciliations,
            _ => asked_fresh,
        };
        let asked_again =
            (delivery.reconcile_unknown_send || delivery.duplicates_acceptable).then(|| {
                self.policy
                    .next_reconciliation_at(self.clock.now_ms(), asked)
            });
        self.unknown_since_asked(intent, error, asked_again, durable, asked_fresh)
            .await
    }

    /// Records an unknown outcome, asked about again at `next_attempt_at` (`None`: parked for
    /// an operator). The failure keeps the time the outcome first became unknown, which the
    /// reconciliation window counts from.
    pub(crate) async fn unknown_until(
        &self,
        intent: &mut DurableSendIntent,
        error: &SendError,
        next_attempt_at: Option<UnixMillis>,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        self.unknown_since_asked(intent, error, next_attempt_at, durable, 0)
            .await
    }

    async fn unknown_since_asked(
        &self,
        intent: &mut DurableSendIntent,
        error: &SendError,
        next_attempt_at: Option<UnixMillis>,
        durable: bool,
        asked_fresh: u32,
    ) -> Result<SendOutcome, MessagesError> {
        let now = self.clock.now_ms();
        let unknown_since = match (&intent.failure, intent.status) {
            (Some(previous), IntentStatus::UnknownAfterSend) => previous.at,
            _ => {
                // Unknown afresh: its reconciliations are counted from here (an earlier
                // episode's, settled since, never count against this one).
                intent.reconciliations = asked_fresh;
                now
            }
        };
        intent.failure = Some(failure(error, None, unknown_since));
        intent.next_attempt_at = next_attempt_at;
        if intent.status == IntentStatus::Sending || intent.status == IntentStatus::UnknownAfterSend
        {
            self.save(intent, IntentStatus::UnknownAfterSend, durable)
                .await?;
        }
        warn!(
            parked = intent.next_attempt_at.is_none(),
            "send outcome unknown; never replayed blindly"
        );
        Ok(SendOutcome::Unknown {
            failure: failure(error, None, now),
            delivered: intent.partial_receipt.clone(),
        })
    }

    pub(crate) async fn fail(
        &self,
        intent: &mut DurableSendIntent,
        error: &SendError,
        reason: FailureReason,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        let now = self.clock.now_ms();
        let failure = failure(error, Some(reason), now);
        intent.failure = Some(failure.clone());
        intent.next_attempt_at = None;
        self.save(intent, IntentStatus::Failed, durable).await?;
        warn!(?reason, "send failed");
        Ok(SendOutcome::Failed {
            failure,
            delivered: intent.partial_receipt.clone(),
        })
    }

    pub(crate) async fn expire(
        &self,
        intent: &mut DurableSendIntent,
        durable: bool,
    ) -> Result<SendOutcome, MessagesError> {
        let error = SendError::before_io(
            clawgate_types::DeliveryFailureKind::Cancelled,
            "the message outlived its time-to-live and was not delivered",
        );
        self.fail(intent, &error, FailureReason::Expired, durable)
            .await
    }
}
