//! The real binary with a Microsoft Teams bot, on the Bot Connector simulator: the simulator
//! runs in the test process, so it outlives a gateway killed with SIGKILL, and its own record of
//! what landed is the judge. Activities reach the gateway with real Bot Framework JWTs; while
//! the gateway is down they fail and the simulator POSTs them again, which the gateway
//! deduplicates durably by activity id. No service URL is configured: the gateway answers from
//! the conversation references it stored from the activities, across its restarts.
//!
//! Teams has no idempotency key and no way for a bot to read an activity back, so a send whose
//! answer a kill cut off cannot be settled: the reply stays `unknown_after_send` for an operator
//! (`clawgate outbox retry|cancel`), never sent again blindly. Everything after a preview exists
//! settles itself: a preview becomes the final by an update (`PUT`, repeated while its answer
//! is lost) in group chats and channel threads, or by the stream's final message in one-on-one
//! chats (repeated: "already completed" means it landed). One outcome stays inherent: a preview
//! whose creating call a kill cut off is not known to the restarted gateway and stays visible
//! beside the final — an orphan preview, always a strict prefix of the final in the same place,
//! and evidenced: its creating call lost its answer, or a gateway that was then killed made it.
//! The judge allows exactly these two (counted), and fails on everything else: a duplicate
//! final, a missing final not recorded unknown, a partial final, a stray, an activity the
//! simulator gave up on, a leftover agent process.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clawgate_channel_teams::simulator::{
    ConversationKind, Fault, FaultKind, Op, SimActivity, SimUser, SimulatorConfig, StreamState,
    TeamsSimulator,
};

use crate::support::{
    GatewayProcess, Rng, channel_config, crash_seed, crash_size, demo_reply, leftover_processes,
    state_pairs,
};

const PASSWORD_ENV: &str = "E2E_TEAMS_APP_PASSWORD";

/// A Teams bot on a simulator, and a state directory for its gateway.
struct Bot {
    sim: TeamsSimulator,
    person: SimUser,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Bot {
    async fn start(agent_args: &[&str]) -> Bot {
        let sim = TeamsSimulator::start(SimulatorConfig {
            answer_deadline: Duration::from_secs(10),
            // Enough attempts to outlast a gateway restart.
            retry_delays: [300, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000]
                .map(Duration::from_millis)
                .to_vec(),
            // 3 s tokens, renewed after 1.5 s: the gateway renews while messages flow.
            token_lifetime: Duration::from_secs(3),
            ..SimulatorConfig::default()
        })
        .await
        .expect("simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        sim.set_endpoint(Some(&format!("http://127.0.0.1:{port}/api/messages")));
        let dir = tempfile::tempdir().expect("tempdir");
        let settings = format!(
            "app_id = \"{}\", app_password_env = \"{PASSWORD_ENV}\", listen = \"127.0.0.1:{port}\", \
             token_url = \"{}\", openid_url = \"{}\", request_timeout_ms = 3000",
            sim.app_id(),
            sim.token_url(),
            sim.openid_url()
        );
        let config = channel_config(dir.path(), "teams", &settings, agent_args, 500);
        let person = sim.person("ada");
        Bot {
            sim,
            person,
            dir,
            config,
        }
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn gateway(&self) -> Result<GatewayProcess, String> {
        self.gateway_with(&self.sim.app_password())
    }

    fn gateway_with(&self, password: &str) -> Result<GatewayProcess, String> {
        GatewayProcess::try_start(
            &self.state(),
            &self.config,
            &[(PASSWORD_ENV, password), ("CLAWGATE_LOG", "info")],
        )
    }

    /// The person writes `text` in `conversation` (in a channel: a new post, answered in its
    /// thread); returns what the test expects back.
    fn write(&self, conversation: &str, text: &str, words: usize) -> Asked {
        let activity = self
            .sim
            .person_writes(conversation, &self.person, text, None)
            .expect("the conversation exists");
        Asked {
            conversation: conversation.to_owned(),
            event_id: format!("{conversation}|{}", activity.id),
            thread: activity.thread.clone(),
            expected: demo_reply(text, words),
        }
    }
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
pub(crate) struct Asked {
    pub(crate) conversation: String,
    pub(crate) event_id: String,
    /// In a channel, the post's thread: the answer goes there.
    pub(crate) thread: Option<String>,
    pub(crate) expected: String,
}

#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) finals: usize,
    /// Finals recorded `unknown_after_send` and not visible (parked, never repeated).
    pub(crate) unknown: usize,
    /// Finals that landed though their send was left `unknown_after_send` (its answer lost):
    /// parked for an operator, who finds the message there.
    pub(crate) parked_landed: usize,
    /// Previews left beside their final (strict prefixes of it, same place).
    pub(crate) orphans: usize,
    pub(crate) problems: Vec<String>,
}

/// Reply intents of the state directory: (idempotency key, status).
fn reply_statuses(state: &Path) -> Vec<(String, String)> {
    state_pairs(state, "SELECT idempotency_key, status FROM send_intents")
}

/// `last_start`: how many calls the simulator had answered when the last gateway (the one never
/// killed) started.
fn judge(sim: &TeamsSimulator, state: &Path, asked: &[Asked], last_start: usize) -> Verdict {
    judge_record(sim, asked, &reply_statuses(state), last_start)
}

/// The verdict from the simulator's record and the reply intents (`statuses`). Every call
/// before call number `killed_calls` was made by a gateway a kill then stopped; an orphan
/// preview needs that evidence, or a lost answer to its creating call.
pub(crate) fn judge_record(
    sim: &TeamsSimulator,
    asked: &[Asked],
    statuses: &[(String, String)],
    killed_calls: usize,
) -> Verdict {
    let calls = sim.calls();
    let evidenced = |id: &str| {
        calls
            .iter()
            .enumerate()
            .any(|(n, c)| c.created.as_deref() == Some(id) && (!c.answered || n < killed_calls))
    };
    let of_event = |a: &Asked| {
        statuses
            .iter()
            .filter(|(key, _)| key.contains(&a.event_id))
            .map(|(_, status)| status.clone())
            .collect::<Vec<_>>()
    };
    let mut verdict = Verdict::default();
    let mut conversations: Vec<&str> = asked.iter().map(|a| a.conversation.as_str()).collect();
    conversations.sort_unstable();
    conversations.dedup();
    for conversation in conversations {
        let mut bot: Vec<SimActivity> = sim.bot_visible(conversation);
        for a in asked.iter().filter(|a| a.conversation == conversation) {
            let here = |m: &SimActivity| m.thread == a.thread;
            let finals = bot
                .iter()
                .filter(|m| here(m) && m.is_final_message() && m.text == a.expected)
                .count();
            match finals {
                1 => {
                    verdict.finals += 1;
                    if of_event(a).iter().any(|s| s == "unknown_after_send") {
                        verdict.parked_landed += 1;
                    }
                }
                0 if of_event(a).iter().any(|s| s == "unknown_after_send") => {
                    verdict.unknown += 1;
                }
                0 => verdict.problems.push(format!(
                    "message {}: no final, replies {:?}",
                    a.event_id,
                    of_event(a)
                )),
                n => verdict
                    .problems
                    .push(format!("message {}: {n} finals", a.event_id)),
            }
            bot.retain(|m| {
                if here(m) && m.is_final_message() && m.text == a.expected {
                    return false;
                }
                let orphan = here(m)
                    && !m.text.is_empty()
                    && m.text.len() < a.expected.len()
                    && a.expected.starts_with(m.text.as_str())
                    && m.stream
                        .as_ref()
                        .is_none_or(|s| s.state != StreamState::Final);
                if orphan && evidenced(&m.id) {
                    verdict.orphans += 1;
                } else if orphan {
                    verdict.problems.push(format!(
                        "message {}: a preview {} left beside its final by a gateway never \
                         killed, its answer received: {:?}",
                        a.event_id, m.id, m.text
                    ));
                }
                !orphan
            });
        }
        for stray in bot {
            verdict.problems.push(format!(
                "stray bot activity {} in {conversation} (thread {:?}, stream {:?}): {:?}",
                stray.id,
                stray.thread,
                stray.stream.map(|s| s.state),
                stray.text
            ));
        }
    }
    for id in sim.given_up_events() {
        if asked.iter().any(|a| a.event_id == id) {
            verdict.problems.push(format!(
                "the simulator gave up delivering activity {id} (answers per attempt: {:?})",
                sim.deliveries()
                    .iter()
                    .filter(|d| d.event_id == id)
                    .map(|d| d.status)
                    .collect::<Vec<_>>()
            ));
        }
    }
    verdict
}

/// Waits until every message has its final or a parked reply (or `quiet` passes with nothing
/// new).
async fn settle(
    sim: &TeamsSimulator,
    state: &Path,
    asked: &[Asked],
    last_start: usize,
    quiet: Duration,
) {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let verdict = judge(sim, state, asked, last_start);
        if verdict.finals + verdict.unknown == asked.len() && sim.pending_events() == 0 {
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

/// Two one-on-one chats, two group chats and two team channels, the bot installed in each.
fn conversations(bot: &Bot) -> Vec<String> {
    let mut all = Vec::new();
    for n in 0..2 {
        let person = bot.sim.person(&format!("pat-{n}"));
        let chat = bot.sim.personal_chat(&person);
        all.push(chat);
    }
    for (kind, name) in [
        (ConversationKind::GroupChat, "crew-0"),
        (ConversationKind::GroupChat, "crew-1"),
        (ConversationKind::Channel, "general"),
        (ConversationKind::Channel, "random"),
    ] {
        all.push(
            bot.sim
                .conversation(kind, name, std::slice::from_ref(&bot.person)),
        );
    }
    all
}

/// The random-time crash matrix on a Teams bot: messages into six conversations (two
/// one-on-one chats previewed as Teams streams, two group chats and two channels previewed as
/// messages updated in place, channel posts answered in their threads), the gateway SIGKILLed
/// at seeded random instants and restarted, one connector answer per round lost after Teams
/// acted (a send or a thread reply: parked; an update or a stream's final: repeated), then a
/// clean stop; judged from the simulator's record and the reply intents' statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_on_a_teams_bot_never_duplicate_or_silently_lose_a_final() {
    const WORDS: usize = 8;
    let seed = crash_seed();
    let (kills, count) = crash_size("TEAMS", 8, 24);
    eprintln!("teams crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let bot = Bot::start(&["--chunk-ms", "25", "--words", "8"]).await;
    let places = conversations(&bot);
    let pick = |rng: &mut Rng| {
        places[usize::try_from(rng.below(places.len() as u64)).unwrap_or(0)].clone()
    };
    let mut asked = Vec::new();
    let per_kill = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let started = Instant::now();
    for _ in 0..kills {
        let gateway = bot
            .gateway()
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        let op = [Op::Update, Op::StreamFinal, Op::Send, Op::Reply]
            [usize::try_from(rng.below(4)).unwrap_or(0)];
        bot.sim
            .inject(Fault::on(op, FaultKind::LoseAnswer).after(rng.below(3) as u32));
        for _ in 0..per_kill.min(count - asked.len()) {
            let place = pick(&mut rng);
            let n = asked.len();
            asked.push(bot.write(&place, &format!("message {n} to {place}"), WORDS));
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        gateway.kill_hard();
    }
    let last_start = bot.sim.calls().len();
    let gateway = bot
        .gateway()
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    while asked.len() < count {
        let place = pick(&mut rng);
        let n = asked.len();
        asked.push(bot.write(&place, &format!("message {n} to {place}"), WORDS));
    }
    settle(
        &bot.sim,
        &bot.state(),
        &asked,
        last_start,
        Duration::from_secs(20),
    )
    .await;
    let status = gateway.interrupt();
    let verdict = judge(&bot.sim, &bot.state(), &asked, last_start);
    let leftovers = leftover_processes(&bot.state());
    let calls = bot.sim.calls();
    let lost = calls.iter().filter(|c| !c.answered).count();
    let count_op = |op: Op| calls.iter().filter(|c| c.op == op).count();
    let completed_repeats = calls
        .iter()
        .filter(|c| c.op == Op::StreamFinal && c.status == 403)
        .count();
    let throttled = calls.iter().filter(|c| c.status == 429).count();
    let redeliveries = bot
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.attempt > 0)
        .count();
    eprintln!(
        "teams crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} parked_landed={} orphan_previews={} lost_answers={lost} sends={} updates={} streams={} \
         stream_finals={} completed_repeats={completed_repeats} throttled={throttled} \
         token_requests={} activity_redeliveries={redeliveries} violations={} leftovers={} \
         seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.parked_landed,
        verdict.orphans,
        count_op(Op::Send) + count_op(Op::Reply),
        count_op(Op::Update),
        count_op(Op::Stream),
        count_op(Op::StreamFinal),
        bot.sim.token_requests(),
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.problems.is_empty() || !leftovers.is_empty() || !status.success() {
        let kept = bot.dir.keep();
        panic!(
            "teams crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays it; \
             state kept in {}): clean stop {status}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            verdict.problems
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_conversation_through_the_binary_streams_in_chats_and_answers_in_threads() {
    let bot = Bot::start(&["--chunk-ms", "150", "--words", "12"]).await;
    let gateway = bot.gateway().expect("gateway starts");
    let chat = bot.sim.personal_chat(&bot.person);
    let channel = bot.sim.conversation(
        ConversationKind::Channel,
        "general",
        std::slice::from_ref(&bot.person),
    );
    let asked = vec![
        bot.write(&chat, "hello from a chat", 12),
        bot.write(&channel, "hello from a channel", 12),
    ];
    settle(&bot.sim, &bot.state(), &asked, 0, Duration::from_secs(20)).await;
    let status = gateway.interrupt();
    let verdict = judge(&bot.sim, &bot.state(), &asked, 0);
    assert!(verdict.problems.is_empty(), "{verdict:?}");
    assert_eq!((verdict.finals, verdict.orphans), (2, 0), "{verdict:?}");
    // The chat's answer is a Teams stream that ended in its final; the channel's a reply in
    // the post's thread.
    let answer = &bot.sim.bot_visible(&chat)[0];
    let stream = answer.stream.as_ref().expect("the preview was a stream");
    assert_eq!(stream.state, StreamState::Final);
    assert!(!stream.streamed.is_empty());
    let reply = &bot.sim.bot_visible(&channel)[0];
    assert_eq!(reply.thread, asked[1].thread);
    assert!(status.success(), "clean stop: {status}");
    assert!(leftover_processes(&bot.state()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_teams_secret_stops_the_start_naming_the_setting() {
    let bot = Bot::start(&[]).await;
    let error = bot
        .gateway_with("not-the-teams-secret")
        .err()
        .expect("the start fails");
    assert!(
        error.contains("channels[0].settings.app_password_env"),
        "names the setting: {error}"
    );
    assert!(
        !error.contains("not-the-teams-secret"),
        "never prints the secret: {error}"
    );
}
