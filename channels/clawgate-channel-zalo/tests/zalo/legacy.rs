//! The files an earlier release kept in the state directory (`zalo-tokens.json`, the rotated
//! token chain; `zalo-sends.jsonl`, the send book) are taken into the gateway's store once:
//! the channel then uses the stored chain and settles sends from the imported evidence, the
//! files are set aside as `<name>.imported`, and an import interrupted before that (the file
//! still there on the next start) adds nothing and does not overwrite what the store has since.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_zalo::simulator::ZaloSimulator;
use clawgate_channel_zalo::{BOOK_FILE, SENDS_BOOK, TOKEN_FILE};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::peer::{build, build_account, quick, settings, stored_tokens};
use crate::send::reply;

fn fingerprint(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

async fn records(state: &Path) -> usize {
    clawgate_conformance::channel_state(state, "zalo", "default")
        .book(SENDS_BOOK)
        .since::<Value>(0)
        .await
        .unwrap()
        .len()
}

fn token_calls(sim: &ZaloSimulator) -> Vec<String> {
    sim.calls()
        .into_iter()
        .filter(|c| c.path == "/v4/oa/access_token")
        .map(|c| {
            c.body["refresh_token"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn the_token_file_and_send_book_of_an_earlier_release_are_imported_once() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    let config = settings(&sim, port, &json!({}));
    // The earlier release spent the configured token long ago; its file holds the live chain.
    let configured = sim.authorize();
    let elsewhere = tempfile::tempdir().unwrap();
    drop(
        build(&sim, elsewhere.path(), config.clone(), &configured)
            .await
            .unwrap(),
    );
    let live = stored_tokens(elsewhere.path(), "default").await["refresh_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let state = tempfile::tempdir().unwrap();
    std::fs::write(
        state.path().join(TOKEN_FILE),
        serde_json::to_vec_pretty(&json!({
            "access_token": "",
            "access_expires_at_ms": 0,
            "refresh_token": live,
            "seeded_from": fingerprint(&configured),
            "refreshing_since_ms": null,
        }))
        .unwrap(),
    )
    .unwrap();
    // Its book: a send whose answer was lost and whose echo came, one answered, a torn line.
    let user = "8777";
    sim.open_window(user);
    let target = MessageTarget::direct(user);
    let lost = SendContext::new(reply(&target, "old-lost", ""), "old-lost");
    let answered = SendContext::new(reply(&target, "old-answered", ""), "old-answered");
    let text = "from the earlier release";
    let unit = RenderedMessageUnit::text(0, text);
    let (lost_key, answered_key) = (lost.unit_key(&unit), answered.unit_key(&unit));
    let at = now_ms();
    let lines = [
        json!({"t": "attempt", "key": lost_key, "user_id": user, "text": text, "at_ms": at}),
        json!({"t": "attempt", "key": answered_key, "user_id": user, "text": text, "at_ms": at}),
        json!({"t": "answered", "key": answered_key, "msg_id": "m-answered"}),
        json!({"t": "echo", "msg_id": "m-answered", "user_id": user, "text": text, "at_ms": at + 5}),
        json!({"t": "echo", "msg_id": "m-lost", "user_id": user, "text": text, "at_ms": at + 10}),
    ];
    let mut book: String = lines.iter().map(|l| format!("{l}\n")).collect();
    book.push_str("{\"t\":\"echo\",\"msg_id\":\"m-torn");
    std::fs::write(state.path().join(BOOK_FILE), book).unwrap();

    let plugin = build_account(
        &sim,
        state.path(),
        "default",
        config.clone(),
        &configured,
        Some(state.path()),
    )
    .await
    .expect("the imported chain works; the configured token is spent");
    assert_eq!(
        token_calls(&sim).last().map(String::as_str),
        Some(live.as_str()),
        "the start refreshed with the file's token"
    );
    for name in [TOKEN_FILE, BOOK_FILE] {
        assert!(!state.path().join(name).exists(), "{name} is set aside");
        assert!(state.path().join(format!("{name}.imported")).is_file());
    }
    let expect_sent = |answer: Reconciliation, msg_id: &str| match answer {
        Reconciliation::Sent(part) => assert_eq!(part.platform_message_id, msg_id),
        other => panic!("{other:?}"),
    };
    expect_sent(
        plugin
            .sender
            .reconcile_unknown_send(&lost, &unit)
            .await
            .unwrap(),
        "m-lost",
    );
    expect_sent(
        plugin
            .sender
            .reconcile_unknown_send(&answered, &unit)
            .await
            .unwrap(),
        "m-answered",
    );
    let imported = records(state.path()).await;
    drop(plugin);

    // A kill between the import and setting the files aside: they are there again on the next
    // start. The store's (since rotated) chain stands and no record is added twice.
    for name in [TOKEN_FILE, BOOK_FILE] {
        std::fs::rename(
            state.path().join(format!("{name}.imported")),
            state.path().join(name),
        )
        .unwrap();
    }
    let plugin = build_account(
        &sim,
        state.path(),
        "default",
        config.clone(),
        &configured,
        Some(state.path()),
    )
    .await
    .expect("the store's chain is used, not the file's spent token");
    assert_eq!(records(state.path()).await, imported);
    for name in [TOKEN_FILE, BOOK_FILE] {
        assert!(!state.path().join(name).exists(), "{name} is set aside");
    }
    expect_sent(
        plugin
            .sender
            .reconcile_unknown_send(&lost, &unit)
            .await
            .unwrap(),
        "m-lost",
    );
    sim.expire_access_tokens();
    sim.open_window(user);
    let ctx = SendContext::new(reply(&target, "after", ""), "after");
    plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "after the import"))
        .await
        .unwrap();
    assert!(
        token_calls(&sim).iter().filter(|t| **t == live).count() == 1,
        "the file's token was spent once"
    );
}

#[tokio::test]
async fn a_token_file_grown_from_another_accounts_token_is_left_for_that_account() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = || {
        settings(
            &sim,
            clawgate_conformance::ports::reserve_loopback_port(),
            &json!({}),
        )
    };
    let (mine, theirs) = (sim.authorize(), sim.authorize());
    std::fs::write(
        state.path().join(TOKEN_FILE),
        serde_json::to_vec_pretty(&json!({
            "refresh_token": theirs,
            "seeded_from": fingerprint(&theirs),
        }))
        .unwrap(),
    )
    .unwrap();
    // The account configured with another token starts first: the file is not its chain.
    build_account(
        &sim,
        state.path(),
        "mine",
        config(),
        &mine,
        Some(state.path()),
    )
    .await
    .unwrap();
    assert!(state.path().join(TOKEN_FILE).is_file(), "left in place");
    // The account whose chain it is takes it.
    build_account(
        &sim,
        state.path(),
        "theirs",
        config(),
        &theirs,
        Some(state.path()),
    )
    .await
    .unwrap();
    assert!(!state.path().join(TOKEN_FILE).exists());
    assert!(
        state
            .path()
            .join(format!("{TOKEN_FILE}.imported"))
            .is_file()
    );
    assert_ne!(
        stored_tokens(state.path(), "mine").await["seeded_from"],
        stored_tokens(state.path(), "theirs").await["seeded_from"]
    );
}
