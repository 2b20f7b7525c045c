//! Live previews on the SDK's in-memory platform over a real SQLite state directory: what a
//! channel's capabilities allow, an in-place final whose answer was lost, and previews the
//! platform will not remove when the final cannot go out.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;
use clawgate_channel_sdk::testing::{MemoryChannel, MemoryFault, MemoryPlatform};
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageOriginAdapter, Reconciliation, SendContext,
    SendError,
};
use clawgate_messages::{
    LiveOptions, LivePreview, MessagesError, Messenger, RetryPolicy, SendOptions, SendOutcome,
};
use clawgate_store::IntentStore;
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::ManualClock;
use clawgate_types::{
    ChannelMessage, DeliveryFailureKind, DurableSendIntent, IntentId, IntentStatus,
    LiveCapabilities, MessageAttachment, MessageCapabilities, MessagePartKind, MessageReceiptPart,
    MessageTarget, RenderedMessageUnit,
};

const ROOM: &str = "room-1";

/// A memory platform, a state directory and a clock the test drives.
struct Harness {
    platform: MemoryPlatform,
    store: Arc<SqliteStore>,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("a temporary state directory");
        Harness {
            platform: MemoryPlatform::new(),
            store: Arc::new(clawgate_store_sqlite::testing::open_store(dir.path())),
            clock: Arc::new(ManualClock::new(1_700_000_000_000)),
            _dir: dir,
        }
    }

    /// The memory channel as it is (edits, deletes, reconciliation by key).
    fn channel(&self) -> MemoryChannel {
        MemoryChannel::new("memory", self.platform.clone())
    }

    fn messenger(&self, adapter: Arc<dyn ChannelMessageAdapter>) -> Messenger {
        let policy = RetryPolicy {
            base_delay_ms: 1_000,
            reconcile_delay_ms: 500,
            ..RetryPolicy::default()
        };
        Messenger::new(
            self.store.clone(),
            vec![adapter],
            policy,
            self.clock.clone(),
            "test",
        )
    }

    async fn begin(&self, messenger: &Messenger, stale_after_ms: u64) -> LivePreview {
        messenger
            .begin_live(
                reply(""),
                SendOptions::default(),
                LiveOptions { stale_after_ms },
            )
            .await
            .expect("the live intent is recorded")
    }

    async fn intent(&self, id: &IntentId) -> DurableSendIntent {
        self.store
            .load_intent(id)
            .await
            .expect("the store answers")
            .expect("the intent is recorded")
    }

    /// The one intent of the test (a live intent is recorded before any report names it).
    async fn only_intent(&self) -> DurableSendIntent {
        let all = self
            .store
            .list_intents(&clawgate_store::IntentFilter {
                limit: 10,
                ..clawgate_store::IntentFilter::default()
            })
            .await
            .expect("the store answers");
        let [one] = all.as_slice() else {
            panic!("one intent expected: {all:?}")
        };
        one.clone()
    }

    fn texts(&self) -> Vec<String> {
        self.platform.texts(ROOM)
    }
}

fn reply(text: &str) -> ChannelMessage {
    ChannelMessage::outbound("out-1", "memory", MessageTarget::group(ROOM), text)
}

/// The recorded preview's platform message, if the live state holds one.
fn recorded_preview(intent: &DurableSendIntent) -> Option<String> {
    intent
        .live_state
        .as_ref()
        .and_then(|s| s.receipt.as_ref())
        .and_then(|r| r.parts.first())
        .map(|p| p.platform_message_id.clone())
}

/// The memory channel declaring only `live` of the platform's abilities: an edit or a delete it
/// does not declare is refused as unsupported, as a channel without it would.
struct Declared {
    inner: MemoryChannel,
    capabilities: MessageCapabilities,
    /// Reconciliations still to turn away as rate limited (HTTP 429, nothing done).
    throttled_probes: AtomicU32,
    probes: AtomicU32,
}

impl Declared {
    fn new(inner: MemoryChannel, live: Option<LiveCapabilities>) -> Declared {
        let mut capabilities = inner.capabilities().clone();
        capabilities.live = live;
        Declared {
            inner,
            capabilities,
            throttled_probes: AtomicU32::new(0),
            probes: AtomicU32::new(0),
        }
    }

    /// The memory channel as it is, its next `n` reconciliations rate limited.
    fn throttling_probes(inner: MemoryChannel, n: u32) -> Declared {
        let live = inner.capabilities().live.clone();
        let declared = Declared::new(inner, live);
        declared.throttled_probes.store(n, Ordering::SeqCst);
        declared
    }
}

#[async_trait]
impl ChannelMessageAdapter for Declared {
    fn channel(&self) -> &str {
        self.inner.channel()
    }

    fn capabilities(&self) -> &MessageCapabilities {
        &self.capabilities
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.inner.send_unit(ctx, unit).await
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        if !self.capabilities.can_edit() {
            return Err(SendError::unsupported(self.channel(), "edit"));
        }
        self.inner.edit(ctx, part, unit).await
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        if !self.capabilities.can_delete() {
            return Err(SendError::unsupported(self.channel(), "delete"));
        }
        self.inner.delete(ctx, part).await
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        self.probes.fetch_add(1, Ordering::SeqCst);
        let throttled = self
            .throttled_probes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if throttled {
            return Err(SendError::before_io(
                DeliveryFailureKind::RateLimit,
                "HTTP 429: request trigger frequency limit",
            )
            .with_retry_after_ms(Some(20)));
        }
        self.inner.reconcile_unknown_send(ctx, unit).await
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        self.inner.live()
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        self.inner.origin()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_that_cannot_take_a_preview_down_shows_none_and_sends_one_plain_final() {
    let live = |edit, delete| {
        Some(
            LiveCapabilities::default()
                .with_edit(edit)
                .with_delete(delete),
        )
    };
    // (case, declared live abilities, previews through the channel's own stream, previews)
    let cases = [
        ("nothing live declared", None, false, false),
        ("edits, but cannot delete", live(true, false), false, false),
        (
            "deletes, but cannot follow the text",
            live(false, true),
            false,
            false,
        ),
        ("edits and deletes", live(true, true), false, true),
        (
            "a stream of its own that deletes (no edit)",
            live(false, true),
            true,
            true,
        ),
        (
            "a stream of its own that cannot delete",
            live(true, false),
            true,
            false,
        ),
    ];
    for (case, declared, own_stream, previews) in cases {
        let h = Harness::new();
        let channel = if own_stream {
            h.channel().with_live_stream()
        } else {
            h.channel()
        };
        let messenger = h.messenger(Arc::new(Declared::new(channel, declared)));
        let mut live = h.begin(&messenger, 60_000).await;
        let shown = live.update("thinking…").await.expect("the update runs");
        assert_eq!(shown, previews, "{case}: preview shown");
        assert_eq!(
            h.texts().len(),
            usize::from(previews),
            "{case}: {:?}",
            h.texts()
        );
        h.clock.advance(1_000);
        let report = live
            .finalize(reply("the answer"))
            .await
            .expect("the final is delivered");
        assert!(
            matches!(report.outcome, SendOutcome::Sent { .. }),
            "{case}: {report:?}"
        );
        assert_eq!(h.texts(), ["the answer"], "{case}: the final alone");
        if !previews {
            assert_eq!(
                h.platform.sends(),
                1,
                "{case}: only the final was ever sent"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_edit_whose_answer_was_lost_is_edited_again_never_sent_beside_its_preview() {
    let h = Harness::new();
    let messenger = h.messenger(Arc::new(h.channel()));
    // Stale by the time recovery comes: a recorded final beside a stale preview would
    // otherwise be sent fresh.
    let mut live = h.begin(&messenger, 10_000).await;
    assert!(live.update("draft").await.expect("the update runs"));
    let preview = h.platform.messages(ROOM)[0].id.clone();
    // The edit into the final lands, its answer is lost; so is the answer to the next one.
    h.platform.inject(MemoryFault::LoseAnswer, 2, 0);
    let report = live
        .finalize(reply("the answer"))
        .await
        .expect("the final is recorded");
    let id = report.intent_id.clone().expect("a durable intent");
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    let stored = h.intent(&id).await;
    assert_eq!(stored.status, IntentStatus::UnknownAfterSend);
    assert_eq!(
        recorded_preview(&stored).as_deref(),
        Some(preview.as_str()),
        "the preview stays recorded as the final's carrier"
    );
    assert!(stored.next_attempt_at.is_some(), "reconciled, not parked");
    assert_eq!(h.texts(), ["the answer"], "the edit did land");

    // Recovery edits again (an edit cannot duplicate); a lost answer again keeps it unknown.
    h.clock.advance(60_000);
    let first = messenger.recover().await.expect("a recovery pass");
    assert_eq!(first.unknown, 1, "{first:?}");
    assert_eq!(h.intent(&id).await.status, IntentStatus::UnknownAfterSend);
    h.clock.advance(60_000);
    let second = messenger.recover().await.expect("a recovery pass");
    assert_eq!(second.committed, 1, "{second:?}");

    let landed = h.platform.messages(ROOM);
    assert_eq!(landed.len(), 1, "{landed:?}");
    assert_eq!(
        (landed[0].id.as_str(), landed[0].text.as_str()),
        (preview.as_str(), "the answer")
    );
    assert_eq!(
        h.platform.sends(),
        1,
        "the final was never sent as a message"
    );
    let sent = h.intent(&id).await;
    assert_eq!(sent.status, IntentStatus::Sent);
    assert_eq!(
        sent.receipt
            .as_ref()
            .and_then(|r| r.primary_platform_message_id.as_deref()),
        Some(preview.as_str())
    );
}

/// An in-place final whose edits keep losing their answers is edited again with backoff, each
/// edit counted as a reconciliation; at the budget it fails — never sent as a fresh message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_final_whose_edits_stay_unknown_fails_at_the_reconciliation_budget() {
    let h = Harness::new();
    let messenger = Messenger::new(
        h.store.clone(),
        vec![Arc::new(h.channel())],
        RetryPolicy {
            reconcile_delay_ms: 500,
            max_reconciliations: 3,
            ..RetryPolicy::default()
        },
        h.clock.clone(),
        "test",
    );
    let mut live = h.begin(&messenger, 10_000).await;
    live.update("draft").await.expect("the update runs");
    h.platform.inject(MemoryFault::LoseAnswer, 100, 0);
    let report = live
        .finalize(reply("the answer"))
        .await
        .expect("the final is recorded");
    let id = report.intent_id.clone().expect("a durable intent");
    for asked in 1..=3 {
        h.clock.advance(10_000);
        messenger.recover().await.expect("a recovery pass");
        let intent = h.intent(&id).await;
        assert_eq!(intent.reconciliations, asked);
        let expected = if asked < 3 {
            IntentStatus::UnknownAfterSend
        } else {
            IntentStatus::Failed
        };
        assert_eq!(intent.status, expected, "after edit {asked}");
    }
    let failed = h.intent(&id).await;
    assert_eq!(
        failed.failure.and_then(|f| f.reason),
        Some(clawgate_types::FailureReason::MaxAttemptsExceeded)
    );
    assert_eq!(h.platform.sends(), 1, "only the preview was ever sent");
    assert_eq!(h.texts(), ["the answer"], "the edits landed in the preview");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_final_that_fails_leaves_no_preview_behind() {
    let h = Harness::new();
    let messenger = h.messenger(Arc::new(h.channel()));
    let mut live = h.begin(&messenger, 1_000).await;
    live.update("draft").await.expect("the update runs");
    // Stale: the preview is removed and the final sent fresh, which the platform refuses.
    h.clock.advance(5_000);
    h.platform
        .inject(MemoryFault::Refuse(DeliveryFailureKind::Auth), 1, 1);
    let report = live
        .finalize(reply("the answer"))
        .await
        .expect("the outcome is recorded");
    assert!(
        matches!(report.outcome, SendOutcome::Failed { .. }),
        "{report:?}"
    );
    assert!(h.texts().is_empty(), "the preview is gone: {:?}", h.texts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_that_will_not_go_keeps_the_edit_error_and_is_removed_by_recovery() {
    let h = Harness::new();
    let messenger = h.messenger(Arc::new(h.channel()));
    let mut live = h.begin(&messenger, 10_000).await;
    live.update("draft").await.expect("the update runs");
    let preview = h.platform.messages(ROOM)[0].id.clone();
    // The edit into the final is refused, and so is removing the preview.
    h.platform.inject(
        MemoryFault::Refuse(DeliveryFailureKind::InvalidPayload),
        1,
        0,
    );
    h.platform
        .inject(MemoryFault::Refuse(DeliveryFailureKind::Transient), 1, 0);
    let report = live
        .finalize(reply("the answer"))
        .await
        .expect("the final is recorded");
    let SendOutcome::RetryScheduled { failure, .. } = &report.outcome else {
        panic!("{report:?}")
    };
    assert!(
        failure.message.contains("(InvalidPayload)") && failure.message.contains("(Transient)"),
        "the edit's error and the removal's: {}",
        failure.message
    );
    let id = report.intent_id.clone().expect("a durable intent");
    let stored = h.intent(&id).await;
    assert_eq!(stored.status, IntentStatus::Pending);
    assert_eq!(
        recorded_preview(&stored).as_deref(),
        Some(preview.as_str()),
        "recorded for a later removal"
    );
    assert_eq!(
        stored.failure.as_ref().map(|f| f.message.as_str()),
        Some(failure.message.as_str())
    );
    assert_eq!(h.texts(), ["draft"], "no final beside the preview");

    // Stale by now: recovery removes the preview, then delivers the final.
    h.clock.advance(60_000);
    let recovered = messenger.recover().await.expect("a recovery pass");
    assert_eq!(recovered.committed, 1, "{recovered:?}");
    assert_eq!(h.texts(), ["the answer"]);
    assert!(h.platform.messages(ROOM).iter().all(|m| m.id != preview));
    assert_eq!(h.intent(&id).await.status, IntentStatus::Sent);
}

fn image() -> MessageAttachment {
    let mut image = MessageAttachment::new(MessagePartKind::Media);
    image.url = Some("https://example.org/cat.png".into());
    image
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_that_cannot_be_rendered_takes_its_preview_down_and_returns_its_error() {
    // (case, removing the preview is refused once)
    for (case, refused) in [("removed at once", false), ("removed by recovery", true)] {
        let h = Harness::new();
        let messenger = h.messenger(Arc::new(h.channel()));
        let mut live = h.begin(&messenger, 60_000).await;
        live.update("draft").await.expect("the update runs");
        if refused {
            h.platform
                .inject(MemoryFault::Refuse(DeliveryFailureKind::Transient), 1, 0);
        }
        // The memory channel takes no attachments: the final cannot be rendered.
        let error = live
            .finalize(reply("the answer").with_attachment(image()))
            .await
            .expect_err("a final the channel cannot carry");
        assert!(
            matches!(error, MessagesError::Render { .. }),
            "{case}: the render error, not the removal's: {error}"
        );
        let stored = h.only_intent().await;
        if refused {
            assert_eq!(h.texts(), ["draft"], "{case}");
            assert!(
                stored.awaits_final() && recorded_preview(&stored).is_some(),
                "{case}: recorded for a later removal: {stored:?}"
            );
            h.clock.advance(1_000);
            let recovered = messenger.recover().await.expect("a recovery pass");
            assert_eq!(recovered.abandoned, 1, "{case}: {recovered:?}");
        }
        assert!(h.texts().is_empty(), "{case}: {:?}", h.texts());
        assert_eq!(
            h.intent(&stored.id).await.status,
            IntentStatus::Cancelled,
            "{case}: its turn replays"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_waits_while_the_preview_will_not_go_and_the_preview_stays_recorded() {
    let h = Harness::new();
    let messenger = h.messenger(Arc::new(h.channel()));
    let mut live = h.begin(&messenger, 60_000).await;
    live.update("draft").await.expect("the update runs");
    h.platform
        .inject(MemoryFault::Refuse(DeliveryFailureKind::Transient), 1, 0);
    let error = live
        .deliver_block("First.")
        .await
        .expect_err("no block beside a preview showing");
    assert!(
        matches!(error, MessagesError::PreviewNotRemoved(_)),
        "{error}"
    );
    assert_eq!(h.texts(), ["draft"], "nothing delivered");
    assert!(
        recorded_preview(&h.only_intent().await).is_some(),
        "the preview stays recorded"
    );
    // The platform allows it now: the block goes out after the preview is gone.
    live.deliver_block("First.")
        .await
        .expect("the block is delivered");
    assert_eq!(h.texts(), ["First."]);
    let report = live
        .finalize(reply("First."))
        .await
        .expect("the final is recorded");
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    assert_eq!(h.texts(), ["First."], "the block was the whole final");
}

/// A preview whose answer was lost is looked for by its key; when the platform turns that probe
/// away (rate limited, nothing done) it is asked again after the platform's retry-after, so the
/// preview that landed is found, recorded and becomes the final in place — not left beside a
/// final sent fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_probe_turned_away_by_a_rate_limit_is_asked_again_and_finds_the_preview() {
    let h = Harness::new();
    let channel = Arc::new(Declared::throttling_probes(h.channel(), 2));
    let messenger = h.messenger(channel.clone());
    let mut live = h.begin(&messenger, 10_000).await;
    // The preview lands; its answer is lost.
    h.platform.inject(MemoryFault::LoseAnswer, 1, 0);
    live.update("draft").await.expect("the update runs");
    let preview = h.platform.messages(ROOM)[0].id.clone();
    assert_eq!(
        channel.probes.load(Ordering::SeqCst),
        3,
        "two probes turned away, the third answered"
    );
    assert_eq!(
        recorded_preview(&h.only_intent().await).as_deref(),
        Some(preview.as_str()),
        "the preview found by its key is recorded"
    );

    let report = live
        .finalize(reply("the answer"))
        .await
        .expect("the final is recorded");
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    assert_eq!(h.texts(), ["the answer"], "the preview became the final");
    assert_eq!(h.platform.sends(), 1, "only the preview was ever sent");
}
