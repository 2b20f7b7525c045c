//! The random-time crash matrix, black box: the real binary on its embedded QA platforms (a
//! slow and a fast agent, each on its own account), human messages over ten conversations, the
//! gateway SIGKILLed at seeded random instants and restarted on the same state directory, then
//! a clean stop. Judged only from the platforms' own state files and the process table: every
//! message has exactly one visible, complete final; nothing else is visible; no agent process
//! is left and no lease is open.
//!
//! `CLAWGATE_CRASH_SEED` replays a run (the seed is printed), `CLAWGATE_CRASH_KILLS` (default
//! 30) and `CLAWGATE_CRASH_MESSAGES` (default 120) size it; `cargo xtask soak` runs it long.

use std::time::{Duration, Instant};

use crate::support::{
    AccountSpec, GatewayProcess, Rng, Sent, config_file_accounts, crash_seed, crash_size,
    demo_reply, judge, leftover_processes, settle,
};

/// Slow: a reply streams for about a third of a second, so kills land mid-stream.
const SLOW_WORDS: usize = 10;
const SLOW: &[&str] = &["--chunk-ms", "30", "--words", "10"];
/// Fast: the whole reply in one go.
const FAST_WORDS: usize = 4;
const FAST: &[&str] = &["--chunk-ms", "0", "--words", "4"];
const CONVERSATIONS_PER_ACCOUNT: usize = 5;
/// The longest random wait before a kill.
const MAX_KILL_DELAY_MS: u64 = 300;

/// The messages of a run, in the order they are sent: unique texts over ten conversations.
fn plan_messages(rng: &mut Rng, count: usize) -> Vec<Sent> {
    (0..count)
        .map(|n| {
            let fast = rng.below(2) == 1;
            let conversation = rng.below(CONVERSATIONS_PER_ACCOUNT as u64);
            let (channel, conversation, words) = if fast {
                ("qa-fast", format!("fast-{conversation}"), FAST_WORDS)
            } else {
                ("qa", format!("slow-{conversation}"), SLOW_WORDS)
            };
            let text = format!("message {n} for {conversation}");
            Sent {
                channel: channel.to_owned(),
                conversation,
                expected: demo_reply(&text, words),
                text,
            }
        })
        .collect()
}

async fn send(gateway: &GatewayProcess, batch: &[Sent]) {
    for message in batch {
        gateway
            .say_on(Some(&message.channel), &message.conversation, &message.text)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_leave_exactly_one_final_per_message() {
    let seed = crash_seed();
    let (kills, count) = crash_size("", 30, 120);
    eprintln!(
        "crash matrix: seed {seed} (CLAWGATE_CRASH_SEED={seed} replays it), {kills} kills, \
         {count} messages"
    );
    let mut rng = Rng(seed);
    let messages = plan_messages(&mut rng, count);

    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file_accounts(
        dir.path(),
        &[
            AccountSpec {
                account: "default",
                agent_args: SLOW,
            },
            AccountSpec {
                account: "fast",
                agent_args: FAST,
            },
        ],
        "",
    );
    let quiet = [("CLAWGATE_LOG", "warn")];
    let started = Instant::now();

    // About half the kills come 0–300 ms after a start, the others 0–300 ms after a batch:
    // batches are sized so the messages are spread over the kills.
    let batch_size = count.div_ceil(usize::try_from(kills / 2).unwrap_or(1).max(1));
    let mut next = 0usize;
    let mut after_batch = 0u64;
    for _ in 0..kills {
        let gateway = GatewayProcess::try_start(&state, &config, &quiet)
            .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        if next < messages.len() && rng.below(2) == 1 {
            let end = (next + batch_size).min(messages.len());
            send(&gateway, &messages[next..end]).await;
            next = end;
            after_batch += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(MAX_KILL_DELAY_MS + 1))).await;
        gateway.kill_hard();
    }

    // The last run: the rest of the messages, then let it settle and stop it cleanly.
    let gateway = GatewayProcess::try_start(&state, &config, &quiet)
        .unwrap_or_else(|why| panic!("seed {seed}: {why}"));
    send(&gateway, &messages[next..]).await;
    settle(&state, &messages, Duration::from_secs(6)).await;
    let status = gateway.interrupt();

    let verdict = judge(&state, &messages);
    let leftovers = leftover_processes(&state);
    eprintln!(
        "crash matrix: seed {seed}: {kills} kills ({after_batch} after a batch), {} messages, \
         {} finals, {} failure notices, {} violations [{}], {:.1} s",
        verdict.messages,
        verdict.finals,
        verdict.notices,
        verdict.violations.len() + verdict.strays.len(),
        verdict.shapes(),
        started.elapsed().as_secs_f64()
    );
    // One line for `cargo xtask soak` to add up.
    eprintln!(
        "crash matrix figures: seed={seed} kills={kills} messages={} finals={} notices={} \
         violations={} leftovers={}",
        verdict.messages,
        verdict.finals,
        verdict.notices,
        verdict.violations.len() + verdict.strays.len(),
        leftovers.len()
    );
    if !verdict.holds() || !leftovers.is_empty() || !status.success() {
        // Kept for a look: the state directory and the gateway's log beside it.
        let kept = dir.keep();
        panic!(
            "crash matrix failed (seed {seed}, CLAWGATE_CRASH_SEED={seed} replays it; state kept \
             in {})\nclean stop: {status}\n{}{}",
            kept.display(),
            verdict.table(),
            leftovers.join("\n")
        );
    }
}
