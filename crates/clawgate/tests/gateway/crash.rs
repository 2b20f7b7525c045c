//! SIGKILL mid-reply, then restart: the reply lands exactly once, the preview shown before the
//! crash is not left beside it, and no agent process of the dead gateway survives.

use std::time::Duration;

use crate::support::{
    GatewayProcess, config_file, eventually, external_platform, lease_processes, leases,
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
    let expected = {
        let mut words = vec!["echo:", "tell", "me", "everything"]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        let mut n = 0;
        while words.len() < 30 {
            n += 1;
            words.push(format!("w{n}"));
        }
        words.join(" ")
    };
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
    assert!(
        restarted.printed("send recovery: 1 unfinished intent(s) examined"),
        "the preview left mid-stream was recovered"
    );

    assert!(restarted.interrupt().success());
    assert!(
        leases(&state).iter().all(|(_, s)| s != "open"),
        "every lease closed after Ctrl-C: {:?}",
        leases(&state)
    );
}
