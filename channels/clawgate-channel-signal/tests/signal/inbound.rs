//! Inbound as signal-cli delivers it: manual receive keeps messages until the source
//! subscribes; on-start mode loses what arrives while nobody listens; sync copies of our own
//! sends, receipts, typing, edits and deletes are not turns.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_channel_sdk::prelude::*;
use clawgate_channel_signal::simulator::{ReceiveMode, SimulatorConfig};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::peer::{Peer, number_for};

/// Collects what the source hands over, until stopped.
#[derive(Default)]
struct Collect {
    got: Mutex<Vec<Value>>,
    stop: Notify,
}

#[async_trait]
impl EventSink for Collect {
    async fn deliver(&self, event: PushedEvent) {
        self.got.lock().unwrap().push(event.raw);
        event.ack.ack();
    }

    async fn stopped(&self) {
        self.stop.notified().await;
    }
}

impl Collect {
    fn texts(&self) -> Vec<String> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter_map(|i| {
                i.pointer("/envelope/dataMessage/message")
                    .and_then(Value::as_str)
            })
            .map(str::to_owned)
            .collect()
    }
}

/// Polls `done` until it holds (a deadline, not a sleep, bounds the wait).
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn run_source(peer: &Peer) -> (Arc<Collect>, tokio::task::JoinHandle<()>) {
    let sink = Arc::new(Collect::default());
    let InboundSource::Pushed(feed) = peer.plugin.source.clone() else {
        panic!("the Signal source is pushed");
    };
    let handle: Arc<dyn EventSink> = sink.clone();
    let task = tokio::spawn(async move {
        let _ = feed.run(handle).await;
    });
    (sink, task)
}

#[tokio::test]
async fn manual_receive_keeps_messages_until_the_source_subscribes() {
    let peer = Peer::start().await;
    let account = peer.sim.account();
    let ada = number_for("ada");
    for text in ["one", "two", "three"] {
        peer.sim.person_writes(&account, &ada, text);
    }
    assert_eq!(
        peer.sim.queued(&account),
        3,
        "nobody subscribed: the messages wait"
    );
    let (sink, task) = run_source(&peer);
    until("the queued messages", || sink.texts().len() == 3).await;
    assert_eq!(sink.texts(), vec!["one", "two", "three"]);
    assert_eq!(peer.sim.queued(&account), 0);
    peer.sim.person_writes(&account, &ada, "four");
    until("the live message", || sink.texts().len() == 4).await;
    // The daemon restarting: the source dials again and resubscribes; what came meanwhile waits.
    peer.sim.drop_subscribers();
    peer.sim.person_writes(&account, &ada, "five");
    until("the message after the drop", || sink.texts().len() == 5).await;
    assert_eq!(sink.texts(), vec!["one", "two", "three", "four", "five"]);
    sink.stop.notify_waiters();
    task.abort();
}

#[tokio::test]
async fn on_start_mode_loses_what_arrives_while_nobody_listens() {
    let config = SimulatorConfig {
        receive_mode: ReceiveMode::OnStart,
        ..SimulatorConfig::default()
    };
    let peer = Peer::with(config, json!({})).await;
    let account = peer.sim.account();
    let ada = number_for("ada");
    // The start-up check's connection is gone.
    until("no connection", || peer.sim.connections() == 0).await;
    peer.sim.person_writes(&account, &ada, "while away");
    assert_eq!(
        peer.sim.lost().len(),
        1,
        "acknowledged to Signal, handed to nobody"
    );
    let (sink, task) = run_source(&peer);
    until("the source's connection", || peer.sim.connections() == 1).await;
    // subscribeReceive is refused in this mode; the source takes what is pushed anyway.
    until("the refused subscription", || {
        peer.sim
            .calls()
            .iter()
            .any(|(m, _)| m == "subscribeReceive")
    })
    .await;
    peer.sim.person_writes(&account, &ada, "while here");
    until("the pushed message", || sink.texts().len() == 1).await;
    assert_eq!(sink.texts(), vec!["while here"]);
    assert_eq!(peer.sim.subscriptions(), 0);
    sink.stop.notify_waiters();
    task.abort();
}

#[tokio::test]
async fn only_data_messages_from_others_are_turns() {
    let peer = Peer::start().await;
    let account = peer.sim.account();
    let ada = number_for("ada");
    let receiver = peer.plugin.receiver.clone().unwrap();
    let asked = peer.sim.person_writes(&account, &ada, "a question");
    let asked_at = asked["envelope"]["timestamp"].as_u64().unwrap();
    let turn = receiver.normalize(&asked).unwrap();
    assert_eq!(turn.event_id, format!("{ada}:{asked_at}"));
    assert_eq!(turn.message.target, MessageTarget::direct(&ada));
    peer.sim.create_group("R3JvdXA=", "Team", &[&ada]);
    let in_group = peer
        .sim
        .person_writes_in_group(&account, &ada, "R3JvdXA=", "hi all");
    assert_eq!(
        receiver.normalize(&in_group).unwrap().message.target,
        MessageTarget::group("R3JvdXA=")
    );
    let quoted = peer
        .sim
        .person_replies(&account, &ada, &account, 7, "about that");
    assert_eq!(
        receiver
            .normalize(&quoted)
            .unwrap()
            .message
            .body
            .unwrap()
            .text,
        "about that"
    );
    let not_turns = [
        (
            "a linked device's sync copy",
            peer.sim
                .linked_device_sends(&account, &ada, "sent from my phone"),
        ),
        (
            "an edit",
            peer.sim
                .person_edits(&account, &ada, asked_at, "a better question"),
        ),
        (
            "a remote delete",
            peer.sim.person_deletes(&account, &ada, asked_at),
        ),
        (
            "a read receipt",
            peer.sim.person_receipt(&account, &ada, &[asked_at], true),
        ),
        ("typing", peer.sim.person_types(&account, &ada)),
    ];
    for (what, item) in not_turns {
        assert!(
            matches!(receiver.normalize(&item), Err(ReceiveError::Ignored { .. })),
            "{what}: {:?}",
            receiver.normalize(&item)
        );
    }
    // allowed_senders narrows who is answered.
    let narrow = Peer::with(
        SimulatorConfig::default(),
        json!({ "allowed_senders": [ada] }),
    )
    .await;
    let eve = narrow
        .sim
        .person_writes(&narrow.sim.account(), &number_for("eve"), "hello");
    assert!(matches!(
        narrow.plugin.receiver.clone().unwrap().normalize(&eve),
        Err(ReceiveError::Ignored { .. })
    ));
}

#[tokio::test]
async fn a_multi_account_daemon_keeps_each_accounts_messages_apart() {
    let (first, second) = ("+15550001111", "+15550002222");
    let config = SimulatorConfig {
        accounts: vec![first.to_owned(), second.to_owned()],
        ..SimulatorConfig::default()
    };
    let peer = Peer::with(config, json!({ "account": second })).await;
    let ada = number_for("ada");
    peer.sim.person_writes(first, &ada, "for the first");
    peer.sim.person_writes(second, &ada, "for the second");
    let (sink, task) = run_source(&peer);
    until("the second account's message", || sink.texts().len() == 1).await;
    assert_eq!(
        peer.sim.queued(first),
        1,
        "the first account's message waits for its own client"
    );
    assert_eq!(sink.texts(), vec!["for the second"]);
    let ctx = SendContext::new(
        ChannelMessage::outbound("m", "signal", MessageTarget::direct(&ada), ""),
        "multi:1",
    );
    peer.plugin
        .sender
        .send_unit(&ctx, &RenderedMessageUnit::text(0, "from the second"))
        .await
        .unwrap();
    assert_eq!(peer.sim.landed()[0].account, second);
    // Every call named its account.
    assert!(peer.sim.calls().iter().all(|(_, p)| p["account"] == second));
    sink.stop.notify_waiters();
    task.abort();
}
