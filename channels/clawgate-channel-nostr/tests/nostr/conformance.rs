//! The channel contract suite against the relay. Skips come from the suite itself: no edit or
//! delete on Nostr (kind-5 deletion is only a request), no previews, no polling source, no
//! chunking (one event carries up to the declared limit), no attachments by URL, no origin
//! markers.

use crate::peer::Peer;

macro_rules! cases {
    ($($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let peer = Peer::start().await;
                clawgate_conformance::$case(&peer)
                    .await
                    .report(concat!(module_path!(), "::", stringify!($case)));
            }
        )+
    };
}

cases!(
    send_round_trip,
    edit_round_trip,
    delete_round_trip,
    declared_text_limit_and_chunking_work,
    idempotency_key_dedupes_when_declared,
    failure_classes,
    unknown_outcome_is_reconcilable_when_declared,
    batch_partial_retry_sends_only_missing_units,
    recovery_after_restart,
    inbound_events_normalize,
    origin_markers_round_trip,
    live_preview_finalizes_in_place_when_declared,
    live_preview_is_removed_when_abandoned,
    remote_attachments_are_delivered_when_declared,
    polling_source_never_passes_an_unfinished_event,
    a_retried_event_keeps_its_conversations_order,
    pushed_redelivery_is_deduplicated,
    pushed_source_resumes_after_a_dropped_connection,
);
