//! The real binary with a Telegram bot, on the Bot API simulator. The simulator runs in the
//! test process, so it outlives a gateway killed with SIGKILL and its own record of what
//! landed is the judge: a restart while updates are accepted but unfinished, a flood-control
//! storm, and the random-time crash matrix in polling and webhook mode.
//!
//! Telegram has no idempotency key and a bot cannot read its chats, so one outcome is
//! inherent: a `sendMessage` whose answer a kill cut off cannot be checked. A final sent that
//! way stays `unknown_after_send` (reported, never repeated); a first preview sent that way
//! stays visible beside the replayed reply (an orphan preview, always a prefix of the final,
//! and always with a cancelled reply on record). The judge allows exactly these, with their
//! evidence, and counts them; everything else — a duplicate, a missing final not reported
//! unknown, a partial final, a stray — fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_telegram::simulator::{
    BotApiSimulator, SimMessage, SimUser, SimulatorConfig, WriteOptions,
};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const TOKEN_ENV: &str = "E2E_TG_TOKEN";
const SECRET_ENV: &str = "E2E_TG_SECRET";
const SECRET: &str = "e2e-webhook-secret";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Polling,
    Webhook,
}

/// A bot account on a simulator, and a state directory for its gateway.
struct Bot {
    sim: BotApiSimulator,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Bot {
    async fn start(sim: SimulatorConfig, mode: Mode, agent_args: &[&str]) -> Bot {
        let sim = BotApiSimulator::start(SimulatorConfig {
            webhook_retry_base: Duration::from_millis(100),
            ..sim
        })
        .await
        .expect("simulator starts");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_file(dir.path(), &sim, mode, agent_args);
        Bot { sim, dir, config }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[
                (TOKEN_ENV, self.sim.token()),
                (SECRET_ENV, SECRET),
                ("CLAWGATE_LOG", "info"),
            ],
        )
    }

    /// A person writes into `chat`; returns what the test expects back.
    fn write(&self, chat: i64, text: &str, words: usize) -> Asked {
        self.write_in(chat, None, text, words)
    }

    /// As [`Bot::write`], into a forum topic when `topic` is set.
    fn write_in(&self, chat: i64, topic: Option<i64>, text: &str, words: usize) -> Asked {
        let update = self.sim.user_writes(
            chat,
            &SimUser::person(4242, "Ada"),
            text,
            WriteOptions {
                thread_id: topic,
                ..WriteOptions::default()
            },
        );
        Asked {
            chat,
            message_id: update["message"]["message_id"]
                .as_i64()
                .expect("a message update"),
            expected: demo_reply(text, words),
        }
    }
}

fn config_file(dir: &Path, sim: &BotApiSimulator, mode: Mode, agent_args: &[&str]) -> PathBuf {
    let source = match mode {
        Mode::Polling => String::new(),
        Mode::Webhook => {
            let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
            format!(
                ", mode = \"webhook\", webhook_listen = \"127.0.0.1:{port}\", \
                 webhook_url = \"http://127.0.0.1:{port}/telegram\", \
                 webhook_secret_env = \"{SECRET_ENV}\""
            )
        }
    };
    let settings = format!(
        "token_env = \"{TOKEN_ENV}\", api_base = \"{}\", poll_timeout_s = 1, \
         request_timeout_ms = 3000{source}",
        sim.base_url()
    );
    channel_config(dir, "telegram", &settings, agent_args, 100)
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    chat: i64,
    message_id: i64,
    expected: String,
}

/// What the simulator shows for the messages of a run.
#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// Finals recorded `unknown_after_send` and not visible (reported, never repeated).
    unknown: usize,
    /// Previews whose send a kill cut off, left beside the replayed reply.
    orphans: usize,
    problems: Vec<String>,
}

impl Verdict {
    fn holds(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Reply intents of the state directory: idempotency key → status.
fn reply_statuses(state: &Path) -> HashMap<String, String> {
    state_pairs(state, "SELECT idempotency_key, status FROM send_intents")
        .into_iter()
        .collect()
}

fn judge(sim: &BotApiSimulator, state: &Path, asked: &[Asked]) -> Verdict {
    let statuses = reply_statuses(state);
    let of_event = |a: &Asked| {
        let prefix = format!("telegram:reply:{}:{}:", a.chat, a.message_id);
        statuses
            .iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .map(|(_, status)| status.clone())
            .collect::<Vec<_>>()
    };
    let mut verdict = Verdict::default();
    let mut chats: Vec<i64> = asked.iter().map(|a| a.chat).collect();
    chats.sort_unstable();
    chats.dedup();
    for chat in chats {
        let mut bot: Vec<SimMessage> = sim
            .messages(chat)
            .into_iter()
            .filter(|m| m.from_bot_self)
            .collect();
        for a in asked.iter().filter(|a| a.chat == chat) {
            let statuses = of_event(a);
            let finals = bot
                .iter()
                .filter(|m| m.text.as_deref() == Some(a.expected.as_str()))
                .count();
            match finals {
                1 => verdict.finals += 1,
                0 if statuses.iter().any(|s| s == "unknown_after_send") => verdict.unknown += 1,
                0 => verdict.problems.push(format!(
                    "message {} in {chat}: no final, replies {statuses:?}",
                    a.message_id
                )),
                n => verdict
                    .problems
                    .push(format!("message {} in {chat}: {n} finals", a.message_id)),
            }
            // Orphan previews: a strict prefix of this final, with a cancelled reply on record
            // (the stream whose preview's answer was cut off).
            let cancelled = statuses.iter().any(|s| s == "cancelled");
            bot.retain(|m| {
                let text = m.text.as_deref().unwrap_or_default();
                if text == a.expected {
                    return false;
                }
                let orphan = !text.is_empty() && a.expected.starts_with(text) && cancelled;
                if orphan {
                    verdict.orphans += 1;
                }
                !orphan
            });
        }
        for stray in bot {
            verdict.problems.push(format!(
                "stray bot message {} in {chat}: {:?}",
                stray.message_id, stray.text
            ));
        }
    }
    verdict
}

/// Waits until every message has its final (or `quiet` passes with nothing new).
async fn settle(sim: &BotApiSimulator, state: &Path, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let verdict = judge(sim, state, asked);
        if verdict.finals + verdict.unknown == asked.len() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        let calls = sim.log().len();
        if calls != last.0 {
            last = (calls, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn quiet_sim() -> SimulatorConfig {
    SimulatorConfig {
        rate_limits: false,
        ..SimulatorConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updates_accepted_but_unfinished_at_a_kill_are_each_answered_once_after_the_restart() {
    const WORDS: usize = 14;
    let bot = Bot::start(
        quiet_sim(),
        Mode::Polling,
        &["--chunk-ms", "120", "--words", "14"],
    )
    .await;
    let gateway = bot.gateway().expect("gateway starts");
    let mut chats: Vec<i64> = (0..3)
        .map(|n| bot.sim.supergroup(&format!("team {n}"), false))
        .collect();
    // A forum: the reply to a topic message belongs in that topic.
    let forum = bot.sim.supergroup("forum", true);
    let topic = bot.sim.create_topic(forum, "deploys");
    let mut asked: Vec<Asked> = chats
        .iter()
        .map(|chat| bot.write(*chat, &format!("question for {chat}"), WORDS))
        .collect();
    asked.push(bot.write_in(forum, Some(topic), "question in the topic", WORDS));
    chats.push(forum);
    // Every reply is streaming (its preview shows) and none is final: the updates are
    // accepted and unfinished.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let previews = chats
            .iter()
            .filter(|c| bot.sim.messages(**c).iter().any(|m| m.from_bot_self))
            .count();
        if previews == chats.len() {
            break;
        }
        assert!(Instant::now() < deadline, "previews never showed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mid = judge(&bot.sim, &bot.state(), &asked);
    assert_eq!(mid.finals, 0, "killed before any final: {mid:?}");
    gateway.kill_hard();

    let restarted = bot.gateway().expect("gateway restarts");
    settle(&bot.sim, &bot.state(), &asked, Duration::from_secs(10)).await;
    assert!(
        restarted.printed("accepted before the restart and not answered yet"),
        "the restart says what it replays"
    );
    let status = restarted.interrupt();
    let verdict = judge(&bot.sim, &bot.state(), &asked);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(
        verdict.finals,
        asked.len(),
        "each answered once: {verdict:?}"
    );
    assert!(
        bot.sim.chat_actions(chats[0]).iter().any(|a| a == "typing"),
        "typing… shown while the agent worked"
    );
    let in_topic: Vec<Option<i64>> = bot
        .sim
        .messages(forum)
        .iter()
        .filter(|m| m.from_bot_self)
        .map(|m| m.thread_id)
        .collect();
    assert_eq!(
        in_topic,
        vec![Some(topic)],
        "the topic's reply is in the topic"
    );
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&bot.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_control_storm_delays_finals_and_each_lands_once() {
    const WORDS: usize = 4;
    let bot = Bot::start(
        SimulatorConfig::default(),
        Mode::Polling,
        &["--chunk-ms", "0", "--words", "4"],
    )
    .await;
    let gateway = bot.gateway().expect("gateway starts");
    let chats: Vec<i64> = (0..3)
        .map(|n| bot.sim.supergroup(&format!("busy {n}"), false))
        .collect();
    let mut asked = Vec::new();
    for round in 0..4 {
        for chat in &chats {
            asked.push(bot.write(*chat, &format!("ping {round} in {chat}"), WORDS));
        }
    }
    settle(&bot.sim, &bot.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&bot.sim, &bot.state(), &asked);
    let floods = bot.sim.log().iter().filter(|c| c.status == 429).count();
    eprintln!(
        "flood storm: {} finals, {floods} answers 429",
        verdict.finals
    );
    assert!(floods > 0, "the storm met flood control");
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(
        verdict.finals,
        asked.len(),
        "every final landed once: {verdict:?}"
    );
    assert!(status.success(), "clean stop: {status}");
}

/// The random-time crash matrix on a Telegram bot: messages into six chats (four groups, two
/// private chats with drafts), the gateway SIGKILLed at seeded random instants and restarted,
/// then a clean stop; judged from the simulator's record and the reply intents' statuses.
async fn crash_matrix(mode: Mode) {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("TELEGRAM", 12, 40);
    eprintln!("telegram crash matrix ({mode:?}): seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let bot = Bot::start(quiet_sim(), mode, &["--chunk-ms", "25", "--words", "8"]).await;
    let mut chats: Vec<i64> = (0..4)
        .map(|n| bot.sim.supergroup(&format!("crash {n}"), false))
        .collect();
    chats.extend((0..2).map(|n| bot.sim.private_chat(&SimUser::person(9000 + n, "Pat"))));
    let mut asked = Vec::new();
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = bot
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        for _ in 0..per_kill.min(count - asked.len()) {
            let chat = chats[usize::try_from(rng.below(chats.len() as u64)).unwrap_or(0)];
            let n = asked.len();
            asked.push(bot.write(chat, &format!("message {n} to {chat}"), WORDS));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = bot
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let chat = chats[usize::try_from(rng.below(chats.len() as u64)).unwrap_or(0)];
        let n = asked.len();
        asked.push(bot.write(chat, &format!("message {n} to {chat}"), WORDS));
    }
    settle(&bot.sim, &bot.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&bot.sim, &bot.state(), &asked);
    let leftovers = leftover_processes(&bot.state());
    eprintln!(
        "telegram crash matrix figures: mode={mode:?} seed={seed} kills={kills} messages={} \
         finals={} unknown={} orphan_previews={} violations={} leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.orphans,
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.holds() || !leftovers.is_empty() || !status.success() {
        let kept = bot.dir.keep();
        panic!(
            "telegram crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_polling_bot_never_duplicate_or_silently_lose_a_final() {
    crash_matrix(Mode::Polling).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_webhook_bot_never_duplicate_or_silently_lose_a_final() {
    crash_matrix(Mode::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_bot_token_stops_the_start_naming_the_setting() {
    let bot = Bot::start(quiet_sim(), Mode::Polling, &[]).await;
    let error = GatewayProcess::try_start(
        &bot.state(),
        &bot.config,
        &[(TOKEN_ENV, "123:not-the-token")],
    )
    .err()
    .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.token_env"),
        "names the setting: {error}"
    );
    assert!(error.contains(TOKEN_ENV), "names the variable: {error}");
    assert!(
        !error.contains("not-the-token"),
        "never prints the token: {error}"
    );
}
