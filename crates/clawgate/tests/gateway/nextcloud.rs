//! The real binary with a Nextcloud Talk account on the Talk simulator: the simulator runs in
//! the test process, so it outlives a gateway killed with SIGKILL, and its own record of what
//! landed is the judge.
//!
//! Bot mode. Talk POSTs each message to the bot once (5 s, no retry), returns no message id
//! for a bot's message and lets a bot read no history. So, per message:
//! - its webhook was answered 2xx only after the gateway recorded it durably; an event Talk
//!   could not deliver (the gateway down, or killed before the record) is dropped *by the
//!   platform* and must get no final — counted apart (`lost_by_platform`), never answered;
//! - a recorded message gets exactly one final, whole, in its conversation;
//! - the one allowed exception, with its evidence: a send whose outcome is unknown (a kill
//!   during the call, or an answer lost after Talk stored the message) cannot be settled, so
//!   its reply intent is `unknown_after_send`, parked for an operator and never repeated; the
//!   simulator then shows zero or one copy of that final, never two. Later messages of that
//!   conversation may wait behind it (`received`, counted as `blocked_behind_unknown`).
//!
//! User mode. The chat is polled from the durable watermark, so nothing is lost while the
//! gateway is down; a lost answer is settled from history by its referenceId: every message
//! gets exactly one final, no parked unknowns.
//!
//! Everything else fails: a duplicate final, a missing final, a partial or stray message, a
//! 2xx answer without a durable record, a leftover agent process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_nextcloud::simulator::{
    Fault, FaultKind, NextcloudSimulator, Op, RoomType, SimRoom, SimulatorConfig,
};

use crate::support::{
    GatewayProcess, Rng, Stillness, channel_config, crash_seed, crash_size, demo_reply,
    leftover_processes, state_pairs,
};

const SECRET_ENV: &str = "E2E_NEXTCLOUD_BOT_SECRET";
const PASSWORD_ENV: &str = "E2E_NEXTCLOUD_APP_PASSWORD";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bot,
    User,
}

/// A Talk server with three conversations, and a state directory for the gateway.
struct App {
    sim: NextcloudSimulator,
    mode: Mode,
    rooms: Vec<SimRoom>,
    port: u16,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl App {
    async fn start(mode: Mode, agent_args: &[&str]) -> App {
        let sim = NextcloudSimulator::start(SimulatorConfig::default())
            .await
            .expect("simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        let rooms: Vec<SimRoom> = (0..3)
            .map(|n| sim.add_conversation(&format!("room {n}"), RoomType::Group))
            .collect();
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = match mode {
            Mode::Bot => {
                sim.set_bot_url(Some(&format!("http://127.0.0.1:{port}/nextcloud/webhook")));
                for room in &rooms {
                    sim.enable_bot(&room.token);
                }
                format!(
                    "base_url = \"{}\", mode = \"bot\", bot_secret_env = \"{SECRET_ENV}\", \
                     webhook_listen = \"127.0.0.1:{port}\", request_timeout_ms = 3000",
                    sim.base_url()
                )
            }
            Mode::User => format!(
                "base_url = \"{}\", mode = \"user\", user = \"{}\", \
                 app_password_env = \"{PASSWORD_ENV}\", poll_timeout_s = 5, \
                 request_timeout_ms = 3000",
                sim.base_url(),
                sim.config().user
            ),
        };
        let config = channel_config(dir.path(), "nextcloud", &settings, agent_args, 500);
        App {
            sim,
            mode,
            rooms,
            port,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway_with_secret(&self, secret: &str) -> Result<GatewayProcess, String> {
        let env = match self.mode {
            Mode::Bot => SECRET_ENV,
            Mode::User => PASSWORD_ENV,
        };
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[(env, secret), ("CLAWGATE_LOG", "info")],
        )
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        let config = self.sim.config();
        self.gateway_with_secret(match self.mode {
            Mode::Bot => &config.bot_secret,
            Mode::User => &config.app_password,
        })
    }

    /// Waits until the gateway can take a message: the webhook listener accepts connections
    /// (Talk does not deliver an event twice), or the poller has begun (user mode).
    async fn ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        match self.mode {
            Mode::Bot => {
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
            Mode::User => {
                // The start is kept in the channel's state (in the store) before the first poll.
                while !poll_start_stored(&self.state()) {
                    assert!(Instant::now() < deadline, "the poller never started");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// `who` writes `text` into room `room`; what the test expects back.
    fn write(&self, who: &str, room: usize, text: &str, words: usize) -> Asked {
        let token = self.rooms[room].token.clone();
        let id = self.sim.person_writes(&token, who, who, text);
        Asked {
            id,
            token,
            expected: demo_reply(text, words),
        }
    }
}

fn poll_start_stored(state: &Path) -> bool {
    state.join("state.db").exists()
        && !state_pairs(
            state,
            "SELECT name, value FROM channel_values WHERE kind = 'nextcloud' \
             AND name = 'talk-start'",
        )
        .is_empty()
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    id: i64,
    token: String,
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
    /// Events the platform could not deliver (the gateway down or killed first).
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

/// The account's visible messages: the bot's, or the user's (not deleted).
fn our_texts(app: &App) -> Vec<(String, String)> {
    app.rooms
        .iter()
        .flat_map(|room| {
            let texts = match app.mode {
                Mode::Bot => app.sim.bot_texts(&room.token),
                Mode::User => app.sim.user_texts(&room.token),
            };
            texts.into_iter().map(|t| (room.token.clone(), t))
        })
        .collect()
}

fn judge(app: &App, asked: &[Asked]) -> Verdict {
    let state = app.state();
    let statuses: HashMap<String, String> =
        state_pairs(&state, "SELECT idempotency_key, status FROM send_intents")
            .into_iter()
            .collect();
    let inbound: HashMap<String, String> =
        state_pairs(&state, "SELECT event_id, status FROM inbound_records")
            .into_iter()
            .collect();
    let delivered: HashMap<i64, u16> = app
        .sim
        .deliveries()
        .iter()
        .filter_map(|d| Some((d.message_id()?, d.status)))
        .fold(HashMap::new(), |mut best, (id, status)| {
            let entry = best.entry(id).or_insert(status);
            *entry = (*entry).max(status);
            best
        });
    let texts = our_texts(app);
    let mut unmatched = texts.clone();
    let mut parked: HashMap<String, usize> = HashMap::new();
    let mut verdict = Verdict::default();
    for (at, a) in asked.iter().enumerate() {
        let recorded = inbound.get(&format!("talk:{}", a.id));
        let finals = texts
            .iter()
            .filter(|(t, text)| *t == a.token && *text == a.expected)
            .count();
        unmatched.retain(|(t, text)| !(*t == a.token && *text == a.expected));
        let prefix = format!("nextcloud:reply:talk:{}:", a.id);
        let replies: Vec<(&String, &String)> = statuses
            .iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .collect();
        let unknown = replies
            .iter()
            .any(|(_, s)| s.as_str() == "unknown_after_send");
        if recorded.is_none() {
            let status = delivered.get(&a.id).copied().unwrap_or(0);
            if app.mode == Mode::User {
                verdict.problems.push(format!(
                    "message {}: never recorded (polling loses nothing)",
                    a.id
                ));
            } else if (200..300).contains(&status) {
                verdict.problems.push(format!(
                    "message {}: answered {status} without a durable record",
                    a.id
                ));
            } else if finals > 0 {
                verdict.problems.push(format!(
                    "message {}: never recorded, yet {finals} finals",
                    a.id
                ));
            } else {
                verdict.lost_by_platform += 1;
            }
            continue;
        }
        if unknown && app.mode == Mode::User {
            verdict.problems.push(format!(
                "message {}: a reply parked unknown, though history settles it",
                a.id
            ));
        }
        match finals {
            1 if unknown => {
                verdict.unknown_landed += 1;
                verdict.finals += 1;
                parked.entry(a.token.clone()).or_insert(at);
            }
            1 => verdict.finals += 1,
            0 if unknown => {
                verdict.unknown += 1;
                parked.entry(a.token.clone()).or_insert(at);
            }
            0 if replies.is_empty()
                && parked.get(&a.token).is_some_and(|first| *first < at)
                && recorded.map(String::as_str) == Some("received") =>
            {
                verdict.blocked += 1;
            }
            0 => verdict.problems.push(format!(
                "message {} in {}: no final (inbound {recorded:?}, replies {replies:?})",
                a.id, a.token
            )),
            n => verdict
                .problems
                .push(format!("message {} in {}: {n} finals", a.id, a.token)),
        }
    }
    for (token, text) in unmatched {
        verdict
            .problems
            .push(format!("stray or partial message in {token}: {text:?}"));
    }
    verdict
}

/// Waits until every message is settled (or `quiet` passes with nothing new).
async fn settle(app: &App, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    let mut still = Stillness::new();
    loop {
        let verdict = judge(app, asked);
        let held = still.still_for(&app.state(), Stillness::EXCUSED);
        if verdict.settled() == asked.len()
            && verdict.problems.is_empty()
            && app.sim.deliveries().iter().all(|d| d.done)
        {
            if verdict.unknown + verdict.blocked == 0 {
                // A last look after a pause: a duplicate would show now.
                tokio::time::sleep(Stillness::SETTLED).await;
                return;
            }
            if held {
                return;
            }
        }
        let activity = app.sim.all_messages().len() + app.sim.deliveries().len();
        if activity != last.0 {
            last = (activity, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The random-time crash matrix in one mode: messages from five people in three
/// conversations, the gateway SIGKILLed at seeded random instants and restarted, one send
/// answer per round lost after Talk stored the message, then a clean stop; judged from the
/// simulator's record and the state database's statuses.
async fn crash_matrix(mode: Mode, name: &str) {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size(name, 8, 24);
    eprintln!("nextcloud {mode:?} crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let app = App::start(mode, &["--chunk-ms", "25", "--words", "8"]).await;
    let people: Vec<String> = (0..5).map(|n| format!("person{n}")).collect();
    let op = match mode {
        Mode::Bot => Op::BotSend,
        Mode::User => Op::ChatSend,
    };
    let mut asked = Vec::new();
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    let pick = |rng: &mut Rng| {
        let who = people[usize::try_from(rng.below(5)).unwrap_or(0)].clone();
        (who, usize::try_from(rng.below(3)).unwrap_or(0))
    };
    for _ in 0..kills {
        let gateway = app
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        app.ready().await;
        // Besides the kill, one send's answer per round is lost after Talk stored it.
        app.sim
            .inject(Fault::new(Some(op), FaultKind::LoseAnswer).after(rng.below(6) as u32));
        for _ in 0..per_kill.min(count - asked.len()) {
            let (who, room) = pick(&mut rng);
            let n = asked.len();
            asked.push(app.write(&who, room, &format!("message {n} from {who}"), WORDS));
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
    app.ready().await;
    while asked.len() < count {
        let (who, room) = pick(&mut rng);
        let n = asked.len();
        asked.push(app.write(&who, room, &format!("message {n} from {who}"), WORDS));
    }
    settle(&app, &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app, &asked);
    let leftovers = leftover_processes(&app.state());
    let lost_answers = app.sim.calls().iter().filter(|c| !c.answered).count();
    let dropped = app
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.message_id().is_some() && d.dropped())
        .count();
    let slowest = app
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.status == 200)
        .map(|d| d.elapsed_ms)
        .max()
        .unwrap_or(0);
    eprintln!(
        "nextcloud {mode:?} crash matrix figures: seed={seed} kills={kills} messages={} \
         finals={} unknown={} unknown_landed={} blocked_behind_unknown={} lost_by_platform={} \
         lost_answers={lost_answers} webhooks={} dropped_webhooks={dropped} \
         slowest_recorded_webhook_ms={slowest} violations={} leftovers={} seconds={:.1}",
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
            "nextcloud {mode:?} crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} \
             replays it; state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
    // Talk gives a webhook 5 s: the durable record must come well inside it.
    assert!(
        slowest < 5_000,
        "a webhook took {slowest} ms to be recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_nextcloud_talk_bot_never_duplicate_or_silently_lose_a_final() {
    crash_matrix(Mode::Bot, "NEXTCLOUD").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_nextcloud_talk_user_settle_every_final_exactly_once() {
    crash_matrix(Mode::User, "NEXTCLOUD_USER").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nextcloud_talk_bot_through_the_binary_answers_each_message_once() {
    let app = App::start(Mode::Bot, &["--chunk-ms", "40", "--words", "12"]).await;
    let gateway = app.gateway().expect("gateway starts");
    app.ready().await;
    let asked = vec![
        app.write("ada", 0, "hello from Talk", 12),
        app.write("grace", 1, "hello again", 12),
    ];
    settle(&app, &asked, Duration::from_secs(20)).await;
    // A second copy of each event (Talk never sends one; a proxy might) is taken and dropped
    // by its message id: answered, never answered twice.
    let firsts: Vec<usize> = app
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.message_id().is_some())
        .map(|d| d.id)
        .collect();
    let copies: Vec<usize> = firsts.iter().filter_map(|id| app.sim.replay(*id)).collect();
    assert!(app.sim.deliveries_settled(Duration::from_secs(10)).await);
    for copy in copies {
        assert_eq!(app.sim.deliveries()[copy].status, 200, "a copy is answered");
    }
    settle(&app, &asked, Duration::from_secs(3)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app, &asked);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(verdict.finals, 2, "{verdict:?}");
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
    // Plain durable finals: one bot message per answer, nothing else.
    let sends: Vec<_> = app
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.op.is_some())
        .collect();
    assert_eq!(sends.len(), 2, "{sends:?}");
    assert!(
        sends
            .iter()
            .all(|c| c.op == Some(Op::BotSend) && c.status == 201)
    );
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&app.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nextcloud_talk_user_through_the_binary_answers_each_message_once() {
    let app = App::start(Mode::User, &["--chunk-ms", "40", "--words", "12"]).await;
    let gateway = app.gateway().expect("gateway starts");
    app.ready().await;
    let asked = vec![
        app.write("ada", 0, "hello from Talk", 12),
        app.write("grace", 1, "hello again", 12),
    ];
    settle(&app, &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app, &asked);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(verdict.finals, 2, "{verdict:?}");
    // The account's own messages came back through the poll and were never answered.
    let records = state_pairs(&app.state(), "SELECT event_id, status FROM inbound_records");
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&app.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_app_password_stops_the_start_naming_the_setting() {
    let app = App::start(Mode::User, &[]).await;
    let error = app
        .gateway_with_secret("not-the-app-password")
        .err()
        .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.app_password_env"),
        "names the setting: {error}"
    );
    assert!(
        !error.contains("not-the-app-password"),
        "never prints the password: {error}"
    );
}
