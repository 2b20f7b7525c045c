//! The real binary with a LINE Official Account, on the LINE simulator: the simulator runs in
//! the test process, so it outlives a gateway killed with SIGKILL, and its own record of what
//! landed is the judge. Webhooks reach the gateway signed with the channel secret; while the
//! gateway is down they fail and LINE redelivers them (`isRedelivery`, the same
//! `webhookEventId`, which the gateway deduplicates durably).
//!
//! A reply goes out with the event's reply token while it is fresh, else as a push under an
//! `X-Line-Retry-Key` from the unit's key. A push whose answer a kill (or a lost answer) cut
//! off is settled after the restart by the same push: LINE's 409 returns the first one's ids.
//! A reply that never started (no entry in the channel's reply journal) is sent after the
//! restart. A reply whose call a kill cut mid-flight cannot be settled (LINE keeps no history
//! and a used token answers like an expired one): it stays `unknown_after_send` for an
//! operator (`clawgate outbox retry|cancel`), and its conversation waits behind it. The judge
//! allows exactly that — a reply intent unknown whose call was started (in the platform's
//! record, or at least in the reply journal the channel syncs before the call), and at most
//! the later messages of that conversation unanswered — counts it, and
//! fails on everything else: a duplicate final, a missing final otherwise, a stray or partial
//! message, an event LINE gave up on, a leftover agent process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_line::simulator::{
    Fault, FaultKind, LineSimulator, PUSH_PATH, REPLY_PATH, SimulatorConfig, Via,
};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const TOKEN_ENV: &str = "E2E_LINE_TOKEN";
const SECRET_ENV: &str = "E2E_LINE_CHANNEL_SECRET";

/// A LINE channel on a simulator, and a state directory for its gateway.
struct Account {
    sim: LineSimulator,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Account {
    async fn start(agent_args: &[&str]) -> Account {
        let sim = LineSimulator::start(SimulatorConfig {
            // LINE publishes no schedule; these cover a restart.
            redelivery_delays: [300, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000]
                .into_iter()
                .map(Duration::from_millis)
                .collect(),
            ..SimulatorConfig::default()
        })
        .await
        .expect("simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        sim.set_webhook_url(Some(&format!("http://127.0.0.1:{port}/line/webhook")));
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = format!(
            "token_env = \"{TOKEN_ENV}\", channel_secret_env = \"{SECRET_ENV}\", \
             api_base = \"{}\", webhook_listen = \"127.0.0.1:{port}\", request_timeout_ms = 3000",
            sim.api_url()
        );
        let config = channel_config(dir.path(), "line", &settings, agent_args, 500);
        Account { sim, dir, config }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[
                (TOKEN_ENV, self.sim.access_token().as_str()),
                (SECRET_ENV, self.sim.channel_secret().as_str()),
                ("CLAWGATE_LOG", "info"),
            ],
        )
    }

    /// `user` writes `text` in `chat` (their 1:1 chat when it is their id).
    fn write(&self, chat: &str, user: &str, text: &str, words: usize) -> Asked {
        let written = if chat == user {
            self.sim.user_writes(user, text)
        } else {
            self.sim.member_writes(chat, user, text)
        };
        Asked {
            chat: chat.to_owned(),
            event_id: written.event_id,
            reply_token: written.reply_token,
            expected: demo_reply(text, words),
        }
    }
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub(crate) chat: String,
    pub(crate) event_id: String,
    pub(crate) reply_token: String,
    pub(crate) expected: String,
}

#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) finals: usize,
    /// Replies left unknown for an operator with no final: a call a kill cut, or one whose
    /// answer was lost while LINE refused it (e.g. an expired token).
    pub(crate) parked: usize,
    pub(crate) problems: Vec<String>,
}

/// What the judge reads from the gateway's state besides LINE's record.
pub(crate) struct Evidence {
    /// Every reply intent's status, by idempotency key.
    pub(crate) statuses: HashMap<String, String>,
    /// The keys of the channel's reply journal: each attempt (`start:<n>:<unit key>`) written
    /// before its call, and a refusal of it (`refused:<n>:<unit key>`).
    pub(crate) journal: Vec<String>,
}

fn judge(sim: &LineSimulator, state: &Path, asked: &[Asked]) -> Verdict {
    let evidence = Evidence {
        statuses: state_pairs(state, "SELECT idempotency_key, status FROM send_intents")
            .into_iter()
            .collect(),
        journal: state_pairs(
            state,
            "SELECT key, value FROM channel_records \
             WHERE kind = 'line' AND book = 'reply-journal'",
        )
        .into_iter()
        .map(|(key, _)| key)
        .collect(),
    };
    judge_evidence(sim, &evidence, asked)
}

/// Every message has exactly one final, or (excused) its reply is parked `unknown_after_send`
/// with evidence that its call was started: the call is in LINE's record, or the reply journal
/// holds an attempt LINE did not refuse (written before the call, so a kill between the journal
/// and LINE leaves exactly that). Nothing else from the bot in those chats, no second final, no
/// event of theirs LINE gave up on.
pub(crate) fn judge_evidence(sim: &LineSimulator, evidence: &Evidence, asked: &[Asked]) -> Verdict {
    let (statuses, journal) = (&evidence.statuses, &evidence.journal);
    let calls = sim.calls();
    let started_attempt = |prefix: &str| {
        journal.iter().any(|key| {
            key.strip_prefix("start:")
                .and_then(|rest| rest.split_once(':'))
                .is_some_and(|(n, unit)| {
                    unit.starts_with(prefix) && !journal.contains(&format!("refused:{n}:{unit}"))
                })
        })
    };
    let mut verdict = Verdict::default();
    let mut chats: Vec<&str> = asked.iter().map(|a| a.chat.as_str()).collect();
    chats.sort_unstable();
    chats.dedup();
    for chat in chats {
        let mut bot: Vec<_> = sim.bot_messages(chat);
        for a in asked.iter().filter(|a| a.chat == chat) {
            let finals = bot.iter().filter(|m| m.text == a.expected).count();
            let prefix = format!("line:reply:{}:", a.event_id);
            let replies: Vec<&String> = statuses
                .iter()
                .filter(|(key, _)| key.starts_with(&prefix))
                .map(|(_, status)| status)
                .collect();
            let token_used = calls.iter().any(|c| {
                c.path == REPLY_PATH && c.body["replyToken"].as_str() == Some(&a.reply_token)
            });
            // Started: its call reached LINE, or the kill came between the journal and LINE.
            let started = token_used || started_attempt(&prefix);
            let unknown = replies.iter().any(|s| *s == "unknown_after_send");
            match finals {
                1 => verdict.finals += 1,
                // A parked reply does not hold the messages after it: they get their finals.
                0 if unknown && started => verdict.parked += 1,
                0 => verdict.problems.push(format!(
                    "event {} in {chat}: no final (replies {replies:?}, reply started {started})",
                    a.event_id
                )),
                n => verdict
                    .problems
                    .push(format!("event {} in {chat}: {n} finals", a.event_id)),
            }
            bot.retain(|m| m.text != a.expected);
        }
        for stray in bot {
            verdict.problems.push(format!(
                "stray bot message {} in {chat}: {:?}",
                stray.id, stray.text
            ));
        }
    }
    for id in sim.given_up_events() {
        if asked.iter().any(|a| a.event_id == id) {
            verdict
                .problems
                .push(format!("LINE gave up delivering event {id}"));
        }
    }
    verdict
}

/// Waits until every message has its final or a parked reply (or `quiet` passes with nothing
/// new).
async fn settle(sim: &LineSimulator, state: &Path, asked: &[Asked], quiet: Duration) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let verdict = judge(sim, state, asked);
        if verdict.finals + verdict.parked == asked.len() && sim.pending_events() == 0 {
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

/// The random-time crash matrix on a LINE channel: messages from three people 1:1 and in two
/// groups (a third of their reply tokens expired at once, so those answers are pushes), the gateway SIGKILLed at seeded random instants and restarted, one API answer per
/// round lost after LINE acted (settled by its retry key), then a clean stop; judged from the
/// simulator's record and the reply intents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_line_channel_never_duplicate_or_silently_lose_a_final() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("LINE", 8, 24);
    eprintln!("line crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let account = Account::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let people: Vec<String> = (0..3)
        .map(|n| account.sim.user(&format!("pat-{n}")))
        .collect();
    let mut chats: Vec<(String, String)> = people.iter().map(|p| (p.clone(), p.clone())).collect();
    for n in 0..2 {
        let group = account.sim.group(&format!("crew-{n}"), &people);
        chats.push((group, people[n].clone()));
    }
    let pick =
        |rng: &mut Rng| chats[usize::try_from(rng.below(chats.len() as u64)).unwrap_or(0)].clone();
    let mut asked = Vec::new();
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = account
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        // Besides the kill, one push answer per round is lost after LINE acted (a lost reply
        // answer would park its conversation: the crate's tests cover it).
        account
            .sim
            .inject(Fault::on(PUSH_PATH, FaultKind::LoseAnswer).after(rng.below(4) as u32));
        for _ in 0..per_kill.min(count - asked.len()) {
            let (chat, user) = pick(&mut rng);
            let n = asked.len();
            asked.push(account.write(&chat, &user, &format!("message {n} to {chat}"), WORDS));
            // A third of the tokens expire at once: those answers go out as pushes.
            if rng.below(3) == 0 {
                account.sim.expire_reply_token(&asked[n].reply_token);
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let gateway = account
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let (chat, user) = pick(&mut rng);
        let n = asked.len();
        asked.push(account.write(&chat, &user, &format!("message {n} to {chat}"), WORDS));
        if rng.below(3) == 0 {
            account.sim.expire_reply_token(&asked[n].reply_token);
        }
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
    let messages = account.sim.every_message();
    let replies = messages
        .iter()
        .filter(|m| matches!(m.via, Via::Reply(_)))
        .count();
    let pushes = messages
        .iter()
        .filter(|m| matches!(m.via, Via::Push(_)))
        .count();
    let calls = account.sim.calls();
    let lost = calls.iter().filter(|c| !c.answered).count();
    let accepted = calls.iter().filter(|c| c.status == 409).count();
    let redeliveries = account
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.is_redelivery)
        .count();
    eprintln!(
        "line crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         parked_replies={} by_reply={replies} by_push={pushes} retry_key_409s={accepted} \
         lost_answers={lost} redeliveries={redeliveries} violations={} leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.parked,
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.problems.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = account.dir.keep();
        panic!(
            "line crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_conversation_through_the_binary_replies_with_the_token() {
    let account = Account::start(&["--chunk-ms", "20", "--words", "12"]).await;
    let gateway = account.gateway().expect("gateway starts");
    let ada = account.sim.user("ada");
    let group = account.sim.group("crew", std::slice::from_ref(&ada));
    let asked = vec![
        account.write(&ada, &ada, "hello from a 1:1 chat", 12),
        account.write(&group, &ada, "hello from a group", 12),
    ];
    settle(
        &account.sim,
        &account.state(),
        &asked,
        Duration::from_secs(20),
    )
    .await;
    let status = gateway.interrupt();
    let verdict = judge(&account.sim, &account.state(), &asked);
    assert!(verdict.problems.is_empty(), "{verdict:?}");
    assert_eq!(verdict.finals, 2, "{verdict:?}");
    // Both answered within the token's minute: replies, no push.
    for a in &asked {
        let sent = account.sim.bot_messages(&a.chat);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].via, Via::Reply(a.reply_token.clone()));
    }
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&account.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_line_token_stops_the_start_naming_the_setting() {
    let account = Account::start(&[]).await;
    let error = GatewayProcess::try_start(
        &account.state(),
        &account.config,
        &[
            (TOKEN_ENV, "not-the-line-token"),
            (SECRET_ENV, account.sim.channel_secret().as_str()),
        ],
    )
    .err()
    .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.token_env"),
        "names the setting: {error}"
    );
    assert!(
        !error.contains("not-the-line-token"),
        "never prints the token: {error}"
    );
}
