//! The channel contract suite (layer 3): run it against any channel and its platform.
//!
//! A channel crate implements [`ConformancePeer`] for its channel and a peer of its platform — a
//! real server where one runs, a faithful simulator otherwise — that can inject failures, lose
//! answers, write into conversations and show what landed. [`conformance_tests!`] then generates
//! one `#[tokio::test]` per case in a module of the name you give it (call it once per peer):
//!
//! `clawgate_conformance::conformance_tests!(my_channel, MyPeer::start().await);` in a test
//! file of the channel crate (dev-dependency: `clawgate-conformance`, nothing else) is the whole
//! wiring; the peer implements this crate's [`ConformancePeer`] with [`async_trait`](macro@async_trait).
//! `docs/channels.md` in the repository shows a whole channel crate with its peer.
//!
//! Every case either passes, fails with a message naming the broken contract, or is **skipped
//! with its reason** when it does not apply (a send-only channel has no inbound cases). A
//! skipped case still shows as a passing test to libtest; the generated test prints
//! `conformance: <case> skipped: <reason>` on stderr and `cargo xtask conformance` lists every
//! skip of every suite, so "13 passed" never hides what was not checked. A case that applies —
//! the adapter declares the capability — and that the peer cannot drive **fails** rather than
//! skips.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)] // A test suite: failures panic loudly.

use clawgate_channel_sdk::ChannelPlugin;
use clawgate_types::{DeliveryFailureKind, MessageTarget};

pub mod fuzz;
/// Loopback ports for a peer's webhook listener (see [`clawgate_channel_sdk::testing::ports`]).
pub use clawgate_channel_sdk::testing::ports;
mod send;
mod source;
mod support;

pub use send::{
    batch_partial_retry_sends_only_missing_units, declared_text_limit_and_chunking_work,
    delete_round_trip, edit_round_trip, failure_classes, idempotency_key_dedupes_when_declared,
    inbound_events_normalize, live_preview_finalizes_in_place_when_declared,
    origin_markers_round_trip, recovery_after_restart,
    remote_attachments_are_delivered_when_declared, send_round_trip,
    unknown_outcome_is_reconcilable_when_declared,
};
pub use source::{
    a_retried_event_keeps_its_conversations_order, live_preview_is_removed_when_abandoned,
    polling_source_never_passes_an_unfinished_event, pushed_redelivery_is_deduplicated,
    pushed_source_resumes_after_a_dropped_connection,
};

/// The async-trait macro [`ConformancePeer`] is declared with.
pub use async_trait::async_trait;
#[doc(hidden)]
pub use tokio as __tokio;

/// What a case found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Outcome {
    /// Every check of the case held.
    Passed,
    /// The case does not apply to this channel, for this reason.
    Skipped(String),
}

impl Outcome {
    /// A skip for `reason`.
    pub fn skipped(reason: impl Into<String>) -> Outcome {
        Outcome::Skipped(reason.into())
    }

    /// Prints a skip where `cargo xtask conformance` finds it.
    pub fn report(&self, case: &str) {
        if let Outcome::Skipped(reason) = self {
            eprintln!("conformance: {case} skipped: {reason}");
        }
    }
}

/// A channel and the platform it talks to, as the suite needs them.
#[async_trait]
pub trait ConformancePeer: Send + Sync {
    /// The channel under test, as its factory builds it (sender, receiver, source).
    fn plugin(&self) -> ChannelPlugin;

    /// A fresh conversation the case may use alone.
    fn target(&self, case: &str) -> MessageTarget;

    /// Makes the platform refuse `count` calls, after `after` calls went through, with an error
    /// the adapter should classify as `kind`. `false` when the platform cannot produce that class.
    fn inject_failure(&self, kind: DeliveryFailureKind, count: u32, after: u32) -> bool;

    /// Makes the platform accept the next call (after `after` calls went through) but lose the
    /// answer. `false` when it cannot (then the unknown-outcome cases fail: every channel has
    /// unknown outcomes, and a peer must be able to produce one).
    fn inject_lost_answer(&self, after: u32) -> bool;

    /// Texts visible in the conversation, oldest first.
    async fn visible_texts(&self, target: &MessageTarget) -> Vec<String>;

    /// Makes someone on the platform write `text` into `target` (as a bot account when `bot`)
    /// and returns the raw platform event the channel's receiver normalizes. `None` when the
    /// peer cannot (a receiving channel's peer must).
    async fn inject_inbound(
        &self,
        _target: &MessageTarget,
        _text: &str,
        _bot: bool,
    ) -> Option<serde_json::Value> {
        None
    }

    /// A URL of an image the platform can fetch, for the attachment case (platforms that
    /// fetch files by URL, such as Telegram, refuse one they cannot reach).
    fn attachment_url(&self) -> String {
        "https://files.example/conformance.png".to_owned()
    }

    /// The raw platform events of the messages visible in `target` (to check that metadata the
    /// adapter wrote, such as origin markers, comes back). Empty when the peer cannot.
    async fn visible_raw(&self, _target: &MessageTarget) -> Vec<serde_json::Value> {
        Vec::new()
    }

    /// A pushed source: makes the platform deliver every event again, acked ones included (a
    /// webhook retry that raced its answer). `false` when the peer cannot.
    fn redeliver_pushed(&self) -> bool {
        false
    }

    /// A pushed source: drops the connection (a socket closed by the platform); the source
    /// reconnects and resumes. `false` when the peer cannot.
    fn drop_connection(&self) -> bool {
        false
    }
}

/// The cases, in the order the macro generates them.
pub const CASES: &[&str] = &[
    "send_round_trip",
    "edit_round_trip",
    "delete_round_trip",
    "declared_text_limit_and_chunking_work",
    "idempotency_key_dedupes_when_declared",
    "failure_classes",
    "unknown_outcome_is_reconcilable_when_declared",
    "batch_partial_retry_sends_only_missing_units",
    "recovery_after_restart",
    "inbound_events_normalize",
    "origin_markers_round_trip",
    "live_preview_finalizes_in_place_when_declared",
    "live_preview_is_removed_when_abandoned",
    "remote_attachments_are_delivered_when_declared",
    "polling_source_never_passes_an_unfinished_event",
    "a_retried_event_keeps_its_conversations_order",
    "pushed_redelivery_is_deduplicated",
    "pushed_source_resumes_after_a_dropped_connection",
];

/// One generated test per case, `$suite::conformance::<case>` (so one file may run several
/// peers);
/// `$peer` is an async expression building a fresh peer, evaluated once per case. The tests
/// use the suite's own tokio: the caller needs no tokio dev-dependency.
#[macro_export]
macro_rules! conformance_tests {
    ($suite:ident, $peer:expr) => {
        $crate::conformance_tests!(@cases $suite, $peer;
            send_round_trip, edit_round_trip, delete_round_trip,
            declared_text_limit_and_chunking_work, idempotency_key_dedupes_when_declared,
            failure_classes, unknown_outcome_is_reconcilable_when_declared,
            batch_partial_retry_sends_only_missing_units, recovery_after_restart,
            inbound_events_normalize, origin_markers_round_trip,
            live_preview_finalizes_in_place_when_declared,
            live_preview_is_removed_when_abandoned,
            remote_attachments_are_delivered_when_declared,
            polling_source_never_passes_an_unfinished_event,
            a_retried_event_keeps_its_conversations_order,
            pushed_redelivery_is_deduplicated,
            pushed_source_resumes_after_a_dropped_connection);
    };
    (@cases $suite:ident, $peer:expr; $($case:ident),+) => {
        // `<suite>::conformance::<case>`: `cargo xtask conformance` selects the tests by the
        // `conformance` path segment.
        mod $suite {
            #[allow(unused_imports)]
            use super::*;
            mod conformance {
                #[allow(unused_imports)]
                use super::*;
                $(
                    #[$crate::__tokio::test(flavor = "multi_thread", worker_threads = 2, crate = "clawgate_conformance::__tokio")]
                    async fn $case() {
                        let peer = $peer;
                        $crate::$case(&peer)
                            .await
                            .report(concat!(module_path!(), "::", stringify!($case)));
                    }
                )+
            }
        }
    };
}

/// The state a gateway hands channel `name` of `account` (scoped by `name` and `account`; the
/// gateway scopes by kind and account), kept in the SQLite store of `dir` (created and migrated
/// there): a channel built again on the same `dir` — a restart — finds what the first one
/// wrote.
pub fn channel_state(
    dir: impl AsRef<std::path::Path>,
    name: &str,
    account: &str,
) -> clawgate_channel_sdk::ChannelState {
    let store = std::sync::Arc::new(clawgate_store_sqlite::testing::open_store(dir.as_ref()));
    clawgate_channel_sdk::ChannelState::with_system_clock(
        store,
        clawgate_store::ChannelScope::new(name, account),
    )
}

/// A [`ChannelSetup`](clawgate_channel_sdk::ChannelSetup) for entry `index`, as the gateway
/// builds it, with its state in the SQLite store of `dir` (see [`channel_state`]).
pub fn channel_setup(
    index: usize,
    name: &str,
    account: &str,
    settings: serde_json::Value,
    dir: impl AsRef<std::path::Path>,
) -> clawgate_channel_sdk::ChannelSetup {
    clawgate_channel_sdk::ChannelSetup::new(
        index,
        name,
        account,
        settings,
        channel_state(dir, name, account),
    )
}

/// A [`ChannelSetup`](clawgate_channel_sdk::ChannelSetup) whose state is kept in an in-memory
/// SQLite store (gone with the channel): for a test that restarts nothing.
pub fn channel_setup_in_memory(
    index: usize,
    name: &str,
    account: &str,
    settings: serde_json::Value,
) -> clawgate_channel_sdk::ChannelSetup {
    let store = clawgate_store_sqlite::SqliteStore::open_in_memory(
        clawgate_store_sqlite::SqliteOptions::default(),
    )
    .expect("an in-memory SQLite store");
    clawgate_channel_sdk::ChannelSetup::new(
        index,
        name,
        account,
        settings,
        clawgate_channel_sdk::ChannelState::with_system_clock(
            std::sync::Arc::new(store),
            clawgate_store::ChannelScope::new(name, account),
        ),
    )
}
