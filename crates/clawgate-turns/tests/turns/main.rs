//! The turn engine on its own: a real SQLite state directory, the SDK's in-memory platform and
//! channel, and no gateway binary. No agent is configured, so these cover everything a turn
//! does before and instead of prompting one.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clawgate_acpx::{ControllerConfig, LifecycleController, system_table};
use clawgate_awareness::Awareness;
use clawgate_channel_sdk::NormalizedInbound;
use clawgate_channel_sdk::testing::{MemoryChannel, MemoryPlatform};
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_turns::{Channel, Counters, TurnError, Turns, reply_key, session_key_for};
use clawgate_types::clock::SystemClock;
use clawgate_types::{
    ChannelMessage, MessageActor, MessageDurabilityPolicy, MessageTarget, SessionKey,
};
use tokio::sync::watch;

/// A turn engine over a fresh state directory with one memory channel answered by agent
/// `main`, for which no command is configured.
struct Host {
    _dir: tempfile::TempDir,
    platform: MemoryPlatform,
    channel: Arc<Channel>,
    messenger: Messenger,
    awareness: Arc<Awareness>,
    turns: Arc<Turns>,
    _stop: watch::Sender<bool>,
}

async fn host() -> Host {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let platform = MemoryPlatform::new();
    let plugin = MemoryChannel::new("memory", platform.clone()).plugin();
    let channel = Arc::new(Channel::new(
        "memory", "memory", "default", "main", plugin, 3,
    ));
    let messenger = Messenger::new(
        store.clone(),
        vec![channel.plugin.sender.clone()],
        RetryPolicy::default(),
        Arc::new(SystemClock),
        "turns-test",
    );
    let awareness = Arc::new(Awareness::builder(store.clone()).build());
    // The wrapper is never started: no agent has a command.
    let wrapper = std::env::current_exe().expect("own path");
    let acpx = Arc::new(
        LifecycleController::new(
            store.clone(),
            system_table(),
            ControllerConfig::new(wrapper),
        )
        .await
        .expect("controller"),
    );
    let (stop, stopped) = watch::channel(false);
    let turns = Arc::new(Turns::new(
        store,
        messenger.clone(),
        awareness.clone(),
        acpx,
        HashMap::new(),
        MessageDurabilityPolicy::Required,
        Arc::new(Counters::default()),
        stopped,
    ));
    Host {
        _dir: dir,
        platform,
        channel,
        messenger,
        awareness,
        turns,
        _stop: stop,
    }
}

fn inbound(event: &str, conversation: &str, text: &str) -> NormalizedInbound {
    let mut message = ChannelMessage::inbound(event, "memory", MessageTarget::group(conversation))
        .with_text(text);
    message.sender = Some(MessageActor::new("person-1"));
    NormalizedInbound::new(event, message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_without_an_agent_fails_after_registering_the_session() {
    let host = host().await;
    let error = host
        .turns
        .turn(&host.channel, inbound("u-1", "room-1", "hello"))
        .await
        .expect_err("no agent is configured");
    assert!(
        matches!(&error, TurnError::NoAgent(id) if id == "main"),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "no agent \"main\" is configured for this channel"
    );
    let session = session_key_for("main", "memory", "room-1").expect("key");
    let row = host.awareness.session(&session).await.expect("read");
    assert!(row.is_some(), "the conversation's session is registered");
    let counters = host.turns.counters();
    assert_eq!(counters.turns_failed.load(Ordering::SeqCst), 1);
    assert_eq!(counters.turns_completed.load(Ordering::SeqCst), 0);
    assert_eq!(counters.turns_in_flight.load(Ordering::SeqCst), 0);
    assert_eq!(host.platform.sends(), 0, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_event_whose_reply_was_delivered_does_nothing() {
    let host = host().await;
    let event = inbound("u-2", "room-1", "hello");
    // An earlier attempt delivered generation 0 of this event's reply.
    let key = reply_key("memory", "u-2", 0);
    let reply = clawgate_turns::reply_message(&host.channel, &event, &key, "hi");
    let options = SendOptions {
        durability: MessageDurabilityPolicy::Required,
        idempotency_key: Some(key),
        time_to_live_ms: None,
    };
    let report = host.messenger.send(reply, options).await.expect("send");
    assert!(
        matches!(report.outcome, SendOutcome::Sent { .. }),
        "{report:?}"
    );

    // The agent is never asked (none is configured): the delivered reply completes the turn.
    host.turns
        .turn(&host.channel, event)
        .await
        .expect("nothing left to do");
    assert_eq!(host.platform.texts("room-1"), ["hi"]);
    assert_eq!(
        host.turns.counters().turns_completed.load(Ordering::SeqCst),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_message_is_written_into_its_conversation_then_answered_as_a_turn() {
    let host = host().await;
    let from = SessionKey::parse("agent:main:manager").expect("key");
    host.turns
        .deliver_to_session(&host.channel, "room-2", &from, "status?")
        .await
        .expect("delivered");
    assert_eq!(
        host.platform.texts("room-2"),
        ["session:agent:main:manager: status?"]
    );
    // The turn runs on after the delivery; without an agent it fails.
    let failed = &host.turns.counters().turns_failed;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while failed.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the session message's turn never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let session = session_key_for("main", "memory", "room-2").expect("key");
    assert!(
        host.awareness
            .session(&session)
            .await
            .expect("read")
            .is_some()
    );
}

#[test]
fn turn_errors_say_what_became_of_the_reply() {
    let cases: [(TurnError, &str); 4] = [
        (
            TurnError::Session("bad key".into()),
            "session registry: bad key",
        ),
        (
            TurnError::Undelivered("platform said no".into()),
            "the reply could not be delivered: platform said no",
        ),
        (
            TurnError::TooManyReplies("u-9".into()),
            "event u-9 had 1000 abandoned replies; giving up",
        ),
        (
            TurnError::Stopping,
            "stopping before the reply was delivered",
        ),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text, "{error:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_relaying_into_a_watched_session_gets_no_notice_of_its_own_message() {
    let host = host().await;
    let coordinator = session_key_for("main", "memory", "coord").expect("key");
    let worker = session_key_for("main", "memory", "worker").expect("key");
    for key in [&coordinator, &worker] {
        host.awareness
            .create_session(
                clawgate_awareness::NewSession::new(key.clone()),
                clawgate_awareness::Actor::system("test"),
            )
            .await
            .expect("session");
    }
    assert!(host.awareness.watch(&coordinator, &worker).await);
    let failed = &host.turns.counters().turns_failed;
    let turns_done = |n: u64| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while failed.load(Ordering::SeqCst) < n {
            assert!(tokio::time::Instant::now() < deadline, "turn {n} never ran");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    host.turns
        .deliver_to_session(&host.channel, "worker", &coordinator, "status?")
        .await
        .expect("delivered");
    // The turn logs the message, then fails (no agent).
    turns_done(1).await;
    assert!(
        host.awareness.pending_notices(&coordinator).is_empty(),
        "its own message is not news to the coordinator"
    );
    let _ = host
        .turns
        .turn(&host.channel, inbound("u-9", "worker", "new plan"))
        .await;
    let notices = host.awareness.pending_notices(&coordinator);
    assert_eq!(notices.len(), 1, "a person's message is: {notices:?}");
    assert_eq!(notices[0].target, worker);
}

#[test]
fn only_failures_a_retry_cannot_fix_are_permanent() {
    let permanent = [
        TurnError::Undelivered("chat not found".into()),
        TurnError::TooManyReplies("e1".into()),
        TurnError::NoAgent("main".into()),
    ];
    for error in &permanent {
        assert!(error.is_permanent(), "{error}");
    }
    let retryable = [
        TurnError::Session("busy".into()),
        TurnError::Stopping,
        TurnError::IntentGone(clawgate_types::IntentId::parse("i-1").expect("id")),
    ];
    for error in &retryable {
        assert!(!error.is_permanent(), "{error}");
    }
}
