//! Live previews against the QA platform: finalize in place, edit coalescing, stale and
//! reply-target fallbacks, recovery that never leaves a preview dangling, and media streamed
//! mid-reply that the final (in place, fresh, or recovered after a crash) never repeats.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use clawgate_channel_qa::{Fault, LogEvent, QaAdapter};
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageOriginAdapter, Reconciliation, SendContext, SendError,
};
use clawgate_messages::{LiveOptions, SendOptions, SendOutcome};
use clawgate_store::IntentStore;
use clawgate_types::{
    ChannelMessage, IntentStatus, MessageAttachment, MessageCapabilities, MessagePartKind,
    MessageReceiptPart, MessageRelation, RenderedMessageUnit,
};

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
    reply.relation = Some(MessageRelation::reply_to_inbound(question.id.clone()));
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
    let cancelled = h.intents_with(IntentStatus::Cancelled).await;
    assert_eq!(
        cancelled.len(),
        1,
        "the streamed intent without a final is cancelled (the turn replays)"
    );
}

/// A turn asking about its stream while a recovery pass of the same engine is ending it (the
/// passes run beside the turns) gets the pass's outcome — the stream ended — not the intent as
/// it was before the pass, which would look still open and fail the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_asking_while_a_pass_ends_its_stream_sees_it_ended() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("p", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("half an ans").await.unwrap();
    drop(live); // The process dies mid-stream.
    let id = h.intents().await.remove(0).id;
    let restarted = h.messenger(Arc::new(h.adapter()));
    h.clock.advance(3 * 60_000);
    // Removing the preview takes the platform a while: the pass holds the intent meanwhile.
    h.platform
        .inject(clawgate_channel_qa::Fault::delay_after_accept(1, 500));
    let pass = {
        let restarted = restarted.clone();
        tokio::spawn(async move { restarted.recover().await.unwrap() })
    };
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let seen = restarted.recover_intent(&id).await.unwrap().unwrap();
    assert_eq!(
        seen.status,
        IntentStatus::Cancelled,
        "the turn sees the stream ended by the pass"
    );
    assert_eq!(pass.await.unwrap().abandoned, 1);
    assert!(h.platform.messages("room-1").is_empty());
}

/// The claim token of a process that has exited, on this machine: `worker`'s token with the
/// pid and start time of a child that is gone.
fn token_of_a_dead_process(worker: &clawgate_store::ClaimToken) -> clawgate_store::ClaimToken {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let fields: Vec<&str> = worker.as_str().rsplitn(5, '/').collect();
    let [unique, _ticks, _pid, machine, name] = fields[..] else {
        panic!("a token has five fields: {}", worker.as_str())
    };
    clawgate_store::ClaimToken(format!("{name}/{machine}/{pid}/12345/{unique}-dead"))
}

/// Right after a restart, a replayed turn asks about its stream while the killed process's
/// claim still holds it (the first recovery pass, running beside the turns, has not released
/// it yet): the turn's own look releases the dead holder's claim and ends the stream, rather
/// than failing the turn as "still streaming elsewhere" until the next pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_asking_about_a_stream_a_dead_process_holds_ends_it() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("d", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("half an ans").await.unwrap();
    drop(live); // The process dies mid-stream...
    let id = h.intents().await.remove(0).id;
    // ...holding the intent's claim, which has not expired.
    h.store
        .release_claims_held_by(messenger.worker())
        .await
        .unwrap();
    let dead = token_of_a_dead_process(messenger.worker());
    let claim = clawgate_store::Claim {
        token: dead,
        now: clawgate_types::clock::Clock::now_ms(&*h.clock),
        ttl_ms: 120_000,
    };
    assert!(h.store.claim_intent(&id, &claim).await.unwrap().is_some());
    let restarted = h.messenger(Arc::new(h.adapter()));
    let seen = restarted.recover_intent(&id).await.unwrap().unwrap();
    assert_eq!(
        seen.status,
        IntentStatus::Cancelled,
        "the stream the dead process left is ended at once"
    );
    assert!(
        h.platform.messages("room-1").is_empty(),
        "its preview is gone"
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

const CAT: &str = "https://files.example/cat.png";
const DOG: &str = "https://files.example/dog.png";

fn image(url: &str) -> MessageAttachment {
    let mut attachment = MessageAttachment::new(MessagePartKind::Media)
        .with_url(url)
        .with_mime_type("image/png");
    attachment.file_name = url.rsplit('/').next().map(str::to_owned);
    attachment
}

fn with_images(mut message: ChannelMessage, urls: &[&str]) -> ChannelMessage {
    message.attachments = urls.iter().map(|url| image(url)).collect();
    message
}

/// How many times the platform log shows `event` for this message.
fn events(h: &Harness, event: LogEvent, message_id: &str) -> usize {
    h.platform
        .log()
        .iter()
        .filter(|e| e.event == event && e.message_id == message_id)
        .count()
}

fn sends(h: &Harness) -> usize {
    h.platform
        .log()
        .iter()
        .filter(|e| e.event == LogEvent::Sent)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn media_streamed_mid_reply_is_not_repeated_by_a_final_made_in_place() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("m", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("Here is").await.unwrap();
    let preview = h.platform.messages("room-1")[0].id.clone();
    live.deliver_media(image(CAT)).await.unwrap();
    let landed = h.platform.messages("room-1");
    assert_eq!(
        landed.len(),
        2,
        "the image went out at once, as its own message"
    );
    let cat = landed[1].id.clone();
    assert_eq!(landed[1].attachments[0].url, CAT);
    assert_eq!(
        (landed[0].id.as_str(), landed[0].text.as_str()),
        (preview.as_str(), "Here is"),
        "the text preview is untouched"
    );
    h.clock.advance(250);
    assert!(
        live.update("Here is the cat").await.unwrap(),
        "the preview still streams"
    );

    h.clock.advance(250);
    let full = with_images(message("m", "Here is the cat you asked for."), &[CAT]);
    let report = live.finalize(full).await.unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let landed = h.platform.messages("room-1");
    assert_eq!(
        landed.len(),
        2,
        "the preview became the final; the image is there once"
    );
    assert_eq!(
        (landed[0].id.as_str(), landed[0].text.as_str()),
        (preview.as_str(), "Here is the cat you asked for."),
        "finalized in place with the full text"
    );
    assert!(
        landed[0].attachments.is_empty(),
        "the final did not attach the image again"
    );
    assert_eq!(landed[1].id, cat);
    assert_eq!(
        h.platform.landed_with_attachment(CAT),
        1,
        "the image was sent once"
    );
    assert_eq!(
        sends(&h),
        2,
        "one preview, one image: nothing else was sent"
    );
    assert_eq!(
        events(&h, LogEvent::Deleted, &preview),
        0,
        "the preview was not cancelled"
    );
    assert_eq!(events(&h, LogEvent::Deleted, &cat), 0);
    assert_eq!(
        receipt.platform_message_ids,
        vec![preview.clone(), cat.clone()],
        "the final's receipt names its text and the streamed image"
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
async fn a_final_with_media_not_streamed_sends_only_that_and_cancels_the_preview() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("n", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("Two pictures").await.unwrap();
    let preview = h.platform.messages("room-1")[0].id.clone();
    live.deliver_media(image(CAT)).await.unwrap();
    let cat = h.platform.messages("room-1")[1].id.clone();

    let text = "Two pictures: a cat and a dog.";
    let full = with_images(message("n", text), &[CAT, DOG]);
    let report = live.finalize(full).await.unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(
        h.platform.landed_with_attachment(CAT),
        1,
        "the streamed image is not sent again"
    );
    assert_eq!(
        h.platform.landed_with_attachment(DOG),
        1,
        "the other one is delivered"
    );
    assert_eq!(
        events(&h, LogEvent::Deleted, &preview),
        1,
        "media the preview cannot become: the preview is cancelled"
    );
    assert_eq!(
        events(&h, LogEvent::Deleted, &cat),
        0,
        "streamed media is content, never removed"
    );
    assert_eq!(
        h.platform.landed_with_text(text),
        1,
        "the final text once, delivered normally"
    );
    let landed = h.platform.messages("room-1");
    let shown: Vec<(&str, Vec<&str>)> = landed
        .iter()
        .map(|m| {
            let urls = m.attachments.iter().map(|a| a.url.as_str()).collect();
            (m.text.as_str(), urls)
        })
        .collect();
    assert_eq!(
        shown,
        vec![("", vec![CAT]), (text, vec![]), ("", vec![DOG])]
    );
    assert_eq!(sends(&h), 4, "preview, cat, final text, dog");
    assert_eq!(
        receipt.platform_message_ids,
        vec![landed[1].id.clone(), landed[2].id.clone(), cat],
        "the final's own units, then the streamed image"
    );
}

/// Stops the first platform call after it is armed, for good: the process "dies" there.
struct Gate {
    inner: QaAdapter,
    armed: AtomicBool,
    reached: tokio::sync::Notify,
}

impl Gate {
    async fn hold(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.reached.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl ChannelMessageAdapter for Gate {
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
        self.hold().await;
        self.inner.send_unit(ctx, unit).await
    }
    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.hold().await;
        self.inner.edit(ctx, part, unit).await
    }
    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        self.hold().await;
        self.inner.delete(ctx, part).await
    }
    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        self.hold().await;
        self.inner.reconcile_unknown_send(ctx, unit).await
    }
    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        self.inner.origin()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_recovered_after_a_crash_neither_repeats_nor_removes_streamed_media() {
    // (case, preview age at the final): in place, the crash comes at the edit (`sending`) and
    // recovery makes the edit again (the preview becomes the final); stale, at the preview's
    // removal before a fresh final (`pending`), and recovery removes it and sends the final.
    for (case, age) in [("in place", 250), ("stale preview", 120_000)] {
        let in_place = age < 60_000;
        let h = Harness::new().await;
        let gate = Arc::new(Gate {
            inner: h.adapter(),
            armed: AtomicBool::new(false),
            reached: tokio::sync::Notify::new(),
        });
        let messenger = h.messenger(gate.clone());
        let mut live = messenger
            .begin_live(message("k", ""), opts(), LiveOptions::default())
            .await
            .unwrap();
        live.update("Here is").await.unwrap();
        let preview = h.platform.messages("room-1")[0].id.clone();
        live.deliver_media(image(CAT)).await.unwrap();
        let cat = h.platform.messages("room-1")[1].id.clone();
        h.clock.advance(age);

        // The final is recorded, then the process dies at its first platform call.
        gate.armed.store(true, Ordering::SeqCst);
        let text = "Here is the cat you asked for.";
        let full = with_images(message("k", text), &[CAT]);
        tokio::select! {
            biased;
            () = gate.reached.notified() => {}
            report = live.finalize(full) => panic!("{case}: the final got through: {report:?}"),
        }
        assert_eq!(
            h.platform.landed_with_text(text),
            0,
            "{case}: the final was not delivered"
        );
        let recorded = h.intents().await;
        assert_eq!(recorded.len(), 1, "{case}");
        assert!(
            recorded[0].batch.is_some(),
            "{case}: the final was recorded"
        );

        // A restarted gateway recovers once the dead worker's claim expired.
        let restarted = h.messenger(Arc::new(h.adapter()));
        h.clock.advance(3 * 60_000);
        let report = restarted.recover().await.unwrap();
        assert_eq!(report.committed, 1, "{case}: {report:?}");

        assert_eq!(
            h.platform.landed_with_attachment(CAT),
            1,
            "{case}: the image is not repeated"
        );
        assert_eq!(
            events(&h, LogEvent::Deleted, &cat),
            0,
            "{case}: nor removed"
        );
        assert_eq!(
            events(&h, LogEvent::Deleted, &preview),
            usize::from(!in_place),
            "{case}: the preview becomes the final in place, or is cleaned up"
        );
        assert_eq!(
            h.platform.landed_with_text(text),
            usize::from(!in_place),
            "{case}: the final lands once as a message of its own, or as the preview's edit"
        );
        let landed = h.platform.messages("room-1");
        assert_eq!(landed.len(), 2, "{case}: {landed:?}");
        let (final_message, image) = if in_place {
            assert_eq!(landed[0].id, preview, "{case}: the preview is the final");
            (&landed[0], &landed[1])
        } else {
            (&landed[1], &landed[0])
        };
        assert_eq!(image.id, cat, "{case}");
        assert_eq!(
            (final_message.text.as_str(), final_message.attachments.len()),
            (text, 0),
            "{case}: the final carries the text only"
        );
        let intent = h.store.load_intent(&recorded[0].id).await.unwrap().unwrap();
        assert_eq!(intent.status, IntentStatus::Sent, "{case}");
        assert_eq!(
            intent.receipt.unwrap().platform_message_ids,
            vec![final_message.id.clone(), cat],
            "{case}: the receipt names the final and the streamed image"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_cut_off_mid_edit_is_edited_in_again_even_without_idempotency_keys() {
    // A platform without idempotency keys (Telegram) cannot settle a lost send, but an edit
    // repeated is harmless: the final interrupted while it replaced its preview is finished by
    // editing again, never parked as unknown and never sent as a second message.
    let h = Harness::new().await;
    let gate = Arc::new(Gate {
        inner: h.plain_adapter(),
        armed: AtomicBool::new(false),
        reached: tokio::sync::Notify::new(),
    });
    let messenger = h.messenger(gate.clone());
    let mut live = messenger
        .begin_live(message("e", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("The answer").await.unwrap();
    let preview = h.platform.messages("room-1")[0].id.clone();
    h.clock.advance(250);
    gate.armed.store(true, Ordering::SeqCst);
    let text = "The answer is 42.";
    tokio::select! {
        biased;
        () = gate.reached.notified() => {}
        report = live.finalize(message("e", text)) => panic!("the final got through: {report:?}"),
    }
    let recorded = h.intents().await;
    assert_eq!(
        recorded[0].status,
        IntentStatus::Sending,
        "cut off mid-edit"
    );

    let restarted = h.messenger(Arc::new(h.plain_adapter()));
    h.clock.advance(3 * 60_000);
    let report = restarted.recover().await.unwrap();
    assert_eq!(report.committed, 1, "{report:?}");
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 1, "{landed:?}");
    assert_eq!(
        (landed[0].id.as_str(), landed[0].text.as_str()),
        (preview.as_str(), text)
    );
    assert_eq!(h.platform.landed_with_text(text), 0, "no second message");
    assert_eq!(events(&h, LogEvent::Deleted, &preview), 0);
    let intent = h.store.load_intent(&recorded[0].id).await.unwrap().unwrap();
    assert_eq!(intent.status, IntentStatus::Sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_cut_off_while_it_cancels_a_preview_answering_elsewhere_is_not_edited_in() {
    // The final answers another message than the preview: the live path removes the preview
    // and sends the final fresh. A crash in between must not let recovery edit the final into
    // the preview, which would show it answering the wrong message.
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
    let gate = Arc::new(Gate {
        inner: h.adapter(),
        armed: AtomicBool::new(false),
        reached: tokio::sync::Notify::new(),
    });
    let messenger = h.messenger(gate.clone());
    // Not stale when recovery comes (after the dead worker's claim expired).
    let fresh = LiveOptions {
        stale_after_ms: 60 * 60_000,
    };
    let mut live = messenger
        .begin_live(message("m", ""), opts(), fresh)
        .await
        .unwrap();
    live.update("draft").await.unwrap();
    let preview = h.platform.messages("room-1")[1].id.clone();
    let mut reply = message("m", "the answer, as a reply");
    reply.relation = Some(MessageRelation::reply_to_inbound(question.id.clone()));
    gate.armed.store(true, Ordering::SeqCst);
    tokio::select! {
        biased;
        () = gate.reached.notified() => {}
        report = live.finalize(reply) => panic!("the final got through: {report:?}"),
    }
    let restarted = h.messenger(Arc::new(h.adapter()));
    h.clock.advance(3 * 60_000);
    restarted.recover().await.unwrap();
    assert_eq!(events(&h, LogEvent::Edited, &preview), 0, "not edited in");
    assert_eq!(
        events(&h, LogEvent::Deleted, &preview),
        1,
        "the preview is removed"
    );
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 2, "the question and one final: {landed:?}");
    assert_eq!(landed[1].text, "the answer, as a reply");
    assert_eq!(landed[1].reply_to_id.as_deref(), Some(question.id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_media_without_a_final_stays_when_recovery_cancels_the_stream() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("w", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.deliver_media(image(CAT)).await.unwrap();
    live.update("and some text").await.unwrap();
    let [cat, preview] = [0, 1].map(|n| h.platform.messages("room-1")[n].id.clone());
    drop(live); // The process dies mid-stream, before any final.
    let restarted = h.messenger(Arc::new(h.adapter()));
    h.clock.advance(3 * 60_000);
    restarted.recover().await.unwrap();
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 1, "{landed:?}");
    assert_eq!(landed[0].id, cat, "the image is content: it stays");
    assert_eq!(
        events(&h, LogEvent::Deleted, &preview),
        1,
        "the preview does not"
    );
    let cancelled = h.intents_with(IntentStatus::Cancelled).await;
    assert_eq!(
        cancelled.len(),
        1,
        "no final: the stream is cancelled (the turn replays)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_of_streamed_media_only_sends_nothing_more() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("o", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.update("drawing…").await.unwrap();
    let preview = h.platform.messages("room-1")[0].id.clone();
    live.deliver_media(image(CAT)).await.unwrap();
    live.deliver_media(image(CAT)).await.unwrap();
    assert_eq!(
        h.platform.landed_with_attachment(CAT),
        1,
        "streamed once per identity"
    );
    let mut only_media = with_images(message("o", ""), &[CAT]);
    only_media.body = None;
    let report = live.finalize(only_media).await.unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    let landed = h.platform.messages("room-1");
    assert_eq!(landed.len(), 1, "{landed:?}");
    assert_eq!(landed[0].attachments[0].url, CAT);
    assert_eq!(
        events(&h, LogEvent::Deleted, &preview),
        1,
        "its text is not the final's"
    );
    assert_eq!(
        sends(&h),
        2,
        "the preview and the image; the final sent nothing"
    );
    assert_eq!(receipt.platform_message_ids, vec![landed[0].id.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_streaming_with_media_sends_each_block_and_image_once() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("q", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    live.deliver_block("First. ").await.unwrap();
    live.deliver_media(image(CAT)).await.unwrap();
    live.deliver_block("Second.").await.unwrap();
    let report = live
        .finalize(with_images(message("q", "First. Second."), &[CAT, DOG]))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let shown: Vec<(String, usize)> = h
        .platform
        .messages("room-1")
        .into_iter()
        .map(|m| (m.text, m.attachments.len()))
        .collect();
    assert_eq!(
        shown,
        vec![
            ("First. ".to_owned(), 0),
            (String::new(), 1),
            ("Second.".to_owned(), 0),
            (String::new(), 1)
        ],
        "blocks and the streamed image once each; the final adds only the new image"
    );
    assert_eq!(h.platform.landed_with_attachment(CAT), 1);
    assert_eq!(h.platform.landed_with_attachment(DOG), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_dies_before_its_final_is_never_delivered_by_recovery() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let live = messenger
        .begin_live(message("nf", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    // From its first durable instant the intent says it has no final.
    let recorded = h.intents().await;
    assert_eq!(recorded.len(), 1);
    assert!(
        recorded[0].awaits_final() && recorded[0].batch.is_none(),
        "recorded without a final: {:?}",
        recorded[0]
    );
    drop(live); // The process dies before the agent produced any text.
    let restarted = h.messenger(Arc::new(h.adapter()));
    h.clock.advance(3 * 60_000);
    let report = restarted.recover().await.unwrap();
    assert_eq!(
        (report.abandoned, report.committed),
        (1, 0),
        "cancelled, not \"delivered\": {report:?}"
    );
    assert!(
        h.platform.messages("room-1").is_empty(),
        "nothing was sent: {:?}",
        h.platform.messages("room-1")
    );
    assert_eq!(h.intents_with(IntentStatus::Cancelled).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_that_landed_before_its_record_is_found_by_its_key_and_removed() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let live = messenger
        .begin_live(message("lost", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    let key = h.intents().await[0].idempotency_key.clone();
    // The preview's POST lands under the preview's own key, then the process dies before
    // the live state records it.
    let landed: serde_json::Value = reqwest::Client::new()
        .post(format!(
            "{}/api/conversations/room-1/messages",
            h.platform.base_url()
        ))
        .bearer_auth(h.platform.token())
        .json(&serde_json::json!({ "text": "echo:", "idempotencyKey": format!("{key}~preview#0") }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(landed["ok"], true, "{landed}");
    drop(live);
    let restarted = h.messenger(Arc::new(h.adapter()));
    h.clock.advance(3 * 60_000);
    let report = restarted.recover().await.unwrap();
    assert_eq!(report.abandoned, 1, "{report:?}");
    assert!(
        h.platform.messages("room-1").is_empty(),
        "the unrecorded preview is removed: {:?}",
        h.platform.messages("room-1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_whose_answer_was_lost_becomes_the_final_instead_of_standing_beside_it() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let mut live = messenger
        .begin_live(message("drop", ""), opts(), LiveOptions::default())
        .await
        .unwrap();
    h.platform.inject(Fault::drop_after_accept(1));
    assert!(
        live.update("echo: hi w1").await.unwrap(),
        "the preview landed; asking by its key finds it"
    );
    assert_eq!(h.platform.messages("room-1").len(), 1);
    h.clock.advance(250);
    let report = live
        .finalize(message("drop", "echo: hi w1 w2"))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let landed = h.platform.messages("room-1");
    assert_eq!(
        landed.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(),
        vec!["echo: hi w1 w2"],
        "one message: the preview finalized in place"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_final_waits_while_the_platform_refuses_to_remove_the_preview() {
    let h = Harness::new().await;
    let messenger = h.messenger(Arc::new(h.adapter()));
    let live_options = LiveOptions {
        stale_after_ms: 1_000,
    };
    let mut live = messenger
        .begin_live(message("stuck", ""), opts(), live_options)
        .await
        .unwrap();
    live.update("thinking…").await.unwrap();
    // Stale: the final is sent fresh, once the preview is gone — but its delete fails.
    h.clock.advance(5_000);
    h.platform.inject(Fault::status(1, 500, "internal"));
    let report = live.finalize(message("stuck", "the answer")).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    let texts = |h: &Harness| {
        h.platform
            .messages("room-1")
            .into_iter()
            .map(|m| m.text)
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&h), ["thinking…"], "no final beside the preview");
    h.clock.advance(60_000);
    messenger.recover().await.unwrap();
    assert_eq!(
        texts(&h),
        ["the answer"],
        "the preview removed, then the final delivered"
    );
    assert_eq!(h.intents_with(IntentStatus::Sent).await.len(), 1);
}
