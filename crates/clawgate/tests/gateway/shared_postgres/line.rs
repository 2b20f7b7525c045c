//! Two gateways on one PostgreSQL state serving one LINE Official Account on the LINE
//! simulator, SIGKILLed alternately at seeded random instants: the one that takes the account
//! over settles what the other left from the shared state (intents, inbound records, the
//! channel's reply journal). Judged from the simulator's record and the shared rows.
//!
//! `CLAWGATE_CRASH_SEED` replays a run; `CLAWGATE_SHARED_LINE_CRASH_KILLS` (default 4) and
//! `CLAWGATE_SHARED_LINE_CRASH_MESSAGES` (default 12) size it.

use std::time::{Duration, Instant};

use clawgate_channel_line::simulator::{
    Fault, FaultKind, LineSimulator, PUSH_PATH, REPLY_PATH, SimulatorConfig, Via,
};

use super::pair::{Setup, TwoGateways};
use crate::line::{Asked, Evidence, Verdict, judge_evidence};
use crate::support::{Rng, crash_seed, crash_size, demo_reply};

const TOKEN_ENV: &str = "E2E_LINE_TOKEN";
const SECRET_ENV: &str = "E2E_LINE_CHANNEL_SECRET";
const WORDS: usize = 8;

/// One LINE channel on the simulator, served by two gateways that share one PostgreSQL state
/// (a fresh schema) and one webhook address (only the gateway serving the account binds it).
struct SharedLine {
    sim: LineSimulator,
    pair: TwoGateways,
}

impl SharedLine {
    async fn start(seed: u64) -> SharedLine {
        let sim = LineSimulator::start(SimulatorConfig {
            // LINE publishes no schedule; long enough to outlast a takeover.
            redelivery_delays: [
                200, 500, 1_000, 2_000, 2_000, 3_000, 3_000, 5_000, 5_000, 10_000, 20_000,
            ]
            .into_iter()
            .map(Duration::from_millis)
            .collect(),
            ..SimulatorConfig::default()
        })
        .await
        .expect("the LINE simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        sim.set_webhook_url(Some(&format!("http://127.0.0.1:{port}/line/webhook")));
        let channel = format!(
            "[[channels]]\nkind = \"line\"\nmax_turn_attempts = 50\n\
             settings = {{ token_env = \"{TOKEN_ENV}\", channel_secret_env = \"{SECRET_ENV}\", \
             api_base = \"{}\", webhook_listen = \"127.0.0.1:{port}\", \
             request_timeout_ms = 3000 }}\n",
            sim.api_url()
        );
        let setup = Setup {
            name: "line-shared".into(),
            channel,
            env: vec![
                (TOKEN_ENV, sim.access_token()),
                (SECRET_ENV, sim.channel_secret()),
            ],
            words: WORDS,
            chunk_ms: 25,
            reconcile_delay_ms: 300,
        };
        SharedLine {
            sim,
            pair: TwoGateways::new(setup, seed),
        }
    }

    /// What the judge reads from the shared state: every intent's status by key, and the keys
    /// of the LINE reply journal.
    async fn shared(&self) -> Evidence {
        Evidence {
            statuses: self.pair.intents().await.into_iter().collect(),
            journal: self.pair.book("line", "reply-journal").await,
        }
    }
}

/// The single-gateway judge ([`judge_evidence`], from the shared intents and reply journal),
/// and beyond the chats written in: no bot message anywhere else, no event LINE gave up on.
fn judge(sim: &LineSimulator, evidence: &Evidence, asked: &[Asked]) -> Verdict {
    let mut verdict = judge_evidence(sim, evidence, asked);
    for stray in sim
        .every_message()
        .into_iter()
        .filter(|m| m.from_bot() && !asked.iter().any(|a| a.chat == m.chat))
    {
        verdict.problems.push(format!(
            "stray bot message {} in {}: {:?}",
            stray.id, stray.chat, stray.text
        ));
    }
    for id in sim
        .given_up_events()
        .into_iter()
        .filter(|id| !asked.iter().any(|a| a.event_id == *id))
    {
        verdict
            .problems
            .push(format!("LINE gave up delivering event {id}"));
    }
    verdict
}

/// The shared-state crash matrix on a LINE channel: two gateways on one PostgreSQL state,
/// SIGKILLed alternately at seeded random instants (the other takes the account over), people
/// writing 1:1 and in two groups throughout (also while the account has no holder, so LINE
/// redelivers to the one that takes it over) (a third of the reply tokens expired at once, so
/// those answers are pushes), one answer per round lost after LINE acted (a push's, settled by
/// its retry key, or a reply's, parked from the shared reply journal by whichever gateway
/// reconciles it). Judged exactly from the simulator's record
/// and the shared intents and reply journal: one final per message, none twice, nothing else;
/// excused only a reply parked unknown whose call was started (see [`judge`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_alternating_between_two_gateways_on_one_line_channel_send_every_final_once()
 {
    let seed = crash_seed();
    let (kills, count) = crash_size("SHARED_LINE", 4, 12);
    eprintln!("shared line crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let mut line = SharedLine::start(seed).await;
    let people: Vec<String> = (0..3).map(|n| line.sim.user(&format!("pat-{n}"))).collect();
    let mut chats: Vec<(String, String)> = people.iter().map(|p| (p.clone(), p.clone())).collect();
    for n in 0..2 {
        let group = line.sim.group(&format!("crew-{n}"), &people);
        chats.push((group, people[n].clone()));
    }
    let write = |rng: &mut Rng, asked: &mut Vec<Asked>| {
        let (chat, user) = &chats[usize::try_from(rng.below(chats.len() as u64)).unwrap_or(0)];
        let text = format!("message {} to {chat}", asked.len());
        let written = if chat == user {
            line.sim.user_writes(user, &text)
        } else {
            line.sim.member_writes(chat, user, &text)
        };
        // A third of the tokens expire at once: those answers go out as pushes.
        if rng.below(3) == 0 {
            line.sim.expire_reply_token(&written.reply_token);
        }
        asked.push(Asked {
            chat: chat.clone(),
            event_id: written.event_id,
            reply_token: written.reply_token,
            expected: demo_reply(&text, WORDS),
        });
    };
    let mut asked: Vec<Asked> = Vec::new();
    line.pair.start(0);
    line.pair.start(1);
    let started = Instant::now();
    let batch = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let (mut lost_pushes, mut lost_replies) = (0, 0);
    for kill in 0..usize::try_from(kills).unwrap_or(0) {
        // Besides the kill, one answer per round is lost after LINE acted: a push's (settled by
        // its retry key) or a reply's (parked: whichever gateway reconciles it finds the
        // attempt in the shared reply journal and must not send it again).
        let path = if rng.below(2) == 0 {
            lost_pushes += 1;
            PUSH_PATH
        } else {
            lost_replies += 1;
            REPLY_PATH
        };
        line.sim
            .inject(Fault::on(path, FaultKind::LoseAnswer).after(rng.below(4) as u32));
        // Half of the round's messages come before the kill, the rest while the account has
        // no holder: their webhooks fail until the other gateway binds the address, and LINE
        // redelivers them.
        let round = batch.min(count - asked.len());
        for _ in 0..round.div_ceil(2) {
            write(&mut rng, &mut asked);
        }
        // Kills alternate, so each one hits the gateway serving the account (the first serves
        // first; the other took over after the previous kill) with its work in flight; the
        // other takes the account over once the 1 s lease runs out.
        let victim = kill % 2;
        line.pair.kill_after_a_while(victim, &mut rng).await;
        for _ in round.div_ceil(2)..round {
            write(&mut rng, &mut asked);
        }
        line.pair.restart_after_takeover(victim, &mut rng).await;
    }
    while asked.len() < count {
        write(&mut rng, &mut asked);
    }

    // Until every message has its final (or its excused parked reply), LINE has nothing left
    // to deliver, and the shared delivery state has held still for a while: anything that
    // would land twice has had its chance.
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut seen = (Vec::new(), Instant::now());
    loop {
        let verdict = judge(&line.sim, &line.shared().await, &asked);
        let state = line.pair.delivery_state().await;
        if state != seen.0 {
            seen = (state, Instant::now());
        }
        let complete = verdict.finals + verdict.parked == asked.len();
        if complete && line.sim.pending_events() == 0 && seen.1.elapsed() > Duration::from_secs(3)
            || Instant::now() > deadline
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let exits = line.pair.interrupt_all();
    let mut verdict = judge(&line.sim, &line.shared().await, &asked);
    let leftovers = line.pair.leftovers().await;
    let served = [0, 1].map(|n| line.pair.served(n));
    if kills >= 2 && served != [true, true] {
        verdict.problems.push(format!(
            "the account never changed hands: each gateway served it {served:?}"
        ));
    }
    let messages = line.sim.every_message();
    let replies = messages
        .iter()
        .filter(|m| matches!(m.via, Via::Reply(_)))
        .count();
    let pushes = messages
        .iter()
        .filter(|m| matches!(m.via, Via::Push(_)))
        .count();
    let calls = line.sim.calls();
    let lost = calls.iter().filter(|c| !c.answered).count();
    let accepted = calls.iter().filter(|c| c.status == 409).count();
    let redeliveries = line
        .sim
        .deliveries()
        .iter()
        .filter(|d| d.is_redelivery)
        .count();
    // `unknown`: replies parked unknown with their evidence (the soak adds them up as excused).
    eprintln!(
        "shared-line crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} by_reply={replies} by_push={pushes} retry_key_409s={accepted} \
         lost_answers={lost} lost_push_answers={lost_pushes} \
         lost_reply_answers={lost_replies} redeliveries={redeliveries} violations={} \
         leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.parked,
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.problems.is_empty() || !leftovers.is_empty() || exits.iter().any(|e| !e.success()) {
        let kept = line.pair.dir.keep();
        panic!(
            "shared line crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays \
             it; logs in {}; schema {}): exits {exits:?}; {:?}; leftovers {leftovers:?}",
            kept.display(),
            line.pair.schema,
            verdict.problems
        );
    }
}
