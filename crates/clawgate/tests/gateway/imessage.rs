//! The real binary with an iMessage account on the BlueBubbles simulator: the simulator runs
//! in the test process, so it outlives a gateway killed with SIGKILL, and its own chat.db-like
//! record of what landed is the judge.
//!
//! The account sends plain durable finals (no Private API: no previews, no edits), and runs
//! with `from_me_is_inbound` (the person's own Apple ID): own-account
//! messages are turns, so the sent-echo cache is the only thing between the server's echo of
//! a reply and a reply to that echo. Every reply's echo comes back 300 ms after its row, also
//! across kills; an echo the cache missed would be answered (`echo: echo: …`) and show up as a
//! stray message. BlueBubbles sends each webhook once. So, per message:
//! - its event was answered 2xx only after the gateway recorded it durably; an event the
//!   server could not deliver (the gateway down, or killed before the record) is lost *by the
//!   platform* and must get no final — counted apart (`lost_by_platform`);
//! - a recorded message gets exactly one final, whole, in its chat;
//! - the one allowed exception, with its evidence: a reply whose outcome is unknown and that
//!   the chat's rows cannot settle (the gateway died after writing its attempt and before the
//!   server made a row) is `unknown_after_send`, parked and never repeated, with zero copies
//!   (or one, when the row appeared after the last look). Later messages of that chat may wait
//!   behind it (`blocked_behind_unknown`).
//!
//! Everything else fails: a duplicate final, a missing final, a reply to an echo or any other
//! stray message, a 2xx answer without a durable record, a leftover agent process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_imessage::simulator::{
    BlueBubblesSimulator, Fault, FaultKind, SimulatorConfig,
};

use crate::support::{
    GatewayProcess, Rng, Stillness, channel_config, crash_seed, crash_size, demo_reply,
    leftover_processes, state_pairs,
};

const PASSWORD_ENV: &str = "E2E_BLUEBUBBLES_PASSWORD";
const TOKEN_ENV: &str = "E2E_BLUEBUBBLES_WEBHOOK_TOKEN";
const TOKEN: &str = "e2e-webhook-token-5f2c9a7e1b";

/// A BlueBubbles server and a state directory for the gateway.
struct App {
    sim: BlueBubblesSimulator,
    port: u16,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl App {
    async fn start(agent_args: &[&str]) -> App {
        let sim = BlueBubblesSimulator::start(SimulatorConfig {
            echo_delay: Duration::from_millis(300),
            ..SimulatorConfig::default()
        })
        .await
        .expect("simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        sim.set_webhook(Some(&format!(
            "http://127.0.0.1:{port}/bluebubbles/webhook?token={TOKEN}"
        )));
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = format!(
            "server_url = \"{}\", password_env = \"{PASSWORD_ENV}\", \
             webhook_listen = \"127.0.0.1:{port}\", webhook_token_env = \"{TOKEN_ENV}\", \
             private_api = false, from_me_is_inbound = true, request_timeout_ms = 3000",
            sim.base_url(),
        );
        let config = channel_config(dir.path(), "imessage", &settings, agent_args, 500);
        App {
            sim,
            port,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway_with_password(&self, password: &str) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[
                (PASSWORD_ENV, password),
                (TOKEN_ENV, TOKEN),
                ("CLAWGATE_LOG", "info"),
            ],
        )
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        self.gateway_with_password(&self.sim.password())
    }

    /// Waits until the gateway's webhook listener accepts connections (BlueBubbles does not
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

    /// `who` writes `text` into `chat`; returns what the test expects back.
    fn write(&self, chat: &str, who: &str, text: &str, words: usize) -> Asked {
        Asked {
            guid: self.sim.person_writes(chat, who, text),
            chat: chat.to_owned(),
            expected: demo_reply(text, words),
        }
    }
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    guid: String,
    chat: String,
    expected: String,
}

/// What the simulator shows for the messages of a run.
#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// Replies parked `unknown_after_send` with no copy on the platform.
    unknown: usize,
    /// Replies parked `unknown_after_send` whose one copy did land.
    unknown_landed: usize,
    /// Later messages of a chat that waits behind a parked reply.
    blocked: usize,
    /// Events the server could not deliver (the gateway down or killed first).
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

/// Our messages that landed (sent, not failed, not unsent), per chat.
fn our_rows(sim: &BlueBubblesSimulator) -> Vec<(String, String)> {
    sim.messages()
        .into_iter()
        .filter(|m| m.is_from_me && m.error == 0 && m.date_retracted.is_none())
        .map(|m| (m.chat_guid, m.text))
        .collect()
}

fn judge(sim: &BlueBubblesSimulator, state: &Path, asked: &[Asked]) -> Verdict {
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
        .filter_map(|d| Some((d.body["data"]["guid"].as_str()?.to_owned(), d.status)))
        .fold(HashMap::new(), |mut best, (guid, status)| {
            let entry = best.entry(guid).or_insert(status);
            *entry = (*entry).max(status);
            best
        });
    let rows = our_rows(sim);
    let mut unmatched = rows.clone();
    let mut parked: HashMap<String, usize> = HashMap::new();
    let mut verdict = Verdict::default();
    for (at, a) in asked.iter().enumerate() {
        let recorded = inbound.get(&a.guid);
        let status = delivered.get(&a.guid).copied().unwrap_or(0);
        let finals = rows
            .iter()
            .filter(|(c, text)| *c == a.chat && *text == a.expected)
            .count();
        unmatched.retain(|(c, text)| !(*c == a.chat && *text == a.expected));
        let prefix = format!("imessage:reply:{}:", a.guid);
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
                    "message {}: answered {status} without a durable record",
                    a.guid
                ));
            } else if finals > 0 {
                verdict.problems.push(format!(
                    "message {}: never recorded, yet {finals} finals",
                    a.guid
                ));
            } else {
                verdict.lost_by_platform += 1;
            }
            continue;
        }
        match finals {
            1 if unknown => {
                verdict.unknown_landed += 1;
                verdict.finals += 1;
                parked.entry(a.chat.clone()).or_insert(at);
            }
            1 => verdict.finals += 1,
            0 if unknown => {
                verdict.unknown += 1;
                parked.entry(a.chat.clone()).or_insert(at);
            }
            0 if replies.is_empty()
                && parked.get(&a.chat).is_some_and(|first| *first < at)
                && recorded.map(String::as_str) == Some("received") =>
            {
                verdict.blocked += 1;
            }
            0 => verdict.problems.push(format!(
                "message {} in {}: no final (inbound {recorded:?}, replies {replies:?})",
                a.guid, a.chat
            )),
            n => verdict
                .problems
                .push(format!("message {} in {}: {n} finals", a.guid, a.chat)),
        }
    }
    for (chat, text) in unmatched {
        verdict.problems.push(format!(
            "stray message in {chat} (a reply to an echo?): {text:?}"
        ));
    }
    verdict
}

/// Waits until every message is settled and no echo is on its way (or `quiet` passes with
/// nothing new).
async fn settle(sim: &BlueBubblesSimulator, state: &Path, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    let mut still = Stillness::new();
    loop {
        let verdict = judge(sim, state, asked);
        let held = still.still_for(state, Stillness::EXCUSED);
        if verdict.settled() == asked.len()
            && sim.deliveries_settled(Duration::from_millis(1)).await
        {
            if verdict.unknown + verdict.blocked > 0 {
                if held {
                    return;
                }
            } else {
                // A last look after the echoes of the last replies: a reply to one would show
                // now.
                tokio::time::sleep(Duration::from_secs(2)).await;
                if judge(sim, state, asked).settled() == asked.len()
                    && sim.deliveries_settled(Duration::from_millis(1)).await
                {
                    return;
                }
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

/// The random-time crash matrix on an iMessage account: DMs from four people and a group
/// chat, the gateway SIGKILLed at seeded random instants and restarted, one send answer per
/// round lost after the row exists (settled from the chat's rows), every reply echoed back
/// 300 ms later as an own-account message; judged from the simulator's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_an_imessage_account_never_duplicate_lose_or_answer_an_echo() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("IMESSAGE", 8, 24);
    eprintln!("imessage crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let app = App::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let people: Vec<String> = (0..4).map(|n| format!("+1555010000{n}")).collect();
    let chats: Vec<String> = people.iter().map(|p| app.sim.dm(p)).collect();
    let group = app.sim.group("crew", &[&people[0], &people[1]]);
    let pick = |rng: &mut Rng| {
        let n = usize::try_from(rng.below(people.len() as u64 + 1)).unwrap_or(0);
        match people.get(n) {
            Some(person) => (chats[n].clone(), person.clone()),
            // One pick in five is the group.
            None => (group.clone(), people[1].clone()),
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
        // Besides the kill, one send's answer per round is lost after its row exists.
        app.sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(rng.below(6) as u32));
        for _ in 0..per_kill.min(count - asked.len()) {
            let (chat, who) = pick(&mut rng);
            let n = asked.len();
            asked.push(app.write(&chat, &who, &format!("message {n} from {who}"), WORDS));
            tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
        }
        // A third of the rounds end at once after the last write, so the kill can land while
        // an event is recorded or a reply is sent (its echo then arrives after the restart).
        let pause = if rng.below(3) == 0 {
            rng.below(5)
        } else {
            rng.below(500)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        gateway.kill_hard();
    }
    let gateway = app
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    app.listening().await;
    while asked.len() < count {
        let (chat, who) = pick(&mut rng);
        let n = asked.len();
        asked.push(app.write(&chat, &who, &format!("message {n} from {who}"), WORDS));
    }
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app.sim, &app.state(), &asked);
    let leftovers = leftover_processes(&app.state());
    let lost_answers = app.sim.calls().iter().filter(|c| !c.answered).count();
    let echoes = app
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.body["data"]["isFromMe"] == true)
        .count();
    eprintln!(
        "imessage crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} unknown_landed={} blocked_behind_unknown={} lost_by_platform={} \
         lost_answers={lost_answers} echoes={echoes} webhooks={} violations={} leftovers={} \
         seconds={:.1}",
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
            "imessage crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imessage_conversation_through_the_binary_answers_people_and_never_its_echoes() {
    let app = App::start(&["--chunk-ms", "40", "--words", "12"]).await;
    let dm = app.sim.dm("+15550200001");
    let group = app.sim.group("friends", &["+15550200001", "+15550200002"]);
    let gateway = app.gateway().expect("gateway starts");
    app.listening().await;
    let asked = vec![
        app.write(&dm, "+15550200001", "hello from iMessage", 12),
        app.write(&group, "+15550200002", "hello group", 12),
    ];
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(20)).await;
    // A second copy of each person's event (BlueBubbles sends one; a second registered URL
    // or a replay might) is taken and dropped by its guid: answered, never answered twice.
    let firsts: Vec<usize> = app
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.body["data"]["isFromMe"] == false)
        .map(|d| d.id)
        .collect();
    let copies: Vec<usize> = firsts.iter().filter_map(|id| app.sim.replay(*id)).collect();
    assert!(app.sim.deliveries_settled(Duration::from_secs(10)).await);
    for copy in copies {
        assert_eq!(app.sim.deliveries()[copy].status, 200, "a copy is answered");
    }
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(3)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app.sim, &app.state(), &asked);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(verdict.finals, 2, "{verdict:?}");
    // The echoes of both replies came back and were never turns: one inbound record and one
    // reply per person's message.
    let echoes = app
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.body["data"]["isFromMe"] == true && d.status == 200)
        .count();
    assert_eq!(echoes, 2);
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
    // Plain durable finals: one send per answer, no preview, no edit; each with its tempGuid.
    let sends: Vec<_> = app
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.path.starts_with("/api/v1/message/"))
        .filter(|c| c.path != "/api/v1/message/query")
        .collect();
    assert_eq!(sends.len(), 2, "{sends:?}");
    assert!(sends.iter().all(|c| {
        c.path == "/api/v1/message/text"
            && c.status == 200
            && c.body["tempGuid"]
                .as_str()
                .is_some_and(|t| t.starts_with("clawgate-"))
    }));
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&app.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_bluebubbles_password_stops_the_start_naming_the_setting() {
    let app = App::start(&[]).await;
    let error = app
        .gateway_with_password("not-the-password")
        .err()
        .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.password_env"),
        "names the setting: {error}"
    );
    assert!(
        !error.contains("not-the-password"),
        "never prints the password: {error}"
    );
}
