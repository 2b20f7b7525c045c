//! A person talks to the agent through the QA platform: the reply streams as a preview and
//! lands as one final; Ctrl-C closes the agent session and its lease.

use std::time::Duration;

use crate::support::{GatewayProcess, config_file, eventually, lease_processes, leases};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_streams_a_preview_then_lands_one_final() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // Embedded QA platform; slow chunks so the preview is observable.
    let config = config_file(dir.path(), None, &["--chunk-ms", "60", "--words", "12"]);
    let gateway = GatewayProcess::start(&state, &config);

    gateway.say("dm-e2e", "hello gateway").await;
    let preview = eventually(Duration::from_secs(30), "a streaming preview", || async {
        gateway
            .chat("dm-e2e")
            .await
            .into_iter()
            .find(|m| m["fromAgent"] == true && m["state"] == "streaming")
    })
    .await;
    let final_message = eventually(Duration::from_secs(30), "the final", || async {
        gateway
            .chat("dm-e2e")
            .await
            .into_iter()
            .find(|m| m["fromAgent"] == true && m["state"] == "final")
    })
    .await;
    assert_eq!(
        preview["id"], final_message["id"],
        "the preview became the final (finalized in place)"
    );
    let text = final_message["text"].as_str().expect("text");
    assert!(text.starts_with("echo: hello gateway w1"), "{text}");
    assert!(text.ends_with(" w9"), "the whole reply: {text}");
    let agent_messages = gateway
        .chat("dm-e2e")
        .await
        .into_iter()
        .filter(|m| m["fromAgent"] == true)
        .count();
    assert_eq!(agent_messages, 1, "one reply, no leftover preview");

    // DNS rebinding: a page on another domain resolved to 127.0.0.1 names its own host.
    let rebound = reqwest::Client::new()
        .get(format!(
            "{}/chat/api/messages?conversation=dm-e2e",
            gateway.url
        ))
        .header(reqwest::header::HOST, "evil.example:8640")
        .send()
        .await
        .expect("answer");
    assert_eq!(rebound.status(), reqwest::StatusCode::MISDIRECTED_REQUEST);

    // A second message in the same conversation reuses the session's agent process.
    gateway.say("dm-e2e", "again").await;
    eventually(Duration::from_secs(30), "the second final", || async {
        let finals = gateway
            .chat("dm-e2e")
            .await
            .into_iter()
            .filter(|m| m["fromAgent"] == true && m["state"] == "final")
            .count();
        (finals == 2).then_some(())
    })
    .await;
    let open = leases(&state);
    assert_eq!(
        open.len(),
        1,
        "one lease for the conversation's session: {open:?}"
    );
    let lease_id = open[0].0.clone();
    assert_eq!(open[0].1, "open");
    assert_eq!(
        lease_processes(&lease_id).len(),
        2,
        "wrapper and agent run under the lease"
    );

    let status = gateway.interrupt();
    assert!(status.success(), "clean exit on Ctrl-C: {status:?}");
    assert_eq!(
        leases(&state),
        vec![(lease_id.clone(), "closed".to_owned())]
    );
    assert!(
        lease_processes(&lease_id).is_empty(),
        "nothing orphaned: {:?}",
        lease_processes(&lease_id)
    );
    assert!(!state.join("gateway.json").exists(), "runtime file removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_platform_keeps_the_conversation_across_restarts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &["--chunk-ms", "1"]);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-r", "first").await;
    eventually(Duration::from_secs(30), "the first final", || async {
        gateway
            .chat("dm-r")
            .await
            .into_iter()
            .find(|m| m["state"] == "final")
    })
    .await;
    assert!(gateway.interrupt().success());

    // Update ids continue past the durable watermark: the new message is not skipped.
    let gateway = GatewayProcess::start(&state, &config);
    assert_eq!(gateway.chat("dm-r").await.len(), 2, "history kept");
    gateway.say("dm-r", "second").await;
    eventually(Duration::from_secs(30), "the second final", || async {
        let finals: Vec<String> = gateway
            .chat("dm-r")
            .await
            .into_iter()
            .filter(|m| m["state"] == "final")
            .filter_map(|m| m["text"].as_str().map(str::to_owned))
            .collect();
        (finals.len() == 2).then_some(finals)
    })
    .await;
    assert!(gateway.interrupt().success());
}
