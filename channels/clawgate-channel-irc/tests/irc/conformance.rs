//! The channel contract suite against ngircd (plain IRC: PING receipts) and, in `inspircd`,
//! against InspIRCd with IRCv3 (labeled echoes as receipts). Every case but one comes from the
//! suite as it is; `pushed_redelivery_is_deduplicated` is reported as a skip: an IRC server
//! never delivers a line twice (no acknowledgements, no retries), so no peer can produce a
//! redelivery.

use crate::peer::Peer;

macro_rules! cases {
    ($start:path; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let peer = $start().await;
                clawgate_conformance::$case(&peer)
                    .await
                    .report(concat!(module_path!(), "::", stringify!($case)));
            }
        )+
    };
}

macro_rules! every_case {
    ($start:path) => {
        cases!($start;
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
    pushed_source_resumes_after_a_dropped_connection,
);
    };
}

every_case!(Peer::start);

#[test]
fn pushed_redelivery_is_deduplicated() {
    clawgate_conformance::Outcome::skipped(
        "an IRC server never delivers a line twice (no acknowledgements, no retries): \
         there is no redelivery to deduplicate",
    )
    .report(concat!(
        module_path!(),
        "::pushed_redelivery_is_deduplicated"
    ));
}

/// The same suite against InspIRCd 3 with echo-message + labeled-response.
mod inspircd {
    use crate::peer::Peer;

    every_case!(Peer::start_inspircd);

    #[test]
    fn pushed_redelivery_is_deduplicated() {
        clawgate_conformance::Outcome::skipped(
            "an IRC server never delivers a line twice, IRCv3 or not: there is no redelivery \
             to deduplicate",
        )
        .report(concat!(
            module_path!(),
            "::pushed_redelivery_is_deduplicated"
        ));
    }
}
