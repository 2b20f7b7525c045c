//! A channel kind the gateway binary does not know — the SDK's in-memory `memory` kind,
//! registered only here — carries whole conversations: the gateway reaches it through its
//! factory, its source (polled, or pushed with acks) and its adapter, and nothing else.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clawgate::config::Config;
use clawgate::gateway::Gateway;
use clawgate_channel_sdk::ChannelRegistry;
use clawgate_channel_sdk::testing::{MemoryFactory, MemoryPlatform};
use clawgate_types::IntentStatus;

use crate::support::eventually;

fn config(state: &std::path::Path, mode: &str) -> Config {
    let text = format!(
        "state_dir = {state:?}\n\
         [gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 3000\n\n\
         [[agents]]\nid = \"main\"\n\n\
         [[channels]]\nkind = \"memory\"\n[channels.settings]\nmode = \"{mode}\"\n"
    );
    Config::parse(&text, "memory.toml").expect("valid configuration")
}

fn program() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_clawgate"))
}

/// The agent's messages of `conversation` once none of them is a preview any more.
async fn finals(
    gateway: &Gateway,
    platform: &MemoryPlatform,
    conversation: &str,
    count: usize,
) -> Vec<String> {
    eventually(
        Duration::from_secs(60),
        "the agent's final replies",
        || async {
            let sent = gateway
                .store
                .list_intents(&clawgate_store::IntentFilter {
                    limit: 100,
                    ..clawgate_store::IntentFilter::default()
                })
                .await
                .ok()?;
            let done = sent
                .iter()
                .filter(|i| i.status == IntentStatus::Sent)
                .count();
            let replies: Vec<String> = platform
                .messages(conversation)
                .into_iter()
                .filter(|m| m.author.is_none())
                .map(|m| m.text)
                .collect();
            (done >= count && replies.len() >= count).then_some(replies)
        },
    )
    .await
}

async fn conversation_on(mode: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let platform = MemoryPlatform::new();
    let mut registry = ChannelRegistry::new();
    registry.register(Arc::new(MemoryFactory::new(platform.clone())));
    let gateway = Gateway::start_with(config(dir.path(), mode), &registry, program())
        .await
        .expect("a gateway on a test-only channel kind");
    assert_eq!(gateway.channels[0].name, "memory");
    assert!(
        !clawgate::qa::has_qa_channel(&gateway.channels),
        "no QA channel: the chat page and /v1/qa are not mounted"
    );
    gateway.run().await;

    platform.write("dm-ada", "ada", "hello there", false);
    let replies = finals(&gateway, &platform, "dm-ada", 1).await;
    assert_eq!(
        replies.len(),
        1,
        "one reply, its preview finalized in place: {replies:?}"
    );
    assert!(replies[0].starts_with("echo: hello there"), "{replies:?}");

    // The second message of the conversation is answered after the first.
    platform.write("dm-ada", "ada", "and again", false);
    let replies = finals(&gateway, &platform, "dm-ada", 2).await;
    assert!(replies[1].starts_with("echo: and again"), "{replies:?}");
    assert_eq!(
        platform.sends(),
        2,
        "each reply created one platform message"
    );

    if mode == "pushed" {
        // The platform delivers everything not acked again; the gateway acked both events
        // after recording them, and a redelivered one would be deduplicated anyway.
        platform.redeliver_unacked();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            platform.sends(),
            2,
            "no second reply to a redelivered event"
        );
        assert_eq!(platform.queued_updates(), 0, "both events were acked");
    } else {
        // The next poll asks from past both: the platform forgets them.
        eventually(
            Duration::from_secs(30),
            "the watermark past both updates",
            || async { (platform.queued_updates() == 0).then_some(()) },
        )
        .await;
    }
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_only_polling_channel_kind_carries_a_conversation() {
    conversation_on("polling").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_only_pushed_channel_kind_carries_a_conversation() {
    conversation_on("pushed").await;
}

/// Serves `gateway` as `clawgate up` does; answers the status of `GET path` with the token.
async fn status_of(gateway: &Arc<Gateway>, path: &str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("loopback port");
    let port = listener.local_addr().expect("address").port();
    let app = clawgate::serve::app(gateway, "test-token", port);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let status = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}{path}"))
        .bearer_auth("test-token")
        .send()
        .await
        .expect("the gateway answers")
        .status()
        .as_u16();
    server.abort();
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_page_and_qa_routes_are_served_only_beside_a_qa_channel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut registry = ChannelRegistry::new();
    registry.register(Arc::new(MemoryFactory::default()));
    let memory_only = Gateway::start_with(config(dir.path(), "polling"), &registry, program())
        .await
        .expect("a memory-only gateway");
    assert_eq!(status_of(&memory_only, "/v1/status").await, 200);
    assert_eq!(status_of(&memory_only, "/").await, 404, "no chat page");
    assert_eq!(
        status_of(&memory_only, "/v1/qa/messages?conversation=dm-a").await,
        404,
        "no QA routes"
    );
    memory_only.shutdown().await;

    let dir = tempfile::tempdir().expect("tempdir");
    let text = format!(
        "state_dir = {:?}\n[gateway]\nlisten = \"127.0.0.1:0\"\n[[agents]]\nid = \"main\"\n\
         [[channels]]\nkind = \"qa\"\n",
        dir.path()
    );
    let config = Config::parse(&text, "qa.toml").expect("valid configuration");
    let with_qa = Gateway::start_with(config, &clawgate::channels::registry(dir.path()), program())
        .await
        .expect("a gateway with an embedded QA channel");
    assert_eq!(status_of(&with_qa, "/").await, 200, "the chat page");
    assert_eq!(
        status_of(&with_qa, "/v1/qa/messages?conversation=dm-a").await,
        200,
        "the QA routes"
    );
    with_qa.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_kind_or_a_bad_setting_stops_the_start_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = ChannelRegistry::new();
    let error = Gateway::start_with(config(dir.path(), "polling"), &registry, program())
        .await
        .expect_err("no memory kind in this registry")
        .to_string();
    assert!(
        error.contains("channels[0].kind") && error.contains("memory"),
        "{error}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let mut registry = ChannelRegistry::new();
    registry.register(Arc::new(MemoryFactory::default()));
    let error = Gateway::start_with(config(dir.path(), "carrier-pigeon"), &registry, program())
        .await
        .expect_err("no such mode")
        .to_string();
    assert!(error.contains("channels[0].settings.mode"), "{error}");
}
