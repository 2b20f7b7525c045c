//! The real binary with a Mattermost bot on the Mattermost simulator (in this test process, so it
//! outlives a gateway killed with SIGKILL): a person mentions the bot in a channel and sees the
//! reply stream as patches of one draft post in a thread, finalized in place; the random-time
//! crash matrix with WebSocket drops, server restarts (the pending_post_id cache and every
//! connection forgotten: the feed re-fetches over REST) and lost create answers between the
//! kills, judged only from the simulator's own record of what landed. A lost create is settled
//! by its pending_post_id inside the window and by the props key beyond it, so nothing here may
//! be left unknown: every message gets exactly one final, and no draft is left behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_mattermost::simulator::{
    Fault, FaultKind, MattermostSimulator, Route, SimUser, SimulatorConfig,
};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
};

const TOKEN_ENV: &str = "E2E_MATTERMOST_TOKEN";
const BOT: &str = "clawbot";

/// A channel with a person and the gateway's bot, on its own simulator.
struct Room {
    sim: MattermostSimulator,
    bot: SimUser,
    person: SimUser,
    channel: String,
    dir: tempfile::TempDir,
    config: PathBuf,
    /// Lost creates already counted by `lost_create_landed`.
    lost_seen: std::cell::Cell<usize>,
}

impl Room {
    async fn start(agent_args: &[&str]) -> Room {
        let sim = MattermostSimulator::start(SimulatorConfig::default())
            .await
            .expect("the Mattermost simulator starts");
        let bot = sim.add_bot(BOT);
        let person = sim.add_person("ada");
        let channel = sim.add_channel("town-square", &[&bot, &person]);
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_file(dir.path(), &sim.url(), agent_args);
        Room {
            sim,
            bot,
            person,
            channel,
            dir,
            config,
            lost_seen: std::cell::Cell::new(0),
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[(TOKEN_ENV, self.bot.token.as_str())],
        )
    }

    /// Waits until the bot's WebSocket is open (the server pushes a post only to connections
    /// open when it is written; later ones resume or re-fetch).
    async fn connected(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.sim.socket_stats().open == 0 {
            assert!(
                Instant::now() < deadline,
                "the gateway never opened the Mattermost WebSocket"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The person mentions the bot with `text`; returns the reply the agent must give (the
    /// mention is taken off the prompt).
    fn say(&self, text: &str, words: usize) -> Asked {
        let post =
            self.sim
                .person_writes(&self.channel, &self.person, &format!("@{BOT} {text}"), None);
        Asked {
            post_id: post.id,
            expected: demo_reply(text, words),
        }
    }

    /// Waits (with a deadline) until a create landed whose answer was lost; `false` when none
    /// came (the gateway was between replies).
    async fn lost_create_landed(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let landed = self
                .sim
                .calls()
                .iter()
                .filter(|c| c.method == "POST" && !c.answered && c.status == 201)
                .count();
            if landed > self.lost_seen.get() {
                self.lost_seen.set(landed);
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The bot's visible posts (id, root, text), oldest first: the simulator's own record,
    /// patches applied, deletions gone.
    fn bot_posts(&self) -> Vec<(String, String, String)> {
        self.sim
            .visible(&self.channel)
            .into_iter()
            .filter(|p| p.user_id == self.bot.id)
            .map(|p| (p.id, p.root_id, p.message))
            .collect()
    }
}

fn config_file(dir: &Path, url: &str, agent_args: &[&str]) -> PathBuf {
    let settings =
        format!("url = \"{url}\", token_env = \"{TOKEN_ENV}\", request_timeout_ms = 3000");
    channel_config(dir, "mattermost", &settings, agent_args, 100)
}

#[derive(Debug, Clone)]
struct Asked {
    post_id: String,
    expected: String,
}

/// What is wrong with the channel: each message needs exactly one final, in its thread, and
/// nothing else shows.
fn problems(room: &Room, asked: &[Asked]) -> (usize, Vec<String>) {
    let mut shown = room.bot_posts();
    let mut finals = 0;
    let mut wrong = Vec::new();
    for a in asked {
        let ours: Vec<_> = shown
            .iter()
            .filter(|(_, _, text)| *text == a.expected)
            .collect();
        match ours.as_slice() {
            [(_, root, _)] if *root == a.post_id => finals += 1,
            [(id, root, _)] => wrong.push(format!("{id} answers {} in thread {root:?}", a.post_id)),
            many => wrong.push(format!(
                "{}: {} finals of {:?}",
                a.post_id,
                many.len(),
                a.expected
            )),
        }
        shown.retain(|(_, _, text)| *text != a.expected);
    }
    wrong.extend(
        shown
            .into_iter()
            .map(|(id, _, text)| format!("stray {id}: {text:?}")),
    );
    (finals, wrong)
}

async fn settle(room: &Room, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let (finals, wrong) = problems(room, asked);
        if finals == asked.len() && wrong.is_empty() {
            // A last look after a moment: nothing more may arrive.
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
async fn a_person_mentioning_a_mattermost_bot_sees_a_draft_patched_and_finalized_in_its_thread() {
    const WORDS: usize = 12;
    let room = Room::start(&["--chunk-ms", "150", "--words", "12"]).await;
    let gateway = room.gateway().expect("gateway starts");
    room.connected().await;
    let mut asked = Vec::new();
    for n in 0..3 {
        asked.push(room.say(&format!("question {n}"), WORDS));
        settle(&room, &asked, Duration::from_secs(20)).await;
    }
    // Not mentioned: not answered.
    room.sim
        .person_writes(&room.channel, &room.person, "just chatting", None);
    let (finals, wrong) = problems(&room, &asked);
    let patches = room
        .sim
        .calls()
        .iter()
        .filter(|c| c.method == "PUT" && c.path.ends_with("/patch") && c.status == 200)
        .count();
    let creates = room
        .sim
        .calls()
        .iter()
        .filter(|c| c.method == "POST" && c.status == 201)
        .count();
    let status = gateway.interrupt();
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(finals, asked.len());
    assert_eq!(
        creates,
        asked.len(),
        "one draft per reply, finalized in place"
    );
    assert!(
        patches > asked.len(),
        "the drafts were patched: {patches} patches"
    );
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&room.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_socket_drops_and_server_restarts_on_a_mattermost_bot_leave_exactly_one_final_per_message()
 {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("MATTERMOST", 8, 24);
    eprintln!("mattermost crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let room = Room::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let mut asked = Vec::new();
    let (mut drops, mut restarts, mut lost, mut lost_then_restart) = (0, 0, 0, 0);
    let started = Instant::now();
    for kill in 0..kills {
        let gateway = room
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        if kill == 0 {
            room.connected().await;
        }
        for _ in 0..per_kill.min(count - asked.len()) {
            let n = asked.len();
            asked.push(room.say(&format!("message {n}"), WORDS));
            match rng.below(6) {
                0 => {
                    room.sim.drop_sockets();
                    drops += 1;
                }
                1 => {
                    room.sim.restart();
                    restarts += 1;
                }
                2 => {
                    room.sim
                        .inject(Fault::on(Route::CreatePost, FaultKind::LoseAnswer));
                    lost += 1;
                    // Half the time the server restarts right after the lost create landed,
                    // forgetting its pending_post_id: only the props key can settle it then.
                    if rng.below(2) == 0 {
                        lost_then_restart += u32::from(room.lost_create_landed().await);
                        room.sim.restart();
                        restarts += 1;
                    }
                }
                _ => {}
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
    let stats = room.sim.socket_stats();
    eprintln!(
        "mattermost crash matrix figures: seed={seed} kills={kills} messages={} finals={finals} \
         violations={} leftovers={} socket_drops={drops} server_restarts={restarts} \
         lost_answers={lost} lost_then_restart={lost_then_restart} fresh_connections={} \
         resumes={} seconds={:.1}",
        asked.len(),
        wrong.len(),
        leftovers.len(),
        stats.fresh,
        stats.resumed,
        started.elapsed().as_secs_f64()
    );
    if !wrong.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = room.dir.keep();
        panic!(
            "mattermost crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {wrong:?}; leftovers {leftovers:?}",
            kept.display()
        );
    }
}
