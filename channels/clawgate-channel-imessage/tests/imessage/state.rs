//! The send journal in the gateway's store: imported once from an earlier release's
//! `imessage-sends.jsonl`, kept apart per account, and read by a second gateway on the same
//! store, which settles the sends the first left unknown and recognises their echoes.

use std::path::Path;
use std::time::Duration;

use clawgate_channel_imessage::simulator::{
    BlueBubblesSimulator, Fault, FaultKind, SimulatorConfig,
};
use clawgate_channel_imessage::{
    ImessageAccount, ImessageFactory, JOURNAL_FILE, RETENTION_MS, temp_guid_for,
};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{LegacyFiles, SideEffect};
use serde_json::json;

use crate::echoes::Run;
use crate::peer::{Peer, TOKEN, build, quick, settings};

fn unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn context(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "imessage", target.clone(), ""),
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

/// The channel of `account` on `sim` with its state in the store of `dir` and the files of an
/// earlier release in `legacy`.
async fn build_account(
    sim: &BlueBubblesSimulator,
    dir: &Path,
    account: &str,
    legacy: &Path,
) -> ChannelPlugin {
    let settings = settings(
        sim,
        clawgate_conformance::ports::reserve_loopback_port(),
        &json!({}),
    );
    let setup = clawgate_conformance::channel_setup(0, "imessage", account, settings, dir)
        .with_legacy_files(LegacyFiles::in_dir(legacy));
    ImessageFactory
        .build_with_secrets(&setup, Secret::new(sim.password()), Secret::new(TOKEN))
        .await
        .unwrap()
}

/// An attempt line of the earlier release's journal.
fn attempt_line(key: &str, chat: &str, text: &str, at_ms: u64) -> serde_json::Value {
    json!({ "t": "attempt", "key": key, "chat": chat, "text": text,
        "temp_guid": temp_guid_for(key), "at_ms": at_ms })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_journal_is_imported_once_and_settles_what_it_recorded() {
    let peer = Peer::start().await;
    let person = peer.person("legacy");
    let now = now_ms();
    // The earlier release sent a unit whose answer was lost (its row exists) and one that was
    // answered; a third attempt is older than the week that release kept.
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let error = peer
        .plugin
        .sender
        .send_unit(&context(&person, "lost"), &unit("sent before the upgrade"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    let old = tempfile::tempdir().unwrap();
    let lines = [
        attempt_line("lost#0", &person.id, "sent before the upgrade", now - 1_000),
        attempt_line("answered#0", &person.id, "answered", now - 900),
        json!({ "t": "answered", "key": "answered#0", "guid": "G-ANSWERED" }),
        attempt_line(
            "ancient#0",
            &person.id,
            "long ago",
            now - RETENTION_MS - 60_000,
        ),
    ];
    let mut file: String = lines.iter().map(|l| format!("{l}\n")).collect();
    file.push_str("{\"t\":\"attempt\",\"key\":\"torn");
    std::fs::write(old.path().join(JOURNAL_FILE), &file).unwrap();
    // The upgraded gateway: a store that holds nothing yet.
    let dir = tempfile::tempdir().unwrap();
    let plugin = build_account(&peer.sim, dir.path(), "default", old.path()).await;
    assert!(!old.path().join(JOURNAL_FILE).exists(), "set aside");
    assert!(
        old.path()
            .join(format!("{JOURNAL_FILE}.imported"))
            .is_file()
    );
    let account = plugin.extension::<ImessageAccount>().unwrap();
    assert!(
        !account.echoes.is_empty(),
        "the echo cache was fed the import"
    );
    let row = peer
        .sim
        .messages()
        .into_iter()
        .find(|m| m.text == "sent before the upgrade")
        .unwrap()
        .guid;
    // A crash before the file was set aside: imported again, nothing added or changed.
    std::fs::write(old.path().join(JOURNAL_FILE), &file).unwrap();
    for plugin in [
        plugin,
        build_account(&peer.sim, dir.path(), "default", old.path()).await,
    ] {
        let sender = plugin.sender.clone();
        let Reconciliation::Sent(part) = sender
            .reconcile_unknown_send(&context(&person, "lost"), &unit("sent before the upgrade"))
            .await
            .unwrap()
        else {
            panic!("the imported attempt is settled from its row");
        };
        assert_eq!(part.platform_message_id, row);
        let Reconciliation::Sent(part) = sender
            .reconcile_unknown_send(&context(&person, "answered"), &unit("answered"))
            .await
            .unwrap()
        else {
            panic!("the imported answer settles its unit");
        };
        assert_eq!(part.platform_message_id, "G-ANSWERED");
        assert_eq!(
            sender
                .reconcile_unknown_send(&context(&person, "ancient"), &unit("long ago"))
                .await
                .unwrap(),
            Reconciliation::NotSent,
            "older than the week the earlier release kept"
        );
    }
    assert_eq!(
        peer.sim.our_texts(&person.id),
        vec!["sent before the upgrade"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_journals_apart() {
    let peer = Peer::start().await;
    let person = peer.person("two-accounts");
    let old = tempfile::tempdir().unwrap();
    let line = attempt_line("old#0", &person.id, "before the upgrade", now_ms());
    std::fs::write(old.path().join(JOURNAL_FILE), format!("{line}\n")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The account that starts first imports the file both shared.
    let alpha = build_account(&peer.sim, dir.path(), "alpha", old.path())
        .await
        .sender;
    let beta = build_account(&peer.sim, dir.path(), "beta", old.path())
        .await
        .sender;
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let ctx = context(&person, "same-key");
    assert!(alpha.send_unit(&ctx, &unit("alpha's words")).await.is_err());
    let Reconciliation::Sent(_) = alpha
        .reconcile_unknown_send(&ctx, &unit("alpha's words"))
        .await
        .unwrap()
    else {
        panic!("alpha settles its own send");
    };
    // Beta never attempted that key: it was not sent on beta, which may send it.
    for key in ["same-key", "old"] {
        assert_eq!(
            beta.reconcile_unknown_send(&context(&person, key), &unit("x"))
                .await
                .unwrap(),
            Reconciliation::NotSent,
            "{key} is alpha's"
        );
    }
    assert_eq!(
        alpha
            .reconcile_unknown_send(&context(&person, "old"), &unit("before the upgrade"))
            .await
            .unwrap(),
        Reconciliation::Unresolved,
        "the imported attempt is alpha's (it has no row: unresolved, never resent)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_settles_the_first_ones_lost_answer_and_knows_its_echoes() {
    let sim = BlueBubblesSimulator::start(SimulatorConfig {
        echo_delay: Duration::from_millis(50),
        ..quick()
    })
    .await
    .unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    sim.set_webhook(Some(&format!(
        "http://127.0.0.1:{port}/bluebubbles/webhook?token={TOKEN}"
    )));
    let dir = tempfile::tempdir().unwrap();
    // The second gateway starts first and takes the webhook; it answers the account's own
    // messages (from_me_is_inbound), so an echo it does not recognise becomes a turn.
    let extra = json!({ "from_me_is_inbound": true });
    let second = Run::open(&sim, dir.path(), port, extra.clone()).await;
    let first = build(
        &sim,
        dir.path(),
        settings(
            &sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &extra,
        ),
    )
    .await
    .unwrap();
    let chat = MessageTarget::direct(sim.dm("+15550004444"));
    first
        .sender
        .send_unit(&context(&chat, "gw-1"), &unit("sent by the first gateway"))
        .await
        .unwrap();
    sim.inject(Fault::new(FaultKind::LoseAnswer));
    let lost = context(&chat, "gw-2");
    let error = first
        .sender
        .send_unit(&lost, &unit("its answer was lost"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    assert_eq!(
        second.sink.texts(),
        Vec::<String>::new(),
        "the first gateway's echoes are not turns"
    );
    assert_eq!(second.account().counts.echoes(), 2);
    // The first gateway is gone; the second settles its send from the shared journal.
    drop(first);
    let Reconciliation::Sent(part) = second
        .plugin
        .sender
        .reconcile_unknown_send(&lost, &unit("its answer was lost"))
        .await
        .unwrap()
    else {
        panic!("the lost answer is settled from the row, not sent again");
    };
    let row = sim
        .messages()
        .into_iter()
        .find(|m| m.text == "its answer was lost")
        .unwrap();
    assert_eq!(part.platform_message_id, row.guid);
    assert_eq!(
        sim.our_texts(&chat.id),
        vec!["sent by the first gateway", "its answer was lost"]
    );
    second.crash().await;
}
