//! Live previews by thread shape: a native stream in a thread (to the person who asked, in a
//! channel), a draft message edited in place where no stream fits (a top-level DM falls back),
//! finalized in place; a final in another thread, too long for an edit, or past the edit
//! window is sent fresh and the preview removed.

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_slack::simulator::ConversationKind;
use clawgate_messages::{LiveOptions, SendOptions, SendOutcome};

use crate::peer::Peer;
use crate::send::{ctx, engine, text};

fn methods(peer: &Peer) -> Vec<String> {
    peer.sim
        .calls()
        .into_iter()
        .filter(|c| c.method != "auth.test")
        .map(|c| c.method)
        .collect()
}

/// Streams a reply of three updates into `target` and finalizes it with `final_text`.
async fn stream_reply(peer: &Peer, target: &MessageTarget, final_text: &str) {
    let (_dir, messenger, clock) = engine(peer);
    let message = |text: &str| ChannelMessage::outbound("reply-1", "slack", target.clone(), text);
    let mut live = messenger
        .begin_live(message(""), SendOptions::default(), LiveOptions::default())
        .await
        .unwrap();
    for text in ["Hel", "Hello", "Hello, wor"] {
        live.update(text).await.unwrap();
        clock.advance(1_000);
    }
    let report = live.finalize(message(final_text)).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_top_level_dm_falls_back_from_native_stream_to_a_draft_preview() {
    let peer = Peer::start().await;
    let dm = peer.sim.dm(&peer.person);
    stream_reply(&peer, &MessageTarget::direct(&dm), "Hello, world").await;
    let calls = methods(&peer);
    assert!(!calls.iter().any(|m| m.contains("Stream")), "{calls:?}");
    assert_eq!(calls[0], "chat.postMessage");
    assert!(calls[1..].iter().all(|m| m == "chat.update"), "{calls:?}");
    let messages = peer.sim.messages(&dm);
    assert_eq!(messages.len(), 1, "the preview became the final");
    assert_eq!(messages[0].text, "Hello, world");
    assert_eq!(
        messages[0].thread_ts, None,
        "at top level, where the question was"
    );
    // The final carries the final's key, not the preview's.
    let key = messages[0].metadata.as_ref().unwrap()["event_payload"]["key"].clone();
    assert!(!key.as_str().unwrap().contains("~preview"), "{key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_thread_streams_natively_and_the_stop_becomes_the_final() {
    let peer = Peer::start().await;
    let dm = peer.sim.dm(&peer.person);
    let question = peer.sim.person_writes(&dm, &peer.person, "question", None);
    let target = MessageTarget::direct(&dm).with_thread_id(Some(question.ts.clone()));
    stream_reply(&peer, &target, "Hello, world").await;
    let calls = methods(&peer);
    assert_eq!(
        calls.first().map(String::as_str),
        Some("chat.startStream"),
        "{calls:?}"
    );
    assert!(calls.contains(&"chat.appendStream".to_owned()), "{calls:?}");
    assert_eq!(
        calls.last().map(String::as_str),
        Some("chat.stopStream"),
        "{calls:?}"
    );
    assert!(!calls.contains(&"chat.postMessage".to_owned()), "{calls:?}");
    let ours: Vec<_> = peer
        .sim
        .messages(&dm)
        .into_iter()
        .filter(|m| m.from_self)
        .collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0].text, "Hello, world");
    assert_eq!(ours[0].streaming, Some(false), "stopped");
    assert_eq!(ours[0].thread_ts.as_deref(), Some(question.ts.as_str()));
    assert!(
        ours[0].metadata.is_some(),
        "stopStream set the final's metadata"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_thread_streams_to_the_person_who_asked_and_without_one_drafts() {
    let peer = Peer::start().await;
    let room = peer
        .sim
        .create_conversation("room", ConversationKind::Public, true);
    let question = peer
        .sim
        .person_writes(&room, &peer.person, "question", None);
    // The receiver learns who asked in this thread.
    let inbound = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(&peer.last_event())
        .unwrap();
    assert_eq!(
        inbound.message.target.thread_id.as_deref(),
        Some(question.ts.as_str())
    );
    stream_reply(&peer, &inbound.message.target, "Hello, world").await;
    let start = peer
        .sim
        .calls()
        .into_iter()
        .find(|c| c.method == "chat.startStream")
        .expect("a native stream");
    assert_eq!(start.args["recipient_user_id"], peer.person.as_str());
    assert_eq!(start.args["recipient_team_id"], peer.sim.team_id().as_str());
    assert_eq!(start.args["thread_ts"], question.ts.as_str());
    // A thread nobody asked in (as far as this process knows): a draft preview.
    let other = peer.sim.person_writes(&room, &peer.person, "another", None);
    let unknown = MessageTarget::group(&room).with_thread_id(Some(other.ts.clone()));
    let before = peer.sim.calls().len();
    stream_reply(&peer, &unknown, "Hello, again").await;
    let later: Vec<String> = peer.sim.calls()[before..]
        .iter()
        .map(|c| c.method.clone())
        .collect();
    assert!(!later.iter().any(|m| m.contains("Stream")), "{later:?}");
    let texts = peer.texts(&room);
    assert_eq!(texts, ["Hello, world", "Hello, again"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_that_rewrites_the_stream_is_edited_in_after_the_stop() {
    let peer = Peer::start().await;
    let dm = peer.sim.dm(&peer.person);
    let question = peer.sim.person_writes(&dm, &peer.person, "question", None);
    let target = MessageTarget::direct(&dm).with_thread_id(Some(question.ts.clone()));
    stream_reply(&peer, &target, "Goodbye").await;
    let calls = methods(&peer);
    assert_eq!(
        &calls[calls.len() - 2..],
        ["chat.stopStream", "chat.update"],
        "{calls:?}"
    );
    let ours: Vec<String> = peer.texts(&dm);
    assert_eq!(ours, ["Goodbye"]);
}

#[tokio::test]
async fn mismatched_too_long_or_closed_previews_give_a_fresh_final_and_go() {
    let peer = Peer::start().await;
    let live = peer.plugin.sender.live().unwrap();
    let room = peer
        .sim
        .create_conversation("room", ConversationKind::Public, true);
    let a = peer.sim.person_writes(&room, &peer.person, "a", None);
    let b = peer.sim.person_writes(&room, &peer.person, "b", None);
    let in_a = MessageTarget::group(&room).with_thread_id(Some(a.ts.clone()));
    let in_b = MessageTarget::group(&room).with_thread_id(Some(b.ts.clone()));
    let cases: [(&str, MessageTarget, String, bool); 3] = [
        ("thread", in_b, "final".into(), false),
        ("too-long", in_a.clone(), "y".repeat(4_001), false),
        ("closed", in_a.clone(), "final".into(), true),
    ];
    for (name, final_target, final_text, close) in cases {
        let preview = live
            .show(&ctx(&in_a, &format!("{name}~preview")), &text("draft"))
            .await
            .unwrap();
        if close {
            peer.sim
                .close_edit_window(&room, &preview.platform_message_id);
        }
        let part = live
            .finalize(&ctx(&final_target, name), &preview, &text(&final_text))
            .await
            .unwrap();
        assert_ne!(
            part.platform_message_id, preview.platform_message_id,
            "{name}"
        );
        let visible: Vec<String> = peer.sim.messages(&room).into_iter().map(|m| m.ts).collect();
        assert!(
            !visible.contains(&preview.platform_message_id),
            "{name}: the preview went"
        );
        assert!(visible.contains(&part.platform_message_id), "{name}");
        assert_eq!(part.thread_id, final_target.thread_id, "{name}");
    }
    assert!(peer.texts(&room).iter().all(|t| t != "draft"));
}

#[tokio::test]
async fn a_stream_stopped_by_the_person_still_ends_as_the_final() {
    let peer = Peer::start().await;
    let live = peer.plugin.sender.live().unwrap();
    let dm = peer.sim.dm(&peer.person);
    let question = peer.sim.person_writes(&dm, &peer.person, "question", None);
    let target = MessageTarget::direct(&dm).with_thread_id(Some(question.ts.clone()));
    let c = ctx(&target, "stopped~preview");
    let preview = live.show(&c, &text("Hel")).await.unwrap();
    peer.sim
        .stop_stream_by_user(&dm, &preview.platform_message_id);
    // Appends after the stop are refused by Slack; the preview stays as it is.
    live.replace(&c, &preview, &text("Hello")).await.unwrap();
    let part = live
        .finalize(&ctx(&target, "stopped"), &preview, &text("Hello, world"))
        .await
        .unwrap();
    assert_eq!(part.platform_message_id, preview.platform_message_id);
    assert_eq!(peer.texts(&dm), ["Hello, world"]);
}

#[tokio::test]
async fn a_stream_whose_start_answer_was_lost_is_found_as_the_threads_one_open_stream() {
    use clawgate_channel_slack::simulator::{Fault, FaultKind};
    let peer = Peer::start().await;
    let adapter = peer.plugin.sender.clone();
    let live = adapter.live().unwrap();
    let dm = peer.sim.dm(&peer.person);
    let question = peer.sim.person_writes(&dm, &peer.person, "question", None);
    let target = MessageTarget::direct(&dm).with_thread_id(Some(question.ts.clone()));
    // A finished reply of ours in the same thread carries metadata: not a candidate.
    adapter
        .send_unit(&ctx(&target, "earlier"), &text("earlier answer"))
        .await
        .unwrap();
    peer.sim
        .inject(Fault::on("chat.startStream", FaultKind::LoseAnswer));
    let preview_ctx = ctx(&target, "reply~preview");
    let error = live.show(&preview_ctx, &text("Hel")).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let stream = peer
        .sim
        .messages(&dm)
        .into_iter()
        .find(|m| m.streaming == Some(true))
        .unwrap();
    let Reconciliation::Sent(part) = adapter
        .reconcile_unknown_send(&preview_ctx, &text(""))
        .await
        .unwrap()
    else {
        panic!("the open stream is the preview");
    };
    assert_eq!(part.platform_message_id, stream.ts);
    // Found, it finalizes like any stream preview.
    live.finalize(&ctx(&target, "reply"), &part, &text("Hello"))
        .await
        .unwrap();
    assert_eq!(peer.texts(&dm), ["earlier answer", "Hello"]);
    // Two open streams in one thread prove nothing.
    for key in ["a~preview", "b~preview"] {
        live.show(&ctx(&target, key), &text("x")).await.unwrap();
    }
    assert_eq!(
        adapter
            .reconcile_unknown_send(&ctx(&target, "c~preview"), &text(""))
            .await
            .unwrap(),
        Reconciliation::Unresolved
    );
}
