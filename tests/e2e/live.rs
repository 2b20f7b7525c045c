//! Live previews against the QA platform: finalize in place, edit coalescing, stale and
//! reply-target fallbacks, and recovery that never leaves a preview dangling.

use std::sync::Arc;

use clawgate_channel_qa::LogEvent;
use clawgate_messages::{LiveOptions, SendOptions, SendOutcome};
use clawgate_store::IntentStore;
use clawgate_types::{IntentStatus, MessageRelation};

use crate::harness::{Harness, message};

fn opts() -> SendOptions {
    SendOptions::default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_is_finalized_in_place() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("l", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    assert!(
        live.update("Hel").await.unwrap(),
        "the first update shows the preview"
    );
    h.clock.advance(250);
    assert!(
        live.update("Hello").await.unwrap(),
        "an edit once the rate allows"
    );
    let preview_id = h.platform.messages("room-1")[0].id.clone();
    h.clock.advance(250);
    let report = live.finalize(message("l", "Hello world")).await.unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 1, "the preview became the final");
    assert_eq!(
        (landed[0].id.as_str(), landed[0].text.as_str()),
        (preview_id.as_str(), "Hello world")
    );
    assert_eq!(
        receipt.primary_platform_message_id.as_deref(),
        Some(preview_id.as_str())
    );
    let intent = h
        .store
        .load_intent(report.intent_id.as_ref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(intent.status, IntentStatus::Sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_token_stream_is_coalesced_to_the_edit_rate() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("c", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    assert!(live.update("a").await.unwrap());
    // The QA platform declares 5 edits/s: updates within 200 ms are held back.
    for text in ["a b", "a b c", "a b c d"] {
        h.clock.advance(10);
        assert!(!live.update(text).await.unwrap(), "{text} coalesced");
    }
    assert_eq!(
        live.coalesced(),
        Some("a b c d"),
        "only the latest text waits"
    );
    assert_eq!(
        h.platform.messages("room-1")[0].edits,
        0,
        "no edit went out yet"
    );
    h.clock.advance(200);
    assert!(live.update("a b c d e").await.unwrap());
    assert_eq!(
        h.platform.messages("room-1")[0].edits,
        1,
        "one edit for the burst"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_preview_gets_a_fresh_final_and_is_cleaned_up() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let live_options = LiveOptions {
        stale_after_ms: 1_000,
    };
    let mut live = messenger
        .begin_live(message("s", ""), opts(), live_options)
        .await
        .unwrap();
    live.update("thinking…").await.unwrap();
    let preview_id = h.platform.messages("room-1")[0].id.clone();
    h.clock.advance(5_000);
    let report = live.finalize(message("s", "the answer")).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 1);
    assert_ne!(
        landed[0].id, preview_id,
        "a fresh final, not the old preview"
    );
    assert_eq!(landed[0].text, "the answer");
    assert!(
        h.platform
            .log()
            .iter()
            .any(|e| e.event == LogEvent::Deleted && e.message_id == preview_id),
        "preview cleaned up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_target_mismatch_cancels_the_preview_and_delivers_normally() {
    let h = Harness::new().await;
    let question = h
        .platform
        .inject_inbound(
            "room-1",
            clawgate_channel_qa::InboundRequest {
                text: "question?".into(),
                author_id: "alice".into(),
                author_is_bot: false,
                thread_id: None,
                reply_to_id: None,
                metadata: None,
            },
        )
        .unwrap();
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("r", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("draft").await.unwrap();
    let preview = h.platform.messages("room-1")[1].id.clone();
    let mut reply = message("r", "the answer, as a reply");
    reply.relation = Some(MessageRelation::Reply {
        inbound_message_id: Some(question.id.clone()),
        reply_to_id: Some(question.id.clone()),
        thread_id: None,
        quote: None,
    });
    let report = live.finalize(reply).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    assert!(
        h.platform
            .log()
            .iter()
            .any(|e| e.event == LogEvent::Deleted && e.message_id == preview),
        "the preview (not a reply) was cancelled"
    );
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 2, "the question and one final");
    assert_eq!(
        landed[1].reply_to_id.as_deref(),
        Some(question.id.as_str()),
        "delivered normally, as a reply"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_left_by_a_crash_is_cleaned_by_recovery() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("x", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("half an ans").await.unwrap();
    let id = {
        let preview = h.platform.messages("room-1");
        assert_eq!(preview.len(), 1, "visible before the crash");
        preview[0].id.clone()
    };
    drop(live); // The process dies mid-stream.
    // A restarted gateway (another worker) recovers once the dead worker's claim expired.
    let restarted = h.messenger(Arc::new(h.adapter()));
    h.clock.advance(3 * 60_000);
    restarted.recover().await.unwrap();
    assert!(
        h.platform.messages("room-1").is_empty(),
        "the preview {id} is not orphaned"
    );
    let cancelled = h
        .store
        .list_intents(&clawgate_store::IntentFilter {
            statuses: vec![IntentStatus::Cancelled],
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        cancelled.len(),
        1,
        "the streamed intent without a final is cancelled (the turn replays)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_streaming_and_preview_streaming_never_deliver_the_same_text() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("b", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("First para").await.unwrap();
    let preview = h.platform.messages("room-1")[0].id.clone();
    live.deliver_block("First paragraph. ").await.unwrap();
    assert!(
        h.platform
            .log()
            .iter()
            .any(|e| e.event == LogEvent::Deleted && e.message_id == preview),
        "the preview goes when its text is delivered as a block"
    );
    live.deliver_block("Second paragraph. ").await.unwrap();
    let report = live
        .finalize(message("b", "First paragraph. Second paragraph. The end."))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let texts: Vec<String> = h
        .platform
        .messages("room-1")
        .into_iter()
        .map(|m| m.text)
        .collect();
    assert_eq!(
        texts,
        vec!["First paragraph. ", "Second paragraph. ", "The end."],
        "each text once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_fully_delivered_as_blocks_sends_nothing_more() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("f", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.deliver_block("All of it.").await.unwrap();
    let report = live.finalize(message("f", "All of it.")).await.unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 1, "not repeated by the final");
    assert_eq!(
        receipt.platform_message_ids,
        vec![landed[0].id.clone()],
        "the receipt names the block"
    );
}
