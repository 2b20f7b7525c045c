//! A backlog of due replies (an outage's worth) drains in paced recovery passes beside the
//! receive loops: a new message is answered while the backlog is still going out, and every
//! backlog reply lands once.

use std::time::Duration;

use clawgate_store::IntentStore as _;
use clawgate_types::{
    BatchAtomicity, ChannelMessage, DurableSendIntent, IntentId, MessageTarget,
    RenderedMessageBatch, RenderedMessageUnit,
};

use crate::support::{GatewayProcess, config_file, eventually, external_platform};

const BACKLOG: usize = 300;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_message_is_answered_while_a_backlog_of_replies_drains() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).expect("state dir");
    {
        // The replies an earlier run recorded and could not send: due now.
        let store = clawgate_store_sqlite::testing::open_store(&state);
        let now = clawgate_types::clock::Clock::now_ms(&clawgate_types::clock::SystemClock);
        for n in 0..BACKLOG {
            let key = format!("qa:backlog:{n}");
            let message = ChannelMessage::outbound(
                format!("backlog-{n}"),
                "qa",
                MessageTarget::group("backlog"),
                format!("backlog reply {n}"),
            )
            .with_account_id("default");
            let mut intent = DurableSendIntent::new(
                IntentId::parse(format!("019a0000-0000-7000-8000-{n:012}")).expect("id"),
                key.clone(),
                message,
                now,
            );
            intent.batch = Some(RenderedMessageBatch::new(
                vec![RenderedMessageUnit::text(0, format!("backlog reply {n}"))],
                BatchAtomicity::AllOrRetryRemaining,
                key,
            ));
            store.insert_intent(&intent, None).await.expect("seeded");
        }
    }
    // A slow platform: every call answers after a second, so the backlog takes a while.
    platform.inject(clawgate_channel_qa::Fault::delay_after_accept(
        100_000, 1_000,
    ));
    let config = config_file(dir.path(), Some(&platform), &["--chunk-ms", "0"]);
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("fresh", "hello").await;
    let answered = eventually(Duration::from_secs(60), "the answer", || async {
        platform
            .messages("fresh")
            .into_iter()
            .any(|m| m.author_is_bot && m.text == "echo: hello")
            .then(|| platform.messages("backlog").len())
    })
    .await;
    assert!(
        answered < BACKLOG,
        "answered while the backlog drained ({answered} of {BACKLOG} backlog replies out)"
    );
    eventually(Duration::from_secs(120), "the whole backlog", || async {
        (platform.messages("backlog").len() >= BACKLOG).then_some(())
    })
    .await;
    for n in 0..BACKLOG {
        assert_eq!(
            platform.landed_with_text(&format!("backlog reply {n}")),
            1,
            "backlog reply {n} landed once"
        );
    }
    assert!(gateway.interrupt().success());
}
