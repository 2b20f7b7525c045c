//! The send book in the gateway's store: imported once from an earlier release's
//! `zalo-personal-sends.jsonl`, kept apart per account, and shared by gateways: the one holding
//! the account's listener records the echo of a send another gateway made, and settles it.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{LegacyFiles, SideEffect};
use clawgate_channel_zalo_personal::simulator::{
    Fault, FaultKind, SimulatorConfig, ZaloWebSimulator,
};
use clawgate_channel_zalo_personal::{BOOK_FILE, ZaloPersonalFactory};
use serde_json::{Value, json};

use crate::peer::{Relay, run_feed, settings, user_for};

fn unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn context(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "zalo-personal", target.clone(), ""),
        key,
    )
}

fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// The channel of `account` on `sim`, its state in the store of `dir`, the files of an earlier
/// release in `legacy`.
async fn build_account(
    sim: &ZaloWebSimulator,
    dir: &Path,
    account: &str,
    legacy: &Path,
    overrides: &Value,
) -> ChannelPlugin {
    let setup = clawgate_conformance::channel_setup(
        0,
        "zalo-personal",
        account,
        settings(sim, overrides),
        dir,
    )
    .with_legacy_files(LegacyFiles::in_dir(legacy));
    ZaloPersonalFactory
        .build_with_secrets(&setup, Secret::new(sim.cookie()), Secret::new(sim.imei()))
        .await
        .unwrap()
}

async fn reconcile(plugin: &ChannelPlugin, target: &MessageTarget, key: &str) -> Reconciliation {
    plugin
        .sender
        .reconcile_unknown_send(&context(target, key), &unit("x"))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_send_book_is_imported_once_and_settles_what_it_recorded() {
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let person = MessageTarget::direct(user_for("legacy"));
    let now = now_ms();
    let old = tempfile::tempdir().unwrap();
    // Answered; echoed on the listener (under its retry's clientId); neither (recent).
    let lines = [
        json!({ "t": "attempt", "key": "answered#0", "client_id": 7001, "at_ms": now }),
        json!({ "t": "answered", "key": "answered#0", "msg_id": "M-ANSWERED" }),
        json!({ "t": "attempt", "key": "echoed#0", "client_id": 7002, "at_ms": now }),
        json!({ "t": "attempt", "key": "echoed#0", "client_id": 7003, "at_ms": now + 5 }),
        json!({ "t": "echo", "client_id": 7003, "msg_id": "M-ECHOED" }),
        json!({ "t": "echo", "client_id": 9999, "msg_id": "M-SOMEONE-ELSE" }),
        json!({ "t": "attempt", "key": "pending#0", "client_id": 7004, "at_ms": now }),
    ];
    let mut file: String = lines.iter().map(|l| format!("{l}\n")).collect();
    file.push_str("{\"t\":\"attempt\",\"key\":\"torn");
    std::fs::write(old.path().join(BOOK_FILE), &file).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let window = json!({ "echo_window_ms": 600_000 });
    let first = build_account(&sim, dir.path(), "default", old.path(), &window).await;
    assert!(!old.path().join(BOOK_FILE).exists(), "set aside");
    assert!(old.path().join(format!("{BOOK_FILE}.imported")).is_file());
    // A crash before the file was set aside: imported again, nothing added or changed.
    std::fs::write(old.path().join(BOOK_FILE), &file).unwrap();
    let second = build_account(&sim, dir.path(), "default", old.path(), &window).await;
    for plugin in [&first, &second] {
        let Reconciliation::Sent(part) = reconcile(plugin, &person, "answered").await else {
            panic!("the imported answer settles its unit");
        };
        assert_eq!(part.platform_message_id, "M-ANSWERED");
        let Reconciliation::Sent(part) = reconcile(plugin, &person, "echoed").await else {
            panic!("the imported echo settles its unit");
        };
        assert_eq!(part.platform_message_id, "M-ECHOED");
        assert_eq!(
            reconcile(plugin, &person, "pending").await,
            Reconciliation::Unresolved,
            "attempted, neither answered nor echoed: never resent"
        );
        assert_eq!(
            reconcile(plugin, &person, "never").await,
            Reconciliation::NotSent
        );
    }
    sim.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_send_books_apart() {
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let person = MessageTarget::direct(user_for("two-accounts"));
    let old = tempfile::tempdir().unwrap();
    let line = json!({ "t": "attempt", "key": "old#0", "client_id": 8001, "at_ms": now_ms() });
    std::fs::write(old.path().join(BOOK_FILE), format!("{line}\n")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let window = json!({ "echo_window_ms": 600_000 });
    // The account that starts first imports the file both shared.
    let alpha = build_account(&sim, dir.path(), "alpha", old.path(), &window).await;
    let beta = build_account(&sim, dir.path(), "beta", old.path(), &window).await;
    let sent = alpha
        .sender
        .send_unit(&context(&person, "same-key"), &unit("from alpha"))
        .await
        .unwrap();
    let Reconciliation::Sent(found) = reconcile(&alpha, &person, "same-key").await else {
        panic!("alpha's answer settles alpha's send");
    };
    assert_eq!(found.platform_message_id, sent.platform_message_id);
    assert_eq!(
        reconcile(&alpha, &person, "old").await,
        Reconciliation::Unresolved,
        "the imported attempt is alpha's"
    );
    for key in ["same-key", "old"] {
        assert_eq!(
            reconcile(&beta, &person, key).await,
            Reconciliation::NotSent,
            "{key} was never sent on beta"
        );
    }
    sim.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_holding_the_listener_settles_a_lost_answer_of_another_gateways_send() {
    let sim = ZaloWebSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let none = tempfile::tempdir().unwrap();
    let window = json!({ "echo_window_ms": 600_000 });
    // The second gateway starts first and holds the account's one listener.
    let listening = build_account(&sim, dir.path(), "default", none.path(), &window).await;
    let feed = run_feed(&listening, Arc::new(Relay::default()));
    assert!(sim.listening(Duration::from_secs(20)).await);
    // The first gateway sends (its listener is not running: Zalo allows one) and loses the
    // answer; Zalo pushes the echo to the second gateway's listener.
    let sending = build_account(&sim, dir.path(), "default", none.path(), &window).await;
    let person = MessageTarget::direct(user_for("second-gateway"));
    sim.inject(Fault::new(FaultKind::LoseAnswer));
    let error = sending
        .sender
        .send_unit(&context(&person, "lost"), &unit("its answer was lost"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    drop(sending);
    let landed = sim.landed_in(&person.id);
    assert_eq!(landed.len(), 1);
    // The listener records the echo under the first gateway's clientId, read from the store.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let part = loop {
        match reconcile(&listening, &person, "lost").await {
            Reconciliation::Sent(part) => break part,
            Reconciliation::Unresolved => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the echo never settled the send"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("the first gateway's attempt is in the store: {other:?}"),
        }
    };
    assert_eq!(part.platform_message_id, landed[0].msg_id);
    assert_eq!(sim.landed_in(&person.id).len(), 1, "never sent twice");
    feed.abort();
    sim.stop();
}
