//! Two gateways on two state directories: each one's reaping and shutdown touch only the
//! processes of its own leases.

use std::time::Duration;

use crate::support::{
    GatewayProcess, config_file, eventually, lease_processes, leases, processes_mentioning,
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
