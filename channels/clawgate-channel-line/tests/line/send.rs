//! Sends as LINE answers them: a reply with a fresh token (up to five messages, the rest
//! pushed), the push fallback when the token is refused or stale, push off, single use across
//! generations, LINE's refusals as failure classes, and what happens after a lost answer: a
//! push is settled by its retry key (after a restart too), a reply is parked, or pushed when
//! the settings say so.

use std::sync::Arc;

use clawgate_channel_line::simulator::{
    Fault, FaultKind, PUSH_PATH, REPLY_PATH, SimulatorConfig, Via,
};
use clawgate_channel_line::{MAX_TEXT_CHARS, retry_key};
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore as _};
use clawgate_types::IntentStatus;
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{Peer, quick};

/// An engine over `sender`, on the store in `dir` and a driven clock.
pub(crate) fn engine(
    dir: &std::path::Path,
    sender: Arc<dyn ChannelMessageAdapter>,
) -> (
    Messenger,
    Arc<clawgate_store_sqlite::SqliteStore>,
    Arc<ManualClock>,
) {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let clock = Arc::new(ManualClock::new(1_000));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(
        store.clone(),
        vec![sender],
        policy,
        clock.clone(),
        "line-tests",
    );
    (messenger, store, clock)
}

/// A person asks in a 1:1 chat; the channel's receiver sees the event (and its token). The
/// reply's key, as the turn engine writes it.
pub(crate) fn asked(peer: &Peer, name: &str) -> (MessageTarget, String, String) {
    let user = peer.sim.user(name);
    let written = peer.sim.user_writes(&user, "question");
    let inbound = peer
        .plugin
        .receiver
        .as_ref()
        .unwrap()
        .normalize(&peer.envelope_of(&written))
        .unwrap();
    assert_eq!(inbound.event_id, written.event_id);
    let key = format!("line:reply:{}:0", written.event_id);
    (MessageTarget::direct(user), key, written.reply_token)
}

pub(crate) fn reply(
    target: &MessageTarget,
    key: &str,
    text: &str,
) -> (ChannelMessage, SendOptions) {
    let message = ChannelMessage::outbound(key, "line", target.clone(), text);
    let options = SendOptions {
        idempotency_key: Some(key.to_owned()),
        ..SendOptions::default()
    };
    (message, options)
}

fn vias(peer: &Peer, chat: &str) -> Vec<String> {
    peer.sim
        .bot_messages(chat)
        .into_iter()
        .map(|m| match m.via {
            Via::Reply(_) => "reply".to_owned(),
            Via::Push(Some(_)) => "push+key".to_owned(),
            other => format!("{other:?}"),
        })
        .collect()
}

pub(crate) async fn statuses(store: &clawgate_store_sqlite::SqliteStore) -> Vec<IntentStatus> {
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

#[tokio::test]
async fn a_fresh_token_replies_with_five_messages_and_the_rest_is_pushed() {
    let peer = Peer::start().await;
    let (target, key, token) = asked(&peer, "long");
    let dir = tempfile::tempdir().unwrap();
    let (messenger, _, _) = engine(dir.path(), peer.plugin.sender.clone());
    let text: String = (0..7)
        .map(|i| {
            char::from(b'a' + i)
                .to_string()
                .repeat(MAX_TEXT_CHARS as usize)
        })
        .collect();
    let (message, options) = reply(&target, &key, &text);
    let report = messenger.send(message, options).await.unwrap();
    let receipt = report.outcome.receipt().cloned().expect("sent");
    assert_eq!(receipt.parts.len(), 3, "one reply call and two pushes");
    assert_eq!(
        vias(&peer, &target.id),
        [
            "reply", "reply", "reply", "reply", "reply", "push+key", "push+key"
        ]
    );
    assert_eq!(peer.texts(&target.id).concat(), text);
    let calls = peer.sim.calls();
    let reply_call = calls.iter().find(|c| c.path == REPLY_PATH).unwrap();
    assert_eq!(reply_call.body["replyToken"], token.as_str());
    assert_eq!(
        reply_call.retry_key, None,
        "the Reply API takes no retry key"
    );
    // Each push under its unit's key.
    let keys: Vec<_> = calls
        .iter()
        .filter(|c| c.path == PUSH_PATH)
        .map(|c| c.retry_key.clone())
        .collect();
    assert_eq!(
        keys,
        [
            Some(retry_key(&format!("{key}#1"))),
            Some(retry_key(&format!("{key}#2")))
        ]
    );
    // The receipt keeps all five ids of the reply.
    let ids = receipt.parts[0].raw.as_ref().unwrap()["ids"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(ids, 5);
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_refused_token_falls_back_to_push_and_a_second_generation_pushes() {
    let peer = Peer::start().await;
    let (target, key, token) = asked(&peer, "expired");
    assert!(peer.sim.expire_reply_token(&token));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, _, _) = engine(dir.path(), peer.plugin.sender.clone());
    let (message, options) = reply(&target, &key, "late answer");
    assert!(
        messenger
            .send(message, options)
            .await
            .unwrap()
            .outcome
            .receipt()
            .is_some()
    );
    let calls: Vec<(String, u16)> = peer
        .sim
        .calls()
        .iter()
        .map(|c| (c.path.clone(), c.status))
        .collect();
    assert_eq!(
        calls[1..],
        [(REPLY_PATH.to_owned(), 400), (PUSH_PATH.to_owned(), 200)]
    );
    assert_eq!(vias(&peer, &target.id), ["push+key"]);

    // A token is used once: generation 1 of a reply to the same event pushes.
    let (target, key, _) = asked(&peer, "generations");
    let (message, options) = reply(&target, &key, "first");
    messenger.send(message, options).await.unwrap();
    let second = key.replace(":0", ":1");
    let (message, options) = reply(&target, &second, "second");
    messenger.send(message, options).await.unwrap();
    assert_eq!(vias(&peer, &target.id), ["reply", "push+key"]);
    peer.sim.stop().await;
}

#[tokio::test]
async fn with_push_off_an_unusable_token_is_a_permission_failure() {
    let peer = Peer::with(quick(), json!({ "push": false })).await;
    let (target, key, token) = asked(&peer, "nopush");
    peer.sim.expire_reply_token(&token);
    let adapter = peer.plugin.sender.clone();
    let render = adapter.render().unwrap();
    let (message, _) = reply(&target, &key, "late");
    let batch = render
        .render(&message, adapter.capabilities(), &key)
        .unwrap();
    let ctx = SendContext::new(message, key.clone());
    let error = adapter.send_unit(&ctx, &batch.units[0]).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(error.message.contains("push"), "{}", error.message);
    assert!(peer.texts(&target.id).is_empty());
    // Without a token at all (a relayed message), nothing is pushed either.
    let relay = ChannelMessage::outbound("line:relay:1", "line", target.clone(), "hi");
    let ctx = SendContext::new(relay, "line:relay:1");
    let error = adapter
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "hi"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission);
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_lost_reply_is_parked_and_never_sent_again() {
    let peer = Peer::start().await;
    let (target, key, _) = asked(&peer, "lostreply");
    peer.sim
        .inject(Fault::on(REPLY_PATH, FaultKind::LoseAnswer));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store, clock) = engine(dir.path(), peer.plugin.sender.clone());
    let (message, options) = reply(&target, &key, "answer");
    let report = messenger.send(message, options).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    for _ in 0..3 {
        clock.advance(60_000);
        messenger.recover().await.unwrap();
    }
    // After a restart too: a new process cannot tell a used token from an expired one.
    drop(messenger);
    let (messenger, _, clock) = engine(dir.path(), peer.rebuilt(&json!({})).await.sender);
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    assert_eq!(
        peer.texts(&target.id),
        ["answer"],
        "landed once, never repeated"
    );
    assert_eq!(statuses(&store).await, [IntentStatus::UnknownAfterSend]);
    assert!(
        peer.sim.calls().iter().all(|c| c.path != PUSH_PATH),
        "no push"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_lost_reply_is_pushed_when_the_settings_say_so() {
    let peer = Peer::with(quick(), json!({ "after_unknown_reply": "push" })).await;
    let (target, key, _) = asked(&peer, "pushafter");
    peer.sim
        .inject(Fault::on(REPLY_PATH, FaultKind::LoseAnswer));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store, clock) = engine(dir.path(), peer.plugin.sender.clone());
    let (message, options) = reply(&target, &key, "answer");
    messenger.send(message, options).await.unwrap();
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    // The documented trade-off: the lost reply had landed, so the answer shows twice.
    assert_eq!(vias(&peer, &target.id), ["reply", "push+key"]);
    assert_eq!(statuses(&store).await, [IntentStatus::Sent]);
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_lost_push_is_settled_by_its_retry_key_after_a_restart() {
    let peer = Peer::start().await;
    let target = MessageTarget::direct(peer.sim.user("lostpush"));
    peer.sim.inject(Fault::on(PUSH_PATH, FaultKind::LoseAnswer));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store, _) = engine(dir.path(), peer.plugin.sender.clone());
    let (message, options) = reply(&target, "line:relay:lost", "pushed once");
    let report = messenger.send(message, options).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    drop(messenger);
    let (messenger, _, clock) = engine(dir.path(), peer.rebuilt(&json!({})).await.sender);
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    assert_eq!(peer.texts(&target.id), ["pushed once"]);
    assert_eq!(statuses(&store).await, [IntentStatus::Sent]);
    let pushes: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path == PUSH_PATH)
        .collect();
    assert_eq!(pushes.len(), 2);
    assert_eq!(pushes[0].retry_key, pushes[1].retry_key);
    assert_eq!((pushes[0].status, pushes[0].answered), (200, false));
    assert_eq!(
        pushes[1].status, 409,
        "the repeat is LINE's 'already accepted'"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn line_refusals_are_failure_classes() {
    let config = SimulatorConfig {
        monthly_push_limit: Some(1),
        ..quick()
    };
    let peer = Peer::with(config, json!({})).await;
    let target = MessageTarget::direct(peer.sim.user("refusals"));
    let adapter = peer.plugin.sender.clone();
    let ctx = |key: &str| {
        SendContext::new(
            ChannelMessage::outbound(key, "line", target.clone(), ""),
            key,
        )
    };
    let unit = RenderedMessageUnit::text(0, "x");
    adapter.send_unit(&ctx("k-1"), &unit).await.unwrap();
    let quota = adapter.send_unit(&ctx("k-2"), &unit).await.unwrap_err();
    assert_eq!(quota.kind, DeliveryFailureKind::Permission, "{quota:?}");
    assert!(quota.message.contains("monthly"), "{}", quota.message);
    peer.sim.inject(Fault::once(FaultKind::RateLimited));
    let limited = adapter.send_unit(&ctx("k-3"), &unit).await.unwrap_err();
    assert_eq!(limited.kind, DeliveryFailureKind::RateLimit);
    let too_long = RenderedMessageUnit::text(0, "y".repeat(MAX_TEXT_CHARS as usize + 1));
    let invalid = adapter.send_unit(&ctx("k-4"), &too_long).await.unwrap_err();
    assert_eq!(invalid.kind, DeliveryFailureKind::InvalidPayload);
    assert!(
        invalid.message.contains("messages[0].text"),
        "{}",
        invalid.message
    );
    // A reply the server failed on may have gone out: unknown, never a retry with the token.
    let (target, key, _) = asked(&peer, "fivehundred");
    peer.sim
        .inject(Fault::on(REPLY_PATH, FaultKind::InternalError(500)));
    let render = adapter.render().unwrap();
    let (message, _) = reply(&target, &key, "answer");
    let batch = render
        .render(&message, adapter.capabilities(), &key)
        .unwrap();
    let ctx = SendContext::new(message, key.clone());
    let error = adapter.send_unit(&ctx, &batch.units[0]).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    assert_eq!(peer.texts(&target.id), Vec::<String>::new());
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_wrong_token_stops_the_start_naming_the_setting_and_no_edits_are_declared() {
    let peer = Peer::start().await;
    let state = tempfile::tempdir().unwrap();
    let error = crate::peer::build(
        &peer.sim,
        state.path(),
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({}),
        "wrong",
    )
    .await
    .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("token_env"), "{text}");
    assert!(!text.contains("wrong"), "the token never prints: {text}");
    // LINE has no edits, deletes or previews for bot messages: simple durable finals.
    let capabilities = peer.plugin.sender.capabilities();
    assert!(capabilities.live.is_none());
    assert!(!capabilities.can_edit() && !capabilities.can_delete());
    assert!(peer.plugin.sender.live().is_none());
    let message = ChannelMessage::outbound("m", "line", MessageTarget::direct("U1"), "x");
    assert!(
        !peer.plugin.sender.previews(&message),
        "no previews: they could never be removed"
    );
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_push_older_than_its_retry_key_is_parked_not_repeated() {
    let peer = Peer::start().await;
    let target = MessageTarget::direct(peer.sim.user("old"));
    // A process that never sent it (a restart), reconciling a unit rendered a day ago.
    let adapter = peer.rebuilt(&json!({})).await.sender;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let unit = |rendered: u64| {
        RenderedMessageUnit::new(
            0,
            clawgate_types::MessagePartKind::Text,
            json!({ "messages": [{ "type": "text", "text": "old" }], "renderedAtMs": rendered }),
        )
    };
    let mut ctx = SendContext::new(
        ChannelMessage::outbound("line:relay:old", "line", target.clone(), ""),
        "line:relay:old",
    );
    ctx.intent_id = Some(clawgate_types::IntentId::parse(clawgate_store::ids::new_id()).unwrap());
    let day = 24 * 60 * 60 * 1_000;
    assert_eq!(
        adapter
            .reconcile_unknown_send(&ctx, &unit(now - day))
            .await
            .unwrap(),
        Reconciliation::Undecidable,
        "LINE forgot the key: a push now could duplicate"
    );
    assert!(peer.sim.calls().iter().all(|c| c.path != PUSH_PATH));
    // Within the window the same push settles it.
    assert!(matches!(
        adapter
            .reconcile_unknown_send(&ctx, &unit(now - 60_000))
            .await
            .unwrap(),
        Reconciliation::Sent(_)
    ));
    assert_eq!(peer.texts(&target.id), ["old"]);
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_reply_refused_by_the_rate_limit_is_retried_with_its_token() {
    let peer = Peer::start().await;
    let (target, key, token) = asked(&peer, "ratelimited");
    peer.sim
        .inject(Fault::on(REPLY_PATH, FaultKind::RateLimited));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store, clock) = engine(dir.path(), peer.plugin.sender.clone());
    let (message, options) = reply(&target, &key, "answer");
    let report = messenger.send(message, options).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    // A 429 sent nothing: the token was still unused, and the retry replies with it.
    let landed = peer.sim.bot_messages(&target.id);
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].via, Via::Reply(token));
    assert_eq!(statuses(&store).await, [IntentStatus::Sent]);
    peer.sim.stop().await;
}

#[tokio::test]
async fn after_a_restart_a_reply_that_never_started_is_not_sent_and_one_that_did_is_parked() {
    let peer = Peer::start().await;
    let (target, key, _) = asked(&peer, "journal");
    let adapter = peer.plugin.sender.clone();
    let (message, _) = reply(&target, &key, "answer");
    let batch = adapter
        .render()
        .unwrap()
        .render(&message, adapter.capabilities(), &key)
        .unwrap();
    let mut ctx = SendContext::new(message, key.clone());
    ctx.intent_id = Some(clawgate_types::IntentId::parse(clawgate_store::ids::new_id()).unwrap());
    // Killed after the intent was written, before the reply call: no journal entry.
    let restarted = peer.rebuilt(&json!({})).await.sender;
    assert_eq!(
        restarted
            .reconcile_unknown_send(&ctx, &batch.units[0])
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    // Killed while the reply call was out (the answer is lost here): the entry says it may
    // have landed.
    peer.sim
        .inject(Fault::on(REPLY_PATH, FaultKind::LoseAnswer));
    let error = adapter.send_unit(&ctx, &batch.units[0]).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let restarted = peer.rebuilt(&json!({})).await.sender;
    assert_eq!(
        restarted
            .reconcile_unknown_send(&ctx, &batch.units[0])
            .await
            .unwrap(),
        Reconciliation::Undecidable
    );
    assert_eq!(peer.texts(&target.id), ["answer"]);
    peer.sim.stop().await;
}

#[tokio::test]
async fn a_refused_reply_then_a_lost_push_is_settled_by_the_push_after_a_restart() {
    let peer = Peer::start().await;
    let (target, key, token) = asked(&peer, "refusedthenlost");
    peer.sim.expire_reply_token(&token);
    peer.sim.inject(Fault::on(PUSH_PATH, FaultKind::LoseAnswer));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store, _) = engine(dir.path(), peer.plugin.sender.clone());
    let (message, options) = reply(&target, &key, "answer");
    let report = messenger.send(message, options).await.unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    drop(messenger);
    // The journal says the reply was refused: the unit is a push, settled by its retry key.
    let (messenger, _, clock) = engine(dir.path(), peer.rebuilt(&json!({})).await.sender);
    clock.advance(60_000);
    messenger.recover().await.unwrap();
    assert_eq!(vias(&peer, &target.id), ["push+key"]);
    assert_eq!(statuses(&store).await, [IntentStatus::Sent]);
    peer.sim.stop().await;
}
