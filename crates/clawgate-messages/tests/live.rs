//! Live previews on the SDK's in-memory platform over a real SQLite state directory: what a
//! channel's capabilities allow.

use std::sync::Arc;

use async_trait::async_trait;
use clawgate_channel_sdk::testing::{MemoryChannel, MemoryPlatform};
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageOriginAdapter, Reconciliation, SendContext,
    SendError,
};
use clawgate_messages::{
    LiveOptions, LivePreview, Messenger, RetryPolicy, SendOptions, SendOutcome,
};
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::ManualClock;
use clawgate_types::{
    ChannelMessage, LiveCapabilities, MessageCapabilities, MessageReceiptPart, MessageTarget,
    RenderedMessageUnit,
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

    fn texts(&self) -> Vec<String> {
        self.platform.texts(ROOM)
    }
}

fn reply(text: &str) -> ChannelMessage {
    ChannelMessage::outbound("out-1", "memory", MessageTarget::group(ROOM), text)
}

/// The memory channel declaring only `live` of the platform's abilities: an edit or a delete it
/// does not declare is refused as unsupported, as a channel without it would.
struct Declared {
    inner: MemoryChannel,
    capabilities: MessageCapabilities,
}

impl Declared {
    fn new(inner: MemoryChannel, live: Option<LiveCapabilities>) -> Declared {
        let mut capabilities = inner.capabilities().clone();
        capabilities.live = live;
        Declared {
            inner,
            capabilities,
        }
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
