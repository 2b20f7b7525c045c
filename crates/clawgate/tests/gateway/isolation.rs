//! Two gateways on two state directories: each one's reaping and shutdown touch only the
//! processes of its own leases; a gateway on a copy of a running one's state directory (same
//! instance id, same leases) refuses to start and touches nothing.

use std::time::Duration;

use crate::support::{
    GatewayProcess, config_file, demo_reply, eventually, lease_processes, leases,
    processes_mentioning,
};

async fn one_reply(gateway: &GatewayProcess, conversation: &str, text: &str, finals: usize) {
    gateway.say(conversation, text).await;
    eventually(Duration::from_secs(30), "a final", || async {
        let n = gateway
            .chat(conversation)
            .await
            .into_iter()
            .filter(|m| m["fromAgent"] == true && m["state"] == "final")
            .count();
        (n == finals).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_never_touches_the_first_ones_processes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state_a, state_b) = (dir.path().join("a"), dir.path().join("b"));
    let config = config_file(dir.path(), None, &["--chunk-ms", "1"]);
    let a = GatewayProcess::start(&state_a, &config);
    one_reply(&a, "dm-a", "from a", 1).await;
    let lease_a = leases(&state_a)[0].0.clone();
    let pids_a = lease_processes(&lease_a);
    assert_eq!(
        pids_a.len(),
        2,
        "wrapper and agent of A: {pids_a:?} {:?}",
        processes_mentioning(&lease_a)
    );

    // B starts (its startup reap), serves a conversation, is killed, restarts (reaps its own
    // orphan) and stops cleanly: A's processes are untouched through all of it.
    let b = GatewayProcess::start(&state_b, &config);
    one_reply(&b, "dm-b", "from b", 1).await;
    let lease_b = leases(&state_b)[0].0.clone();
    b.kill_hard();
    let b = GatewayProcess::start(&state_b, &config);
    // Generous: the wrapper's own drain (TERM, 2 s grace, KILL) and the restart's reap may both
    // run on a loaded machine.
    eventually(Duration::from_secs(30), "B's orphan resolved", || async {
        lease_processes(&lease_b).is_empty().then_some(())
    })
    .await;
    assert!(b.interrupt().success());

    assert_eq!(
        lease_processes(&lease_a),
        pids_a,
        "A's wrapper and agent still run, same pids"
    );
    assert_eq!(
        leases(&state_a),
        vec![(lease_a.clone(), "open".to_owned())],
        "A's lease untouched; B's leases: {:?}",
        leases(&state_b)
    );
    one_reply(&a, "dm-a", "still there", 2).await;
    assert!(a.interrupt().success());
    assert_eq!(
        leases(&state_a),
        vec![(lease_a.clone(), "closed".to_owned())],
        "A closed its own lease on Ctrl-C"
    );
    assert!(
        lease_processes(&lease_a).is_empty(),
        "nothing of A left: {:?}",
        processes_mentioning(&lease_a)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_a_copy_of_a_running_state_refuses_to_start_naming_the_original() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (state, copy) = (dir.path().join("state"), dir.path().join("copy"));
    // A slow reply (60 words, 200 ms apart: about 12 s) keeps the agent mid-turn throughout.
    let config = config_file(dir.path(), None, &["--chunk-ms", "200", "--words", "60"]);
    let original = GatewayProcess::start(&state, &config);
    original.say("dm-copy", "a long answer please").await;
    eventually(Duration::from_secs(30), "a streaming preview", || async {
        original
            .chat("dm-copy")
            .await
            .into_iter()
            .find(|m| m["fromAgent"] == true && m["state"] == "streaming")
    })
    .await;
    let lease = leases(&state)[0].0.clone();
    let pids = lease_processes(&lease);
    assert_eq!(pids.len(), 2, "wrapper and agent of the original: {pids:?}");

    // The copy a backup made while the gateway ran: database, WAL, lock file, runtime file.
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&state)
        .arg(&copy)
        .status()
        .expect("cp runs");
    assert!(status.success(), "cp -a: {status}");
    let refused = match GatewayProcess::try_start(&copy, &config, &[]) {
        Ok(_) => panic!("a gateway started on a copy of a running gateway's state directory"),
        Err(why) => why,
    };
    let pid = original.child.id();
    assert!(
        refused.contains(&format!(
            "another gateway (pid {pid}) runs with this gateway instance id"
        )) && refused.contains(&format!("stop the gateway with pid {pid} first")),
        "the refusal names the original's pid and what to do: {refused}"
    );
    assert_eq!(
        refused.matches("another gateway (pid").count(),
        1,
        "said once: {refused}"
    );

    assert_eq!(
        lease_processes(&lease),
        pids,
        "the original's wrapper and agent still run, same pids"
    );
    assert_eq!(
        leases(&copy),
        vec![(lease.clone(), "open".to_owned())],
        "the copy's lease was not changed"
    );
    assert!(
        original
            .chat("dm-copy")
            .await
            .iter()
            .all(|m| m["state"] != "final"),
        "the refusal came while the turn still ran"
    );
    let final_message = eventually(Duration::from_secs(60), "the original's final", || async {
        original
            .chat("dm-copy")
            .await
            .into_iter()
            .find(|m| m["fromAgent"] == true && m["state"] == "final")
    })
    .await;
    assert_eq!(
        final_message["text"],
        demo_reply("a long answer please", 60),
        "the turn finished with its whole final"
    );
    assert!(original.interrupt().success());
    assert!(
        lease_processes(&lease).is_empty(),
        "the original closed its own agent on Ctrl-C"
    );
}
