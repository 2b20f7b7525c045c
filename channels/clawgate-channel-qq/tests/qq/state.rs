//! The active-message journal in the gateway's store: imported once from an earlier release's
//! `active-sends.jsonl`, kept apart per account, and read from the store by a second gateway
//! that settles the sends the first one left unknown.

use std::sync::Arc;

use clawgate_channel_qq::simulator::{Fault, FaultKind};
use clawgate_channel_qq::{JOURNAL_FILE, QqFactory, msg_seq_of};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::state::ChannelScope;
use clawgate_channel_sdk::types::IntentId;
use clawgate_channel_sdk::types::clock::ManualClock;
use clawgate_channel_sdk::{LegacyFiles, SideEffect};
use serde_json::{Value, json};

use crate::peer::{Peer, build, chat, settings, user_for};

/// 2024-03-15T12:00:00Z: a month that is not the test machine's.
const MARCH_2024: i64 = 1_710_504_000_000;

/// A durable send of `key` to `target` (the engine's shape: with an intent).
fn durable(target: &MessageTarget, key: &str) -> SendContext {
    let message = ChannelMessage::outbound(key, "qq", target.clone(), "");
    let mut ctx = SendContext::new(message, key);
    ctx.intent_id = Some(IntentId::parse("0193b0c2-7d3e-7a11-8000-0000000000aa").unwrap());
    ctx
}

fn text(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::new(0, MessagePartKind::Text, json!({ "text": text }))
}

/// A channel of `account` on `sim` whose state is in the store of `dir`, read by a clock
/// standing at `now`, with the files of an earlier release in `legacy`.
async fn build_at(
    peer: &Peer,
    dir: &std::path::Path,
    account: &str,
    now: i64,
    legacy: &std::path::Path,
    overrides: &Value,
) -> ChannelPlugin {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let state = ChannelState::new(
        store,
        ChannelScope::new("qq", account),
        Arc::new(ManualClock::new(now)),
    );
    let setup = ChannelSetup::new(
        0,
        "qq",
        account,
        settings(
            &peer.sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            overrides,
        ),
        state,
    )
    .with_legacy_files(LegacyFiles::in_dir(legacy));
    QqFactory
        .build_with_secret(&setup, Secret::new(peer.sim.secret()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_journal_is_imported_once_and_settles_counts_and_targets_as_before() {
    let peer = Peer::start().await;
    let quiet = user_for("legacy-quiet");
    let (chosen_target, chosen_msg) = peer.person_with_id("legacy-chosen");
    let old = tempfile::tempdir().unwrap();
    // Two active attempts to `quiet` in March 2024 (one answered), a passive reply's id, a
    // reply target chosen at send time, and a torn last line.
    let lines = [
        json!({ "key": "qq:relay:a#0", "target": quiet, "month": "2024-03" }),
        json!({ "key": "qq:relay:a#0", "target": quiet, "month": "2024-03", "id": "ROBOT1.0_old_a" }),
        json!({ "key": "qq:relay:b#0", "target": quiet, "month": "2024-03" }),
        json!({ "key": "qq:reply:P:0#0", "target": quiet, "month": "", "id": "ROBOT1.0_old_p", "passive": true }),
        json!({ "key": "qq:relay:c#0", "target": "", "month": "", "passive": true, "reply_to": chosen_msg }),
    ];
    let mut file: String = lines.iter().map(|l| format!("{l}\n")).collect();
    file.push_str("{\"key\":\"qq:relay:torn#0\",\"tar");
    std::fs::write(old.path().join(JOURNAL_FILE), &file).unwrap();
    let quota = json!({ "active_quota_per_month": 3 });
    let first = build_at(
        &peer,
        peer.state.path(),
        "default",
        MARCH_2024,
        old.path(),
        &quota,
    )
    .await;
    assert!(!old.path().join(JOURNAL_FILE).exists(), "set aside");
    assert!(
        old.path()
            .join(format!("{JOURNAL_FILE}.imported"))
            .is_file()
    );
    // A crash before the file was set aside: the next start imports it again, adding nothing.
    std::fs::write(old.path().join(JOURNAL_FILE), &file).unwrap();
    let sender = build_at(
        &peer,
        peer.state.path(),
        "default",
        MARCH_2024,
        old.path(),
        &quota,
    )
    .await
    .sender;
    drop(first);
    let target = MessageTarget::direct(quiet.clone());
    // The answered attempt names its message; the other is parked, not sent again.
    let Reconciliation::Sent(part) = sender
        .reconcile_unknown_send(&durable(&target, "qq:relay:a"), &text("a"))
        .await
        .unwrap()
    else {
        panic!("an imported answered attempt settles as sent");
    };
    assert_eq!(part.platform_message_id, "ROBOT1.0_old_a");
    assert_eq!(
        sender
            .reconcile_unknown_send(&durable(&target, "qq:relay:b"), &text("b"))
            .await
            .unwrap(),
        Reconciliation::Undecidable
    );
    let Reconciliation::Sent(part) = sender
        .reconcile_unknown_send(&durable(&target, "qq:reply:P:0"), &text("p"))
        .await
        .unwrap()
    else {
        panic!("an imported passive id settles as sent");
    };
    assert_eq!(part.platform_message_id, "ROBOT1.0_old_p");
    // The chosen target holds: the check answers the message chosen before the upgrade.
    let Reconciliation::Sent(_) = sender
        .reconcile_unknown_send(&durable(&chosen_target, "qq:relay:c"), &text("c"))
        .await
        .unwrap()
    else {
        panic!("an imported chosen target is checked with its pair");
    };
    let landed = peer.sim.messages(&chat(&chosen_target));
    assert_eq!(landed.len(), 1);
    assert_eq!(landed[0].reply_to.as_deref(), Some(chosen_msg.as_str()));
    assert_eq!(landed[0].msg_seq, Some(msg_seq_of("qq:relay:c#0")));
    // Two of March's three active messages were used (once, though imported twice).
    sender
        .send_unit(&durable(&target, "qq:relay:d"), &text("third"))
        .await
        .unwrap();
    let error = sender
        .send_unit(&durable(&target, "qq:relay:e"), &text("fourth"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error}");
    assert_eq!(peer.texts(&chat(&target)), vec!["third"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_journals_and_quotas_apart() {
    let peer = Peer::start().await;
    let quiet = user_for("two-accounts");
    let target = MessageTarget::direct(quiet.clone());
    let old = tempfile::tempdir().unwrap();
    let line = json!({ "key": "qq:relay:old#0", "target": quiet, "month": "2024-03" });
    std::fs::write(old.path().join(JOURNAL_FILE), format!("{line}\n")).unwrap();
    let quota = json!({ "active_quota_per_month": 2 });
    // The account that starts first imports the shared file.
    let alpha = build_at(
        &peer,
        peer.state.path(),
        "alpha",
        MARCH_2024,
        old.path(),
        &quota,
    )
    .await
    .sender;
    let sent = alpha
        .send_unit(&durable(&target, "qq:relay:x"), &text("from alpha"))
        .await
        .unwrap();
    let beta = build_at(
        &peer,
        peer.state.path(),
        "beta",
        MARCH_2024,
        old.path(),
        &quota,
    )
    .await
    .sender;
    // Beta's quota is its own: alpha's two attempts (imported and sent) are not counted.
    for n in 0..2 {
        beta.send_unit(
            &durable(&target, &format!("qq:relay:beta-{n}")),
            &text(&format!("from beta {n}")),
        )
        .await
        .unwrap();
    }
    assert!(
        alpha
            .send_unit(&durable(&target, "qq:relay:y"), &text("alpha again"))
            .await
            .is_err(),
        "alpha's own quota is used up"
    );
    // Each account settles its own sends only.
    let Reconciliation::Sent(found) = alpha
        .reconcile_unknown_send(&durable(&target, "qq:relay:x"), &text("from alpha"))
        .await
        .unwrap()
    else {
        panic!("alpha's send is in alpha's journal");
    };
    assert_eq!(found.platform_message_id, sent.platform_message_id);
    for key in ["qq:relay:x", "qq:relay:old"] {
        assert_eq!(
            beta.reconcile_unknown_send(&durable(&target, key), &text("x"))
                .await
                .unwrap(),
            Reconciliation::NotSent,
            "{key} is alpha's"
        );
    }
    assert_eq!(
        alpha
            .reconcile_unknown_send(&durable(&target, "qq:relay:old"), &text("x"))
            .await
            .unwrap(),
        Reconciliation::Undecidable,
        "the imported attempt is alpha's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_settles_the_sends_the_first_left_unknown_from_the_shared_store() {
    let peer = Peer::with(crate::peer::quick(), json!({ "active_quota_per_month": 2 })).await;
    // The second gateway starts before the first one sends anything: nothing it read at start
    // knows of those sends.
    let second = build(
        peer.state.path(),
        settings(
            &peer.sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({ "active_quota_per_month": 2 }),
        ),
        &peer.sim.secret(),
    )
    .await
    .unwrap()
    .sender;
    let first = peer.plugin.sender.clone();
    // Active messages (the person never wrote: no passive reply is possible).
    let target = MessageTarget::direct(user_for("second-gateway"));
    let answered = durable(&target, "qq:relay:answered");
    let part = first.send_unit(&answered, &text("answered")).await.unwrap();
    let lost = durable(&target, "qq:relay:lost");
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let error = first.send_unit(&lost, &text("lost")).await.unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    // A passive reply to the chat's latest message, which only the first gateway saw.
    let (person, msg_id) = peer.person_with_id("second-gateway-chosen");
    let notice = durable(&person, "qq:relay:notice");
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    assert!(first.send_unit(&notice, &text("a notice")).await.is_err());
    // The first gateway is gone; the second settles each from the store.
    drop(first);
    let Reconciliation::Sent(found) = second
        .reconcile_unknown_send(&answered, &text("answered"))
        .await
        .unwrap()
    else {
        panic!("the answered active message is settled from the shared journal");
    };
    assert_eq!(found.platform_message_id, part.platform_message_id);
    assert_eq!(
        second
            .reconcile_unknown_send(&lost, &text("lost"))
            .await
            .unwrap(),
        Reconciliation::Undecidable,
        "an active attempt without an answer is parked, not sent again"
    );
    let Reconciliation::Sent(settled) = second
        .reconcile_unknown_send(&notice, &text("a notice"))
        .await
        .unwrap()
    else {
        panic!("the notice is checked under the pair the first gateway chose");
    };
    let seq = msg_seq_of("qq:relay:notice#0");
    assert_eq!(settled.platform_message_id, format!("{msg_id}:{seq}"));
    // The month's quota counts the first gateway's attempts.
    let error = second
        .send_unit(&durable(&target, "qq:relay:third"), &text("third"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::Permission, "{error}");
    assert_eq!(peer.texts(&chat(&target)), vec!["answered", "lost"]);
    assert_eq!(peer.texts(&chat(&person)), vec!["a notice"]);
}
