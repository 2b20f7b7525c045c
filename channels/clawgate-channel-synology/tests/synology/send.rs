//! Sends as Synology Chat answers them: DMs through `chatbot` to the Chat-internal user id,
//! channel answers through the incoming webhook, the token in quotes, `success:false` in an
//! HTTP 200 as a classed failure, the 411 rate limit kept clear of by spacing, web-server
//! errors as unknown outcomes, plain durable finals, and unknown sends parked, never resent.

use std::sync::Arc;
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_synology::simulator::{Author, Conversation, Fault, FaultKind};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_store::{IntentFilter, IntentStore};
use clawgate_types::IntentStatus;
use clawgate_types::clock::ManualClock;
use serde_json::json;

use crate::peer::{Peer, quick};

/// An engine over `sender`, on the store in `dir` and a driven clock.
fn engine_in(
    dir: &std::path::Path,
    sender: Arc<dyn ChannelMessageAdapter>,
    clock: Arc<ManualClock>,
) -> (Messenger, Arc<clawgate_store_sqlite::SqliteStore>) {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    let messenger = Messenger::new(store.clone(), vec![sender], policy, clock, "synology-tests");
    (messenger, store)
}

fn reply(target: &MessageTarget, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "synology", target.clone(), text)
}

fn unit(text: &str) -> RenderedMessageUnit {
    RenderedMessageUnit::text(0, text)
}

fn ctx(target: &MessageTarget, key: &str) -> SendContext {
    SendContext::new(reply(target, key, "x"), key)
}

async fn statuses(store: &clawgate_store_sqlite::SqliteStore) -> Vec<IntentStatus> {
    store
        .list_intents(&IntentFilter {
            limit: 10,
            ..IntentFilter::default()
        })
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.status)
        .collect()
}

#[tokio::test]
async fn a_dm_goes_through_chatbot_to_the_chat_internal_user_id() {
    let peer = Peer::start().await;
    let person = peer.person("Ada");
    let user = peer.sim.user(&person.id).unwrap();
    assert_ne!(user.user_id, user.bot_user_id, "two id spaces");
    let part = peer
        .plugin
        .sender
        .send_unit(&ctx(&person, "dm-1"), &unit("hello Ada"))
        .await
        .unwrap();
    assert!(
        part.platform_message_id.starts_with("synology:chatbot:"),
        "{part:?}"
    );
    let post = peer.sim.posts().pop().unwrap();
    assert_eq!(
        (post.conversation, post.author, post.text.as_str()),
        (Conversation::Direct(user.user_id), Author::Bot, "hello Ada")
    );
    let chatbot = peer
        .sim
        .calls()
        .into_iter()
        .find(|c| c.method == "chatbot")
        .unwrap();
    assert_eq!(chatbot.payload["user_ids"], json!([user.user_id]));
    assert_eq!(chatbot.raw_token, format!("\"{}\"", peer.sim.bot_token()));
    // The user id is cached: a second DM asks user_list no more.
    let lists = |peer: &Peer| {
        peer.sim
            .calls()
            .iter()
            .filter(|c| c.method == "user_list")
            .count()
    };
    let before = lists(&peer);
    peer.plugin
        .sender
        .send_unit(&ctx(&person, "dm-2"), &unit("again"))
        .await
        .unwrap();
    assert_eq!(lists(&peer), before);
    assert_eq!(
        peer.sim.bot_texts_to(&person.id),
        vec!["hello Ada", "again"]
    );
}

#[tokio::test]
async fn a_person_unknown_to_user_list_is_not_found_and_nothing_is_posted() {
    let peer = Peer::start().await;
    let nobody = MessageTarget::direct("no-such-user");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&nobody, "dm-x"), &unit("hello?"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::NotFound, SideEffect::None),
        "{error:?}"
    );
    assert!(error.message.contains("no-such-user"), "{}", error.message);
    assert!(peer.sim.posts().is_empty());
}

#[tokio::test]
async fn a_channel_answer_goes_through_its_incoming_webhook() {
    let peer = Peer::start().await;
    let channel = peer.channel_target();
    peer.plugin
        .sender
        .send_unit(&ctx(&channel, "ch-1"), &unit("to everyone"))
        .await
        .unwrap();
    assert_eq!(
        peer.sim.integration_texts_in(peer.channel.channel_id),
        vec!["to everyone"]
    );
    let incoming = peer
        .sim
        .calls()
        .into_iter()
        .find(|c| c.method == "incoming")
        .unwrap();
    assert_eq!(
        incoming.raw_token,
        format!("\"{}\"", peer.channel.incoming_token)
    );
    // A channel the settings do not list has no webhook to post through.
    let other = MessageTarget::group("999");
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&other, "ch-2"), &unit("nowhere"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::NotFound, SideEffect::None)
    );
}

#[tokio::test]
async fn success_false_in_an_http_200_is_a_classed_failure() {
    let peer = Peer::start().await;
    let person = peer.person("refused");
    for (code, kind) in [
        (117, DeliveryFailureKind::InvalidPayload),
        (404, DeliveryFailureKind::Auth),
        (411, DeliveryFailureKind::RateLimit),
    ] {
        peer.sim.inject(Fault::new(FaultKind::Refuse(code)));
        let error = peer
            .plugin
            .sender
            .send_unit(&ctx(&person, &format!("r-{code}")), &unit("no"))
            .await
            .unwrap_err();
        assert_eq!(
            (error.kind, error.side_effect),
            (kind, SideEffect::None),
            "{code}"
        );
        assert_eq!(
            error.platform_code.as_deref(),
            Some(code.to_string().as_str())
        );
        let call = peer.sim.calls().pop().unwrap();
        assert_eq!(
            (call.status, call.success),
            (200, Some(false)),
            "HTTP 200 all the same"
        );
    }
    assert!(peer.sim.bot_texts_to(&person.id).is_empty());
}

#[tokio::test]
async fn a_web_server_error_or_a_cut_answer_is_an_unknown_outcome() {
    let peer = Peer::start().await;
    let person = peer.person("unknown");
    peer.sim.inject(Fault::new(FaultKind::ServerError(502)));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&person, "u-1"), &unit("maybe"))
        .await
        .unwrap_err();
    assert_eq!(
        (error.kind, error.side_effect),
        (DeliveryFailureKind::Unknown, SideEffect::Possible)
    );
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    let error = peer
        .plugin
        .sender
        .send_unit(&ctx(&person, "u-2"), &unit("landed"))
        .await
        .unwrap_err();
    assert_eq!(error.side_effect, SideEffect::Possible);
    assert!(
        !error.message.contains(&peer.sim.bot_token()),
        "the token is never in an error"
    );
    assert_eq!(peer.sim.bot_texts_to(&person.id), vec!["landed"]);
}

#[tokio::test]
async fn posts_are_spaced_so_the_rate_limit_is_not_hit() {
    // The platform refuses posts of one token closer than 150 ms.
    let config = clawgate_channel_synology::simulator::SimulatorConfig {
        min_send_interval: Duration::from_millis(150),
        ..quick()
    };
    let spaced = Peer::with(config, json!({ "send_interval_ms": 200 })).await;
    let person = spaced.person("spaced");
    for i in 0..3 {
        spaced
            .plugin
            .sender
            .send_unit(
                &ctx(&person, &format!("s-{i}")),
                &unit(&format!("post {i}")),
            )
            .await
            .unwrap();
    }
    assert_eq!(spaced.sim.bot_texts_to(&person.id).len(), 3);
    // Without the spacing the platform's limit shows, as a rate limit with a wait (a limit
    // of a minute here, so no pause of this machine lets the second post through).
    let strict = clawgate_channel_synology::simulator::SimulatorConfig {
        min_send_interval: Duration::from_secs(60),
        ..quick()
    };
    let eager = Peer::with(strict, json!({ "send_interval_ms": 0 })).await;
    let person = eager.person("eager");
    let sender = &eager.plugin.sender;
    sender
        .send_unit(&ctx(&person, "e-0"), &unit("first"))
        .await
        .unwrap();
    let error = sender
        .send_unit(&ctx(&person, "e-1"), &unit("second"))
        .await
        .unwrap_err();
    assert_eq!(error.kind, DeliveryFailureKind::RateLimit);
    assert!(error.retry_after_ms.is_some());
    assert_eq!(eager.sim.bot_texts_to(&person.id), vec!["first"]);
}

#[tokio::test]
async fn finals_are_plain_durable_sends_without_previews_or_edits() {
    // The test plan's "simple durable finals" line for Synology Chat: the intent (with its
    // whole batch) is durable before any I/O, and the final is one post per chunk, never
    // edited (Synology has no edit for a bot).
    let peer = Peer::start().await;
    let person = peer.person("plain");
    let capabilities = peer.plugin.sender.capabilities();
    assert!(capabilities.live.is_none(), "no live previews");
    assert!(!capabilities.reconciles_unknown_sends());
    assert!(peer.plugin.sender.live().is_none());
    let dir = tempfile::tempdir().unwrap();
    let (messenger, store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    // The platform refuses the first attempt (too fast): the intent must already be durable.
    peer.sim.inject(Fault::new(FaultKind::Refuse(411)));
    let long = "word ".repeat(500);
    let report = messenger
        .send(
            reply(&person, "final-1", long.trim()),
            SendOptions::default(),
        )
        .await
        .unwrap();
    assert!(report.durable);
    assert!(
        matches!(report.outcome, SendOutcome::RetryScheduled { .. }),
        "{report:?}"
    );
    drop(messenger);
    // A restart sends it from the stored intent alone, chunked at 2000.
    let (messenger, store2) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        Arc::new(ManualClock::new(60_000)),
    );
    drop(store);
    messenger.recover().await.unwrap();
    let texts = peer.sim.bot_texts_to(&person.id);
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts.iter().all(|t| t.chars().count() <= 2_000));
    assert_eq!(texts.join(" ").split_whitespace().count(), 500);
    assert_eq!(statuses(&store2).await, vec![IntentStatus::Sent]);
}

#[tokio::test]
async fn an_unknown_send_is_parked_and_never_sent_again_after_a_restart() {
    let peer = Peer::start().await;
    let person = peer.person("parked");
    let dir = tempfile::tempdir().unwrap();
    peer.sim.inject(Fault::new(FaultKind::LoseAnswer));
    {
        let (messenger, _store) = engine_in(
            dir.path(),
            peer.plugin.sender.clone(),
            Arc::new(ManualClock::new(1_000)),
        );
        let report = messenger
            .send(
                reply(&person, "lost-1", "exactly once"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(report.outcome, SendOutcome::Unknown { .. }),
            "{report:?}"
        );
    }
    let (messenger, store) = engine_in(
        dir.path(),
        peer.plugin.sender.clone(),
        Arc::new(ManualClock::new(600_000)),
    );
    messenger.recover().await.unwrap();
    messenger.recover().await.unwrap();
    assert_eq!(peer.sim.bot_texts_to(&person.id), vec!["exactly once"]);
    assert_eq!(statuses(&store).await, vec![IntentStatus::UnknownAfterSend]);
}

#[tokio::test]
async fn a_refused_bot_token_stops_the_start_naming_the_setting() {
    let peer = Peer::start().await;
    peer.sim.revoke_bot_token();
    let state = tempfile::tempdir().unwrap();
    let setup = clawgate_conformance::channel_setup(
        0,
        "synology",
        "default",
        json!({
            "base_url": peer.sim.base_url(),
            "bot_token_env": "SYNOLOGY_BOT_TOKEN",
            "webhook_listen": "127.0.0.1:0",
        }),
        state.path(),
    );
    let secrets = clawgate_channel_synology::SynologySecrets {
        bot_token: Some(Secret::new(peer.sim.bot_token())),
        ..Default::default()
    };
    let error = clawgate_channel_synology::SynologyFactory
        .build_with_secrets(&setup, secrets)
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("bot_token_env") && text.contains("404"),
        "{text}"
    );
    assert!(!text.contains(&peer.sim.bot_token()), "{text}");
    // Unknown settings are refused.
    let typo = clawgate_conformance::channel_setup(
        0,
        "synology",
        "default",
        json!({ "base_url": "http://127.0.0.1:1", "webhook_listen": "127.0.0.1:0", "bot_tokn_env": "X" }),
        state.path(),
    );
    assert!(
        clawgate_channel_synology::SynologyFactory
            .build_with_secrets(&typo, Default::default())
            .await
            .is_err()
    );
}
