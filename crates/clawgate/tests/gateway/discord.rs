//! The real binary with a Discord bot on the Discord simulator (in this test process, so it
//! outlives a gateway killed with SIGKILL): a person talks to the agent in a channel and sees the
//! reply stream as edits of one message; the random-time crash matrix with Gateway disconnects,
//! op 7 reconnects and resumable invalid sessions between the kills, judged from the simulator's
//! own record of what landed. Discord sends carry a nonce from the unit's key and a lost answer
//! is settled from the channel's recent messages, so nothing here may be left unknown: every
//! message gets exactly one final, and no preview is left behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_discord::simulator::{
    DiscordSimulator, SimUser, SimulatorConfig, WriteOptions,
};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
};

const TOKEN_ENV: &str = "E2E_DISCORD_TOKEN";

/// A guild channel with a person and the gateway's bot, on its own simulator.
struct Room {
    sim: DiscordSimulator,
    bot: SimUser,
    person: SimUser,
    channel: String,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Room {
    async fn start(agent_args: &[&str]) -> Room {
        let sim = DiscordSimulator::start(SimulatorConfig::fast())
            .await
            .expect("the Discord simulator starts");
        let bot = sim.add_bot("clawbot");
        let person = sim.add_person("ada");
        let channel = sim.add_channel("general");
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_file(dir.path(), &sim.api_base(), agent_args);
        Room {
            sim,
            bot,
            person,
            channel,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        let token = self.bot.token.clone().expect("a bot has a token");
        GatewayProcess::try_start(&self.state(), &self.config, &[(TOKEN_ENV, token.as_str())])
    }

    /// Waits until the bot's Gateway session is open (Discord delivers a message only to the
    /// sessions open when it is written; later ones get it by resuming).
    async fn connected(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.sim.connected(&self.bot) == 0 {
            assert!(
                Instant::now() < deadline,
                "the gateway never opened a Discord session"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The person writes `text`; returns the reply the agent must give.
    fn say(&self, text: &str, words: usize) -> Asked {
        let message =
            self.sim
                .person_writes(&self.channel, &self.person, text, WriteOptions::default());
        Asked {
            message_id: message.id,
            expected: demo_reply(text, words),
        }
    }

    /// The bot's visible messages (id, text), oldest first: the simulator's own record, edits
    /// applied, deletions gone.
    fn bot_messages(&self) -> Vec<(String, String)> {
        self.sim
            .messages(&self.channel)
            .into_iter()
            .filter(|m| m.author_id == self.bot.id)
            .map(|m| (m.id, m.content))
            .collect()
    }
}

fn config_file(dir: &Path, api_base: &str, agent_args: &[&str]) -> PathBuf {
    let settings = format!(
        "api_base = \"{api_base}\", token_env = \"{TOKEN_ENV}\", \
         request_timeout_ms = 5000"
    );
    channel_config(dir, "discord", &settings, agent_args, 100)
}

#[derive(Debug, Clone)]
struct Asked {
    message_id: String,
    expected: String,
}

/// What is wrong with the channel: each message needs exactly one final, nothing else shows.
fn problems(room: &Room, asked: &[Asked]) -> (usize, Vec<String>) {
    let mut shown = room.bot_messages();
    let mut finals = 0;
    let mut wrong = Vec::new();
    for a in asked {
        let count = shown.iter().filter(|(_, text)| *text == a.expected).count();
        match count {
            1 => finals += 1,
            n => wrong.push(format!("{}: {n} finals of {:?}", a.message_id, a.expected)),
        }
        shown.retain(|(_, text)| *text != a.expected);
    }
    wrong.extend(
        shown
            .into_iter()
            .map(|(id, text)| format!("stray {id}: {text:?}")),
    );
    (finals, wrong)
}

async fn settle(room: &Room, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let (finals, _) = problems(room, asked);
        if finals == asked.len() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        if finals != last.0 {
            last = (finals, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_in_a_discord_channel_sees_the_reply_stream_as_edits_and_one_final() {
    const WORDS: usize = 12;
    let room = Room::start(&["--chunk-ms", "150", "--words", "12"]).await;
    let gateway = room.gateway().expect("gateway starts");
    room.connected().await;
    let mut asked = Vec::new();
    for n in 0..3 {
        asked.push(room.say(&format!("question {n}"), WORDS));
        settle(&room, &asked, Duration::from_secs(20)).await;
    }
    let (finals, wrong) = problems(&room, &asked);
    let edits = room
        .sim
        .calls()
        .iter()
        .filter(|c| c.method == "PATCH" && c.status == 200)
        .count();
    let status = gateway.interrupt();
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(finals, asked.len());
    assert!(
        edits >= asked.len(),
        "the previews were edited: {edits} edits"
    );
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&room.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_and_gateway_disconnects_on_a_discord_bot_leave_exactly_one_final_per_message()
 {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("DISCORD", 8, 24);
    eprintln!("discord crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let room = Room::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let mut asked = Vec::new();
    let mut disruptions = 0;
    let started = Instant::now();
    for kill in 0..kills {
        let gateway = room
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        if kill == 0 {
            // Discord delivers only to open sessions; later starts resume the session kept in
            // the state directory and get what they missed.
            room.connected().await;
        }
        for _ in 0..per_kill.min(count - asked.len()) {
            let n = asked.len();
            asked.push(room.say(&format!("message {n}"), WORDS));
            // Often the Gateway socket goes while replies flow: dropped, asked to reconnect
            // (op 7), or told its session is invalid but resumable (op 9 true).
            if rng.below(2) == 0 {
                room.connected().await;
                disruptions += match rng.below(3) {
                    0 => room.sim.disconnect(&room.bot),
                    1 => room.sim.request_reconnect(&room.bot),
                    _ => room.sim.invalidate_session(&room.bot, true),
                };
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = room
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let n = asked.len();
        asked.push(room.say(&format!("message {n}"), WORDS));
    }
    settle(&room, &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let (finals, wrong) = problems(&room, &asked);
    let leftovers = leftover_processes(&room.state());
    let stats = room.sim.gateway_stats(&room.bot);
    eprintln!(
        "discord crash matrix figures: seed={seed} kills={kills} messages={} finals={finals} \
         violations={} leftovers={} disruptions={disruptions} identifies={} resumes={} \
         seconds={:.1}",
        asked.len(),
        wrong.len(),
        leftovers.len(),
        stats.identifies,
        stats.resumes,
        started.elapsed().as_secs_f64()
    );
    if !wrong.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = room.dir.keep();
        panic!(
            "discord crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {wrong:?}; leftovers {leftovers:?}",
            kept.display()
        );
    }
}
