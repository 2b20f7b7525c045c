//! Two gateways on one PostgreSQL state serving one Matrix account on a real Synapse (started
//! by the test, so it outlives a SIGKILLed gateway, and its room history is the judge). Matrix
//! sends carry a transaction id, which Synapse deduplicates per access token: both gateways use
//! the account's one token, so a send the other gateway repeats after a takeover lands once.
//! What the gateways must share besides the core's records is the account's first sync token
//! (`sync-start` in the channel state): an account taken over before its first event was
//! recorded resumes from it, so what people wrote while nobody served is answered. Synapse
//! runs without its `/sync` response cache: with it, a second gateway starting within two
//! minutes of the first is answered from the cache with the first one's start token, which
//! would hide a token kept per gateway.
//!
//! `CLAWGATE_CRASH_SEED` replays a run; `CLAWGATE_SHARED_MATRIX_CRASH_KILLS` (default 4) and
//! `CLAWGATE_SHARED_MATRIX_CRASH_MESSAGES` (default 12) size it.

use std::time::{Duration, Instant};

use clawgate_channel_matrix::testing::{MessageLimit, Synapse};

use super::pair::{Setup, TwoGateways};
use crate::matrix::{Asked, SynapseRoom, TOKEN_ENV, problems, settle};
use crate::support::{Rng, crash_seed, crash_size, eventually};

const WORDS: usize = 8;

/// The shared-state crash matrix on a Matrix account. The first round kills the first holder
/// before anyone wrote (its only channel state is the first sync token) and the round's
/// messages are written while nobody serves; every later round writes, then kills the holder
/// at a random instant with its work in flight. Judged from Synapse's room history: every
/// message has exactly one final, nothing else from the account shows (no preview left
/// behind, none doubled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_alternating_between_two_gateways_on_one_matrix_account_leave_one_final_each()
 {
    let seed = crash_seed();
    let (kills, count) = crash_size("SHARED_MATRIX", 4, 12);
    eprintln!("shared matrix crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let room =
        SynapseRoom::open_on(Synapse::start_without_sync_cache(MessageLimit::RAISED).await).await;
    let channel = format!(
        "[[channels]]\nkind = \"matrix\"\nmax_turn_attempts = 50\nsettings = {{ {} }}\n",
        room.settings()
    );
    let mut pair = TwoGateways::new(
        Setup {
            name: format!("matrix-{seed}"),
            channel,
            env: vec![(TOKEN_ENV, room.bot.token.clone())],
            words: WORDS,
            chunk_ms: 25,
            reconcile_delay_ms: 300,
        },
        seed,
    );
    pair.start(0);
    eventually(
        Duration::from_secs(30),
        "the first gateway serves and keeps the account's first sync token",
        || async {
            let kept = pair
                .pairs(
                    "SELECT name, value FROM {schema}.channel_values \
                     WHERE kind = 'matrix' AND name = 'sync-start'",
                )
                .await;
            (pair.served(0) && !kept.is_empty()).then_some(())
        },
    )
    .await;
    let started = Instant::now();
    let batch = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    let mut asked: Vec<Asked> = Vec::new();
    for kill in 0..usize::try_from(kills).unwrap_or(0) {
        let victim = kill % 2;
        if kill == 0 {
            // The first holder dies before anyone writes; the other gateway starts only after
            // the round's messages, so it has seen nothing of the account but the shared state.
            pair.kill(victim);
        }
        for _ in 0..batch.min(count - asked.len()) {
            let n = asked.len();
            asked.push(room.say(n, &format!("message {n}"), WORDS).await);
        }
        if kill == 0 {
            pair.start(1);
        } else {
            pair.kill_after_a_while(victim, &mut rng).await;
        }
        pair.restart_after_takeover(victim, &mut rng).await;
    }
    while asked.len() < count {
        let n = asked.len();
        asked.push(room.say(n, &format!("message {n}"), WORDS).await);
    }
    settle(&room, &asked, Duration::from_secs(30)).await;
    // A while longer, for anything that would land twice.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let exits = pair.interrupt_all();
    let (finals, wrong) = problems(&room, &asked).await;
    let leftovers = pair.leftovers().await;
    let served = [0, 1].map(|n| pair.served(n));
    eprintln!(
        "shared-matrix crash matrix figures: seed={seed} kills={kills} messages={} \
         finals={finals} violations={} leftovers={} seconds={:.1}",
        asked.len(),
        wrong.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !wrong.is_empty() || !leftovers.is_empty() || exits.iter().any(|e| !e.success()) {
        let kept = pair.dir.keep();
        panic!(
            "shared matrix crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} replays \
             it; logs in {}; schema {}): exits {exits:?}; {wrong:?}; leftovers {leftovers:?}",
            kept.display(),
            pair.schema
        );
    }
    assert!(
        served.iter().all(|s| *s) || kills < 2,
        "seed {seed}: both gateways served the account at some point: {served:?}"
    );
}
