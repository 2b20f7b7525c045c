//! The seed's line for iMessage: "durable iMessage finals populate the monitor's sent-message
//! echo cache". Every final the engine sends durably — each chunk, the sends recovery makes
//! after a restart, and sends whose answer was lost — is in the cache before its echo arrives,
//! so the server's `new-message` of our own text (`isFromMe: true`, seconds later, under a
//! guid we may not know yet) is never a turn. The tests run the account in the mode where the
//! cache is the only guard (`from_me_is_inbound`: the person's own messages from their other
//! devices also arrive `isFromMe`), so a cache that was not populated would show up as a turn.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_imessage::ImessageAccount;
use clawgate_channel_imessage::simulator::{
    BlueBubblesSimulator, Fault, FaultKind, SimulatorConfig,
};
use clawgate_channel_sdk::prelude::*;
use clawgate_messages::{Messenger, RetryPolicy, SendOptions, SendOutcome};
use clawgate_types::clock::ManualClock;
use serde_json::{Value, json};

use crate::peer::{TOKEN, build, listening, settings};

/// What the source hands on (each event acked: recorded).
#[derive(Default)]
pub(crate) struct Recording {
    events: Mutex<Vec<Value>>,
}

impl Recording {
    pub(crate) fn texts(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| {
                let text = e["data"]["text"].as_str().unwrap_or_default();
                // Own-account messages are marked: the same words from a person are not ours.
                if e["data"]["isFromMe"] == true {
                    format!("(me) {text}")
                } else {
                    text.to_owned()
                }
            })
            .collect()
    }
}

#[async_trait]
impl EventSink for Recording {
    async fn deliver(&self, event: PushedEvent) {
        self.events.lock().unwrap().push(event.raw.clone());
        event.ack.ack();
    }

    async fn stopped(&self) {
        std::future::pending::<()>().await;
    }
}

/// One run of the account: its plugin, its listener and what it handed on.
pub(crate) struct Run {
    pub(crate) plugin: ChannelPlugin,
    pub(crate) sink: Arc<Recording>,
    task: tokio::task::JoinHandle<()>,
}

impl Run {
    /// The account of `state` on `sim`, listening on `port`.
    pub(crate) async fn open(
        sim: &BlueBubblesSimulator,
        state: &std::path::Path,
        port: u16,
        extra: Value,
    ) -> Run {
        let plugin = build(sim, state, settings(sim, port, &extra))
            .await
            .unwrap();
        let sink = Arc::new(Recording::default());
        let InboundSource::Pushed(feed) = plugin.source.clone() else {
            panic!("pushed")
        };
        let as_sink: Arc<dyn EventSink> = sink.clone();
        let task = tokio::spawn(async move {
            let _ = feed.run(as_sink).await;
        });
        listening(port).await;
        Run { plugin, sink, task }
    }

    pub(crate) fn account(&self) -> Arc<ImessageAccount> {
        self.plugin.extension::<ImessageAccount>().unwrap()
    }

    /// The process dies: the listener goes, nothing is flushed.
    pub(crate) async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

pub(crate) fn engine(
    dir: &std::path::Path,
    sender: Arc<dyn ChannelMessageAdapter>,
    clock: Arc<ManualClock>,
) -> Messenger {
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir));
    let policy = RetryPolicy {
        base_delay_ms: 1_000,
        reconcile_delay_ms: 1_000,
        ..RetryPolicy::default()
    };
    Messenger::new(store, vec![sender], policy, clock, "imessage-tests")
}

pub(crate) fn reply(chat: &str, id: &str, text: &str) -> ChannelMessage {
    ChannelMessage::outbound(id, "imessage", MessageTarget::direct(chat), text)
}

/// The process of a recorded final that dies before its request: nothing reaches the server.
struct DiedBeforeTheRequest(clawgate_types::MessageCapabilities);

#[async_trait]
impl ChannelMessageAdapter for DiedBeforeTheRequest {
    fn channel(&self) -> &str {
        "imessage"
    }

    fn capabilities(&self) -> &clawgate_types::MessageCapabilities {
        &self.0
    }

    async fn send_unit(
        &self,
        _ctx: &SendContext,
        _unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        Err(SendError::before_io(
            DeliveryFailureKind::Transient,
            "the process died before the request",
        ))
    }
}

async fn started(config: SimulatorConfig) -> (BlueBubblesSimulator, u16) {
    let sim = BlueBubblesSimulator::start(config).await.unwrap();
    let port = clawgate_conformance::ports::reserve_loopback_port();
    sim.set_webhook(Some(&format!(
        "http://127.0.0.1:{port}/bluebubbles/webhook?token={TOKEN}"
    )));
    (sim, port)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_durable_imessage_finals_populate_the_sent_echo_cache() {
    // Echoes come 400 ms after the row: after the send's answer, as on a real Mac.
    let (sim, port) = started(SimulatorConfig {
        echo_delay: Duration::from_millis(400),
        ..SimulatorConfig::default()
    })
    .await;
    let state = tempfile::tempdir().unwrap();
    let run = Run::open(
        &sim,
        state.path(),
        port,
        json!({ "from_me_is_inbound": true }),
    )
    .await;
    let chat = sim.dm("+15550001111");
    let db = tempfile::tempdir().unwrap();
    let messenger = engine(
        db.path(),
        run.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    // A reply long enough for two chunks: each chunk is its own message and its own echo.
    let text = format!("{} {}", "a".repeat(3_990), "the second chunk");
    let report = messenger
        .send(reply(&chat, "reply-1", &text), SendOptions::default())
        .await
        .unwrap();
    let SendOutcome::Sent { receipt } = report.outcome else {
        panic!("{report:?}")
    };
    assert_eq!(receipt.parts.len(), 2);
    // The person types the very words of our second chunk (as it landed) before its echo is
    // back (it is
    // 400 ms away): their message (isFromMe: false) is a turn, never taken for the echo.
    let second = sim.our_texts(&chat)[1].clone();
    sim.person_writes(&chat, "+15550001111", &second);
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    let echoes: Vec<_> = sim
        .deliveries()
        .into_iter()
        .filter(|d| d.body["data"]["isFromMe"] == true)
        .collect();
    assert_eq!(echoes.len(), 2, "the server echoed both chunks");
    assert!(echoes.iter().all(|d| d.status == 200));
    assert_eq!(
        run.sink.texts(),
        vec![second.clone()],
        "the person's message is a turn, the echoes are not"
    );
    assert_eq!(run.account().counts.echoes(), 2);
    // The same words from another device of the same Apple ID (isFromMe: true) are a turn too
    // once the echoes have used their entries.
    sim.own_device_writes(&chat, &second);
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    assert_eq!(
        run.sink.texts(),
        vec![second.clone(), format!("(me) {second}")]
    );
    run.crash().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_arriving_after_a_crash_are_suppressed_and_recovery_sends_populate_the_cache() {
    // Echoes come 1.5 s after the row: after the gateway died and came back.
    let (sim, port) = started(SimulatorConfig {
        echo_delay: Duration::from_millis(1_500),
        ..SimulatorConfig::default()
    })
    .await;
    let state = tempfile::tempdir().unwrap();
    let db = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_000));
    let extra = json!({ "from_me_is_inbound": true });
    let chat = sim.dm("+15550002222");
    let first = Run::open(&sim, state.path(), port, extra.clone()).await;
    // 1. The answer of one final is lost after the row exists. 2. Another final is recorded
    // and the process dies before its request (played by a sender that fails before any
    // I/O): only recovery, after the restart, sends it.
    sim.inject(Fault::new(FaultKind::LoseAnswer));
    {
        let messenger = engine(db.path(), first.plugin.sender.clone(), clock.clone());
        let lost = messenger
            .send(
                reply(&chat, "lost", "answer lost, row made"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(lost.outcome, SendOutcome::Unknown { .. }),
            "{lost:?}"
        );
    }
    {
        let died = Arc::new(DiedBeforeTheRequest(
            first.plugin.sender.capabilities().clone(),
        ));
        let messenger = engine(db.path(), died, clock.clone());
        let pending = messenger
            .send(
                reply(&chat, "retry", "sent by recovery"),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(
            matches!(pending.outcome, SendOutcome::RetryScheduled { .. }),
            "{pending:?}"
        );
    }
    first.crash().await;
    // The restart: a new account on the same state directory, a new engine on the same store.
    let second = Run::open(&sim, state.path(), port, extra).await;
    assert!(
        !second.account().echoes.is_empty(),
        "the cache was seeded from the journal"
    );
    clock.advance(60_000);
    let messenger = engine(db.path(), second.plugin.sender.clone(), clock.clone());
    messenger.recover().await.unwrap();
    assert!(sim.deliveries_settled(Duration::from_secs(15)).await);
    // Both finals show once; the lost one was settled from its row, never sent again.
    assert_eq!(
        sim.our_texts(&chat),
        vec!["answer lost, row made", "sent by recovery"]
    );
    let echoes = sim
        .deliveries()
        .into_iter()
        .filter(|d| d.body["type"] == "new-message" && d.body["data"]["isFromMe"] == true)
        .count();
    assert_eq!(echoes, 2);
    assert!(
        second.sink.texts().is_empty(),
        "an echo became a turn: {:?}",
        second.sink.texts()
    );
    assert_eq!(second.account().counts.echoes(), 2);
    second.crash().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echo_later_than_the_ttl_degrades_to_a_duplicate_never_a_lost_inbound() {
    let (sim, port) = started(SimulatorConfig {
        echo_delay: Duration::from_millis(200),
        ..SimulatorConfig::default()
    })
    .await;
    let chat = sim.dm("+15550003333");
    // Default mode: the isFromMe guard keeps a late echo from being answered.
    let state = tempfile::tempdir().unwrap();
    let guarded = Run::open(&sim, state.path(), port, json!({ "echo_ttl_ms": 1 })).await;
    let db = tempfile::tempdir().unwrap();
    let messenger = engine(
        db.path(),
        guarded.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    messenger
        .send(
            reply(&chat, "late-1", "a late echo"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    sim.person_writes(&chat, "+15550003333", "a person's message");
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    assert_eq!(guarded.sink.texts(), vec!["a person's message"]);
    assert_eq!(
        (
            guarded.account().counts.echoes(),
            guarded.account().counts.own()
        ),
        (0, 1),
        "past the TTL the echo is only an own-account message"
    );
    guarded.crash().await;
    // Self-chat mode: past the TTL the echo is a turn (a duplicate), the person's is too.
    let state = tempfile::tempdir().unwrap();
    let open = Run::open(
        &sim,
        state.path(),
        port,
        json!({ "echo_ttl_ms": 1, "from_me_is_inbound": true }),
    )
    .await;
    let db = tempfile::tempdir().unwrap();
    let messenger = engine(
        db.path(),
        open.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    messenger
        .send(
            reply(&chat, "late-2", "another late echo"),
            SendOptions::default(),
        )
        .await
        .unwrap();
    sim.person_writes(&chat, "+15550003333", "still heard");
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    let mut texts = open.sink.texts();
    texts.sort();
    assert_eq!(texts, vec!["(me) another late echo", "still heard"]);
    open.crash().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_stays_within_its_capacity() {
    let (sim, port) = started(SimulatorConfig {
        echo_delay: Duration::from_millis(20),
        ..SimulatorConfig::default()
    })
    .await;
    let chat = sim.dm("+15550004444");
    let state = tempfile::tempdir().unwrap();
    let run = Run::open(&sim, state.path(), port, json!({ "echo_capacity": 2 })).await;
    let db = tempfile::tempdir().unwrap();
    let messenger = engine(
        db.path(),
        run.plugin.sender.clone(),
        Arc::new(ManualClock::new(1_000)),
    );
    for n in 0..5 {
        messenger
            .send(
                reply(&chat, &format!("cap-{n}"), &format!("reply {n}")),
                SendOptions::default(),
            )
            .await
            .unwrap();
        assert!(run.account().echoes.len() <= 2);
    }
    assert_eq!(run.account().echoes.len(), 2);
    run.crash().await;
}
