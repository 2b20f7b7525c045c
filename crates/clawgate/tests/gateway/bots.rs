//! `allow_bots` on a channel entry: another bot's message is answered only when it is on; a
//! person is answered either way.

use std::time::Duration;

use clawgate_channel_qa::InboundRequest;

use crate::support::{
    BIN, GatewayProcess, config_file_with_agent, demo_reply, eventually, external_platform,
};

const WORDS: usize = 6;

/// Another bot writes, then a person, in one conversation (whose events are handled in
/// order): once the person has the reply, the bot's message has been decided. Returns how
/// many replies the bot's message got.
async fn replies_to_another_bot(allow_bots: bool) -> usize {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_file_with_agent(
        dir.path(),
        Some(&platform),
        &[
            BIN.to_owned(),
            "demo-agent".to_owned(),
            "--words".to_owned(),
            WORDS.to_string(),
        ],
    );
    // `allow_bots` belongs to the `[[channels]]` table, which the helper writes last but for
    // its settings line.
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text.replace(
        "[[channels]]\nkind = \"qa\"\n",
        &format!("[[channels]]\nkind = \"qa\"\nallow_bots = {allow_bots}\n"),
    );
    std::fs::write(&config, text).expect("config written");
    let gateway = GatewayProcess::start(&dir.path().join("state"), &config);
    let write = |author: &str, is_bot: bool, text: &str| {
        platform
            .inject_inbound(
                "shared-room",
                InboundRequest {
                    text: text.into(),
                    author_id: author.into(),
                    author_is_bot: is_bot,
                    thread_id: None,
                    reply_to_id: None,
                    metadata: None,
                },
            )
            .expect("inbound")
    };
    write("other-bot", true, "status from-the-other-bot");
    write("ada", false, "question from-a-person");
    let person = demo_reply("question from-a-person", WORDS);
    let bot = demo_reply("status from-the-other-bot", WORDS);
    eventually(Duration::from_secs(60), "the person's reply", || async {
        platform
            .messages("shared-room")
            .iter()
            .any(|m| m.text == person)
            .then_some(())
    })
    .await;
    let count = platform
        .messages("shared-room")
        .iter()
        .filter(|m| m.text == bot)
        .count();
    assert!(gateway.interrupt().success());
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_bots_message_is_answered_only_with_allow_bots() {
    assert_eq!(
        replies_to_another_bot(false).await,
        0,
        "allow_bots off (the default)"
    );
    assert_eq!(replies_to_another_bot(true).await, 1, "allow_bots on");
}
