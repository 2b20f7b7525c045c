//! The database in the way mid-reply, without any crash: the reply lands once when the fault
//! clears, and nothing extra is left visible.

use std::time::Duration;

use crate::support::{GatewayProcess, config_file, eventually, external_platform};

/// The reply the bundled agent gives to `prompt` padded to `words` words.
fn expected_reply(prompt: &str, words: usize) -> String {
    let mut all: Vec<String> = std::iter::once("echo:".to_owned())
        .chain(prompt.split_whitespace().map(str::to_owned))
        .collect();
    let mut n = 0;
    while all.len() < words {
        n += 1;
        all.push(format!("w{n}"));
    }
    all.join(" ")
}

fn bot_texts(platform: &clawgate_channel_qa::QaPlatform, conversation: &str) -> Vec<String> {
    platform
        .messages(conversation)
        .into_iter()
        .filter(|m| m.author_is_bot)
        .map(|m| m.text)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_by_another_process_mid_reply_delays_the_final_but_never_loses_it() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(
        dir.path(),
        Some(&platform),
        &["--chunk-ms", "150", "--words", "20"],
    );
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-locked", "are you stuck").await;
    eventually(Duration::from_secs(30), "the first preview", || async {
        (!bot_texts(&platform, "dm-locked").is_empty()).then_some(())
    })
    .await;
    // Another process takes SQLite's write lock for longer than the gateway's busy timeout
    // (5 s) while the reply streams and its final is due: the gateway's writes fail closed.
    let db = rusqlite::Connection::open(state.join("state.db")).expect("state.db");
    db.execute_batch("BEGIN IMMEDIATE").expect("write lock taken");
    tokio::time::sleep(Duration::from_secs(9)).await;
    db.execute_batch("ROLLBACK").expect("write lock released");
    drop(db);

    let expected = expected_reply("are you stuck", 20);
    eventually(
        Duration::from_secs(60),
        "the final once the lock is gone",
        || async {
            bot_texts(&platform, "dm-locked")
                .iter()
                .any(|t| *t == expected)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        bot_texts(&platform, "dm-locked"),
        vec![expected],
        "one final, no preview or partial reply left beside it"
    );
    assert!(gateway.interrupt().success());
}
