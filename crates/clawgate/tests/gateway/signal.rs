//! The real binary with a Signal account, on the signal-cli daemon simulator: the simulator
//! runs in the test process, so it outlives a gateway killed with SIGKILL, and its own record of
//! what landed is the judge. The daemon runs with `--receive-mode=manual`: what people write
//! while the gateway is down waits until the restarted gateway subscribes again.
//!
//! Signal has no idempotency key and no way to ask whether a message went out, so a send a
//! kill (or a lost answer) cut mid-call is parked at once as `unknown_after_send` for an
//! operator; the conversation goes on. A message signal-cli had written to the socket when the gateway died, before the gateway
//! recorded it, is gone: JSON-RPC notifications have no acknowledgement. The judge allows
//! exactly these, each only with its evidence (the reply intent's status; the daemon's record
//! of the handover and no inbound record), counts them, and fails on everything else: a
//! duplicate final, a missing final otherwise, a partial or stray message, a leftover agent
//! process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_signal::simulator::{Fault, FaultKind, SignalSimulator, SimulatorConfig};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

/// A Signal account on a simulator, and a state directory for its gateway.
struct Account {
    sim: SignalSimulator,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Account {
    async fn start(agent_args: &[&str]) -> Account {
        let sim = SignalSimulator::start(SimulatorConfig::default())
            .await
            .expect("simulator starts");
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = format!(
            "account = \"{}\", daemon = \"{}\", request_timeout_ms = 3000",
            sim.account(),
            sim.tcp_addr()
        );
        let config = channel_config(dir.path(), "signal", &settings, agent_args, 500);
        Account { sim, dir, config }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(&self.state(), &self.config, &[("CLAWGATE_LOG", "info")])
    }

    /// `person` writes `text` 1:1; returns what the test expects back.
    fn write(&self, person: &str, text: &str, words: usize) -> Asked {
        let item = self.sim.person_writes(&self.sim.account(), person, text);
        let timestamp = item["envelope"]["timestamp"].as_u64().expect("a timestamp");
        Asked {
            person: person.to_owned(),
            event_id: format!("{person}:{timestamp}"),
            expected: demo_reply(text, words),
        }
    }
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    person: String,
    /// Signal's id of the message (`<source>:<timestamp>`), the inbound event id.
    event_id: String,
    expected: String,
}

#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// Replies a kill cut mid-call: `unknown_after_send`, parked for an operator (Signal
    /// cannot tell whether they went out; none landed twice).
    unknown: usize,
    /// Messages the daemon handed to a gateway that died before recording them.
    unrecorded: usize,
    problems: Vec<String>,
}

impl Verdict {
    fn holds(&self) -> bool {
        self.problems.is_empty()
    }

    fn settled(&self) -> usize {
        self.finals + self.unknown + self.unrecorded
    }
}

fn judge(sim: &SignalSimulator, state: &Path, asked: &[Asked]) -> Verdict {
    let statuses: HashMap<String, String> =
        state_pairs(state, "SELECT idempotency_key, status FROM send_intents")
            .into_iter()
            .collect();
    let inbound: HashMap<String, String> =
        state_pairs(state, "SELECT event_id, status FROM inbound_records")
            .into_iter()
            .collect();
    let handed: Vec<String> = sim
        .handed()
        .iter()
        .filter_map(|item| {
            let e = &item["envelope"];
            Some(format!(
                "{}:{}",
                e["source"].as_str()?,
                e["timestamp"].as_u64()?
            ))
        })
        .collect();
    let landed = sim.landed();
    let mut unmatched = landed.clone();
    let mut verdict = Verdict::default();
    for a in asked {
        let prefix = format!("signal:reply:{}:", a.event_id);
        let replies: Vec<&String> = statuses
            .iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .map(|(_, status)| status)
            .collect();
        let unknown = replies.iter().any(|s| *s == "unknown_after_send");
        let finals = landed
            .iter()
            .filter(|m| m.recipient.as_deref() == Some(a.person.as_str()) && m.body == a.expected)
            .count();
        match finals {
            1 => verdict.finals += 1,
            0 if unknown => verdict.unknown += 1,
            0 if !inbound.contains_key(&a.event_id) && handed.contains(&a.event_id) => {
                verdict.unrecorded += 1;
            }
            0 => verdict.problems.push(format!(
                "message {} from {}: no final (replies {replies:?}, inbound {:?})",
                a.event_id,
                a.person,
                inbound.get(&a.event_id)
            )),
            n => verdict.problems.push(format!(
                "message {} from {}: {n} finals",
                a.event_id, a.person
            )),
        }
        unmatched.retain(|m| {
            !(m.recipient.as_deref() == Some(a.person.as_str()) && m.body == a.expected)
        });
    }
    for stray in unmatched {
        verdict.problems.push(format!(
            "stray message {} to {:?}: {:?}",
            stray.timestamp, stray.recipient, stray.body
        ));
    }
    verdict
}

/// Waits until every message is settled (or `quiet` passes with nothing new).
async fn settle(sim: &SignalSimulator, state: &Path, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let verdict = judge(sim, state, asked);
        if verdict.settled() == asked.len() && sim.queued(&sim.account()) == 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        let activity = sim.calls().len() + sim.handed().len();
        if activity != last.0 {
            last = (activity, Instant::now());
        }
        if last.1.elapsed() > quiet || start.elapsed() > Duration::from_secs(150) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_conversation_through_the_binary_gets_plain_durable_finals() {
    let account = Account::start(&["--chunk-ms", "40", "--words", "12"]).await;
    // Written before the gateway runs: manual receive keeps it until the source subscribes.
    let mut asked = vec![account.write("+4915112340001", "hello from Signal", 12)];
    let gateway = account.gateway().expect("gateway starts");
    asked.push(account.write("+4915112340002", "hello again", 12));
    settle(
        &account.sim,
        &account.state(),
        &asked,
        Duration::from_secs(20),
    )
    .await;
    let status = gateway.interrupt();
    let verdict = judge(&account.sim, &account.state(), &asked);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(verdict.finals, 2, "{verdict:?}");
    // Plain durable finals: one send per answer, no edit, no delete.
    let calls = account.sim.calls();
    let sends: Vec<_> = calls.iter().filter(|(m, _)| m == "send").collect();
    assert_eq!(sends.len(), 2, "{sends:?}");
    assert!(sends.iter().all(|(_, p)| p.get("editTimestamp").is_none()));
    assert!(!calls.iter().any(|(m, _)| m == "remoteDelete"));
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&account.state()).is_empty());
}

/// The random-time crash matrix on a Signal account: messages from six people, the gateway
/// SIGKILLed at seeded random instants and restarted, now and then a send answer lost after
/// the message went out (parked: Signal cannot settle it) and the daemon's socket dropped,
/// then a clean stop; judged from the
/// simulator's record, the reply intents and the inbound records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_signal_account_never_duplicate_or_silently_lose_a_final() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("SIGNAL", 8, 24);
    eprintln!("signal crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let account = Account::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let people: Vec<String> = (0..6).map(|n| format!("+4915100000{n:03}")).collect();
    let pick = |rng: &mut Rng| {
        people[usize::try_from(rng.below(people.len() as u64)).unwrap_or(0)].clone()
    };
    let mut asked = Vec::new();
    let mut lost_answers = 0;
    let mut drops = 0;
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = account
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        // Now and then a send's answer is lost after the message went out: parked.
        if rng.below(3) == 0 {
            account
                .sim
                .inject(Fault::new(FaultKind::LoseAnswer).after(rng.below(4) as u32));
            lost_answers += 1;
        }
        for _ in 0..per_kill.min(count - asked.len()) {
            let person = pick(&mut rng);
            let n = asked.len();
            asked.push(account.write(&person, &format!("message {n} from {person}"), WORDS));
            // Often the daemon drops the socket while messages flow (a daemon restart): the
            // source dials again and subscribes anew; what came meanwhile waits.
            if rng.below(3) == 0 {
                drops += account.sim.drop_subscribers();
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = account
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let person = pick(&mut rng);
        let n = asked.len();
        asked.push(account.write(&person, &format!("message {n} from {person}"), WORDS));
    }
    settle(
        &account.sim,
        &account.state(),
        &asked,
        Duration::from_secs(20),
    )
    .await;
    let status = gateway.interrupt();
    let verdict = judge(&account.sim, &account.state(), &asked);
    let leftovers = leftover_processes(&account.state());
    let parked = state_pairs(
        &account.state(),
        "SELECT idempotency_key, status FROM send_intents",
    )
    .into_iter()
    .filter(|(_, status)| status == "unknown_after_send")
    .count();
    let subscriptions = account
        .sim
        .calls()
        .iter()
        .filter(|(m, _)| m == "subscribeReceive")
        .count();
    eprintln!(
        "signal crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} unrecorded={} parked_intents={parked} \
         injected_lost_answers={lost_answers} answers_lost={} socket_drops={drops} sends={} \
         subscriptions={subscriptions} violations={} leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.unrecorded,
        account.sim.dropped_answers(),
        account.sim.landed().len(),
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.holds() || !leftovers.is_empty() || !status.success() {
        let kept = account.dir.keep();
        panic!(
            "signal crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}
