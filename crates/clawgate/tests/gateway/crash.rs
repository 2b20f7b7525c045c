//! SIGKILL mid-reply, then restart: the reply lands exactly once, the preview shown before the
//! crash is not left beside it, and no agent process of the dead gateway survives.

use std::time::Duration;

use crate::support::{
    GatewayProcess, MidReply, bot_texts, config_file, demo_reply, eventually, external_platform,
    lease_processes, leases,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_reply_then_restart_delivers_the_final_exactly_once() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // About 3 s of streaming: plenty of time to kill the gateway mid-reply.
    let config = config_file(
        dir.path(),
        Some(&platform),
        &["--chunk-ms", "100", "--words", "30"],
    );
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-crash", "tell me everything").await;
    let bot = |platform: &clawgate_channel_qa::QaPlatform| {
        platform
            .messages("dm-crash")
            .into_iter()
            .filter(|m| m.author_is_bot)
            .collect::<Vec<_>>()
    };
    eventually(
        Duration::from_secs(30),
        "a preview with some words",
        || async {
            bot(&platform)
                .into_iter()
                .find(|m| m.edits >= 2 && !m.text.ends_with("w28"))
        },
    )
    .await;
    let first_lease = leases(&state)
        .first()
        .map(|(id, _)| id.clone())
        .expect("a lease");
    assert!(!lease_processes(&first_lease).is_empty(), "agent runs");
    gateway.kill_hard();

    // The wrapper notices its parent died and ends the agent's group; either way, after the
    // restart nothing of the dead gateway's lease may run.
    let restarted = GatewayProcess::start(&state, &config);
    let expected = demo_reply("tell me everything", 30);
    eventually(
        Duration::from_secs(60),
        "the final after the restart",
        || async {
            bot(&platform)
                .into_iter()
                .find(|m| m.text == expected)
                .map(|_| ())
        },
    )
    .await;
    // Give recovery and the loops time to do anything wrong, then check the whole picture.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let replies = bot(&platform);
    assert_eq!(
        replies.len(),
        1,
        "exactly one agent message: {:?}",
        replies.iter().map(|m| &m.text).collect::<Vec<_>>()
    );
    assert_eq!(replies[0].text, expected);
    assert!(
        lease_processes(&first_lease).is_empty(),
        "the dead gateway's agent processes are gone: {:?}",
        lease_processes(&first_lease)
    );
    let states = leases(&state);
    let first = states
        .iter()
        .find(|(id, _)| *id == first_lease)
        .expect("first lease kept");
    assert_ne!(
        first.1, "open",
        "the orphaned lease is resolved: {states:?}"
    );
    assert!(
        restarted
            .log()
            .contains("agent processes of an earlier run resolved"),
        "the restart reaped from the lease"
    );
    // The dead gateway's wrapper may have ended its group before the restart looked (gone) or
    // not yet (reaped): one lease either way.
    assert!(
        restarted
            .printed("agent leases of an earlier run: 1 reaped (processes ended), 0 already gone")
            || restarted.printed(
                "agent leases of an earlier run: 0 reaped (processes ended), 1 already gone"
            ),
        "and told the operator what happened: {:?}",
        restarted.stdout.lock().expect("lines")
    );
    // Recovered by the startup pass or, when the replayed message's turn got to it first, by
    // that turn (recovery runs beside the receive loops).
    assert!(
        restarted.printed("send recovery: 1 unfinished intent(s) examined")
            || restarted
                .log()
                .contains("a reply without a final was cancelled; its turn runs again"),
        "the preview left mid-stream was recovered"
    );

    assert!(restarted.interrupt().success());
    assert!(
        leases(&state).iter().all(|(_, s)| s != "open"),
        "every lease closed after Ctrl-C: {:?}",
        leases(&state)
    );
}

/// How many send intents the state database holds (read-only, beside the running gateway).
fn intent_count(state: &std::path::Path) -> i64 {
    rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .and_then(|db| db.query_row("SELECT count(*) FROM send_intents", [], |r| r.get(0)))
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_the_agent_wrote_anything_then_restart_answers_in_full() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // The first chunk comes after 1.5 s: the kill lands while the reply intent exists and
    // the agent has produced nothing yet.
    let config = config_file(
        dir.path(),
        Some(&platform),
        &["--chunk-ms", "1500", "--words", "4"],
    );
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-early", "hello there").await;
    eventually(
        Duration::from_secs(30),
        "the reply intent recorded",
        || async { (intent_count(&state) > 0).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        bot_texts(&platform, "dm-early").is_empty(),
        "killed before anything was shown"
    );
    gateway.kill_hard();

    let restarted = GatewayProcess::start(&state, &config);
    let expected = demo_reply("hello there", 4);
    eventually(Duration::from_secs(60), "the full final", || async {
        bot_texts(&platform, "dm-early")
            .contains(&expected)
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        bot_texts(&platform, "dm-early"),
        vec![expected],
        "one complete final, no placeholder or empty reply beside it"
    );
    assert!(
        restarted.printed("1 reply stream(s) without a final cancelled")
            || restarted
                .log()
                .contains("a reply without a final was cancelled; its turn runs again"),
        "the startup line says the reply was cancelled, not delivered: {:?}",
        restarted.stdout.lock().expect("lines")
    );
    assert!(restarted.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_turn_dies_with_the_gateway_every_time_is_dead_lettered_once() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(
        dir.path(),
        Some(&platform),
        &["--chunk-ms", "400", "--words", "20"],
    );
    // The channel section is the file's last table: its budget of turn starts is set to 3.
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str("max_turn_attempts = 3\n");
    std::fs::write(&config, text).expect("config written");
    let mut gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-poison", "poison").await;
    // Three starts of the turn, each ended by SIGKILL as soon as its preview shows: as if the
    // message crashed the gateway every time. Each start's own preview is waited for (a new
    // platform message): the dead start's preview may still show for a moment after a restart,
    // until the replayed turn or a recovery pass removes it.
    let mut previews = std::collections::HashSet::new();
    for start in 1..=3 {
        let preview = eventually(
            Duration::from_secs(30),
            &format!("the preview of start {start}"),
            || async {
                platform
                    .messages("dm-poison")
                    .into_iter()
                    .find(|m| m.author_is_bot && !previews.contains(&m.id))
                    .map(|m| m.id)
            },
        )
        .await;
        previews.insert(preview);
        gateway.kill_hard();
        gateway = GatewayProcess::start(&state, &config);
    }
    let notice = eventually(Duration::from_secs(30), "the failure notice", || async {
        bot_texts(&platform, "dm-poison")
            .into_iter()
            .find(|t| t.contains("could not answer"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        bot_texts(&platform, "dm-poison"),
        vec![notice],
        "the person is told once; no preview or reply of the dead attempts is left"
    );
    assert!(
        gateway.log().contains("never finished"),
        "the log says why it was set aside"
    );
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_mid_reply_gives_the_attempt_back_and_the_restart_answers() {
    // About 5 s of streaming: longer than the test config's shutdown grace (3 s).
    let MidReply {
        platform,
        state,
        config,
        gateway,
        _dir,
    } = MidReply::start(
        "dm-stop",
        "take your time",
        &["--chunk-ms", "250", "--words", "20"],
    )
    .await;
    assert!(gateway.interrupt().success(), "clean stop");
    let attempts: Vec<(String, i64)> = {
        let db = rusqlite::Connection::open_with_flags(
            state.join("state.db"),
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .expect("state.db");
        let mut statement = db
            .prepare("SELECT status, attempts FROM inbound_records")
            .expect("query");
        statement
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("rows")
            .map(|r| r.expect("row"))
            .collect()
    };
    assert_eq!(
        attempts,
        [("received".to_owned(), 0)],
        "unfinished, and the stop did not use up an attempt"
    );
    let restarted = GatewayProcess::start(&state, &config);
    let expected = demo_reply("take your time", 20);
    eventually(
        Duration::from_secs(60),
        "the final after the restart",
        || async {
            bot_texts(&platform, "dm-stop")
                .contains(&expected)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(bot_texts(&platform, "dm-stop"), [expected]);
    assert!(restarted.interrupt().success());
}
