//! The agent process of a conversation dies between two messages (SIGKILL): the second message
//! still gets its normal reply, from a fresh process under a new lease, not the failure notice.

use std::time::Duration;

use crate::support::{
    GatewayProcess, MidReply, bot_texts, config_file, demo_reply, eventually, external_platform,
    lease_processes, leases, signal,
};

/// The adapter of a lease: the process carrying the lease's environment mark that is not the
/// wrapper itself (whose argv names the lease).
fn adapter_of(lease_id: &str) -> u32 {
    let adapters: Vec<u32> = lease_processes(lease_id)
        .into_iter()
        .filter(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline.contains("demo-agent") && !cmdline.contains("acpx-wrapper")
        })
        .collect();
    assert_eq!(adapters.len(), 1, "one adapter under lease {lease_id}");
    adapters[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_between_two_messages_the_second_still_gets_its_reply() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), Some(&platform), &["--chunk-ms", "10"]);
    let gateway = GatewayProcess::start(&state, &config);
    let bot_texts = |platform| bot_texts(platform, "dm-dead-agent");

    gateway.say("dm-dead-agent", "first").await;
    eventually(Duration::from_secs(30), "the first reply", || async {
        bot_texts(&platform)
            .contains(&"echo: first".to_owned())
            .then_some(())
    })
    .await;
    let first_lease = leases(&state)
        .first()
        .map(|(id, _)| id.clone())
        .expect("a lease");
    signal(adapter_of(&first_lease), 9);
    // The whole tree of that lease ends (the wrapper follows its adapter) before the next
    // message is sent: the gateway must notice a dead process, not race one.
    eventually(
        Duration::from_secs(10),
        "the killed agent's tree gone",
        || async { lease_processes(&first_lease).is_empty().then_some(()) },
    )
    .await;

    gateway.say("dm-dead-agent", "second").await;
    eventually(Duration::from_secs(30), "the second reply", || async {
        bot_texts(&platform)
            .contains(&"echo: second".to_owned())
            .then_some(())
    })
    .await;
    let texts = bot_texts(&platform);
    assert!(
        texts.iter().all(|t| !t.contains("could not answer")),
        "no failure notice: {texts:?}"
    );
    assert_eq!(texts, ["echo: first", "echo: second"], "one reply each");
    // Noticed before the turn, not by a failed attempt: the second turn ran once.
    assert!(
        !gateway.log().contains("turn failed; retrying"),
        "the dead process was handed to no turn"
    );
    let states = leases(&state);
    assert_eq!(
        states.len(),
        2,
        "a new lease for the new process: {states:?}"
    );
    assert_eq!(
        states[0],
        (first_lease.clone(), "lost".to_owned()),
        "{states:?}"
    );
    assert_eq!(states[1].1, "open", "{states:?}");
    assert_eq!(
        lease_processes(&states[1].0).len(),
        2,
        "the fresh wrapper and agent run"
    );

    assert!(gateway.interrupt().success());
    assert!(
        leases(&state).iter().all(|(_, s)| s != "open"),
        "every lease closed after Ctrl-C: {:?}",
        leases(&state)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_mid_reply_the_turn_is_retried_on_a_fresh_process() {
    let MidReply {
        platform,
        state,
        gateway,
        _dir,
        ..
    } = MidReply::start(
        "dm-mid",
        "keep going",
        &["--chunk-ms", "150", "--words", "12"],
    )
    .await;
    let bot_texts = |platform| bot_texts(platform, "dm-mid");
    let first_lease = leases(&state)
        .first()
        .map(|(id, _)| id.clone())
        .expect("a lease");
    signal(adapter_of(&first_lease), 9);

    let expected = demo_reply("keep going", 12);
    eventually(
        Duration::from_secs(60),
        "the retried turn's final",
        || async { bot_texts(&platform).contains(&expected).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        bot_texts(&platform),
        [expected],
        "one complete final: the dead attempt's preview is gone, no failure notice"
    );
    let states = leases(&state);
    assert_eq!(
        (states.len(), states[0].1.as_str()),
        (2, "lost"),
        "the dead process's lease resolved, a new one for the retry: {states:?}"
    );
    assert!(gateway.interrupt().success());
}
