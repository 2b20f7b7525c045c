//! The real binary with a Google Chat app, on the Google Chat simulator: the simulator runs in
//! the test process, so it outlives a gateway killed with SIGKILL, and its own record of what
//! landed is the judge. Events reach the gateway over HTTP with real bearer JWTs; while the
//! gateway is down they fail and the simulator sends them again. The gateway authenticates as a
//! service account: it mints its access tokens at the simulator's token endpoint.
//!
//! Every create carries a `requestId` and a client-assigned `messageId` derived from the unit's
//! key, so a send whose answer a kill (or an injected fault) cut off is settled after the
//! restart by a GET of that id: found → committed, 404 → sent again under the same ids, which
//! can never make a second message. That holds for previews too (a replayed preview is the same
//! message), so the judge allows no orphan preview, unlike Slack's: it fails on a duplicate
//! final, a preview left beside its final, a missing final not recorded unknown, a partial
//! final, a stray, an event the simulator gave up on, and a leftover agent process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_googlechat::simulator::{
    Fault, FaultKind, GoogleChatSimulator, Op, SimMessage, SimUser, SimulatorConfig, SpaceKind,
};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const KEY_ENV: &str = "E2E_GOOGLECHAT_SERVICE_ACCOUNT_KEY";
const SERVICE_ACCOUNT: &str = "clawgate-e2e@clawgate-simulator.iam.gserviceaccount.com";

/// A Chat app on a simulator, and a state directory for its gateway.
struct App {
    sim: GoogleChatSimulator,
    /// The service account's JSON key the gateway authenticates with.
    key: String,
    person: SimUser,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl App {
    async fn start(agent_args: &[&str]) -> App {
        let sim = GoogleChatSimulator::start(SimulatorConfig {
            rate_limits: false,
            answer_deadline: Duration::from_secs(10),
            // Enough attempts to outlast a gateway restart.
            retry_delays: [300, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000]
                .map(Duration::from_millis)
                .to_vec(),
            // 2 s tokens, renewed after 1 s: a gateway renews its token while messages flow.
            token_lifetime: Duration::from_secs(2),
            ..SimulatorConfig::default()
        })
        .await
        .expect("simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        sim.set_endpoint_url(Some(&format!("http://127.0.0.1:{port}/googlechat/events")));
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_file(dir.path(), &sim, port, agent_args);
        let person = sim.person("ada");
        let key = sim.add_test_service_account(SERVICE_ACCOUNT);
        App {
            sim,
            key,
            person,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[(KEY_ENV, self.key.as_str()), ("CLAWGATE_LOG", "info")],
        )
    }

    /// The person writes `text` in `space`; returns what the test expects back.
    fn write(&self, space: &str, direct: bool, text: &str, words: usize) -> Asked {
        let message = self
            .sim
            .person_writes(space, &self.person, text, None)
            .expect("the space exists");
        Asked {
            space: space.to_owned(),
            name: message.name.clone(),
            // A room's answer goes to the question's thread; a DM's to the top level.
            thread: (!direct).then_some(message.thread),
            expected: demo_reply(text, words),
        }
    }
}

fn config_file(dir: &Path, sim: &GoogleChatSimulator, port: u16, agent_args: &[&str]) -> PathBuf {
    let settings = format!(
        "service_account_key_env = \"{KEY_ENV}\", api_base = \"{}\", certs_url = \"{}\", \
         audience = \"{}\", app_user = \"{}\", events_listen = \"127.0.0.1:{port}\", \
         request_timeout_ms = 3000",
        sim.api_url(),
        sim.jwks_url(),
        sim.audience(),
        sim.app().name
    );
    channel_config(dir, "googlechat", &settings, agent_args, 500)
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    space: String,
    name: String,
    thread: Option<String>,
    expected: String,
}

#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// Finals recorded `unknown_after_send` and not visible (reported, never repeated).
    unknown: usize,
    /// Previews left beside their final (strict prefixes of it, same place): each a violation.
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

fn judge(sim: &GoogleChatSimulator, state: &Path, asked: &[Asked]) -> Verdict {
    let statuses = reply_statuses(state);
    let of_event = |a: &Asked| {
        statuses
            .iter()
            .filter(|(key, _)| key.contains(&a.name))
            .map(|(_, status)| status.clone())
            .collect::<Vec<_>>()
    };
    let mut verdict = Verdict::default();
    let mut spaces: Vec<&str> = asked.iter().map(|a| a.space.as_str()).collect();
    spaces.sort_unstable();
    spaces.dedup();
    for space in spaces {
        let mut app: Vec<SimMessage> = sim
            .messages(space)
            .into_iter()
            .filter(|m| m.from_app)
            .collect();
        for a in asked.iter().filter(|a| a.space == space) {
            // In a room, the question's thread; in a DM, a top-level message.
            let here = |m: &SimMessage| match &a.thread {
                Some(thread) => &m.thread == thread,
                None => !m.thread_reply,
            };
            let finals = app
                .iter()
                .filter(|m| here(m) && m.text == a.expected)
                .count();
            match finals {
                1 => verdict.finals += 1,
                0 if of_event(a).iter().any(|s| s == "unknown_after_send") => {
                    verdict.unknown += 1;
                }
                0 => verdict.problems.push(format!(
                    "message {}: no final, replies {:?}",
                    a.name,
                    of_event(a)
                )),
                n => verdict
                    .problems
                    .push(format!("message {}: {n} finals", a.name)),
            }
            app.retain(|m| {
                if here(m) && m.text == a.expected {
                    return false;
                }
                let orphan = here(m)
                    && !m.text.is_empty()
                    && m.text.len() < a.expected.len()
                    && a.expected.starts_with(m.text.as_str());
                if orphan {
                    // Preview creates carry their unit's ids too: a replayed preview is the
                    // same message, so one left beside its final is a second create.
                    verdict.orphans += 1;
                    verdict.problems.push(format!(
                        "message {}: a preview {} left beside its final: {:?}",
                        a.name, m.name, m.text
                    ));
                }
                !orphan
            });
        }
        for stray in app {
            verdict.problems.push(format!(
                "stray app message {} (thread {}): {:?}",
                stray.name, stray.thread, stray.text
            ));
        }
    }
    for id in sim.given_up_events() {
        if asked.iter().any(|a| a.name == id) {
            verdict
                .problems
                .push(format!("the simulator gave up delivering event {id}"));
        }
    }
    verdict
}

/// Waits until every message has its final (or `quiet` passes with nothing new).
async fn settle(sim: &GoogleChatSimulator, state: &Path, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let verdict = judge(sim, state, asked);
        if verdict.finals + verdict.unknown == asked.len() && sim.unacknowledged_events() == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
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

/// The random-time crash matrix on a Chat app: messages into six spaces (four rooms answered
/// in threads, two DMs answered at top level), the gateway SIGKILLed at seeded random instants
/// and restarted, one API answer per round lost after Google acted (a create, settled by GET of
/// its client id; or a patch, repeated), then a clean stop; judged from the simulator's record
/// and the reply intents' statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_google_chat_app_never_duplicate_or_silently_lose_a_final() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("GOOGLECHAT", 8, 24);
    eprintln!("googlechat crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let app = App::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let mut spaces: Vec<(String, bool)> = (0..4)
        .map(|n| {
            let space =
                app.sim
                    .create_space(&format!("crash-{n}"), SpaceKind::Room, Some(&app.person));
            (space, false)
        })
        .collect();
    for n in 0..2 {
        let person = app.sim.person(&format!("pat-{n}"));
        spaces.push((app.sim.dm(&person), true));
    }
    let pick = |rng: &mut Rng| {
        spaces[usize::try_from(rng.below(spaces.len() as u64)).unwrap_or(0)].clone()
    };
    let mut asked = Vec::new();
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = app
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        let op = [Op::Create, Op::Create, Op::Patch][usize::try_from(rng.below(3)).unwrap_or(0)];
        app.sim
            .inject(Fault::on(op, FaultKind::LoseAnswer).after(rng.below(4) as u32));
        for _ in 0..per_kill.min(count - asked.len()) {
            let (space, direct) = pick(&mut rng);
            let n = asked.len();
            asked.push(app.write(&space, direct, &format!("message {n} to {space}"), WORDS));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = app
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let (space, direct) = pick(&mut rng);
        let n = asked.len();
        asked.push(app.write(&space, direct, &format!("message {n} to {space}"), WORDS));
    }
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app.sim, &app.state(), &asked);
    let leftovers = leftover_processes(&app.state());
    let redeliveries = app
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.attempt > 0)
        .count();
    let calls = app.sim.calls();
    let lost = calls.iter().filter(|c| !c.answered).count();
    let token_mints = app.sim.tokens_issued(SERVICE_ACCOUNT);
    let unauthenticated = calls.iter().filter(|c| c.status == 401).count();
    let settled_found = calls
        .iter()
        .filter(|c| c.op == Op::Get && c.status == 200)
        .count();
    let settled_absent = calls
        .iter()
        .filter(|c| c.op == Op::Get && c.status == 404)
        .count();
    // Creates answered with the message an earlier request of the same requestId made.
    let mut request_ids = std::collections::HashSet::new();
    let request_id_repeats = calls
        .iter()
        .filter(|c| c.op == Op::Create && c.status == 200)
        .filter_map(|c| c.param("requestId"))
        .filter(|id| !request_ids.insert(*id))
        .count();
    eprintln!(
        "googlechat crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} orphan_previews={} lost_answers={lost} gets_found={settled_found} \
         gets_absent={settled_absent} request_id_repeats={request_id_repeats} \
         event_redeliveries={redeliveries} token_mints={token_mints} \
         unauthenticated={unauthenticated} violations={} leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.orphans,
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.holds() || !leftovers.is_empty() || !status.success() {
        let kept = app.dir.keep();
        panic!(
            "googlechat crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_google_chat_conversation_through_the_binary_answers_in_threads_and_dms() {
    let app = App::start(&["--chunk-ms", "40", "--words", "12"]).await;
    let gateway = app.gateway().expect("gateway starts");
    let room = app
        .sim
        .create_space("general", SpaceKind::Room, Some(&app.person));
    let dm = app.sim.dm(&app.person);
    let asked = vec![
        app.write(&room, false, "hello from the room", 12),
        app.write(&dm, true, "hello from a DM", 12),
    ];
    settle(&app.sim, &app.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&app.sim, &app.state(), &asked);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!((verdict.finals, verdict.orphans), (2, 0), "{verdict:?}");
    // Every create carried the ids that make it retry-safe and reconcilable.
    let creates: Vec<_> = app
        .sim
        .calls()
        .into_iter()
        .filter(|c| c.op == Op::Create)
        .collect();
    assert!(!creates.is_empty());
    for call in &creates {
        let id = call.param("messageId").expect("a messageId");
        assert!(id.starts_with("client-cg-"), "{id}");
        assert_eq!(call.param("requestId"), Some(id));
    }
    // The service account's token was minted and accepted.
    assert!(app.sim.tokens_issued(SERVICE_ACCOUNT) >= 1);
    assert!(app.sim.calls().iter().all(|c| c.status != 401));
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&app.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_audience_stops_the_start_naming_the_setting() {
    let app = App::start(&[]).await;
    let text = std::fs::read_to_string(&app.config)
        .expect("config")
        .replace(
            &format!("audience = \"{}\"", app.sim.audience()),
            "audience = \" \"",
        );
    std::fs::write(&app.config, text).expect("config written");
    let error = app.gateway().err().expect("the start fails");
    assert!(
        error.contains("channels[0].settings.audience"),
        "names the setting: {error}"
    );
    let key: serde_json::Value = serde_json::from_str(&app.key).expect("the key is JSON");
    let pem = key["private_key"].as_str().expect("a private key");
    assert!(
        pem.lines()
            .skip(1)
            .take(3)
            .all(|line| !error.contains(line)),
        "never prints the key: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_no_service_account_key_stops_the_start_naming_the_variable() {
    let app = App::start(&[]).await;
    let mut key: serde_json::Value = serde_json::from_str(&app.key).expect("the key is JSON");
    key["type"] = serde_json::json!("authorized_user");
    let error = GatewayProcess::try_start(
        &app.state(),
        &app.config,
        &[(KEY_ENV, key.to_string().as_str())],
    )
    .err()
    .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.service_account_key_env")
            && error.contains(KEY_ENV)
            && error.contains("\"authorized_user\""),
        "names the setting, the variable and the type: {error}"
    );
    let pem = key["private_key"].as_str().expect("a private key");
    assert!(
        pem.lines()
            .skip(1)
            .take(3)
            .all(|line| !error.contains(line)),
        "never prints the key: {error}"
    );
    assert!(app.sim.token_requests().is_empty());
}
