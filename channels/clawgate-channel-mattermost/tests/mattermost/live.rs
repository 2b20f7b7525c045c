//! The test plan's Mattermost line, "draft finalization and fresh-send fallback": the live
//! adapter owns a draft post, patched in place as the reply streams (progress and tool lines
//! grouped above the text), finalized in place; when the draft was deleted or the patch is
//! refused, the final is sent fresh and no draft is left behind.

use clawgate_channel_mattermost::KEY_PROP;
use clawgate_channel_mattermost::simulator::{Fault, FaultKind, Route};
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{LiveOptions, SendOptions, SendOutcome};
use serde_json::json;

use crate::peer::Peer;
use crate::send::{ctx, engine};

/// Streams "Hel", "Hello", "Hello, wor" into `target` through the engine, runs `between`
/// (what happens to the draft meanwhile), and finalizes with `final_text`.
async fn stream_reply(
    peer: &Peer,
    target: &MessageTarget,
    final_text: &str,
    between: impl FnOnce(&Peer),
) {
    let (_dir, messenger, clock) = engine(peer);
    let message =
        |text: &str| ChannelMessage::outbound("reply-1", "mattermost", target.clone(), text);
    let mut live = messenger
        .begin_live(message(""), SendOptions::default(), LiveOptions::default())
        .await
        .unwrap();
    for text in ["Hel", "Hello", "Hello, wor"] {
        live.update(text).await.unwrap();
        clock.advance(1_000);
    }
    between(peer);
    let report = live.finalize(message(final_text)).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
}

fn methods(peer: &Peer) -> Vec<String> {
    peer.sim
        .calls()
        .into_iter()
        .filter(|c| c.path != "/api/v4/users/me")
        .map(|c| {
            format!(
                "{} {}",
                c.method,
                c.path.rsplit('/').next().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_draft_is_patched_as_the_reply_streams_and_finalized_in_place() {
    let peer = Peer::start().await;
    let channel = peer.channel("draft");
    let question = peer
        .sim
        .person_writes(&channel, &peer.person, "question", None);
    let target = MessageTarget::group(&channel).with_thread_id(Some(question.id.clone()));
    stream_reply(&peer, &target, "Hello, world", |_| {}).await;
    let calls = methods(&peer);
    assert_eq!(calls[0], "POST posts", "{calls:?}");
    assert!(calls[1..].iter().all(|c| c == "PUT patch"), "{calls:?}");
    assert_eq!(
        calls.len(),
        4,
        "one create, two stream patches, the final patch: {calls:?}"
    );
    let ours: Vec<_> = peer
        .sim
        .posts(&channel)
        .into_iter()
        .filter(|p| p.user_id == peer.bot.id)
        .collect();
    assert_eq!(ours.len(), 1, "the draft became the final");
    assert_eq!(ours[0].message, "Hello, world");
    assert_eq!(ours[0].root_id, question.id, "in the question's thread");
    assert_eq!(ours[0].delete_at, 0);
    let key = ours[0].props[KEY_PROP].as_str().unwrap();
    assert!(
        !key.contains("~preview"),
        "the final carries the final's key: {key}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_draft_gets_a_fresh_final() {
    let peer = Peer::start().await;
    let channel = peer.channel("deleted-draft");
    let target = MessageTarget::group(&channel);
    stream_reply(&peer, &target, "Hello, world", |peer| {
        // Someone (a moderator) deletes the draft while the reply streams.
        let draft = peer
            .sim
            .visible(&channel)
            .into_iter()
            .find(|p| p.user_id == peer.bot.id)
            .unwrap();
        assert!(peer.sim.delete_post(&draft.id));
    })
    .await;
    assert_eq!(
        peer.texts(&channel),
        ["Hello, world"],
        "one fresh final, visible"
    );
    let ours: Vec<_> = peer
        .sim
        .posts(&channel)
        .into_iter()
        .filter(|p| p.user_id == peer.bot.id)
        .collect();
    assert_eq!(ours.len(), 2, "the deleted draft and the fresh final");
    assert!(ours[0].delete_at > 0);
    assert_eq!(ours[1].message, "Hello, world");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_final_patch_sends_the_final_fresh_and_removes_the_draft() {
    let peer = Peer::start().await;
    let channel = peer.channel("refused-patch");
    let target = MessageTarget::group(&channel);
    stream_reply(&peer, &target, "Hello, world", |peer| {
        // The edit time limit passed: the server refuses the patch.
        peer.sim.inject(Fault::on(
            Route::EditPost,
            FaultKind::Error {
                status: 400,
                id: "api.post.update_post.permissions_time_limit.app_error".into(),
                message: "Post edit is only allowed for 300 seconds.".into(),
            },
        ));
    })
    .await;
    assert_eq!(peer.texts(&channel), ["Hello, world"]);
    let ours: Vec<_> = peer
        .sim
        .posts(&channel)
        .into_iter()
        .filter(|p| p.user_id == peer.bot.id)
        .collect();
    assert_eq!(ours.len(), 2);
    assert!(ours[0].delete_at > 0, "the draft was removed");
    assert_eq!(ours[0].message, "Hello, wor");
}

#[tokio::test]
async fn progress_and_tool_lines_are_grouped_in_the_draft_and_gone_from_the_final() {
    let peer = Peer::start().await;
    let channel = peer.channel("progress");
    let target = MessageTarget::group(&channel);
    let live = peer.plugin.sender.live().unwrap();
    let preview_ctx = ctx(&target, "progress-1~preview");
    let mut unit = RenderedMessageUnit::text(0, "Looking");
    unit.payload["progress"] = json!(["tool: search", "tool: search", "tool: search"]);
    let part = live.show(&preview_ctx, &unit).await.unwrap();
    assert_eq!(
        peer.sim.post(&part.platform_message_id).unwrap().message,
        "> tool: search ×3\n\nLooking"
    );
    let mut more = RenderedMessageUnit::text(0, "Looking, found it");
    more.payload["progress"] = json!(["tool: search", "tool: search", "tool: read_file"]);
    live.replace(&preview_ctx, &part, &more).await.unwrap();
    assert_eq!(
        peer.sim.post(&part.platform_message_id).unwrap().message,
        "> tool: search ×2\n> tool: read_file\n\nLooking, found it"
    );
    let done = live
        .finalize(
            &ctx(&target, "progress-1"),
            &part,
            &RenderedMessageUnit::text(0, "Found it."),
        )
        .await
        .unwrap();
    assert_eq!(done.platform_message_id, part.platform_message_id);
    assert_eq!(peer.texts(&channel), ["Found it."]);
}
