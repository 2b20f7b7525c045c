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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_notice_a_crash_cut_off_gets_it_when_the_update_comes_back() {
    use clawgate_store::{InboundKey, InboundStatus, InboundStore as _};
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // The state an earlier run left when it was killed right after dead-lettering the event:
    // the record is dead-lettered, no notice recorded, the update not confirmed.
    let message = platform
        .inject_inbound(
            "dm-cut",
            clawgate_channel_qa::InboundRequest {
                text: "poison".into(),
                author_id: "web-user".into(),
                author_is_bot: false,
                thread_id: None,
                reply_to_id: None,
                metadata: None,
            },
        )
        .expect("inbound");
    {
        std::fs::create_dir_all(&state).expect("state dir");
        let store = clawgate_store_sqlite::testing::open_store(&state);
        let key = InboundKey {
            channel: "qa".into(),
            // Recorded under the channel's account (the gateway stamps it on every event).
            account_id: "default".into(),
            event_id: message.id.clone(),
        };
        store
            .record_inbound(&key, &serde_json::json!({}), 10)
            .await
            .expect("record");
        store
            .finish_inbound(
                &key,
                InboundStatus::DeadLettered,
                Some("crashed 5 times"),
                20,
            )
            .await
            .expect("dead-lettered");
    }
    // An agent that would answer: a record the gateway did not take as this event's would
    // show up as a reply instead of the notice.
    let config = crate::support::config_file(dir.path(), Some(&platform), &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let notice = eventually(Duration::from_secs(30), "the notice", || async {
        platform
            .messages("dm-cut")
            .into_iter()
            .find(|m| m.author_is_bot)
    })
    .await;
    assert!(notice.text.contains("could not answer"), "{}", notice.text);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        platform
            .messages("dm-cut")
            .into_iter()
            .filter(|m| m.author_is_bot)
            .count(),
        1,
        "told once, and not answered: {:?}",
        platform.messages("dm-cut")
    );
    assert!(gateway.interrupt().success());
}

/// A pushed (or confirmed) event is never delivered again: when a crash fell between its dead
/// letter and its failure notice, the gateway that takes the account tells the person anyway —
/// once, and only about a recent dead letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_whose_notice_a_crash_cut_off_is_told_at_the_next_start() {
    use clawgate_store::{InboundKey, InboundStatus, InboundStore as _};
    let platform = external_platform().await;
    // The events as the platform sent them once; this platform never delivers them again.
    let elsewhere = external_platform().await;
    let event = |conversation: &str| {
        let message = elsewhere
            .inject_inbound(
                conversation,
                clawgate_channel_qa::InboundRequest {
                    text: "poison".into(),
                    author_id: "web-user".into(),
                    author_is_bot: false,
                    thread_id: None,
                    reply_to_id: None,
                    metadata: None,
                },
            )
            .expect("inbound");
        let payload = serde_json::json!({ "raw": serde_json::to_value(&message).expect("json") });
        (message.id, payload)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    {
        std::fs::create_dir_all(&state).expect("state dir");
        let store = clawgate_store_sqlite::testing::open_store(&state);
        // Dead-lettered a minute ago, and two days ago (too old to tell out of the blue).
        for (conversation, at) in [("dm-swept", now - 60_000), ("dm-old", now - 2 * 86_400_000)] {
            let (id, payload) = event(conversation);
            let key = InboundKey {
                channel: "qa".into(),
                account_id: "default".into(),
                event_id: id,
            };
            store
                .record_inbound(&key, &payload, at)
                .await
                .expect("record");
            store
                .finish_inbound(
                    &key,
                    InboundStatus::DeadLettered,
                    Some("crashed 5 times"),
                    at,
                )
                .await
                .expect("dead-lettered");
        }
    }
    let config = crate::support::config_file(dir.path(), Some(&platform), &[]);
    let bot_messages = |conversation: &str| {
        platform
            .messages(conversation)
            .into_iter()
            .filter(|m| m.author_is_bot)
            .collect::<Vec<_>>()
    };
    for start in 0..2 {
        let gateway = GatewayProcess::start(&state, &config);
        let notice = eventually(Duration::from_secs(30), "the notice", || async {
            bot_messages("dm-swept").into_iter().next()
        })
        .await;
        assert!(notice.text.contains("could not answer"), "{}", notice.text);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert_eq!(
            bot_messages("dm-swept").len(),
            1,
            "start {start}: told once"
        );
        assert!(
            bot_messages("dm-old").is_empty(),
            "start {start}: a two-day-old dead letter is not told"
        );
        assert!(gateway.interrupt().success());
    }
}
