//! Sends as Telegram answers them: markup fallbacks, migrations, media, topics, quotes,
//! edits, drafts, typing and the failure classes of Telegram's own refusals.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_telegram::simulator::{Fault, FaultKind, SimUser, WriteOptions};
use clawgate_messages::{LiveOptions, Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::ManualClock;
use clawgate_types::{IntentStatus, MessageQuote, MessageRelation};
use serde_json::json;

use crate::peer::{Peer, build, build_from, quiet, setup};

fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "telegram", target.clone(), ""),
        key,
    )
}

fn text(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn html(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::new(
        0,
        MessagePartKind::Text,
        json!({ "text": text, "format": "html" }),
    )
}

fn group(peer: &Peer, title: &str) -> MessageTarget {
    MessageTarget::group(peer.sim.supergroup(title, false).to_string())
}

fn calls(peer: &Peer, method: &str) -> Vec<u16> {
    peer.sim
        .log()
        .into_iter()
        .filter(|c| c.method == method)
        .map(|c| c.status)
        .collect()
}

/// An engine over the peer's channel, on a fresh store and a driven clock.
fn engine(peer: &Peer) -> (tempfile::TempDir, Messenger, Arc<ManualClock>) {
    let (dir, messenger, clock, _) = engine_and_store(peer);
    (dir, messenger, clock)
}

fn engine_and_store(
    peer: &Peer,
) -> (
    tempfile::TempDir,
    Messenger,
    Arc<ManualClock>,
    Arc<clawgate_store_sqlite::SqliteStore>,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let clock = Arc::new(ManualClock::new(1_000));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(
        store.clone(),
        vec![peer.plugin.sender.clone()],
        policy,
        clock.clone(),
        "telegram-tests",
    );
    (dir, messenger, clock, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn html_is_sent_with_its_parse_mode_and_broken_markup_falls_back_to_plain_text() {
    let peer = Peer::polling().await;
    let target = group(&peer, "markup");
    let sender = &peer.plugin.sender;
    sender
        .send_unit(&ctx(&target, "a"), &html("<b>bold</b> move"))
        .await
        .unwrap();
    sender
        .send_unit(&ctx(&target, "b"), &html("<b>never closed"))
        .await
        .unwrap();
    assert_eq!(
        peer.texts(peer.chat(&target)),
        vec!["bold move", "<b>never closed"],
        "entities parsed; the broken markup went out as the plain text it is"
    );
    let messages = peer.sim.messages(peer.chat(&target));
    assert_eq!(messages[0].parse_mode.as_deref(), Some("HTML"));
    assert_eq!(messages[1].parse_mode, None);
    assert_eq!(calls(&peer, "sendMessage"), vec![200, 400, 200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_upgraded_to_a_supergroup_is_followed_once_and_remembered() {
    let peer = Peer::polling().await;
    let old = peer.sim.group("migrating");
    let target = MessageTarget::group(old.to_string());
    let sender = &peer.plugin.sender;
    sender
        .send_unit(&ctx(&target, "1"), &text("before"))
        .await
        .unwrap();
    let new = peer.sim.upgrade_to_supergroup(old);
    let part = sender
        .send_unit(&ctx(&target, "2"), &text("after"))
        .await
        .unwrap();
    assert_eq!(peer.texts(new), vec!["after"]);
    assert_eq!(
        part.edit_token,
        Some(new.to_string()),
        "the part knows its chat"
    );
    sender
        .send_unit(&ctx(&target, "3"), &text("again"))
        .await
        .unwrap();
    assert_eq!(peer.texts(new), vec!["after", "again"]);
    let refused = calls(&peer, "sendMessage")
        .iter()
        .filter(|s| **s == 400)
        .count();
    assert_eq!(refused, 1, "the move is learned once");

    // A channel built again on the same state directory (a restart) knows the move.
    let state = tempfile::tempdir().unwrap();
    let first = build(&peer.sim, state.path(), json!({})).await.unwrap();
    let other = peer.sim.group("moves later");
    let other_target = MessageTarget::group(other.to_string());
    let other_new = peer.sim.upgrade_to_supergroup(other);
    first
        .sender
        .send_unit(&ctx(&other_target, "4"), &text("learn"))
        .await
        .unwrap();
    let restarted = build(&peer.sim, state.path(), json!({})).await.unwrap();
    restarted
        .sender
        .send_unit(&ctx(&other_target, "5"), &text("known"))
        .await
        .unwrap();
    assert_eq!(peer.texts(other_new), vec!["learn", "known"]);
    let refused = calls(&peer, "sendMessage")
        .iter()
        .filter(|s| **s == 400)
        .count();
    assert_eq!(
        refused, 2,
        "the restarted channel did not have to learn it again"
    );
}

/// The old chat ids of the moves account `account` keeps in the store of `dir`.
async fn kept_moves(dir: &std::path::Path, account: &str) -> Vec<(String, String)> {
    clawgate_conformance::channel_state(dir, "telegram", account)
        .book("chat-migrations")
        .since::<String>(0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect()
}

fn refused_sends(peer: &Peer) -> usize {
    calls(peer, "sendMessage")
        .iter()
        .filter(|s| **s == 400)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_chat_moves_apart() {
    let peer = Peer::polling().await;
    let state = tempfile::tempdir().unwrap();
    let account = |name: &str| setup(&peer.sim, state.path(), name, json!({}));
    let first = build_from(&peer.sim, &account("default")).await.unwrap();
    let second = build_from(&peer.sim, &account("second")).await.unwrap();
    let first_old = peer.sim.group("the first account's group");
    let first_new = peer.sim.upgrade_to_supergroup(first_old);
    let second_old = peer.sim.group("the second account's group");
    let second_new = peer.sim.upgrade_to_supergroup(second_old);
    let first_target = MessageTarget::group(first_old.to_string());
    let second_target = MessageTarget::group(second_old.to_string());
    // Each learns its own move (one file for both kept only the last writer's moves).
    first
        .sender
        .send_unit(&ctx(&first_target, "1"), &text("first learns"))
        .await
        .unwrap();
    second
        .sender
        .send_unit(&ctx(&second_target, "2"), &text("second learns"))
        .await
        .unwrap();
    assert_eq!(refused_sends(&peer), 2);
    let first = build_from(&peer.sim, &account("default")).await.unwrap();
    let second = build_from(&peer.sim, &account("second")).await.unwrap();
    first
        .sender
        .send_unit(&ctx(&first_target, "3"), &text("first knows"))
        .await
        .unwrap();
    second
        .sender
        .send_unit(&ctx(&second_target, "4"), &text("second knows"))
        .await
        .unwrap();
    assert_eq!(
        refused_sends(&peer),
        2,
        "after a restart each account still knows its move"
    );
    assert_eq!(peer.texts(first_new), vec!["first learns", "first knows"]);
    assert_eq!(
        peer.texts(second_new),
        vec!["second learns", "second knows"]
    );
    assert_eq!(
        kept_moves(state.path(), "default").await,
        vec![(first_old.to_string(), first_new.to_string())]
    );
    assert_eq!(
        kept_moves(state.path(), "second").await,
        vec![(second_old.to_string(), second_new.to_string())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_moves_an_earlier_release_kept_are_imported_once() {
    let peer = Peer::polling().await;
    let old = peer.sim.group("moved before the upgrade");
    let new = peer.sim.upgrade_to_supergroup(old);
    let old_dir = tempfile::tempdir().unwrap();
    let file = old_dir.path().join("telegram-chat-migrations.json");
    // The earlier release's format: a pretty-printed JSON object, old chat id → new chat id.
    let content = serde_json::to_vec_pretty(&json!({ old.to_string(): new.to_string() })).unwrap();
    std::fs::write(&file, &content).unwrap();
    let state = tempfile::tempdir().unwrap();
    let upgraded = || {
        setup(&peer.sim, state.path(), "default", json!({}))
            .with_legacy_files(LegacyFiles::in_dir(old_dir.path()))
    };
    let plugin = build_from(&peer.sim, &upgraded()).await.unwrap();
    assert!(!file.exists(), "the file is set aside");
    assert_eq!(
        std::fs::read(
            old_dir
                .path()
                .join("telegram-chat-migrations.json.imported")
        )
        .unwrap(),
        content
    );
    plugin
        .sender
        .send_unit(
            &ctx(&MessageTarget::group(old.to_string()), "1"),
            &text("known"),
        )
        .await
        .unwrap();
    assert_eq!(peer.texts(new), vec!["known"]);
    assert_eq!(refused_sends(&peer), 0, "the imported move is followed");
    // A crash after the import and before the file was set aside leaves it there: imported
    // again, it adds nothing.
    std::fs::write(&file, &content).unwrap();
    build_from(&peer.sim, &upgraded()).await.unwrap();
    assert!(!file.exists(), "the file is set aside");
    build_from(&peer.sim, &upgraded()).await.unwrap();
    assert_eq!(
        kept_moves(state.path(), "default").await,
        vec![(old.to_string(), new.to_string())],
        "imported once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_message_goes_to_its_thread_and_a_missing_topic_is_not_found() {
    let peer = Peer::polling().await;
    let chat = peer.sim.supergroup("forum", true);
    let topic = peer.sim.create_topic(chat, "builds");
    let target = MessageTarget::group(chat.to_string()).with_thread_id(Some(topic.to_string()));
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx(&target, "t"), &text("in the topic"))
        .await
        .unwrap();
    assert_eq!(part.thread_id, Some(topic.to_string()));
    let landed = peer.sim.messages(chat);
    assert_eq!(landed.last().unwrap().thread_id, Some(topic));
    let missing = MessageTarget::group(chat.to_string()).with_thread_id(Some("999999"));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&missing, "m"), &text("nowhere"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::NotFound, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_reply_carries_reply_parameters_and_shows_no_preview() {
    let peer = Peer::polling().await;
    let chat = peer.sim.supergroup("quotes", false);
    let asked = peer.sim.user_writes(
        chat,
        &SimUser::person(5, "Bo"),
        "what is the answer to everything?",
        WriteOptions::default(),
    );
    let asked_id = asked["message"]["message_id"].as_i64().unwrap();
    let target = MessageTarget::group(chat.to_string());
    let mut relation = MessageRelation::reply_to(asked_id.to_string());
    if let MessageRelation::Reply { quote, .. } = &mut relation {
        *quote = Some(MessageQuote::new("the answer"));
    }
    let reply =
        ChannelMessage::outbound("q", "telegram", target.clone(), "42").with_relation(relation);
    assert!(
        !peer.plugin.sender.previews(&reply),
        "no preview for a quoted reply"
    );
    let (_dir, messenger, _clock) = engine(&peer);
    let mut live = messenger
        .begin_live(
            reply.clone(),
            SendOptions::default(),
            LiveOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        !live.update("4").await.unwrap(),
        "nothing shown while it streams"
    );
    assert!(peer.texts(chat).is_empty());
    let report = live.finalize(reply).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let landed = peer.sim.messages(chat);
    let answer = landed.last().unwrap();
    assert_eq!(answer.text.as_deref(), Some("42"));
    assert_eq!(answer.reply_to_message_id, Some(asked_id));
    assert_eq!(answer.quote.as_deref(), Some("the answer"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_to_the_same_text_is_done_and_an_edit_of_a_deleted_message_is_not_found() {
    let peer = Peer::polling().await;
    let target = group(&peer, "edits");
    let sender = &peer.plugin.sender;
    let c = ctx(&target, "e");
    let part = sender.send_unit(&c, &text("same")).await.unwrap();
    sender.edit(&c, &part, &text("same")).await.unwrap();
    assert!(
        calls(&peer, "editMessageText").contains(&400),
        "Telegram said not modified"
    );
    sender.delete(&c, &part).await.unwrap();
    let error = sender.edit(&c, &part, &text("gone")).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::NotFound, "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_whose_answer_was_lost_is_made_again_and_settles() {
    let peer = Peer::polling().await;
    let target = group(&peer, "lost edit");
    let sender = &peer.plugin.sender;
    let c = ctx(&target, "l");
    let part = sender.send_unit(&c, &text("draft")).await.unwrap();
    peer.sim
        .inject(Fault::on("editMessageText", FaultKind::LoseAnswer));
    let edited = sender.edit(&c, &part, &text("final")).await.unwrap();
    assert_eq!(edited.platform_message_id, part.platform_message_id);
    assert_eq!(peer.texts(peer.chat(&target)), vec!["final"]);
    assert_eq!(calls(&peer, "editMessageText").len(), 2, "sent again once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_whose_answer_was_lost_is_never_repeated() {
    let peer = Peer::polling().await;
    let target = group(&peer, "lost send");
    let (_dir, messenger, clock, store) = engine_and_store(&peer);
    peer.sim
        .inject(Fault::on("sendMessage", FaultKind::LoseAnswer));
    let message = ChannelMessage::outbound("u", "telegram", target.clone(), "only once");
    let report = messenger
        .send(message, SendOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    clock.advance(10 * 60_000);
    messenger.recover().await.unwrap();
    assert_eq!(peer.texts(peer.chat(&target)), vec!["only once"]);
    assert_eq!(calls(&peer, "sendMessage").len(), 1, "no blind repeat");
    let intent =
        clawgate_store::IntentStore::load_intent(&*store, report.intent_id.as_ref().unwrap())
            .await
            .unwrap()
            .unwrap();
    assert_eq!(intent.status, IntentStatus::UnknownAfterSend);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_file_goes_out_as_a_link_with_its_caption() {
    let peer = Peer::polling().await;
    let target = group(&peer, "media");
    let url = "http://files.invalid/cat.png";
    let message = ChannelMessage::outbound("p", "telegram", target.clone(), "a cat")
        .with_attachments(vec![
            MessageAttachment::new(MessagePartKind::Media)
                .with_url(url)
                .with_mime_type("image/png"),
        ]);
    let (_dir, messenger, _clock) = engine(&peer);
    let report = messenger
        .send(message, SendOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    assert_eq!(
        peer.texts(peer.chat(&target)),
        vec![format!("a cat\n{url}")]
    );
    assert_eq!(calls(&peer, "sendPhoto"), vec![400]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telegrams_refusals_are_classified() {
    let peer = Peer::polling().await;
    let person = SimUser::person(77, "Cy");
    let private = MessageTarget::direct(peer.sim.private_chat(&person).to_string());
    peer.sim.block_bot(77);
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&private, "b"), &text("hello?"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error:?}");
    assert!(error.message.contains("blocked"), "{error:?}");

    let target = group(&peer, "flood");
    peer.sim
        .inject(Fault::once(FaultKind::too_many_requests(7)));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&target, "f"), &text("hi"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit);
    assert_eq!(error.retry_after_ms, Some(7_000));

    let unknown = MessageTarget::group("-100987654321");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&unknown, "n"), &text("hi"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::NotFound, "{error:?}");

    let kicked = peer.sim.supergroup("kicked", false);
    peer.sim.kick_bot(kicked);
    let error = peer
        .plugin
        .sender
        .send_unit(
            &ctx(&MessageTarget::group(kicked.to_string()), "k"),
            &text("hi"),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_older_than_48_hours_cannot_be_deleted() {
    let peer = Peer::polling().await;
    let target = group(&peer, "old");
    let c = ctx(&target, "o");
    let part = peer
        .plugin
        .sender
        .send_unit(&c, &text("old news"))
        .await
        .unwrap();
    peer.sim.advance_clock(Duration::from_secs(49 * 3600));
    let error = peer.plugin.sender.delete(&c, &part).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload, "{error:?}");
    assert!(error.message.contains("can't be deleted"), "{error:?}");
    assert_eq!(peer.texts(peer.chat(&target)), vec!["old news"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_chat_previews_as_a_native_draft_and_the_final_is_one_message() {
    let peer = Peer::polling().await;
    let person = SimUser::person(88, "Di");
    let chat = peer.sim.private_chat(&person);
    let target = MessageTarget::direct(chat.to_string());
    let (_dir, messenger, clock) = engine(&peer);
    let reply = |text: &str| ChannelMessage::outbound("d", "telegram", target.clone(), text);
    let mut live = messenger
        .begin_live(reply(""), SendOptions::default(), LiveOptions::default())
        .await
        .unwrap();
    live.update("Thinking about").await.unwrap();
    clock.advance(1_500);
    live.update("Thinking about it").await.unwrap();
    assert!(peer.texts(chat).is_empty(), "a draft is not a message");
    let drafts = peer.sim.drafts(chat);
    assert_eq!(drafts.len(), 2, "{drafts:?}");
    assert_eq!(
        drafts[0].draft_id, drafts[1].draft_id,
        "one draft, animated"
    );
    let report = live
        .finalize(reply("Thinking about it: yes."))
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    assert_eq!(peer.texts(chat), vec!["Thinking about it: yes."]);
    assert!(
        calls(&peer, "editMessageText").is_empty(),
        "no edit of a draft"
    );
    assert!(
        calls(&peer, "deleteMessage").is_empty(),
        "nothing to delete"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_drafts_are_refused_previews_are_messages_edited_into_the_final() {
    let peer = Peer::start(
        clawgate_channel_telegram::simulator::SimulatorConfig {
            drafts_allowed: false,
            ..quiet()
        },
        json!({}),
    )
    .await;
    let chat = peer.sim.private_chat(&SimUser::person(89, "Ed"));
    let target = MessageTarget::direct(chat.to_string());
    let (_dir, messenger, clock) = engine(&peer);
    let reply = |text: &str| ChannelMessage::outbound("r", "telegram", target.clone(), text);
    let mut live = messenger
        .begin_live(reply(""), SendOptions::default(), LiveOptions::default())
        .await
        .unwrap();
    live.update("Partly").await.unwrap();
    assert_eq!(peer.texts(chat), vec!["Partly"], "the preview is a message");
    clock.advance(1_500);
    live.finalize(reply("Partly done.")).await.unwrap();
    assert_eq!(
        peer.texts(chat),
        vec!["Partly done."],
        "edited into the final"
    );
    assert_eq!(calls(&peer, "editMessageText"), vec![200]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_preview_gets_a_fresh_final_and_is_deleted() {
    let peer = Peer::polling().await;
    let target = group(&peer, "stale");
    let chat = peer.chat(&target);
    let (_dir, messenger, clock) = engine(&peer);
    let reply = |text: &str| ChannelMessage::outbound("s", "telegram", target.clone(), text);
    let mut live = messenger
        .begin_live(
            reply(""),
            SendOptions::default(),
            LiveOptions {
                stale_after_ms: 30_000,
            },
        )
        .await
        .unwrap();
    live.update("Working on").await.unwrap();
    let preview = peer.sim.messages(chat)[0].message_id;
    clock.advance(31_000);
    live.finalize(reply("Working on it: done.")).await.unwrap();
    let landed = peer.sim.messages(chat);
    assert_eq!(landed.len(), 1);
    assert_ne!(
        landed[0].message_id, preview,
        "a fresh message, at the bottom"
    );
    assert_eq!(landed[0].text.as_deref(), Some("Working on it: done."));
    assert_eq!(
        calls(&peer, "deleteMessage"),
        vec![200],
        "the preview is cleared"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_is_shown_in_the_conversation_and_its_topic() {
    let peer = Peer::polling().await;
    let chat = peer.sim.supergroup("typing", true);
    let topic = peer.sim.create_topic(chat, "t");
    let target = MessageTarget::group(chat.to_string()).with_thread_id(Some(topic.to_string()));
    let sender = &peer.plugin.sender;
    assert_eq!(sender.typing_interval(), Some(Duration::from_secs(4)));
    sender.show_typing(&target).await.unwrap();
    assert_eq!(peer.sim.chat_actions(chat), vec!["typing"]);
    let call = peer
        .sim
        .log()
        .into_iter()
        .find(|c| c.method == "sendChatAction")
        .unwrap();
    assert_eq!(call.params["message_thread_id"], json!(topic.to_string()));

    let quiet_peer = Peer::start(quiet(), json!({ "typing": false })).await;
    assert_eq!(quiet_peer.plugin.sender.typing_interval(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_projected_array_is_one_intent_delivered_whole_and_a_failure_resends_only_what_is_missing()
 {
    // The seed's silent fallback: when an agent's turn ends with no visible text the projected
    // fallback array (here: two text chunks and two files) is recorded in one intent and
    // delivered whole — never an intent per payload.
    let peer = Peer::polling().await;
    let target = group(&peer, "fallback");
    let chat = peer.chat(&target);
    let (_dir, messenger, clock, store) = engine_and_store(&peer);
    let files = clawgate_conformance::ConformancePeer::attachment_url(&peer);
    let image = |name: &str| {
        MessageAttachment::new(MessagePartKind::Media)
            .with_url(files.replace("conformance.png", name))
            .with_mime_type("image/png")
    };
    let long = "fallback ".repeat(600);
    let array = ChannelMessage::outbound("f", "telegram", target.clone(), long.trim_end())
        .with_attachments(vec![image("one.png"), image("two.png")]);
    // The third platform call (the first image) is refused as a transient failure.
    peer.sim
        .inject(Fault::once(FaultKind::error(500, "Internal Server Error: try again")).after(2));
    let report = messenger.send(array, SendOptions::default()).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    let intents = clawgate_store::IntentStore::find_intents_by_key_prefix(&*store, "", 10)
        .await
        .unwrap();
    assert_eq!(intents.len(), 1, "one intent for the whole array");
    assert_eq!(intents[0].status, IntentStatus::Sent);
    assert_eq!(intents[0].batch.as_ref().unwrap().units.len(), 4);
    let landed = peer.sim.messages(chat);
    let shapes: Vec<(bool, Option<String>)> = landed
        .iter()
        .map(|m| (m.media.is_some(), m.media.as_ref().map(|x| x.url.clone())))
        .collect();
    assert_eq!(landed.len(), 4, "each payload exactly once: {shapes:?}");
    assert!(landed[0].text.is_some() && landed[1].text.is_some());
    assert!(landed[2].media.as_ref().unwrap().url.ends_with("one.png"));
    assert!(landed[3].media.as_ref().unwrap().url.ends_with("two.png"));
    assert_eq!(
        calls(&peer, "sendMessage"),
        vec![200, 200],
        "the text chunks were not sent again"
    );
    assert_eq!(calls(&peer, "sendPhoto"), vec![500, 200, 200]);
}
