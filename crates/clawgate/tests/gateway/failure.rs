//! An agent that cannot answer: the event is retried, dead-lettered, and the person gets one
//! visible notice (marked as gateway-failure output) instead of silence.

use std::time::Duration;

use crate::support::{GatewayProcess, config_file_with_agent, eventually, external_platform};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lettered_message_gets_one_marked_failure_notice() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // A program that exits at once: the ACP handshake never happens.
    let config = config_file_with_agent(dir.path(), Some(&platform), &["false".to_owned()]);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-fail", "are you there?").await;

    let notice = eventually(Duration::from_secs(60), "the failure notice", || async {
        platform
            .messages("dm-fail")
            .into_iter()
            .find(|m| m.author_is_bot)
    })
    .await;
    assert!(notice.text.contains("could not answer"), "{}", notice.text);
    let marker = notice.metadata.clone().unwrap_or_default().to_string();
    assert!(
        marker.contains("gateway_failure") && marker.contains("agent_failed_before_reply"),
        "marked as gateway-failure output, so bots in the room drop its echo: {marker}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let bot_messages = platform
        .messages("dm-fail")
        .into_iter()
        .filter(|m| m.author_is_bot)
        .count();
    assert_eq!(bot_messages, 1, "one notice, no retries visible");
    assert!(
        gateway.log().contains("turn dead-lettered"),
        "the operator's log says why"
    );
    assert!(gateway.interrupt().success());
}
