//! The real binary with a Synology Chat bot and one channel, on the Synology Chat simulator:
//! the simulator runs in the test process, so it outlives a gateway killed with SIGKILL, and
//! its own record of what landed is the judge.
//!
//! Synology Chat has no idempotency key, returns no post id and keeps no history a bot can
//! read; it also sends each event once (no retry is known). So, per message:
//! - its event was answered 2xx only after the gateway recorded it durably; an event the
//!   platform could not deliver (the gateway down, or killed before the record) is lost *by the
//!   platform* and must get no final — counted apart (`lost_by_platform`), never answered;
//! - a recorded message gets exactly one final, whole, in its conversation;
//! - the one allowed exception, with its evidence: a send whose outcome is unknown (a kill
//!   during the call, or an answer lost after the NAS posted) cannot be settled, so its reply
//!   intent is `unknown_after_send`, parked for an operator and never repeated; the simulator
//!   then shows zero or one copy of that final, never two. Later messages of that
//!   conversation may wait behind it (`received`, counted as `blocked_behind_unknown`).
//!
//! Everything else fails: a duplicate final, a missing final, a partial or stray post, a
//! 2xx answer without a durable record, a leftover agent process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_synology::simulator::{
    Author, Conversation, Fault, FaultKind, SimChannel, SimulatorConfig, SynologySimulator,
};

use crate::support::{
    GatewayProcess, Rng, Stillness, channel_config, crash_seed, crash_size, demo_reply,
    leftover_processes, state_pairs,
};

const BOT_ENV: &str = "E2E_SYNOLOGY_BOT_TOKEN";
const INCOMING_ENV: &str = "E2E_SYNOLOGY_INCOMING_TOKEN";
const OUTGOING_ENV: &str = "E2E_SYNOLOGY_OUTGOING_TOKEN";
const TRIGGER: &str = "!ask";
const HOOK_NAME: &str = "clawgate";

/// A Chat server with a bot and a channel, and a state directory for the gateway.
struct App {
    sim: SynologySimulator,
    channel: SimChannel,
    outgoing_token: String,
    port: u16,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl App {
    async fn start(agent_args: &[&str]) -> App {
        let sim = SynologySimulator::start(SimulatorConfig {
            min_send_interval: Duration::from_millis(50),
            ..SimulatorConfig::default()
        })
        .await
        .expect("simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        let webhook_url = format!("http://127.0.0.1:{port}/synology/webhook");
        sim.set_bot_url(Some(&webhook_url));
        let channel = sim.add_channel("general", HOOK_NAME);
        let outgoing_token = sim
            .set_outgoing_webhook(channel.channel_id, &[TRIGGER], &webhook_url)
            .expect("the channel exists");
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = format!(
            "base_url = \"{}\", bot_token_env = \"{BOT_ENV}\", \
             channels = [{{ channel_id = \"{}\", incoming_token_env = \"{INCOMING_ENV}\", \
             outgoing_token_env = \"{OUTGOING_ENV}\" }}], \
             webhook_listen = \"127.0.0.1:{port}\", own_usernames = [\"{HOOK_NAME}\"], \
             send_interval_ms = 60, request_timeout_ms = 3000",
            sim.base_url(),
            channel.channel_id
        );
        let config = channel_config(dir.path(), "synology", &settings, agent_args, 500);
        App {
            sim,
            channel,
            outgoing_token,
            port,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway_with_bot_token(&self, token: &str) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[
                (BOT_ENV, token),
                (INCOMING_ENV, self.channel.incoming_token.as_str()),
                (OUTGOING_ENV, self.outgoing_token.as_str()),
                ("CLAWGATE_LOG", "info"),
            ],
        )
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        self.gateway_with_bot_token(&self.sim.bot_token())
    }

    /// Waits until the gateway's webhook listener accepts connections (Synology does not
    /// deliver an event twice, so the test writes only once someone can take it).
    async fn listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "the webhook listener never came up"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `who` writes `text` to the bot (a DM) or, for `Where::Channel`, into the channel after
    /// the trigger word; returns what the test expects back.
    fn write(&self, who: &str, place: Where, text: &str, words: usize) -> Asked {
        let (post_id, text) = match place {
            Where::Dm => (self.sim.person_dms_bot(who, text), text.to_owned()),
            Where::Channel => {
                let text = format!("{TRIGGER} {text}");
                (
                    self.sim.person_posts(who, self.channel.channel_id, &text),
                    text,
                )
            }
        };
        let conversation = match place {
            Where::Dm => Conversation::Direct(self.sim.user(who).expect("a user").user_id),
            Where::Channel => Conversation::Channel(self.channel.channel_id),
        };
        Asked {
            post_id,
            conversation,
            expected: demo_reply(&text, words),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Where {
    Dm,
    Channel,
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    post_id: u64,
    conversation: Conversation,
    expected: String,
}

/// What the simulator shows for the messages of a run.
#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// Replies parked `unknown_after_send` with no copy on the platform.
    unknown: usize,
    /// Replies parked `unknown_after_send` whose one copy did land (a lost answer).
    unknown_landed: usize,
    /// Later messages of a conversation that waits behind a parked reply.
    blocked: usize,
    /// Events the platform could not deliver (the gateway down or killed first): no record,
    /// no final.
    lost_by_platform: usize,
    problems: Vec<String>,
}

impl Verdict {
    fn holds(&self) -> bool {
        self.problems.is_empty()
    }

    fn settled(&self) -> usize {
        self.finals + self.unknown + self.blocked + self.lost_by_platform
    }
}

/// The bot's and the channel's integration posts: what the gateway made land.
fn our_posts(sim: &SynologySimulator) -> Vec<(Conversation, String)> {
    sim.posts()
        .into_iter()
        .filter(|p| matches!(p.author, Author::Bot | Author::Integration(_)))
        .map(|p| (p.conversation, p.text))
        .collect()
}

fn judge(sim: &SynologySimulator, state: &Path, asked: &[Asked]) -> Verdict {
    let statuses: HashMap<String, String> =
        state_pairs(state, "SELECT idempotency_key, status FROM send_intents")
            .into_iter()
            .collect();
    let inbound: HashMap<String, String> =
        state_pairs(state, "SELECT event_id, status FROM inbound_records")
            .into_iter()
            .collect();
    let delivered: HashMap<String, u16> = sim
        .deliveries()
        .iter()
        .filter_map(|d| Some((d.field("post_id")?.to_owned(), d.status)))
        .fold(HashMap::new(), |mut best, (post, status)| {
            let entry = best.entry(post).or_insert(status);
            *entry = (*entry).max(status);
            best
        });
    let posts = our_posts(sim);
    let mut unmatched = posts.clone();
    let mut parked: HashMap<String, usize> = HashMap::new();
    let mut verdict = Verdict::default();
    for (at, a) in asked.iter().enumerate() {
        let conversation = format!("{:?}", a.conversation);
        let post = a.post_id.to_string();
        let recorded = inbound.get(&format!("post:{post}"));
        let status = delivered.get(&post).copied().unwrap_or(0);
        let finals = posts
            .iter()
            .filter(|(c, text)| *c == a.conversation && *text == a.expected)
            .count();
        unmatched.retain(|(c, text)| !(*c == a.conversation && *text == a.expected));
        let prefix = format!("synology:reply:post:{post}:");
        let replies: Vec<(&String, &String)> = statuses
            .iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .collect();
        let unknown = replies
            .iter()
            .any(|(_, s)| s.as_str() == "unknown_after_send");
        if recorded.is_none() {
            if (200..300).contains(&status) {
                verdict.problems.push(format!(
                    "post {post}: answered {status} without a durable record"
                ));
            } else if finals > 0 {
                verdict
                    .problems
                    .push(format!("post {post}: never recorded, yet {finals} finals"));
            } else {
                verdict.lost_by_platform += 1;
            }
            continue;
        }
        match finals {
            1 if unknown => {
                verdict.unknown_landed += 1;
                verdict.finals += 1;
                parked.entry(conversation).or_insert(at);
            }
            1 => verdict.finals += 1,
            0 if unknown => {
                verdict.unknown += 1;
                parked.entry(conversation).or_insert(at);
            }
            0 if replies.is_empty()
                && parked.get(&conversation).is_some_and(|first| *first < at)
                && recorded.map(String::as_str) == Some("received") =>
            {
                verdict.blocked += 1;
            }
            0 => verdict.problems.push(format!(
                "post {post} in {conversation}: no final (inbound {recorded:?}, replies \
                 {replies:?})"
            )),
            n => verdict
                .problems
                .push(format!("post {post} in {conversation}: {n} finals")),
        }
    }
    for (conversation, text) in unmatched {
        verdict.problems.push(format!(
            "stray or partial post in {conversation:?}: {text:?}"
        ));
    }
    verdict
}

/// Waits until every message is settled (or `quiet` passes with nothing new).
async fn settle(sim: &SynologySimulator, state: &Path, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    let mut still = Stillness::new();
    loop {
        let verdict = judge(sim, state, asked);
        let held = still.still_for(state, Stillness::EXCUSED);
        if verdict.settled() == asked.len() && sim.deliveries().iter().all(|d| d.done) {
            if verdict.unknown + verdict.blocked == 0 {
                // A last look after a pause: a duplicate would show now.
                tokio::time::sleep(Stillness::SETTLED).await;
                return;
            }
            if held {
                return;
            }
        }
        let activity = sim.calls().len() + sim.deliveries().len();
        if activity != last.0 {
            last = (activity, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The random-time crash matrix on a Synology Chat bot and channel: DMs from five people and
/// trigger-word posts in one channel, the gateway SIGKILLed at seeded random instants and
/// restarted, one send answer per round lost after the NAS posted, then a clean stop; judged
/// from the simulator's record and the state database's statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_synology_chat_bot_never_duplicate_or_silently_lose_a_final() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("SYNOLOGY", 8, 24);
    eprintln!("synology crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let app = App::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let people: Vec<String> = (0..5).map(|n| format!("person{n}")).collect();
    for person in &people {
        app.sim.add_user(person, person);
    }
    let pick = |rng: &mut Rng| {
        let n = usize::try_from(rng.below(people.len() as u64 + 1)).unwrap_or(0);
        // One pick in six is the channel.
        match people.get(n) {
            Some(person) => (person.clone(), Where::Dm),
            None => (people[0].clone(), Where::Channel),
        }
    };
    let mut asked = Vec::new();
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = app
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        app.listening().await;
        // Besides the kill, one post's answer per round is lost after the NAS made it: the
        // reply is unknown and parked, never repeated.
        app.sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(rng.below(6) as u32));
        for _ in 0..per_kill.min(count - asked.len()) {
            let (person, place) = pick(&mut rng);
            let n = asked.len();
            asked.push(app.write(&person, place, &format!("message {n} from {person}"), WORDS));
            tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
        }
        // A third of the rounds end at once after the last write, so the kill can land while
        // an event is being recorded or answered.
        let pause = if rng.below(3) == 0 {
            rng.below(5)
        } else {
            rng.below(400)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        gateway.kill_hard();
    }
    let gateway = app
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    app.listening().await;
    while asked.len() < count {
        let (person, place) = pick(&mut rng);
        let n = asked.len();
        asked.push(app.write(&person, place, &format!("message {n} from {person}"), WORDS));
    }
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app.sim, &app.state(), &asked);
    let leftovers = leftover_processes(&app.state());
    let lost_answers = app.sim.calls().iter().filter(|c| !c.answered).count();
    let too_fast = app
        .sim
        .calls()
        .iter()
        .filter(|c| c.code == Some(411))
        .count();
    eprintln!(
        "synology crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} unknown_landed={} blocked_behind_unknown={} lost_by_platform={} \
         lost_answers={lost_answers} too_fast={too_fast} webhooks={} violations={} \
         leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.unknown_landed,
        verdict.blocked,
        verdict.lost_by_platform,
        app.sim.deliveries().len(),
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.holds() || !leftovers.is_empty() || !status.success() {
        let kept = app.dir.keep();
        panic!(
            "synology crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synology_chat_conversation_through_the_binary_answers_dms_and_the_channel_plainly() {
    let app = App::start(&["--chunk-ms", "40", "--words", "12"]).await;
    app.sim.add_user("ada", "Ada");
    app.sim.add_user("grace", "Grace");
    let gateway = app.gateway().expect("gateway starts");
    app.listening().await;
    let asked = vec![
        app.write("ada", Where::Dm, "hello from Synology", 12),
        app.write("grace", Where::Channel, "hello channel", 12),
    ];
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(20)).await;
    // A second copy of each event (Synology is not known to send one; a proxy might) is
    // taken and dropped by its post id: answered, never answered twice.
    let firsts: Vec<usize> = app.sim.deliveries().iter().map(|d| d.id).collect();
    let copies: Vec<usize> = firsts.iter().filter_map(|id| app.sim.replay(*id)).collect();
    assert!(app.sim.deliveries_settled(Duration::from_secs(10)).await);
    for copy in copies {
        assert_eq!(app.sim.deliveries()[copy].status, 204, "a copy is answered");
    }
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(3)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app.sim, &app.state(), &asked);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(verdict.finals, 2, "{verdict:?}");
    // The copies left no trace: one inbound record and one reply per post.
    let intents = state_pairs(
        &app.state(),
        "SELECT idempotency_key, status FROM send_intents",
    );
    let records = state_pairs(&app.state(), "SELECT event_id, status FROM inbound_records");
    assert_eq!(
        (intents.len(), records.len()),
        (2, 2),
        "{intents:?} {records:?}"
    );
    // Plain durable finals: one post per answer, no preview, no edit (Synology has none).
    let posts: Vec<_> = app
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.method == "chatbot" || c.method == "incoming")
        .collect();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert!(posts.iter().all(|c| c.success == Some(true)));
    // The DM went to the Chat-internal id, not the id the bot's event carried.
    let ada = app.sim.user("ada").expect("ada");
    let dm = posts.iter().find(|c| c.method == "chatbot").expect("a DM");
    assert_eq!(dm.payload["user_ids"], serde_json::json!([ada.user_id]));
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&app.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_bot_token_stops_the_start_naming_the_setting() {
    let app = App::start(&[]).await;
    let error = app
        .gateway_with_bot_token("not-the-bot-token")
        .err()
        .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.bot_token_env"),
        "names the setting: {error}"
    );
    assert!(
        !error.contains("not-the-bot-token"),
        "never prints the token: {error}"
    );
}
