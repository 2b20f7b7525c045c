//! A QA platform, a state directory and a messenger with a clock the test drives.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use clawgate_channel_qa::{QaAdapter, QaPlatform, QaPlatformConfig};
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageOriginAdapter, MessageRenderAdapter, Reconciliation, SendContext,
    SendError,
};
use clawgate_messages::{Boundary, LifecycleProbe, Messenger, RetryPolicy};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_store_sqlite::{SqliteOptions, SqliteStore};
use clawgate_types::clock::ManualClock;
use clawgate_types::{
    ChannelMessage, DurableSendIntent, IntentId, IntentStatus, MessageCapabilities, MessageReceipt,
    MessageReceiptPart, RenderedMessageUnit,
};

pub struct Harness {
    pub platform: QaPlatform,
    pub store: Arc<SqliteStore>,
    pub clock: Arc<ManualClock>,
    /// Keeps the state directory alive for the test.
    pub _dir: tempfile::TempDir,
}

pub const START: i64 = 1_700_000_000_000;

impl Harness {
    pub async fn new() -> Harness {
        Harness::with_options(SqliteOptions::default()).await
    }

    pub async fn with_options(options: SqliteOptions) -> Harness {
        let platform = QaPlatform::start(QaPlatformConfig::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(clawgate_store_sqlite::testing::open_store_with(
            dir.path(),
            options,
        ));
        Harness {
            platform,
            store,
            clock: Arc::new(ManualClock::new(START)),
            _dir: dir,
        }
    }

    pub fn adapter(&self) -> QaAdapter {
        QaAdapter::new(&self.platform.base_url(), self.platform.token())
    }

    pub fn plain_adapter(&self) -> QaAdapter {
        QaAdapter::without_idempotency(&self.platform.base_url(), self.platform.token())
    }

    pub fn messenger(&self, adapter: Arc<dyn ChannelMessageAdapter>) -> Messenger {
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

    /// The intents in `status` (at most 10: the tests look at a handful).
    pub async fn intents_with(&self, status: IntentStatus) -> Vec<DurableSendIntent> {
        self.list(vec![status]).await
    }

    /// Every recorded intent (the first ten), oldest first.
    pub async fn intents(&self) -> Vec<DurableSendIntent> {
        self.list(Vec::new()).await
    }

    async fn list(&self, statuses: Vec<IntentStatus>) -> Vec<DurableSendIntent> {
        self.store
            .list_intents(&IntentFilter {
                statuses,
                limit: 10,
                ..IntentFilter::default()
            })
            .await
            .unwrap()
    }
}

/// An outbound message to the QA room `room-1`.
pub fn message(id: &str, text: &str) -> ChannelMessage {
    clawgate_e2e::qa_message(id, text)
}

/// Wraps an adapter and counts its post-send hooks.
pub struct Counting<A> {
    pub inner: A,
    pub renderer: Option<PartsRenderer>,
    pub after_commit: AtomicUsize,
    /// Calls of `send_unit` (platform sends tried).
    pub send_calls: AtomicUsize,
    /// The sends whose after_commit ran.
    committed: std::sync::Mutex<std::collections::HashSet<String>>,
    /// When set, every reconciliation gets this answer instead of asking the platform.
    reconcile_answer: std::sync::Mutex<Option<Result<Reconciliation, SendError>>>,
    /// When set, each post-send hook reads its intent here: what the store held then.
    pub store_at_hook: Option<Arc<dyn clawgate_store::IntentStore>>,
    pub statuses_at_hook: std::sync::Mutex<Vec<Option<clawgate_types::IntentStatus>>>,
    /// With `store_at_hook`: each reconciliation reads its intent there first.
    pub intents_at_reconcile: std::sync::Mutex<Vec<Option<DurableSendIntent>>>,
}

impl<A> Counting<A> {
    pub fn new(inner: A) -> Arc<Counting<A>> {
        Arc::new(Counting {
            inner,
            renderer: None,
            after_commit: AtomicUsize::new(0),
            send_calls: AtomicUsize::new(0),
            committed: std::sync::Mutex::default(),
            reconcile_answer: std::sync::Mutex::default(),
            store_at_hook: None,
            statuses_at_hook: std::sync::Mutex::default(),
            intents_at_reconcile: std::sync::Mutex::default(),
        })
    }

    /// [`Counting::new`], whose post-send hooks read their intent's status in `store`.
    pub fn observing(inner: A, store: Arc<dyn clawgate_store::IntentStore>) -> Arc<Counting<A>> {
        Arc::new(Counting {
            inner,
            renderer: None,
            after_commit: AtomicUsize::new(0),
            send_calls: AtomicUsize::new(0),
            committed: std::sync::Mutex::default(),
            reconcile_answer: std::sync::Mutex::default(),
            store_at_hook: Some(store),
            statuses_at_hook: std::sync::Mutex::default(),
            intents_at_reconcile: std::sync::Mutex::default(),
        })
    }

    /// Renders batches whose parts stand alone (`best_effort_parts`).
    pub fn best_effort_parts(inner: A) -> Arc<Counting<A>> {
        Arc::new(Counting {
            inner,
            renderer: Some(PartsRenderer),
            after_commit: AtomicUsize::new(0),
            send_calls: AtomicUsize::new(0),
            committed: std::sync::Mutex::default(),
            reconcile_answer: std::sync::Mutex::default(),
            store_at_hook: None,
            statuses_at_hook: std::sync::Mutex::default(),
            intents_at_reconcile: std::sync::Mutex::default(),
        })
    }

    /// Answers every later reconciliation with `answer` (a platform that cannot tell, or
    /// cannot be reached).
    pub fn answer_reconciliations(&self, answer: Result<Reconciliation, SendError>) {
        *self
            .reconcile_answer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(answer);
    }

    /// `(after_commit calls, distinct sends they were for)`: equal when it ran once per send.
    pub fn hooks(&self) -> (usize, usize) {
        (
            self.after_commit.load(Ordering::SeqCst),
            self.committed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .len(),
        )
    }
}

#[async_trait]
impl<A: ChannelMessageAdapter> ChannelMessageAdapter for Counting<A> {
    fn channel(&self) -> &str {
        self.inner.channel()
    }
    fn capabilities(&self) -> &MessageCapabilities {
        self.inner.capabilities()
    }
    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.send_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.send_unit(ctx, unit).await
    }
    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.inner.edit(ctx, part, unit).await
    }
    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        self.inner.delete(ctx, part).await
    }
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        if let (Some(store), Some(id)) = (&self.store_at_hook, &ctx.intent_id) {
            let stored = store.load_intent(id).await.ok().flatten();
            self.intents_at_reconcile
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(stored);
        }
        let answer = self
            .reconcile_answer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match answer {
            Some(answer) => answer,
            None => self.inner.reconcile_unknown_send(ctx, unit).await,
        }
    }
    async fn after_commit(&self, ctx: &SendContext, receipt: &MessageReceipt) {
        // Per send, not by global counts: concurrent sends interleave their hooks.
        let first = self
            .committed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(ctx.idempotency_key.clone());
        assert!(first, "after_commit of {} runs once", ctx.idempotency_key);
        if let (Some(store), Some(id)) = (&self.store_at_hook, &ctx.intent_id) {
            let status = store
                .load_intent(id)
                .await
                .ok()
                .flatten()
                .map(|intent| intent.status);
            self.statuses_at_hook
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(status);
        }
        self.after_commit.fetch_add(1, Ordering::SeqCst);
        self.inner.after_commit(ctx, receipt).await;
    }
    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        match &self.renderer {
            Some(renderer) => Some(renderer),
            None => self.inner.render(),
        }
    }
    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        self.inner.origin()
    }
}

/// The default rendering with `best_effort_parts` atomicity.
pub struct PartsRenderer;

impl MessageRenderAdapter for PartsRenderer {
    fn render(
        &self,
        message: &ChannelMessage,
        capabilities: &MessageCapabilities,
        key: &str,
    ) -> Result<clawgate_types::RenderedMessageBatch, clawgate_channel_sdk::RenderError> {
        let mut batch = clawgate_channel_sdk::DefaultRenderer.render(message, capabilities, key)?;
        batch.atomicity = clawgate_types::BatchAtomicity::BestEffortParts;
        Ok(batch)
    }
}

/// Stops this send dead at one boundary, as a crash would: the engine goes no further.
pub struct CrashAt(pub Boundary);

impl LifecycleProbe for CrashAt {
    fn reached(&self, boundary: Boundary, _intent: &IntentId) {
        if boundary == self.0 {
            panic!("simulated crash at {boundary:?}");
        }
    }
}

/// Keeps simulated crashes out of the test output; every other panic is reported as usual.
pub fn quiet_simulated_crashes() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let simulated = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("simulated crash"));
            if !simulated {
                default(info);
            }
        }));
    });
}
