//! The real binary with a Twitch bot, on the Twitch chat simulator. The simulator runs in the
//! test process, so it outlives a gateway killed with SIGKILL and its own record of what
//! landed is the judge: a person mentions the bot and gets one reply, and the random-time
//! crash matrix.
//!
//! Two outcomes are inherent to Twitch and allowed, each with its evidence, and counted:
//! - Twitch chat keeps no backlog and TMI has no acknowledgement: a message Twitch relayed in
//!   the instant before a kill, before the gateway recorded it, is never seen again (its event
//!   is absent from `inbound_records`).
//! - Helix has no idempotency key and a bot cannot look up what it sent: a send whose answer a
//!   kill cut off stays `unknown_after_send` (reported, never repeated).
//!
//! Everything else — a duplicate, a missing final without that evidence, a partial final, a
//! stray — fails.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_twitch::limits::without_suffix;
use clawgate_channel_twitch::simulator::{SimUser, SimulatorConfig, TwitchSimulator};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const TOKEN_ENV: &str = "E2E_TWITCH_TOKEN";
const CHANNEL: &str = "clawchan";
/// The channels the bot is in: one conversation each, so turns of different channels overlap.
const CHANNELS: [&str; 3] = [CHANNEL, "clawchan_two", "clawchan_three"];

/// A bot account on a simulator, a person in its channel, and a state directory.
struct Bot {
    sim: TwitchSimulator,
    person: SimUser,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Bot {
    async fn start(send_via: &str, agent_args: &[&str]) -> Bot {
        let sim = TwitchSimulator::start(SimulatorConfig {
            // The gateway's own limit is what is under test elsewhere; the matrix sends faster.
            rate_limits: false,
            channels: CHANNELS.iter().map(|c| (*c).to_owned()).collect(),
            ..SimulatorConfig::default()
        })
        .await
        .expect("simulator starts");
        let person = sim.person("ada");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_file(dir.path(), &sim, send_via, agent_args);
        Bot {
            sim,
            person,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn login(&self) -> String {
        self.sim.config().bot_login
    }

    /// Starts a gateway and waits until its bot is in the channel (Twitch relays nothing to a
    /// bot that is not there).
    async fn gateway(&self) -> Result<GatewayProcess, String> {
        let login = self.login();
        // A killed gateway's link is gone before the next one counts as in the channel.
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.sim.connections(&login) > 0 {
            if Instant::now() > deadline {
                return Err("the killed gateway's chat link never closed".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let token = self.sim.config().bot_token;
        let gateway = GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[(TOKEN_ENV, token.as_str()), ("CLAWGATE_LOG", "info")],
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !CHANNELS
            .iter()
            .all(|c| self.sim.joined(&login).iter().any(|j| j == c))
        {
            if Instant::now() > deadline {
                return Err(format!(
                    "the bot never joined {CHANNELS:?}:\n{}",
                    gateway.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(gateway)
    }

    /// The person mentions the bot in `channel`; returns what the test expects back.
    fn ask(&self, channel: &str, text: &str, words: usize) -> Asked {
        let message = self.sim.person_writes(
            channel,
            &self.person,
            &format!("@{} {text}", self.login()),
            None,
        );
        Asked {
            channel: channel.to_owned(),
            id: message.id,
            expected: demo_reply(text, words),
        }
    }
}

fn config_file(dir: &Path, sim: &TwitchSimulator, send_via: &str, agent_args: &[&str]) -> PathBuf {
    let config = sim.config();
    let channels: Vec<String> = CHANNELS.iter().map(|c| format!("#{c}")).collect();
    let settings = format!(
        "login = \"{}\", token_env = \"{TOKEN_ENV}\", user_id = \"{}\", \
         client_id = \"{}\", channels = {channels:?}, send_via = \"{send_via}\", \
         irc_server = \"127.0.0.1\", irc_port = {}, helix_base = \"{}\", \
         request_timeout_ms = 3000, answer_timeout_ms = 3000, reconnect_min_ms = 50, \
         reconnect_max_ms = 500",
        config.bot_login,
        config.bot_user_id,
        config.client_id,
        sim.irc_port(),
        sim.helix_base(),
    );
    channel_config(dir, "twitch", &settings, agent_args, 100)
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    channel: String,
    id: String,
    expected: String,
}

/// What the simulator shows for the messages of a run.
#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// Relayed at a kill and never recorded: absent from `inbound_records`.
    unseen: usize,
    /// Finals recorded `unknown_after_send` and not visible.
    unknown: usize,
    problems: Vec<String>,
}

fn judge(bot: &Bot, asked: &[Asked]) -> Verdict {
    let state = bot.state();
    let recorded: Vec<String> = if state.join("state.db").exists() {
        state_pairs(&state, "SELECT event_id, status FROM inbound_records")
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    } else {
        Vec::new()
    };
    let intents = if state.join("state.db").exists() {
        state_pairs(&state, "SELECT payload, status FROM send_intents")
    } else {
        Vec::new()
    };
    let login = bot.login();
    let mut mine: Vec<(String, String)> = CHANNELS
        .iter()
        .flat_map(|c| bot.sim.messages(c))
        .filter(|m| m.sender_login == login)
        .map(|m| (m.channel.clone(), without_suffix(&m.text).to_owned()))
        .collect();
    let mut verdict = Verdict::default();
    for a in asked {
        let answer = (a.channel.clone(), a.expected.clone());
        let finals = mine.iter().filter(|m| **m == answer).count();
        let statuses: Vec<&str> = intents
            .iter()
            .filter(|(payload, _)| payload.contains(&a.id))
            .map(|(_, status)| status.as_str())
            .collect();
        match finals {
            1 => verdict.finals += 1,
            0 if !recorded.contains(&a.id) => verdict.unseen += 1,
            0 if statuses.contains(&"unknown_after_send") => verdict.unknown += 1,
            0 => verdict
                .problems
                .push(format!("message {}: no final, replies {statuses:?}", a.id)),
            n => verdict
                .problems
                .push(format!("message {}: {n} finals", a.id)),
        }
        mine.retain(|m| *m != answer);
    }
    verdict.problems.extend(
        mine.into_iter()
            .map(|t| format!("stray bot message: {t:?}")),
    );
    verdict
}

/// Waits until every message in `asked` is in `inbound_records` (at most `wait`).
async fn recorded(bot: &Bot, asked: &[Asked], wait: Duration) {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        let state = bot.state();
        if state.join("state.db").exists() {
            let ids: Vec<String> =
                state_pairs(&state, "SELECT event_id, status FROM inbound_records")
                    .into_iter()
                    .map(|(id, _)| id)
                    .collect();
            if asked.iter().all(|a| ids.contains(&a.id)) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long until the latest retry a pending reply is scheduled for, if one lies ahead.
fn latest_scheduled_retry(bot: &Bot) -> Option<Duration> {
    let state = bot.state();
    if !state.join("state.db").exists() {
        return None;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_millis();
    state_pairs(
        &state,
        "SELECT id, CAST(next_attempt_at AS TEXT) FROM send_intents \
         WHERE status = 'pending' AND next_attempt_at IS NOT NULL",
    )
    .into_iter()
    .filter_map(|(_, at)| at.parse::<u128>().ok())
    .max()
    .filter(|at| *at > now)
    .map(|at| Duration::from_millis(u64::try_from(at - now).unwrap_or(u64::MAX)))
}

/// Waits until every message is settled (or `quiet` passes with nothing new).
async fn settle(bot: &Bot, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let verdict = judge(bot, asked);
        let settled = verdict.finals + verdict.unknown + verdict.unseen;
        if settled == asked.len() && verdict.problems.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        let seen = bot.sim.attempts().len();
        if seen != last.0 {
            last = (seen, Instant::now());
        }
        // A reply waiting for a slot of Twitch's 30 s chat limit is not stuck: quiet counts
        // from its retry, not from the last message the simulator saw.
        if let Some(wait) = latest_scheduled_retry(bot) {
            last.1 = last.1.max(Instant::now() + wait);
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_mentioning_the_bot_gets_one_reply_and_chatter_none() {
    const WORDS: usize = 10;
    let bot = Bot::start("helix", &["--chunk-ms", "20", "--words", "10"]).await;
    let gateway = bot.gateway().await.expect("gateway starts");
    let asked = vec![bot.ask(CHANNEL, "what is the plan", WORDS)];
    // Chatter not mentioning the bot is not answered.
    bot.sim
        .person_writes(CHANNEL, &bot.person, "just chatting", None);
    settle(&bot, &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&bot, &asked);
    assert!(verdict.problems.is_empty(), "{verdict:?}");
    assert_eq!(verdict.finals, 1, "{verdict:?}");
    let replies: Vec<String> = bot
        .sim
        .messages(CHANNEL)
        .into_iter()
        .filter(|m| m.sender_login == bot.login())
        .map(|m| m.text)
        .collect();
    assert_eq!(
        replies,
        [asked[0].expected.clone()],
        "one reply, nothing for the chatter"
    );
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&bot.state()).is_empty());
}

/// The random-time crash matrix on a Twitch bot: mentions written while the bot is in the
/// channel, the gateway SIGKILLed at seeded random instants and restarted, then a clean stop;
/// judged from the simulator's record, the inbound records and the reply intents' statuses.
async fn crash_matrix(send_via: &str) {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("TWITCH", 8, 24);
    eprintln!("twitch crash matrix ({send_via}): seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let bot = Bot::start(send_via, &["--chunk-ms", "25", "--words", "8"]).await;
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let mut asked = Vec::new();
    let started = Instant::now();
    // Restarts that found accepted, unanswered messages to work on: the kills hit turns.
    let mut replaying = 0;
    for _ in 0..kills {
        let gateway = bot
            .gateway()
            .await
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        replaying += usize::from(gateway.printed("accepted before the restart"));
        for _ in 0..per_kill.min(count - asked.len()) {
            let n = asked.len();
            let channel = CHANNELS[usize::try_from(rng.below(3)).unwrap_or(0)];
            asked.push(bot.ask(channel, &format!("message {n}"), WORDS));
            tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
        }
        // Twitch relays a message once and keeps no backlog: the kill is aimed at turns and
        // sends, after the round's messages are on record (a message still unrecorded after
        // 10 s is killed in transit, counted as unseen).
        recorded(&bot, &asked, Duration::from_secs(10)).await;
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = bot
        .gateway()
        .await
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    replaying += usize::from(gateway.printed("accepted before the restart"));
    while asked.len() < count {
        let n = asked.len();
        let channel = CHANNELS[usize::try_from(rng.below(3)).unwrap_or(0)];
        asked.push(bot.ask(channel, &format!("message {n}"), WORDS));
    }
    settle(&bot, &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&bot, &asked);
    let leftovers = leftover_processes(&bot.state());
    eprintln!(
        "twitch crash matrix figures: mode={send_via} seed={seed} kills={kills} messages={} \
         finals={} unseen_at_kill={} unknown={} restarts_replaying={replaying} violations={} \
         leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unseen,
        verdict.unknown,
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.problems.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = bot.dir.keep();
        panic!(
            "twitch crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_twitch_bot_sending_through_helix_never_duplicate_a_final() {
    crash_matrix("helix").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_twitch_bot_sending_over_irc_never_duplicate_a_final() {
    crash_matrix("irc").await;
}
