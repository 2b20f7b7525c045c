//! Two clawgate accounts (two bots) in one Discord channel, each behind the engine's receive
//! path: the echo audit the seed asks for (a gateway-failure notice from one bot is dropped by the
//! other as an echo before `allow_bots`, through the outbound registry, while an unmarked bot
//! message with the same text is authorized normally), and a bot loop that the loop guard ends by
//! itself without dropping a human message.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clawgate_channel_discord::simulator::{
    DiscordSimulator, SimUser, SimulatorConfig, WriteOptions,
};
use clawgate_channel_discord::{DiscordFactory, EchoRegistry};
use clawgate_channel_sdk::prelude::*;
use clawgate_channel_sdk::{EventSink, PushedEvent};
use clawgate_messages::{AckController, ReceiveOptions, ReceiveOutcome, Receiver};
use clawgate_types::clock::ManualClock;
use clawgate_types::{GatewayFailureCode, MessageOrigin, MessageRelation};
use serde_json::json;
use tokio::sync::watch;

use crate::peer::build;

/// One account: its plugin, the engine's receiver in front of it, and what became of each event.
struct Account {
    name: String,
    plugin: ChannelPlugin,
    bot: SimUser,
    receiver: Receiver,
    /// Answers every message it is handed with `re: <text>`.
    replies: bool,
    outcomes: Mutex<Vec<(String, String, &'static str)>>,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

fn label(outcome: &ReceiveOutcome) -> &'static str {
    match outcome {
        ReceiveOutcome::Invalid(_) => "ignored",
        ReceiveOutcome::DroppedEcho => "echo",
        ReceiveOutcome::Unauthorized => "unauthorized",
        ReceiveOutcome::LoopGuarded => "loop-guarded",
        ReceiveOutcome::Duplicate { .. } => "duplicate",
        ReceiveOutcome::Handled { .. } => "handled",
        ReceiveOutcome::Failed { .. } => "failed",
        ReceiveOutcome::InFlight => "in flight",
    }
}

struct Sink {
    account: Arc<Account>,
    stop: watch::Receiver<bool>,
}

#[async_trait]
impl EventSink for Sink {
    async fn deliver(&self, event: PushedEvent) {
        let account = &self.account;
        let ack = AckController::new(event.ack.clone());
        let raw = event.raw.clone();
        let adapter = account.plugin.sender.clone();
        let (name, replies) = (account.name.clone(), account.replies);
        let outcome = account
            .receiver
            .receive(&raw, &ack, |inbound| async move {
                if !replies {
                    return Ok::<(), String>(());
                }
                let text = inbound
                    .message
                    .body
                    .as_ref()
                    .map(|b| b.text.clone())
                    .unwrap_or_default();
                let mut reply = ChannelMessage::outbound(
                    format!("re-{}", inbound.event_id),
                    &name,
                    inbound.message.target.clone(),
                    "",
                );
                reply.relation = Some(MessageRelation::reply_to(&inbound.event_id));
                let ctx = SendContext::new(reply, format!("{name}:{}", inbound.event_id));
                let answer: String = format!("re: {text}").chars().take(2000).collect();
                adapter
                    .send_unit(&ctx, &RenderedMessageUnit::text(0, answer))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.message)
            })
            .await
            .unwrap();
        let author = raw["author"]["id"].as_str().unwrap_or_default().to_owned();
        let text = raw["content"].as_str().unwrap_or_default().to_owned();
        account
            .outcomes
            .lock()
            .unwrap()
            .push((author, text, label(&outcome)));
    }

    async fn stopped(&self) {
        let mut stop = self.stop.clone();
        let _ = stop.wait_for(|s| *s).await;
    }
}

struct Room {
    sim: DiscordSimulator,
    channel: String,
    human: SimUser,
    stop: watch::Sender<bool>,
}

async fn account(
    factory: &DiscordFactory,
    sim: &DiscordSimulator,
    bot: SimUser,
    name: &str,
    allow_bots: bool,
    replies: bool,
) -> Arc<Account> {
    let state = tempfile::tempdir().unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let plugin = build(factory, sim, &bot, state.path(), name, json!({}))
        .await
        .unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(store_dir.path()));
    // A frozen clock: the loop guard's window never passes, so where it cuts is exact.
    let clock = Arc::new(ManualClock::new(1_000));
    let receive = plugin.receiver.clone().unwrap();
    let receiver = Receiver::new(
        store,
        plugin.sender.clone(),
        receive,
        clock,
        ReceiveOptions {
            allow_bots,
            ..ReceiveOptions::default()
        },
    );
    Arc::new(Account {
        name: name.to_owned(),
        plugin,
        bot,
        receiver,
        replies,
        outcomes: Mutex::new(Vec::new()),
        _dirs: (state, store_dir),
    })
}

impl Room {
    async fn open(accounts: &[Arc<Account>], sim: DiscordSimulator) -> Room {
        let (stop, stopped) = watch::channel(false);
        for account in accounts {
            let InboundSource::Pushed(feed) = account.plugin.source.clone() else {
                panic!("pushed");
            };
            let sink: Arc<dyn EventSink> = Arc::new(Sink {
                account: account.clone(),
                stop: stopped.clone(),
            });
            tokio::spawn(async move { feed.run(sink).await });
        }
        for account in accounts {
            until("the account connected", || sim.connected(&account.bot) == 1).await;
        }
        let channel = sim.add_channel("shared");
        let human = sim.add_person("ada");
        Room {
            sim,
            channel,
            human,
            stop,
        }
    }

    /// Every message in the room has been through every account's receiver (Discord sends a
    /// bot its own messages too; those are ignored), so no reply is still on its way.
    fn settled(&self, accounts: &[Arc<Account>]) -> bool {
        let messages = self.sim.messages(&self.channel).len();
        accounts
            .iter()
            .all(|a| a.outcomes.lock().unwrap().len() == messages)
    }
}

async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn outcomes(account: &Account) -> Vec<(String, &'static str)> {
    // Its own messages come back ignored by the channel: left out here.
    account
        .outcomes
        .lock()
        .unwrap()
        .iter()
        .filter(|(author, _, _)| *author != account.bot.id)
        .map(|(_, t, o)| (t.clone(), *o))
        .collect()
}

async fn shared_room(allow_bots: bool) {
    let sim = DiscordSimulator::start(SimulatorConfig::fast())
        .await
        .unwrap();
    let factory = DiscordFactory::with_echo_registry(Arc::new(EchoRegistry::default()));
    let a = account(
        &factory,
        &sim,
        sim.add_bot("alpha"),
        "discord-a",
        true,
        false,
    )
    .await;
    let b = account(
        &factory,
        &sim,
        sim.add_bot("beta"),
        "discord-b",
        allow_bots,
        true,
    )
    .await;
    let room = Room::open(&[a.clone(), b.clone()], sim.clone()).await;
    let target = MessageTarget::group(&room.channel);
    let notice = "The agent failed before replying. Try again.";
    // Alpha's gateway-failure notice (marked), then a normal message with the same text.
    let mut failure = ChannelMessage::outbound("f", "discord-a", target.clone(), notice);
    failure.origin = Some(MessageOrigin::gateway_failure(
        GatewayFailureCode::AgentFailedBeforeReply,
    ));
    let unit = RenderedMessageUnit::text(0, notice);
    a.plugin
        .sender
        .send_unit(&SendContext::new(failure, "failure"), &unit)
        .await
        .unwrap();
    a.plugin
        .sender
        .send_unit(
            &SendContext::new(
                ChannelMessage::outbound("p", "discord-a", target.clone(), notice),
                "plain",
            ),
            &unit,
        )
        .await
        .unwrap();
    room.sim.person_writes(
        &room.channel,
        &room.human,
        "hello both",
        WriteOptions::default(),
    );
    until("beta saw all three", || {
        room.settled(&[a.clone(), b.clone()])
    })
    .await;
    // The marked echo is dropped before authorization either way; the unmarked message is
    // authorized like any bot message.
    let expected_bot = if allow_bots {
        ["echo", "handled"]
    } else {
        ["echo", "unauthorized"]
    };
    assert_eq!(
        outcomes(&b),
        vec![
            (notice.to_owned(), expected_bot[0]),
            (notice.to_owned(), expected_bot[1]),
            ("hello both".to_owned(), "handled"),
        ],
        "allow_bots = {allow_bots}"
    );
    let beta_said: Vec<String> = room
        .sim
        .messages(&room.channel)
        .into_iter()
        .filter(|m| m.author_id == b.bot.id)
        .map(|m| m.content)
        .collect();
    let mut expected = Vec::new();
    if allow_bots {
        expected.push(format!("re: {notice}"));
    }
    expected.push("re: hello both".to_owned());
    assert_eq!(beta_said, expected, "the failure notice is never answered");
    let _ = room.stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_room_with_allow_bots_on_drops_the_marked_echo_and_answers_the_unmarked_message() {
    shared_room(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_room_with_allow_bots_off_answers_only_the_human() {
    shared_room(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_answering_bots_stop_by_themselves_and_every_human_message_is_answered() {
    let sim = DiscordSimulator::start(SimulatorConfig::fast())
        .await
        .unwrap();
    let factory = DiscordFactory::with_echo_registry(Arc::new(EchoRegistry::default()));
    let a = account(
        &factory,
        &sim,
        sim.add_bot("alpha"),
        "discord-a",
        true,
        true,
    )
    .await;
    let b = account(&factory, &sim, sim.add_bot("beta"), "discord-b", true, true).await;
    let accounts = [a.clone(), b.clone()];
    let room = Room::open(&accounts, sim.clone()).await;
    let first = room.sim.person_writes(
        &room.channel,
        &room.human,
        "hi bots",
        WriteOptions::default(),
    );
    until("the loop to end by itself", || {
        room.settled(&accounts)
            && [&a, &b]
                .iter()
                .all(|x| outcomes(x).iter().any(|(_, o)| *o == "loop-guarded"))
    })
    .await;
    let during = room.sim.messages(&room.channel).len();
    // Each bot admits the other's messages up to the guard's limit (10 in the window).
    assert!(
        during <= 1 + 2 * 12,
        "{during} messages: the guard cut the loop"
    );
    let second = room.sim.person_writes(
        &room.channel,
        &room.human,
        "still there?",
        WriteOptions::default(),
    );
    until("the second human message settled", || {
        room.settled(&accounts)
    })
    .await;
    for account in [&a, &b] {
        let handled: Vec<_> = account
            .outcomes
            .lock()
            .unwrap()
            .iter()
            .filter(|(author, _, _)| *author == room.human.id)
            .map(|(_, t, o)| (t.clone(), *o))
            .collect();
        assert_eq!(
            handled,
            vec![
                ("hi bots".to_owned(), "handled"),
                ("still there?".to_owned(), "handled")
            ],
            "{}: no human message dropped",
            account.name
        );
        let answers: Vec<_> = room
            .sim
            .messages(&room.channel)
            .into_iter()
            .filter(|m| m.author_id == account.bot.id)
            .filter_map(|m| m.reply_to)
            .filter(|r| *r == first.id || *r == second.id)
            .collect();
        assert_eq!(
            answers,
            vec![first.id.clone(), second.id.clone()],
            "{} answered both",
            account.name
        );
    }
    // The pair stays cut off: the answers to the second message started no new loop.
    let after = room.sim.messages(&room.channel).len();
    assert_eq!(
        after,
        during + 3,
        "the human message and one answer from each bot"
    );
    let _ = room.stop.send(true);
}
