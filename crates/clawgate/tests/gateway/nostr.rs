//! The real binary with a Nostr key on a real relay (`nostr-relay-builder`'s, in the test
//! process, so it outlives a gateway killed with SIGKILL): a person writes gift-wrapped DMs and
//! gets one gift-wrapped reply each; the random-time crash matrix, judged from the relay's own
//! record of the wraps addressed to the person. Half the gateway's lives also lose one of the
//! relay's `OK` answers. Every reply's signed event is stored with its intent before it is
//! published and a lost answer is looked up by id, so nothing may be left unknown: every
//! message gets exactly one final, in exactly one wrap.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_nostr::testing::{Keys, Person, TestRelay};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const KEY_ENV: &str = "E2E_NOSTR_SECRET_KEY";

/// A relay with a person on it and the gateway's key.
struct Conversation {
    relay: TestRelay,
    person: Person,
    keys: Keys,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Conversation {
    async fn start(agent_args: &[&str]) -> Conversation {
        let relay = TestRelay::start().await;
        let person = Person::join(&relay).await;
        let keys = Keys::generate();
        let dir = tempfile::tempdir().expect("tempdir");
        let config = config_file(dir.path(), &relay.url(), agent_args);
        Conversation {
            relay,
            person,
            keys,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        let secret = self.keys.secret_key().to_secret_hex();
        GatewayProcess::try_start(&self.state(), &self.config, &[(KEY_ENV, secret.as_str())])
    }

    /// The person writes `text`; returns the reply the agent must give.
    async fn say(&self, text: &str, words: usize) -> Asked {
        let wrap = self.person.send_dm(&self.keys.public_key(), text).await;
        Asked {
            wrap: wrap.id.to_hex(),
            expected: demo_reply(text, words),
        }
    }

    /// Every wrap from the gateway's key to the person the relay holds: (wrap id, text).
    async fn replies(&self) -> Vec<(String, String)> {
        let us = self.keys.public_key();
        self.person
            .inbox(&self.relay)
            .await
            .into_iter()
            .filter(|(_, opened)| opened.sender == us)
            .map(|(id, opened)| (id.to_hex(), opened.text))
            .collect()
    }
}

fn config_file(dir: &Path, relay: &str, agent_args: &[&str]) -> PathBuf {
    let settings = format!(
        "secret_key_env = \"{KEY_ENV}\", relays = [\"{relay}\"], \
         answer_timeout_ms = 5000, connect_wait_ms = 5000, reconnect_ms = 100"
    );
    channel_config(dir, "nostr", &settings, agent_args, 100)
}

/// The reply intents: how many were cancelled unsent (the reply of a turn a kill cut short,
/// run again after the restart) and how many took more than one attempt; and those left in a
/// state other than sent or cancelled-before-any-attempt.
fn intents(state: &Path) -> (usize, usize, Vec<String>) {
    let rows = state_pairs(
        state,
        "SELECT status || ':' || CAST(attempt AS TEXT), idempotency_key FROM send_intents",
    );
    let (mut cancelled, mut retried, mut unsettled) = (0, 0, Vec::new());
    for (status_attempt, key) in rows {
        let (status, attempt) = status_attempt.split_once(':').unwrap_or(("", ""));
        let attempt: u32 = attempt.parse().unwrap_or(0);
        if attempt > 1 {
            retried += 1;
        }
        match (status, attempt) {
            ("sent", _) => {}
            ("cancelled", 0) => cancelled += 1,
            _ => unsettled.push(format!("{key}: {status} after {attempt} attempts")),
        }
    }
    (cancelled, retried, unsettled)
}

#[derive(Debug, Clone)]
struct Asked {
    wrap: String,
    expected: String,
}

/// What is wrong on the relay: each message needs exactly one final in one wrap, nothing else.
async fn problems(conversation: &Conversation, asked: &[Asked]) -> (usize, Vec<String>) {
    let mut shown = conversation.replies().await;
    let mut finals = 0;
    let mut wrong = Vec::new();
    for a in asked {
        let count = shown.iter().filter(|(_, text)| *text == a.expected).count();
        match count {
            1 => finals += 1,
            n => wrong.push(format!("{}: {n} finals of {:?}", a.wrap, a.expected)),
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

async fn settle(conversation: &Conversation, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let (finals, _) = problems(conversation, asked).await;
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
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_on_a_relay_gets_one_gift_wrapped_reply_per_dm() {
    const WORDS: usize = 6;
    let conversation = Conversation::start(&["--chunk-ms", "20", "--words", "6"]).await;
    let gateway = conversation.gateway().expect("gateway starts");
    let mut asked = Vec::new();
    for n in 0..3 {
        asked.push(conversation.say(&format!("question {n}"), WORDS).await);
        settle(&conversation, &asked, Duration::from_secs(20)).await;
    }
    let (finals, wrong) = problems(&conversation, &asked).await;
    let status = gateway.interrupt();
    assert!(wrong.is_empty(), "{wrong:?}");
    assert_eq!(finals, asked.len());
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&conversation.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_nostr_key_leave_exactly_one_final_per_message() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("NOSTR", 8, 24);
    eprintln!("nostr crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let conversation = Conversation::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let mut asked = Vec::new();
    let mut lost = 0;
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = conversation
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        // Half the lives also lose one of the relay's OK answers (the relay stored the
        // reply; the gateway must settle it by looking the id up, before or after the kill).
        if rng.below(2) == 0 {
            conversation
                .relay
                .lose_answer(u32::try_from(rng.below(3)).unwrap_or(0));
            lost += 1;
        }
        for _ in 0..per_kill.min(count - asked.len()) {
            let n = asked.len();
            asked.push(conversation.say(&format!("message {n}"), WORDS).await);
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = conversation
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let n = asked.len();
        asked.push(conversation.say(&format!("message {n}"), WORDS).await);
    }
    settle(&conversation, &asked, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let (finals, mut wrong) = problems(&conversation, &asked).await;
    let leftovers = leftover_processes(&conversation.state());
    // Every send can be settled on Nostr: no intent may stay unknown or fail.
    let (cancelled, retried, unsettled) = intents(&conversation.state());
    wrong.extend(unsettled.into_iter().map(|s| format!("reply intent {s}")));
    eprintln!(
        "nostr crash matrix figures: seed={seed} kills={kills} messages={} finals={finals} \
         lost_answers={}/{lost} cancelled_unsent={cancelled} retried_intents={retried} \
         violations={} leftovers={} seconds={:.1}",
        asked.len(),
        conversation.relay.answers_lost(),
        wrong.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !wrong.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = conversation.dir.keep();
        panic!(
            "nostr crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {wrong:?}; leftovers {leftovers:?}",
            kept.display()
        );
    }
}
