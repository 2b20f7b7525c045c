//! Sending in both modes: the bot's signed messages with the referenceId receipt and its parked
//! unknowns; the user's messages with their ids, lost answers settled from history, the edit
//! and delete windows.

use std::time::Duration;

use clawgate_channel_nextcloud::sign::reference_id;
use clawgate_channel_nextcloud::simulator::{Fault, FaultKind, Op, SimulatorConfig};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{Reconciliation, SideEffect};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::IntentStatus;
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{BotPeer, UserPeer};

fn context(target: &MessageTarget, key: &str) -> SendContext {
    let message = ChannelMessage::outbound(key, "nextcloud", target.clone(), "x");
    SendContext::new(message, key)
}

fn unit(index: u32, text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(index, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_message_is_signed_over_random_and_text_and_its_receipt_is_the_reference_id() {
    let peer = BotPeer::start().await;
    let target = peer.conversation("signed");
    let ctx = context(&target, "reply-1");
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx, &unit(0, "hello from the bot"))
        .await
        .unwrap();
    let reference = reference_id(&ctx.unit_key(&unit(0, "")));
    // The bot API returns no id: the receipt is the referenceId Talk stored on the message.
    assert_eq!(part.platform_message_id, format!("ref:{reference}"));
    let landed = peer.sim.messages(&target.id);
    let ours: Vec<_> = landed.iter().filter(|m| m.actor_type == "bots").collect();
    assert_eq!(ours.len(), 1);
    assert_eq!(ours[0].reference_id, reference);
    assert_eq!(ours[0].message, "hello from the bot");
    // The signature covered random ‖ message text: the simulator verified it (201).
    let sends: Vec<_> = peer
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.op == Some(Op::BotSend))
        .collect();
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_with_the_wrong_secret_is_refused_as_auth_and_nothing_lands() {
    let peer = BotPeer::with(
        SimulatorConfig {
            bot_secret: "another-secret-that-talk-knows-0123456789abcdef".into(),
            ..SimulatorConfig::default()
        },
        json!({}),
    )
    .await;
    // The peer signs with the simulator's secret; build a second channel with a wrong one.
    let state = tempfile::tempdir().unwrap();
    let setup = clawgate_conformance::channel_setup(
        0,
        "nextcloud",
        "default",
        json!({ "base_url": peer.sim.base_url(), "mode": "bot", "bot_secret_env": "X",
            "webhook_listen": format!("127.0.0.1:{}", clawgate_conformance::ports::reserve_loopback_port()) }),
        state.path(),
    );
    let wrong = clawgate_channel_nextcloud::NextcloudFactory
        .build_with_secret(
            &setup,
            clawgate_channel_nextcloud::NextcloudSecret::BotSecret(Secret::new(
                "not-the-secret-talk-knows-0123456789abcdefgh",
            )),
        )
        .await
        .unwrap();
    let target = peer.conversation("wrong-secret");
    let error = wrong
        .sender
        .send_unit(&context(&target, "k"), &unit(0, "never"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Auth, SideEffect::None),
        "{error:?}"
    );
    assert!(
        error.message.contains("bot_secret_env"),
        "{}",
        error.message
    );
    assert!(
        !error.message.contains("not-the-secret"),
        "{}",
        error.message
    );
    assert!(peer.sim.bot_texts(&target.id).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_send_whose_answer_was_lost_is_undecidable_and_a_bot_cannot_edit() {
    let peer = BotPeer::start().await;
    let target = peer.conversation("lost");
    peer.sim
        .inject(Fault::new(Some(Op::BotSend), FaultKind::LoseAnswer));
    let ctx = context(&target, "lost-1");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx, &unit(0, "maybe"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    assert_eq!(peer.sim.bot_texts(&target.id), vec!["maybe"]);
    // No history and no id for bots: it can never be settled.
    assert!(!peer.plugin.sender.capabilities().reconciles_unknown_sends());
    assert_eq!(
        peer.plugin
            .sender
            .reconcile_unknown_send(&ctx, &unit(0, "maybe"))
            .await
            .unwrap(),
        Reconciliation::Undecidable
    );
    assert!(!peer.plugin.sender.capabilities().can_edit());
    let part = MessageReceiptPart::new("ref:x", MessagePartKind::Text, 0);
    assert!(
        peer.plugin
            .sender
            .edit(&ctx, &part, &unit(0, "edited"))
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn talks_32000_character_limit_is_declared_and_longer_units_never_leave() {
    let peer = BotPeer::start().await;
    let caps = peer.plugin.sender.capabilities();
    assert_eq!(caps.text.max_length, Some(32_000));
    assert!(caps.text.chunking);
    let target = peer.conversation("long");
    let error = peer
        .plugin
        .sender
        .send_unit(&context(&target, "long"), &unit(0, &"x".repeat(32_001)))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload);
    assert!(peer.sim.calls().iter().all(|c| c.op != Some(Op::BotSend)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_message_returns_its_id_as_receipt_with_the_reference_id() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("user-send");
    let ctx = context(&target, "reply-2");
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx, &unit(0, "hello as a user"))
        .await
        .unwrap();
    let landed = peer
        .sim
        .messages(&target.id)
        .into_iter()
        .find(|m| m.message == "hello as a user")
        .unwrap();
    assert_eq!(part.platform_message_id, landed.id.to_string());
    assert_eq!(
        landed.reference_id,
        reference_id(&ctx.unit_key(&unit(0, "")))
    );
    assert_eq!(
        part.raw.as_ref().unwrap()["referenceId"],
        json!(landed.reference_id)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_user_send_is_found_in_history_past_a_full_page() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("history");
    peer.sim
        .inject(Fault::new(Some(Op::ChatSend), FaultKind::LoseAnswer));
    let ctx = context(&target, "lost-2");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx, &unit(0, "landed, answer lost"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    // 250 later messages: the lookup pages back past Talk's 200-message page.
    for n in 0..250 {
        peer.sim
            .person_writes(&target.id, "ada", "Ada", &format!("chatter {n}"));
    }
    let landed = peer
        .sim
        .messages(&target.id)
        .into_iter()
        .find(|m| m.message == "landed, answer lost")
        .unwrap();
    match peer
        .plugin
        .sender
        .reconcile_unknown_send(&ctx, &unit(0, "landed, answer lost"))
        .await
        .unwrap()
    {
        Reconciliation::Sent(part) => assert_eq!(part.platform_message_id, landed.id.to_string()),
        other => panic!("found in history: {other:?}"),
    }
    let reads = peer
        .sim
        .calls()
        .iter()
        .filter(|c| c.op == Some(Op::ChatRead))
        .count();
    assert!(reads >= 2, "two history pages were read: {reads}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absence_is_proven_only_once_the_attempt_cannot_still_be_in_flight() {
    let peer = UserPeer::with(
        SimulatorConfig::default(),
        json!({ "request_timeout_ms": 400 }),
    )
    .await;
    let target = peer.conversation("absent");
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "an earlier message");
    // The attempt is journaled, then refused: it never landed.
    peer.sim
        .inject(Fault::new(Some(Op::ChatSend), FaultKind::Refuse(503)));
    let ctx = context(&target, "absent-1");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx, &unit(0, "never landed"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Transient);
    // Right away the request could still be in the server's hands: not proof.
    assert_eq!(
        peer.plugin
            .sender
            .reconcile_unknown_send(&ctx, &unit(0, "never landed"))
            .await
            .unwrap(),
        Reconciliation::Unresolved
    );
    // Once the request timeout has passed, the whole history without it proves absence.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let answer = peer
            .plugin
            .sender
            .reconcile_unknown_send(&ctx, &unit(0, "never landed"))
            .await
            .unwrap();
        if answer == Reconciliation::NotSent {
            break;
        }
        assert_eq!(answer, Reconciliation::Unresolved);
        assert!(std::time::Instant::now() < deadline, "never settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A unit that was never attempted has no journal entry: it never left.
    assert_eq!(
        peer.plugin
            .sender
            .reconcile_unknown_send(&context(&target, "never-tried"), &unit(0, "x"))
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_journal_survives_a_restart_of_the_channel() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("restart");
    peer.sim
        .inject(Fault::new(Some(Op::ChatSend), FaultKind::LoseAnswer));
    let ctx = context(&target, "restart-1");
    peer.plugin
        .sender
        .send_unit(&ctx, &unit(0, "before the restart"))
        .await
        .unwrap_err();
    // A new channel on the same state directory finds the attempt and the message.
    let again = UserPeer::build(&peer.sim, peer.state.path(), &json!({}))
        .await
        .unwrap();
    assert!(matches!(
        again
            .sender
            .reconcile_unknown_send(&ctx, &unit(0, "before the restart"))
            .await
            .unwrap(),
        Reconciliation::Sent(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_are_allowed_for_24_hours_and_deletes_for_6() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("windows");
    let sender = &peer.plugin.sender;
    let mut parts = Vec::new();
    for n in 0..3 {
        let ctx = context(&target, &format!("w-{n}"));
        parts.push((
            sender
                .send_unit(&ctx, &unit(0, &format!("message {n}")))
                .await
                .unwrap(),
            ctx,
        ));
    }
    peer.sim.advance_clock(Duration::from_secs(5 * 3_600));
    sender.delete(&parts[0].1, &parts[0].0).await.unwrap();
    peer.sim.advance_clock(Duration::from_secs(2 * 3_600));
    let late_delete = sender.delete(&parts[1].1, &parts[1].0).await.unwrap_err();
    assert_eq!(
        (late_delete.kind, late_delete.side_effect),
        (DeliveryFailureKind::InvalidPayload, SideEffect::None),
        "{late_delete:?}"
    );
    sender
        .edit(&parts[1].1, &parts[1].0, &unit(0, "edited after 7 h"))
        .await
        .unwrap();
    peer.sim.advance_clock(Duration::from_secs(18 * 3_600));
    let late_edit = sender
        .edit(&parts[2].1, &parts[2].0, &unit(0, "too late"))
        .await
        .unwrap_err();
    assert_eq!(late_edit.kind, DeliveryFailureKind::InvalidPayload);
    assert_eq!(
        peer.sim.user_texts(&target.id),
        vec!["edited after 7 h", "message 2"]
    );
    // A receipt older than the window is refused before any request.
    let calls = peer.sim.calls().len();
    let mut old = parts[2].0.clone();
    old.raw = Some(json!({ "timestamp": 1_000_000_000 }));
    assert!(sender.edit(&parts[2].1, &old, &unit(0, "x")).await.is_err());
    assert!(sender.delete(&parts[2].1, &old).await.is_err());
    assert_eq!(peer.sim.calls().len(), calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_app_password_stops_the_start_naming_the_setting() {
    let peer = UserPeer::start().await;
    let state = tempfile::tempdir().unwrap();
    let setup = clawgate_conformance::channel_setup(
        0,
        "nextcloud",
        "default",
        json!({ "base_url": peer.sim.base_url(), "mode": "user", "user": "clawgate",
            "app_password_env": "NC_PASSWORD" }),
        state.path(),
    );
    let error = clawgate_channel_nextcloud::NextcloudFactory
        .build_with_secret(
            &setup,
            clawgate_channel_nextcloud::NextcloudSecret::AppPassword(Secret::new(
                "wrong-app-password-1234",
            )),
        )
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("channels[0].settings.app_password_env"),
        "{text}"
    );
    assert!(!text.contains("wrong-app-password"), "{text}");
}

/// An engine over `sender`, on the store in `dir` and a driven clock.
fn engine_in(
    dir: &std::path::Path,
    sender: std::sync::Arc<dyn ChannelMessageAdapter>,
    clock: std::sync::Arc<ManualClock>,
) -> (
    Messenger,
    std::sync::Arc<clawgate_store_sqlite::SqliteStore>,
) {
    let store = std::sync::Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(
        store.clone(),
        vec![sender],
        policy,
        clock,
        "nextcloud-tests",
    );
    (messenger, store)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nextcloud_talk_finals_are_plain_durable_sends_through_the_bot() {
    // The test plan's "simple durable finals" line for Nextcloud Talk (the seed's "SDK receive
    // bridge plus send adapter"): the intent with its whole batch is durable before any I/O,
    // and the final is one bot message per chunk, never edited (a bot cannot edit).
    let peer = BotPeer::with(
        SimulatorConfig::default(),
        json!({ "max_message_chars": 1000 }),
    )
    .await;
    let target = peer.conversation("plain");
    let capabilities = peer.plugin.sender.capabilities();
    assert!(capabilities.live.is_none(), "no live previews for a bot");
    let probe = ChannelMessage::outbound("p", "nextcloud", target.clone(), "x");
    assert!(
        !peer.plugin.sender.previews(&probe),
        "a bot's reply is sent once, complete"
    );
    assert!(!capabilities.reconciles_unknown_sends());
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        std::sync::Arc::new(ManualClock::new(1_000)),
    );
    // Talk refuses the first attempt (maintenance): the intent must already be durable.
    peer.sim
        .inject(Fault::new(Some(Op::BotSend), FaultKind::Refuse(503)));
    let long = "word ".repeat(300);
    let report = messenger
        .send(
            ChannelMessage::outbound("final-1", "nextcloud", target.clone(), long.trim()),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(report.durable);
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    drop(messenger);
    // A restart sends it from the stored intent alone, split at 1000.
    let (messenger, store2) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        std::sync::Arc::new(ManualClock::new(60_000)),
    );
    drop(store);
    messenger.recover().await.unwrap();
    let texts = peer.sim.bot_texts(&target.id);
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts.iter().all(|t| t.chars().count() <= 1_000));
    assert_eq!(texts.join(" ").split_whitespace().count(), 300);
    assert_eq!(statuses(&store2).await, vec![IntentStatus::Sent]);
    assert!(
        peer.sim
            .calls()
            .iter()
            .all(|c| c.op.is_none_or(|op| op == Op::BotSend))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bot_send_with_a_lost_answer_is_parked_and_never_sent_again_after_a_restart() {
    let peer = BotPeer::start().await;
    let target = peer.conversation("parked");
    let dir = tempfile::tempdir().unwrap();
    peer.sim
        .inject(Fault::new(Some(Op::BotSend), FaultKind::LoseAnswer));
    {
        let (messenger, _store) = engine_in(
            dir.path(),
            peer.plugin.sender.clone(),
            std::sync::Arc::new(ManualClock::new(1_000)),
        );
        let report = messenger
            .send(
                ChannelMessage::outbound("parked-1", "nextcloud", target.clone(), "maybe twice?"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    let (messenger, store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        std::sync::Arc::new(ManualClock::new(10_000_000)),
    );
    messenger.recover().await.unwrap();
    messenger.recover().await.unwrap();
    assert_eq!(peer.sim.bot_texts(&target.id), vec!["maybe twice?"]);
    assert_eq!(statuses(&store).await, vec![IntentStatus::UnknownAfterSend]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_send_with_a_lost_answer_is_settled_from_history_after_a_restart() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("settled");
    let dir = tempfile::tempdir().unwrap();
    peer.sim
        .inject(Fault::new(Some(Op::ChatSend), FaultKind::LoseAnswer));
    {
        let (messenger, _store) = engine_in(
            dir.path(),
            peer.plugin.sender.clone(),
            std::sync::Arc::new(ManualClock::new(1_000)),
        );
        let report = messenger
            .send(
                ChannelMessage::outbound("settle-1", "nextcloud", target.clone(), "exactly once"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    let (messenger, store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        std::sync::Arc::new(ManualClock::new(60_000)),
    );
    messenger.recover().await.unwrap();
    assert_eq!(peer.sim.user_texts(&target.id), vec!["exactly once"]);
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent]);
}
