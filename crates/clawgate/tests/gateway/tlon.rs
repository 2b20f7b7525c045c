//! The real binary with a Tlon account on the Eyre simulator: the simulated ship runs in the
//! test process, so it outlives a gateway killed with SIGKILL, and its own record of what
//! landed is the judge.
//!
//! Eyre keeps a channel's unacked events and replays them on the next GET, and the gateway
//! keeps its channel's uid in the state directory: an event is acked only after its durable
//! record, so every message a person writes is recorded — none is lost by the platform — and
//! must get exactly one final, whole, signed once with the account's model signature, in its
//! conversation (a DM, or the thread of a group post that mentioned the bot). A DM's writ id is
//! chosen by the client from the durable intent and a group reply is found by author and sent
//! time, so a send whose answer was lost is settled by a scry and never parked; a parked
//! reply (`unknown_after_send`) would be allowed only with its evidence (zero or one copy),
//! and is counted.
//!
//! Everything else fails: a duplicate final, a missing final, a stray or unsigned post, a
//! leftover agent process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_tlon::simulator::{Fault, Ship, ShipConfig};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const CODE_ENV: &str = "E2E_TLON_CODE";
const NEST: &str = "chat/~zod/general";
const SIGNATURE: &str = "— e2e-model";

/// A ship, and a state directory for the gateway.
struct App {
    ship: Ship,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl App {
    async fn start(agent_args: &[&str]) -> App {
        let ship = Ship::start(ShipConfig {
            nests: vec![NEST.into()],
            ..ShipConfig::default()
        })
        .await
        .expect("the ship starts");
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = format!(
            "url = \"{}\", ship = \"~zod\", code_env = \"{CODE_ENV}\", \
             signature = \"{SIGNATURE}\", request_timeout_ms = 3000, poke_timeout_ms = 1500, \
             settle_window_ms = 2000",
            ship.url()
        );
        let config = channel_config(dir.path(), "tlon", &settings, agent_args, 500);
        App { ship, dir, config }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway_with_code(&self, code: &str) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[(CODE_ENV, code), ("CLAWGATE_LOG", "info")],
        )
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        self.gateway_with_code(self.ship.code())
    }

    /// Starts a gateway and waits until its feed reads its channel's stream (opened after the
    /// start, with the two subscriptions in place).
    fn started(&self) -> impl Future<Output = Result<GatewayProcess, String>> + '_ {
        let before = self.ship.streams_opened();
        let gateway = self.gateway();
        async move {
            let gateway = gateway?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while self.ship.streams_opened() <= before || self.ship.subscriptions().len() < 2 {
                if Instant::now() >= deadline {
                    return Err("the gateway never read its Eyre channel".into());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(gateway)
        }
    }

    /// `who` writes `text` as a DM or as a group post mentioning the bot.
    fn write(&self, who: &str, place: Where, text: &str, words: usize) -> Asked {
        match place {
            Where::Dm => {
                let id = self.ship.dm_from(who, text);
                Asked {
                    event: format!("dm:{id}"),
                    place: format!("dm:{who}"),
                    expected: signed(&demo_reply(text, words)),
                }
            }
            Where::Group => {
                let id = self.ship.post_from(NEST, who, text, true);
                Asked {
                    event: format!("post:{NEST}/{id}"),
                    place: format!("{NEST}#{id}"),
                    expected: signed(&demo_reply(&format!("~zod {text}"), words)),
                }
            }
        }
    }
}

fn signed(text: &str) -> String {
    format!("{text}\n\n{SIGNATURE}")
}

#[derive(Debug, Clone, Copy)]
enum Where {
    Dm,
    Group,
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    /// The inbound event id.
    event: String,
    /// Where the final goes (`dm:~ship`, or `<nest>#<post id>` for the post's thread).
    place: String,
    expected: String,
}

#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    unknown: usize,
    unknown_landed: usize,
    problems: Vec<String>,
}

impl Verdict {
    fn holds(&self) -> bool {
        self.problems.is_empty()
    }

    fn settled(&self) -> usize {
        self.finals + self.unknown
    }
}

fn judge(ship: &Ship, state: &Path, asked: &[Asked]) -> Verdict {
    let statuses: HashMap<String, String> =
        state_pairs(state, "SELECT idempotency_key, status FROM send_intents")
            .into_iter()
            .collect();
    let landed = ship.landed();
    let mut unmatched = landed.clone();
    let mut verdict = Verdict::default();
    for a in asked {
        let finals = landed
            .iter()
            .filter(|l| l.place == a.place && l.text == a.expected)
            .count();
        unmatched.retain(|l| !(l.place == a.place && l.text == a.expected));
        let prefix = format!("tlon:reply:{}:", a.event);
        let unknown = statuses
            .iter()
            .any(|(key, s)| key.starts_with(&prefix) && s == "unknown_after_send");
        match finals {
            1 if unknown => {
                verdict.unknown_landed += 1;
                verdict.finals += 1;
            }
            1 => verdict.finals += 1,
            0 if unknown => verdict.unknown += 1,
            0 => {}
            n => verdict
                .problems
                .push(format!("{} in {}: {n} finals", a.event, a.place)),
        }
    }
    for l in unmatched {
        verdict.problems.push(format!(
            "stray, partial or unsigned post in {}: {:?}",
            l.place, l.text
        ));
    }
    verdict
}

/// Adds a problem for every message without its final.
fn missing(ship: &Ship, state: &Path, asked: &[Asked], verdict: &mut Verdict) {
    let statuses = state_pairs(state, "SELECT idempotency_key, status FROM send_intents");
    let inbound: HashMap<String, String> =
        state_pairs(state, "SELECT event_id, status FROM inbound_records")
            .into_iter()
            .collect();
    let landed = ship.landed();
    for a in asked {
        let finals = landed
            .iter()
            .filter(|l| l.place == a.place && l.text == a.expected)
            .count();
        let prefix = format!("tlon:reply:{}:", a.event);
        let replies: Vec<_> = statuses
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .collect();
        let parked = replies.iter().any(|(_, s)| s == "unknown_after_send");
        if finals == 0 && !parked {
            verdict.problems.push(format!(
                "{} in {}: no final (inbound {:?}, replies {replies:?})",
                a.event,
                a.place,
                inbound.get(&a.event)
            ));
        }
    }
}

/// Waits until every message is settled (or `quiet` passes with nothing new).
async fn settle(ship: &Ship, state: &Path, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let verdict = judge(ship, state, asked);
        // Settled: every message has its final, and no reply is still being sent or settled.
        let open = state_pairs(state, "SELECT idempotency_key, status FROM send_intents")
            .iter()
            .any(|(_, s)| matches!(s.as_str(), "pending" | "sending" | "unknown_after_send"));
        if verdict.settled() == asked.len() && !open {
            // A last look after a pause: a duplicate would show now.
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        let activity = ship.landed().len() + ship.applied_pokes() as usize;
        if activity != last.0 {
            last = (activity, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The random-time crash matrix on a Tlon account: DMs from five ships and mentions in one
/// group channel (answered in the post's thread), the gateway SIGKILLed at seeded random
/// instants and restarted, one poke result per round lost after the ship applied it, event
/// streams dropped at random; judged from the ship's record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_tlon_account_never_duplicate_or_lose_a_final() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("TLON", 8, 24);
    eprintln!("tlon crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let app = App::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let people: Vec<String> = (0..5)
        .map(|n| format!("~person-{}", ["nec", "bud", "wes", "sev", "per"][n]))
        .collect();
    let pick = |rng: &mut Rng| {
        let n = usize::try_from(rng.below(people.len() as u64 + 1)).unwrap_or(0);
        match people.get(n) {
            Some(person) => (person.clone(), Where::Dm),
            None => (people[0].clone(), Where::Group),
        }
    };
    let mut asked = Vec::new();
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = app
            .started()
            .await
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        // Besides the kill, one poke's result per round is lost after the ship applied it.
        app.ship.inject(rng.below(6) as u32, Fault::LoseResult);
        for _ in 0..per_kill.min(count - asked.len()) {
            let (person, place) = pick(&mut rng);
            let n = asked.len();
            asked.push(app.write(&person, place, &format!("message {n} from {person}"), WORDS));
            if rng.below(8) == 0 {
                app.ship.drop_streams();
            }
            tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
        }
        let pause = if rng.below(3) == 0 {
            rng.below(5)
        } else {
            rng.below(400)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        gateway.kill_hard();
        // Messages written while the gateway is down wait in its Eyre channel.
        if rng.below(2) == 0 && asked.len() < count {
            let (person, place) = pick(&mut rng);
            let n = asked.len();
            asked.push(app.write(&person, place, &format!("message {n} from {person}"), WORDS));
        }
    }
    let gateway = app
        .started()
        .await
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let (person, place) = pick(&mut rng);
        let n = asked.len();
        asked.push(app.write(&person, place, &format!("message {n} from {person}"), WORDS));
    }
    settle(&app.ship, &app.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let mut verdict = judge(&app.ship, &app.state(), &asked);
    missing(&app.ship, &app.state(), &asked, &mut verdict);
    let leftovers = leftover_processes(&app.state());
    let (acks, kicks) = app.ship.acks_and_kicks();
    eprintln!(
        "tlon crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} unknown_landed={} pokes={} acks={acks} kicks={kicks} violations={} \
         leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.unknown_landed,
        app.ship.applied_pokes(),
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.holds() || !leftovers.is_empty() || !status.success() {
        let kept = app.dir.keep();
        panic!(
            "tlon crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tlon_conversation_through_the_binary_answers_dms_mentions_and_its_threads() {
    let app = App::start(&["--chunk-ms", "40", "--words", "12"]).await;
    let gateway = app.started().await.expect("gateway starts");
    let mut asked = vec![
        app.write("~nec", Where::Dm, "hello from Tlon", 12),
        app.write("~bud", Where::Group, "hello group", 12),
    ];
    settle(&app.ship, &app.state(), &asked, Duration::from_secs(20)).await;
    // Our reply landed in the post's thread: a follow-up there needs no mention.
    let parent = asked[1]
        .place
        .rsplit('#')
        .next()
        .expect("a parent")
        .to_owned();
    let follow = app
        .ship
        .reply_from(NEST, &parent, "~bud", "and a follow-up", false);
    asked.push(Asked {
        event: format!("post:{NEST}/{follow}"),
        place: format!("{NEST}#{parent}"),
        expected: signed(&demo_reply("and a follow-up", 12)),
    });
    // An unmentioned top-level post is not answered.
    app.ship.post_from(NEST, "~bud", "just chatting", false);
    // The same event twice (an agent's repeat) is taken and dropped by its id.
    app.ship.repeat_diffs();
    settle(&app.ship, &app.state(), &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let mut verdict = judge(&app.ship, &app.state(), &asked);
    missing(&app.ship, &app.state(), &asked, &mut verdict);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(verdict.finals, 3, "{verdict:?}");
    let intents = state_pairs(
        &app.state(),
        "SELECT idempotency_key, status FROM send_intents",
    );
    assert_eq!(intents.len(), 3, "one reply per message: {intents:?}");
    // The threads the bot replied in, in its state in the store (one record per thread).
    let threads: Vec<String> = state_pairs(
        &app.state(),
        "SELECT key, value FROM channel_records WHERE kind = 'tlon' \
         AND book = 'participated-threads'",
    )
    .into_iter()
    .map(|(key, _)| key)
    .collect();
    assert!(threads.contains(&format!("{NEST} {parent}")), "{threads:?}");
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&app.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_login_code_stops_the_start_naming_the_setting() {
    let app = App::start(&[]).await;
    let error = app
        .gateway_with_code("not-the-code-sampel")
        .err()
        .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.code_env"),
        "names the setting: {error}"
    );
    assert!(
        !error.contains("not-the-code-sampel"),
        "never prints the code: {error}"
    );
}
