//! User mode's state in the gateway's store: the attempt journal and the kept start of the chat,
//! imported once from an earlier release's `<name>.talk` directory, kept apart per account,
//! and read by a second gateway on the same store, which settles the first one's lost answer.

use std::path::Path;

use clawgate_channel_nextcloud::simulator::{Fault, FaultKind, NextcloudSimulator, Op};
use clawgate_channel_nextcloud::{NextcloudFactory, NextcloudSecret, sign};
use clawgate_channel_sdk::LegacyFiles;
use clawgate_channel_sdk::prelude::*;
use serde_json::json;

use crate::peer::UserPeer;

fn unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn context(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(
        ChannelMessage::outbound(key, "nextcloud", target.clone(), ""),
        key,
    )
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// The user channel `name` of `account` on `sim`, its state in the store of `dir`, the files of
/// an earlier release in `legacy`.
async fn build_account(
    sim: &NextcloudSimulator,
    dir: &Path,
    name: &str,
    account: &str,
    legacy: &Path,
) -> ChannelPlugin {
    let settings = json!({
        "base_url": sim.base_url(),
        "mode": "user",
        "user": sim.config().user,
        "app_password_env": "UNUSED_IN_TESTS",
        "poll_timeout_s": 2,
        "request_timeout_ms": 3000,
    });
    let setup = clawgate_conformance::channel_setup(0, name, account, settings, dir)
        .with_legacy_files(LegacyFiles::in_dir(legacy));
    NextcloudFactory
        .build_with_secret(
            &setup,
            NextcloudSecret::AppPassword(Secret::new(sim.config().app_password.clone())),
        )
        .await
        .unwrap()
}

/// What one immediate poll from the beginning hands over, as texts.
async fn polled_texts(plugin: &ChannelPlugin) -> Vec<String> {
    let InboundSource::Polling(feed) = plugin.source.clone() else {
        panic!("user mode polls");
    };
    feed.poll(&PollFrom::new(0, None), PollWait::Immediate)
        .await
        .unwrap()
        .iter()
        .filter_map(|e| plugin.receiver.as_ref().unwrap().normalize(&e.raw).ok())
        .map(|n| n.message.body.unwrap().text)
        .collect()
}

/// An earlier release's `<name>.talk` directory in `legacy`: an attempt of `reference` in
/// `token`, and the chat's start.
fn write_legacy(legacy: &Path, name: &str, attempt: Option<(&str, &str)>, after: i64) {
    let dir = legacy.join(format!("{name}.talk"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut journal = String::new();
    if let Some((reference, token)) = attempt {
        journal.push_str(
            &json!({ "ref": reference, "token": token, "at": now_ms() - 1_000 }).to_string(),
        );
        journal.push('\n');
    }
    journal.push_str("{\"ref\":\"torn");
    std::fs::write(dir.join("talk-attempts.jsonl"), journal).unwrap();
    std::fs::write(
        dir.join("talk-start.json"),
        json!({ "after": after }).to_string(),
    )
    .unwrap();
    // The earlier release's temporary file: not state.
    std::fs::write(dir.join("talk-attempts.jsonl.tmp"), "garbage").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_talk_directory_is_imported_once_journal_and_start() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("legacy");
    // The earlier release sent a unit whose answer was lost (it landed).
    peer.sim
        .inject(Fault::new(Some(Op::ChatSend), FaultKind::LoseAnswer));
    let ctx = context(&target, "legacy-1");
    peer.plugin
        .sender
        .send_unit(&ctx, &unit("sent before the upgrade"))
        .await
        .unwrap_err();
    let skipped = peer
        .sim
        .person_writes(&target.id, "ada", "Ada", "before the kept start");
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "after the kept start");
    let old = tempfile::tempdir().unwrap();
    let reference = sign::reference_id("legacy-1#0");
    write_legacy(
        old.path(),
        "nextcloud",
        Some((&reference, &target.id)),
        skipped,
    );
    // The upgraded gateway, on a store that holds nothing yet.
    let dir = tempfile::tempdir().unwrap();
    let plugin = build_account(&peer.sim, dir.path(), "nextcloud", "default", old.path()).await;
    assert!(!old.path().join("nextcloud.talk").exists(), "set aside");
    assert!(old.path().join("nextcloud.talk.imported").is_dir());
    let Reconciliation::Sent(part) = plugin
        .sender
        .reconcile_unknown_send(&ctx, &unit("sent before the upgrade"))
        .await
        .unwrap()
    else {
        panic!("the imported attempt is looked up in history");
    };
    let landed = peer
        .sim
        .messages(&target.id)
        .into_iter()
        .find(|m| m.message == "sent before the upgrade")
        .unwrap();
    assert_eq!(part.platform_message_id, landed.id.to_string());
    assert_eq!(
        polled_texts(&plugin).await,
        vec!["after the kept start"],
        "the chat starts where the earlier release kept it, not at the present"
    );
    // A crash before the directory was set aside: imported again; the start already in the
    // store holds (the file now names another one).
    std::fs::rename(
        old.path().join("nextcloud.talk.imported"),
        old.path().join("nextcloud.talk"),
    )
    .unwrap();
    let newest = peer.sim.all_messages().last().unwrap().id;
    write_legacy(old.path(), "nextcloud", None, newest);
    let again = build_account(&peer.sim, dir.path(), "nextcloud", "default", old.path()).await;
    assert_eq!(polled_texts(&again).await, vec!["after the kept start"]);
    assert_eq!(
        peer.sim.user_texts(&target.id),
        vec!["sent before the upgrade"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_accounts_on_one_store_keep_their_journals_and_starts_apart() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("two-accounts");
    let skipped = peer
        .sim
        .person_writes(&target.id, "ada", "Ada", "before alpha's start");
    peer.sim
        .person_writes(&target.id, "ada", "Ada", "after alpha's start");
    // Each account's earlier directory was named after its channel: alpha had one.
    let old = tempfile::tempdir().unwrap();
    write_legacy(old.path(), "nextcloud-alpha", None, skipped);
    let dir = tempfile::tempdir().unwrap();
    let alpha = build_account(
        &peer.sim,
        dir.path(),
        "nextcloud-alpha",
        "alpha",
        old.path(),
    )
    .await;
    let beta = build_account(&peer.sim, dir.path(), "nextcloud-beta", "beta", old.path()).await;
    assert_eq!(polled_texts(&alpha).await, vec!["after alpha's start"]);
    assert_eq!(
        polled_texts(&beta).await,
        Vec::<String>::new(),
        "beta had no kept start: it starts at the present"
    );
    // An attempt on alpha is not beta's.
    peer.sim
        .inject(Fault::new(Some(Op::ChatSend), FaultKind::LoseAnswer));
    let ctx = context(&target, "same-key");
    alpha
        .sender
        .send_unit(&ctx, &unit("from alpha"))
        .await
        .unwrap_err();
    assert!(matches!(
        alpha
            .sender
            .reconcile_unknown_send(&ctx, &unit("from alpha"))
            .await
            .unwrap(),
        Reconciliation::Sent(_)
    ));
    assert_eq!(
        beta.sender
            .reconcile_unknown_send(&ctx, &unit("from alpha"))
            .await
            .unwrap(),
        Reconciliation::NotSent,
        "never attempted on beta"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_settles_the_first_ones_lost_answer_from_the_shared_journal() {
    let peer = UserPeer::start().await;
    let target = peer.conversation("second-gateway");
    // The second gateway starts before the first one sends: nothing it read at start knows of
    // the attempt.
    let second = UserPeer::build(&peer.sim, peer.state.path(), &json!({}))
        .await
        .unwrap();
    peer.sim
        .inject(Fault::new(Some(Op::ChatSend), FaultKind::LoseAnswer));
    let ctx = context(&target, "gw-1");
    peer.plugin
        .sender
        .send_unit(&ctx, &unit("its answer was lost"))
        .await
        .unwrap_err();
    let Reconciliation::Sent(part) = second
        .sender
        .reconcile_unknown_send(&ctx, &unit("its answer was lost"))
        .await
        .unwrap()
    else {
        panic!("the attempt is in the store: looked up in history, never sent again");
    };
    let landed = peer
        .sim
        .messages(&target.id)
        .into_iter()
        .find(|m| m.message == "its answer was lost")
        .unwrap();
    assert_eq!(part.platform_message_id, landed.id.to_string());
    assert_eq!(peer.sim.user_texts(&target.id), vec!["its answer was lost"]);
}
