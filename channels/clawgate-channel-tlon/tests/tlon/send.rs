//! Sends as a ship answers them: pokes sent only on their `ok` event (never on the PUT's 204),
//! refused on their `err`, unknown when the result never comes; DM writ ids chosen by the
//! client from the durable intent; group posts whose host-assigned ids are read back; lost
//! answers settled by scrying; and the seed's Tlon line on the durable path — the model
//! signature and the participated threads — including after a crash and a recovery.

use std::sync::Arc;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_tlon::simulator::Fault;
use clawgate_channel_tlon::{aura, sent_of_writ_id};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::IntentStatus;
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{NEST, Peer, SIGNATURE};

/// An engine over `sender`, on the store in `dir` and a driven clock.
fn engine_in(
    dir: &std::path::Path,
    sender: Arc<dyn ChannelMessageAdapter>,
    clock: Arc<ManualClock>,
) -> (Messenger, Arc<clawgate_store_sqlite::SqliteStore>) {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(store.clone(), vec![sender], policy, clock, "tlon-tests");
    (messenger, store)
}

fn reply(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "tlon", target.clone(), text)
}

fn unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(reply(target, key, "x"), key)
}

async fn statuses(store: &clawgate_store_sqlite::SqliteStore) -> Vec<IntentStatus> {
    store
        .list_intents(&IntentFilter {
            limit: 10,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.status)
        .collect()
}

/// A top-level post of a person in the peer's channel, for threads to hang off.
pub(crate) fn parent_post(peer: &Peer) -> String {
    peer.ship
        .post_from(NEST, "~nec", "a question for the thread", true)
}

#[tokio::test]
async fn a_dm_is_a_chat_dm_action_with_a_client_chosen_writ_id() {
    let peer = Peer::start().await;
    let person = peer.person("dm");
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx(&person, "dm-1"), &unit("hello ~nec\nsecond line"))
        .await
        .unwrap();
    let dm = peer.ship.dm(&person.id);
    assert_eq!(dm.len(), 1);
    assert_eq!(
        dm[0].id, part.platform_message_id,
        "the receipt is the writ id"
    );
    assert!(part.platform_message_id.starts_with("~zod/170.141."));
    assert_eq!(dm[0].text, "hello ~nec\nsecond line");
    assert_eq!(
        dm[0].content,
        json!([{ "inline": ["hello ~nec", { "break": null }, "second line"] }]),
        "text becomes a story, one break per line"
    );
    assert_eq!(
        sent_of_writ_id(&dm[0].id),
        Some(dm[0].sent),
        "the writ id's @da is the memo's sent time"
    );
}

#[tokio::test]
async fn a_poke_refused_on_the_event_stream_is_a_refusal_and_nothing_lands() {
    // The PUT is answered 204 either way: only the `err` event says the agent refused it.
    let peer = Peer::start().await;
    let person = peer.person("nack");
    peer.ship.inject(0, Fault::Nack("%chat: bad memo".into()));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&person, "nack-1"), &unit("refused"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::None, "{error:?}");
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload);
    assert!(error.message.contains("%chat: bad memo"), "{error}");
    assert!(peer.ship.dm(&person.id).is_empty());
}

#[tokio::test]
async fn a_put_eyre_did_not_take_is_a_definite_failure() {
    let peer = Peer::start().await;
    let person = peer.person("put");
    peer.ship.inject(0, Fault::PutStatus(500));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&person, "put-1"), &unit("not taken"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::None);
    assert_eq!(error.kind, DeliveryFailureKind::Transient);
    assert!(peer.ship.dm(&person.id).is_empty());
}

#[tokio::test]
async fn a_lost_result_is_unknown_and_settles_by_scrying_the_writ_id() {
    let peer = Peer::start().await;
    let person = peer.person("lost");
    let sender = &peer.plugin.sender;
    peer.ship.inject(0, Fault::LoseResult);
    let context = ctx(&person, "lost-1");
    let error = sender
        .send_unit(&context, &unit("did it land?"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    assert_eq!(error.kind, DeliveryFailureKind::Unknown);
    let Reconciliation::Sent(part) = sender
        .reconcile_unknown_send(&context, &unit("did it land?"))
        .await
        .unwrap()
    else {
        panic!("the writ is on the ship");
    };
    assert_eq!(part.platform_message_id, peer.ship.dm(&person.id)[0].id);
    // A resend after a lost answer uses the same writ id: the ship keeps one message.
    let again = sender
        .send_unit(&context, &unit("did it land?"))
        .await
        .unwrap();
    assert_eq!(again.platform_message_id, part.platform_message_id);
    assert_eq!(peer.ship.our_dm_texts(&person.id), vec!["did it land?"]);
}

#[tokio::test]
async fn a_dropped_stream_replays_the_poke_result_and_the_send_completes() {
    let peer = Peer::start().await;
    let person = peer.person("drop");
    // A first send opens the poke channel's stream.
    peer.plugin
        .sender
        .send_unit(&ctx(&person, "drop-0"), &unit("first"))
        .await
        .unwrap();
    peer.ship.inject(0, Fault::DropStreams);
    peer.plugin
        .sender
        .send_unit(&ctx(&person, "drop-1"), &unit("second"))
        .await
        .unwrap();
    assert_eq!(peer.ship.our_dm_texts(&person.id), vec!["first", "second"]);
}

#[tokio::test]
async fn an_absent_message_is_not_sent_only_after_the_settle_window() {
    let peer = Peer::with(crate::peer::config(), json!({ "settle_window_ms": 60_000 })).await;
    let person = peer.person("window");
    let sender = &peer.plugin.sender;
    let fresh = uuid_v7_now();
    let mut recent = ctx(&person, "window-recent");
    recent.intent_id = Some(intent(fresh));
    assert_eq!(
        sender
            .reconcile_unknown_send(&recent, &unit("in flight?"))
            .await
            .unwrap(),
        Reconciliation::Unresolved,
        "absent but young: the poke may still be on its way"
    );
    let mut old = ctx(&person, "window-old");
    old.intent_id = Some(intent("0180a1b2-c3d4-7abc-8def-0123456789ab"));
    assert_eq!(
        sender
            .reconcile_unknown_send(&old, &unit("never sent"))
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "absent long after its sent time: never taken"
    );
}

fn intent(id: impl Into<String>) -> clawgate_types::IntentId {
    clawgate_types::IntentId::parse(id).unwrap()
}

/// A UUID v7 of now.
fn uuid_v7_now() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let hex = format!("{ms:012x}");
    format!("{}-{}-7123-8456-0123456789ab", &hex[..8], &hex[8..12])
}

#[tokio::test]
async fn the_writ_id_comes_from_the_durable_intent_so_a_resend_reuses_it() {
    let peer = Peer::start().await;
    let person = peer.person("derive");
    let mut context = ctx(&person, "derive-1");
    context.intent_id = Some(intent("0190a1b2-c3d4-7abc-8def-0123456789ab"));
    let part = peer
        .plugin
        .sender
        .send_unit(&context, &unit("derived"))
        .await
        .unwrap();
    let ms = 0x0190_a1b2_c3d4_u64;
    assert_eq!(sent_of_writ_id(&part.platform_message_id), Some(ms));
    assert_eq!(peer.ship.dm(&person.id)[0].sent, ms);
    let da = aura::parse_ud(part.platform_message_id.split_once('/').unwrap().1).unwrap();
    assert_eq!(
        da,
        aura::da_from_unix_ms(ms) + (0xabc_ef0123 << 16),
        "the intent's random bits keep two intents of one millisecond apart"
    );
}

#[tokio::test]
async fn a_group_post_and_a_thread_reply_carry_the_host_assigned_ids() {
    let peer = Peer::start().await;
    let sender = &peer.plugin.sender;
    let top = sender
        .send_unit(
            &ctx(&MessageTarget::group(NEST), "post-1"),
            &unit("top level"),
        )
        .await
        .unwrap();
    let posts = peer.ship.posts(NEST);
    assert_eq!(posts.len(), 1);
    assert_eq!(
        top.platform_message_id, posts[0].id,
        "the host's id, read back"
    );
    let parent = parent_post(&peer);
    let part = sender
        .send_unit(
            &ctx(&peer.thread(&parent), "reply-1"),
            &unit("in the thread"),
        )
        .await
        .unwrap();
    let thread = peer
        .ship
        .posts(NEST)
        .into_iter()
        .find(|p| p.id == parent)
        .unwrap();
    assert_eq!(thread.replies.len(), 1);
    assert_eq!(thread.replies[0].text, "in the thread");
    assert_eq!(part.platform_message_id, thread.replies[0].id);
    assert_eq!(part.thread_id.as_deref(), Some(parent.as_str()));
}

#[tokio::test]
async fn a_lost_post_result_is_settled_by_author_and_sent_time() {
    let peer = Peer::start().await;
    let sender = &peer.plugin.sender;
    let parent = parent_post(&peer);
    let target = peer.thread(&parent);
    let mut context = ctx(&target, "lost-reply");
    context.intent_id = Some(intent(uuid_v7_now()));
    peer.ship.inject(0, Fault::LoseResult);
    let error = sender
        .send_unit(&context, &unit("lost reply"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let Reconciliation::Sent(part) = sender
        .reconcile_unknown_send(&context, &unit("lost reply"))
        .await
        .unwrap()
    else {
        panic!("the reply is in the thread");
    };
    let thread = peer
        .ship
        .posts(NEST)
        .into_iter()
        .find(|p| p.id == parent)
        .unwrap();
    assert_eq!(part.platform_message_id, thread.replies[0].id);
    let mut other = ctx(&target, "other-reply");
    other.intent_id = Some(intent("0180a1b2-c3d4-7abc-8def-0123456789ab"));
    assert_eq!(
        sender
            .reconcile_unknown_send(&other, &unit("never posted"))
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
}

/// The seed's Tlon line, first half: durable finals keep the model signature rendering —
/// exactly once, on the normal durable path and when recovery sends the final after a crash.
#[tokio::test]
async fn tlon_durable_finals_keep_the_model_signature_exactly_once_also_after_recovery() {
    let peer = Peer::signing().await;
    let person = peer.person("signature");
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    // The normal durable path.
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    let report = messenger
        .send(
            reply(&person, "sig-1", "the answer"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(report.durable);
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    // A final whose first attempt fails, then the gateway dies: recovery sends it.
    peer.ship.inject(0, Fault::PutStatus(500));
    let report = messenger
        .send(
            reply(&person, "sig-2", "after the crash"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    // And one whose result is lost: recovery settles it by the writ id.
    peer.ship.inject(0, Fault::LoseResult);
    let report = messenger
        .send(
            reply(&person, "sig-3", "lost then settled"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    drop((messenger, store));
    let restarted = peer.rebuilt().await;
    clock.advance(120_000);
    let (messenger, store) = engine_in(dir.path(), restarted.sender.clone(), clock.clone());
    messenger.recover().await.unwrap();
    let mut texts = peer.ship.our_dm_texts(&person.id);
    texts.sort();
    assert_eq!(
        texts,
        vec![
            format!("after the crash\n\n{SIGNATURE}"),
            format!("lost then settled\n\n{SIGNATURE}"),
            format!("the answer\n\n{SIGNATURE}"),
        ],
        "every final signed, once, none twice"
    );
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent; 3]);
    // A gateway failure notice is the gateway's, not the model's: not signed.
    let mut notice = reply(&person, "notice-1", "Agent failed before reply.");
    notice.origin = Some(clawgate_types::MessageOrigin::gateway_failure(
        clawgate_types::GatewayFailureCode::AgentFailedBeforeReply,
    ));
    messenger
        .send(notice, SendOptions::default())
        .await
        .unwrap();
    assert_eq!(
        peer.ship.our_dm_texts(&person.id).last().unwrap(),
        "Agent failed before reply."
    );
}

/// The seed's Tlon line, second half: after our reply lands in a thread the thread is
/// recorded durably as one we take part in, so later posts in it are answered without a
/// mention — on the durable final path and when recovery settles or resends the final.
#[tokio::test]
async fn tlon_durable_finals_record_participated_threads_also_after_recovery() {
    let peer = Peer::signing().await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let sent_thread = parent_post(&peer);
    let resent_thread = parent_post(&peer);
    let settled_thread = parent_post(&peer);
    let untouched_thread = parent_post(&peer);
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock.clone());
    messenger
        .send(
            reply(&peer.thread(&sent_thread), "t-1", "sent"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    peer.ship.inject(0, Fault::PutStatus(500));
    messenger
        .send(
            reply(&peer.thread(&resent_thread), "t-2", "resent"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    peer.ship.inject(0, Fault::LoseResult);
    messenger
        .send(
            reply(&peer.thread(&settled_thread), "t-3", "settled"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    drop((messenger, store));
    // The crash: the process is gone; a new one is built on the same state directory.
    let restarted = peer.rebuilt().await;
    clock.advance(120_000);
    let (messenger, store) = engine_in(dir.path(), restarted.sender.clone(), clock.clone());
    messenger.recover().await.unwrap();
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent; 3]);
    // Each reply landed once.
    for (parent, text) in [
        (&sent_thread, "sent"),
        (&resent_thread, "resent"),
        (&settled_thread, "settled"),
    ] {
        let thread = peer
            .ship
            .posts(NEST)
            .into_iter()
            .find(|p| &p.id == parent)
            .unwrap();
        let texts: Vec<_> = thread.replies.iter().map(|r| r.text.clone()).collect();
        assert_eq!(texts, vec![format!("{text}\n\n{SIGNATURE}")]);
    }
    // A gateway started after all this answers follow-ups in those threads without a mention,
    // and still ignores an unmentioned post in a thread it never replied in.
    let later = peer.rebuilt().await;
    let receiver = later.receiver.clone().unwrap();
    for parent in [&sent_thread, &resent_thread, &settled_thread] {
        peer.ship
            .reply_from(NEST, parent, "~nec", "and then?", false);
        let event = peer.ship.last_event().unwrap();
        let inbound = receiver
            .normalize(&event)
            .unwrap_or_else(|e| panic!("{parent}: {e}"));
        assert_eq!(
            inbound.message.target.thread_id.as_deref(),
            Some(parent.as_str())
        );
    }
    peer.ship
        .reply_from(NEST, &untouched_thread, "~nec", "anyone?", false);
    let event = peer.ship.last_event().unwrap();
    assert!(matches!(
        receiver.normalize(&event),
        Err(ReceiveError::Ignored { .. })
    ));
}

#[tokio::test]
async fn finals_are_durable_sends_without_previews_or_edits() {
    let peer = Peer::start().await;
    let capabilities = peer.plugin.sender.capabilities();
    assert!(capabilities.live.is_none(), "no live previews");
    assert!(capabilities.reconciles_unknown_sends());
    assert!(peer.plugin.sender.live().is_none());
    assert!(
        peer.plugin.sender.render().is_some(),
        "the signing renderer"
    );
}
