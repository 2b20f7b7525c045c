//! What the cases share: messages, contexts, units and an engine on a fresh state directory.

use std::sync::Arc;

use clawgate_channel_sdk::{ChannelMessageAdapter, SendContext};
use clawgate_messages::{Messenger, RetryPolicy};
use clawgate_store_sqlite::SqliteStore;
use clawgate_types::clock::ManualClock;
use clawgate_types::{ChannelMessage, MessageTarget, RenderedMessageUnit};

use crate::ConformancePeer;

pub(crate) fn message(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, String::new(), target.clone(), text)
}

pub(crate) fn context(
    adapter: &dyn ChannelMessageAdapter,
    target: &MessageTarget,
    id: &str,
) -> SendContext {
    let mut msg = message(target, id, "");
    adapter.channel().clone_into(&mut msg.channel);
    SendContext::new(msg, format!("conformance:{id}"))
}

pub(crate) fn unit(index: u32, text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(index, text)
}

pub(crate) fn engine(
    peer: &dyn ConformancePeer,
    store: Arc<SqliteStore>,
    clock: Arc<ManualClock>,
) -> Messenger {
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    Messenger::new(
        store,
        vec![peer.plugin().sender],
        policy,
        clock,
        "conformance",
    )
}

/// An engine on a fresh state directory (kept alive by the returned guard) and a driven clock.
pub(crate) fn fresh_engine(
    peer: &dyn ConformancePeer,
) -> (tempfile::TempDir, Messenger, Arc<ManualClock>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let clock = Arc::new(ManualClock::new(1_000));
    let messenger = engine(peer, store, clock.clone());
    (dir, messenger, clock)
}

pub(crate) fn addressed(
    peer: &dyn ConformancePeer,
    target: &MessageTarget,
    id: &str,
    text: &str,
) -> ChannelMessage {
    let mut msg = message(target, id, text);
    peer.plugin().sender.channel().clone_into(&mut msg.channel);
    msg
}
