//! Sends as Zalo Web answers them: `msgId` receipts, encrypted parameters with a fresh
//! `clientId` each, plain durable finals to a person and a group, refusals inside HTTP 200
//! bodies (never taken for a send), and a send whose answer was lost settled by the echo of its
//! `clientId` on the listener, or left unknown and then parked, never repeated.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo_personal::simulator::{
    Fault, FaultKind, SimulatorConfig, ZaloWebSimulator,
};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::IntentStatus;
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{GROUP, Peer, build, settings, user_for};

/// An engine over `sender`, on the store in `dir` and a driven clock.
pub(crate) fn engine_in(
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
    let messenger = Messenger::new(
        store.clone(),
        vec![sender],
        policy,
        clock,
        "zalo-personal-tests",
    );
    (messenger, store)
}

pub(crate) fn reply(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "zalo-personal", target.clone(), text)
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

fn context(target: &MessageTarget, id: &str, text: &str) -> SendContext {
    SendContext::new(reply(target, id, text), id)
}

fn unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

/// The seed's line: "plain durable finals of … Zalo Personal".
#[tokio::test]
async fn zalo_personal_plain_durable_finals_land_once_for_a_person_and_a_group() {
    let peer = Peer::start().await;
    let person = MessageTarget::direct(user_for("seed"));
    let group = MessageTarget::group(GROUP);
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, store) = engine_in(dir.path(), peer.plugin.sender.clone(), clock);
    let mut receipts = Vec::new();
    for (target, id, text) in [
        (&person, "final-person", "xin chào"),
        (&group, "final-group", "chào cả nhóm"),
    ] {
        let report = messenger
            .send(reply(target, id, text), SendOptions::default())
            .await
            .unwrap();
        let SendOutcome::Sent { receipt } = report.outcome else {
            panic!("{report:?}")
        };
        receipts.push(receipt.parts[0].platform_message_id.clone());
    }
    // Sending the same durable final again is the engine's no-op, never a second message.
    let again = messenger
        .send(
            reply(&person, "final-person", "xin chào"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(again.outcome, SendOutcome::AlreadySent { .. }),
        "{again:?}"
    );
    let landed = peer.sim.landed();
    assert_eq!(
        landed
            .iter()
            .map(|m| (m.group, m.thread.as_str(), m.text.as_str()))
            .collect::<Vec<_>>(),
        vec![
            (false, person.id.as_str(), "xin chào"),
            (true, GROUP, "chào cả nhóm")
        ]
    );
    assert_eq!(
        receipts,
        landed.iter().map(|m| m.msg_id.clone()).collect::<Vec<_>>(),
        "the receipt is Zalo's msgId"
    );
    assert_ne!(
        landed[0].cli_msg_id, landed[1].cli_msg_id,
        "a fresh clientId per send"
    );
    assert_eq!(statuses(&store).await, vec![IntentStatus::Sent; 2]);
}

#[tokio::test]
async fn long_texts_are_chunked_and_every_chunk_is_its_own_message() {
    let peer = Peer::start().await;
    let person = MessageTarget::direct(user_for("chunks"));
    let dir = tempfile::tempdir().unwrap();
    let (messenger, _store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    let text = format!("{} {}", "a".repeat(1_900), "b".repeat(1_500));
    let report = messenger
        .send(reply(&person, "chunks-1", &text), SendOptions::default())
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );
    let texts = peer.texts(&person.id);
    assert_eq!(texts.len(), 2);
    assert!(texts.iter().all(|t| t.chars().count() <= 2_000));
    assert_eq!(texts.concat(), text);
}

#[tokio::test]
async fn a_refusal_in_a_200_body_is_a_failure_without_side_effect_never_a_send() {
    let peer = Peer::start().await;
    let person = MessageTarget::direct(user_for("refused"));
    let adapter = peer.plugin.sender.clone();
    peer.sim
        .inject(Fault::new(FaultKind::Refuse(-1401, "blocked".into())));
    let ctx = context(&person, "refused-1", "hi");
    let error = adapter.send_unit(&ctx, &unit("hi")).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::InvalidPayload, "{error:?}");
    assert_eq!(error.side_effect, SideEffect::None);
    assert!(error.message.contains("-1401"), "{}", error.message);
    assert!(peer.texts(&person.id).is_empty());
    peer.sim.inject(Fault::new(FaultKind::ServerError(502)));
    let ctx = context(&person, "refused-2", "hi");
    let error = adapter.send_unit(&ctx, &unit("hi")).await.unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Transient);
    assert_eq!(error.side_effect, SideEffect::None);
}

#[tokio::test]
async fn a_lost_answer_is_settled_by_the_echo_of_its_client_id() {
    let peer = Peer::start().await;
    let person = MessageTarget::direct(user_for("lost"));
    let adapter = peer.plugin.sender.clone();
    // An identical text landed normally just before: the echo must be matched by clientId,
    // not by text.
    let first = context(&person, "lost-0", "same words");
    let part = adapter
        .send_unit(&first, &unit("same words"))
        .await
        .unwrap();
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let ctx = context(&person, "lost-1", "same words");
    let error = adapter
        .send_unit(&ctx, &unit("same words"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible, "{error:?}");
    peer.read_up().await;
    let landed = peer.sim.landed_in(&person.id);
    assert_eq!(landed.len(), 2);
    assert!(!landed[1].answered);
    match adapter
        .reconcile_unknown_send(&ctx, &unit("same words"))
        .await
        .unwrap()
    {
        Reconciliation::Sent(found) => {
            assert_eq!(found.platform_message_id, landed[1].msg_id);
            assert_ne!(found.platform_message_id, part.platform_message_id);
        }
        other => panic!("the echo settles it: {other:?}"),
    }
}

#[tokio::test]
async fn a_lost_answer_without_an_echo_is_unresolved_then_parked_never_resent() {
    // The channel's listener is not running (a gateway between restarts): the echo is pushed
    // to nobody, and Zalo never pushes it again.
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let plugin = build(
        &sim,
        state.path(),
        settings(&sim, &json!({ "echo_window_ms": 300 })),
    )
    .await
    .unwrap();
    let person = MessageTarget::direct(user_for("parked"));
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let (messenger, store) = engine_in(dir.path(), plugin.sender.clone(), clock.clone());
    sim.inject(Fault::new(FaultKind::LoseAnswer));
    let report = messenger
        .send(
            reply(&person, "parked-1", "only once"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(
        matches!(report.outcome, SendOutcome::Unknown { .. }),
        "{report:?}"
    );
    let adapter = plugin.sender.clone();
    // The unit as the engine addresses it (its idempotency key).
    let intent = store
        .list_intents(&IntentFilter {
            limit: 1,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .remove(0);
    let ctx = SendContext::new(
        reply(&person, "parked-1", "only once"),
        intent.idempotency_key.clone(),
    );
    assert_eq!(
        adapter
            .reconcile_unknown_send(&ctx, &unit("only once"))
            .await
            .unwrap(),
        Reconciliation::Unresolved,
        "inside the echo window it may still come"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while adapter
        .reconcile_unknown_send(&ctx, &unit("only once"))
        .await
        .unwrap()
        != Reconciliation::Undecidable
    {
        assert!(std::time::Instant::now() < deadline, "never undecidable");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    clock.advance(120_000);
    messenger.recover().await.unwrap();
    assert_eq!(
        sim.landed_in(&person.id).len(),
        1,
        "an unknown send is never repeated"
    );
    assert_eq!(statuses(&store).await, vec![IntentStatus::UnknownAfterSend]);
    // A key that never went out reconciles as not sent.
    let never = context(&person, "never", "x");
    assert_eq!(
        adapter
            .reconcile_unknown_send(&never, &unit("x"))
            .await
            .unwrap(),
        Reconciliation::NotSent
    );
    sim.stop();
}

#[tokio::test]
async fn secrets_stay_out_of_debug_output_and_errors() {
    let peer = Peer::start().await;
    let cookie = peer.sim.cookie();
    let sek = cookie
        .split(';')
        .next()
        .unwrap()
        .trim_start_matches("zpw_sek=")
        .to_owned();
    let imei = peer.sim.imei();
    let account = crate::peer::account(&peer.plugin);
    let shown = format!(
        "{:?} {account:?} {:?}",
        peer.plugin,
        account.session().await.unwrap()
    );
    assert!(!shown.contains(&sek) && !shown.contains(&imei), "{shown}");
    // A refused login names the setting, never the values.
    let other = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let setup = clawgate_conformance::channel_setup(
        0,
        "zalo-personal",
        "default",
        settings(&other, &json!({})),
        state.path(),
    );
    let error = clawgate_channel_zalo_personal::ZaloPersonalFactory
        .build_with_secrets(
            &setup,
            Secret::new(cookie.clone()),
            Secret::new(imei.clone()),
        )
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("cookie_env"), "{text}");
    assert!(!text.contains(&sek) && !text.contains(&imei), "{text}");
    other.stop();
}
