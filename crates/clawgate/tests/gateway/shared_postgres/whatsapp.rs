//! Two gateways on one PostgreSQL state serving one WhatsApp Business number on the Cloud API
//! simulator (in the test process, so it outlives a SIGKILLed gateway and its record is the
//! judge). Both are configured with the same webhook address; only the gateway serving the
//! account binds it, so Meta's deliveries fail while the account changes hands and are
//! delivered again (on a shortened schedule) to the gateway that took it over.
//!
//! WhatsApp has no idempotency key: a send whose answer was lost is settled only by the status
//! book (`statuses` in the account's shared state: `attempted:<unit key>` before the request,
//! `accepted:<unit key>` from Graph's answer or a `sent`/`delivered` status webhook). A reply
//! whose answer one gateway lost before it was killed is settled by the other from that shared
//! evidence, once the message's status webhook reaches it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clawgate_channel_whatsapp::simulator::{
    Fault, FaultKind, SimMessage, SimulatorConfig, WhatsAppSimulator,
};

use super::pair::{Setup, TwoGateways};
use crate::support::{Rng, Stillness, crash_seed, crash_size, demo_reply, lease_processes};

const TOKEN_ENV: &str = "E2E_WHATSAPP_TOKEN";
const SECRET_ENV: &str = "E2E_WHATSAPP_APP_SECRET";
const VERIFY_ENV: &str = "E2E_WHATSAPP_VERIFY_TOKEN";
const VERIFY_TOKEN: &str = "e2e-verify-token";
const WORDS: usize = 8;
/// With nothing excused, how long the state must hold still before the verdict: a last look in
/// which a duplicate would show.
const LAST_LOOK: Duration = Duration::from_secs(3);

/// One business number on the simulator, served by two gateways that share one PostgreSQL
/// state (a fresh schema) and one webhook address.
struct SharedNumber {
    sim: WhatsAppSimulator,
    pair: TwoGateways,
}

impl SharedNumber {
    async fn start(seed: u64) -> SharedNumber {
        let sim = WhatsAppSimulator::start(SimulatorConfig {
            // Meta's schedule ("with decreasing frequency", for days), shortened; the last
            // wait repeats, so a delivery outlasts any takeover.
            retry_delays: vec![
                Duration::from_millis(200),
                Duration::from_millis(500),
                Duration::from_secs(1),
                Duration::from_secs(2),
            ],
            ..SimulatorConfig::default()
        })
        .await
        .expect("the WhatsApp simulator starts");
        let port = clawgate_channel_sdk::testing::ports::reserve_loopback_port();
        sim.set_webhook_url(Some(&format!("http://127.0.0.1:{port}/whatsapp/webhook")));
        let channel = format!(
            "[[channels]]\nkind = \"whatsapp\"\nmax_turn_attempts = 50\n\
             settings = {{ token_env = \"{TOKEN_ENV}\", app_secret_env = \"{SECRET_ENV}\", \
             verify_token_env = \"{VERIFY_ENV}\", phone_number_id = \"{}\", api_base = \"{}\", \
             webhook_listen = \"127.0.0.1:{port}\", request_timeout_ms = 3000 }}\n",
            sim.phone_number_id(),
            sim.api_url()
        );
        let setup = Setup {
            name: "whatsapp-shared".into(),
            channel,
            env: vec![
                (TOKEN_ENV, sim.token()),
                (SECRET_ENV, sim.app_secret()),
                (VERIFY_ENV, VERIFY_TOKEN.to_owned()),
            ],
            words: WORDS,
            chunk_ms: 25,
            reconcile_delay_ms: 500,
        };
        SharedNumber {
            sim,
            pair: TwoGateways::new(setup, seed),
        }
    }

    /// What the shared state holds now: reply intents, inbound records, the status book.
    async fn shared(&self) -> Shared {
        Shared {
            intents: self.pair.intents().await,
            inbound: self.pair.inbound().await,
            book: self.pair.book("whatsapp", "statuses").await,
            leases: self
                .pair
                .pairs("SELECT lease_id, state FROM {schema}.acpx_leases ORDER BY lease_id")
                .await,
        }
    }
}

/// Person `wa_id` writes `text`; returns what the test expects back.
fn write(sim: &WhatsAppSimulator, wa_id: &str, text: &str) -> Asked {
    let wamid = sim.person_writes(wa_id, "Ada", text);
    Asked {
        wa_id: wa_id.to_owned(),
        wamid,
        expected: demo_reply(text, WORDS),
    }
}

/// One message a person wrote, and the one final it must get.
#[derive(Debug, Clone)]
struct Asked {
    wa_id: String,
    wamid: String,
    expected: String,
}

/// The shared state, as the judge reads it (each list sorted).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Shared {
    /// Reply intents: (idempotency key, status).
    intents: Vec<(String, String)>,
    /// Inbound records: (event id = the person's `wamid`, status).
    inbound: Vec<(String, String)>,
    /// Record keys of the account's status book.
    book: Vec<String>,
    /// Agent process leases: (lease id, state).
    leases: Vec<(String, String)>,
}

impl Shared {
    fn recorded(&self, record: &str) -> bool {
        self.book
            .binary_search_by(|k| k.as_str().cmp(record))
            .is_ok()
    }

    fn inbound_status(&self, event_id: &str) -> Option<&str> {
        self.inbound
            .iter()
            .find(|(id, _)| id == event_id)
            .map(|(_, status)| status.as_str())
    }
}

/// What the simulator and the shared state show for the messages of a run.
#[derive(Debug, Default)]
struct Verdict {
    finals: usize,
    /// Replies recorded `unknown_after_send` whose request provably never reached WhatsApp: no
    /// message carries their key, and the shared book holds their attempt and no acceptance
    /// (so no gateway may send them again). Left for an operator.
    unknown: usize,
    /// Later messages of a person whose conversation waits behind such a reply: recorded
    /// durably (`received`) and without a reply intent.
    blocked: usize,
    /// Replies whose outcome stayed unknown through the whole reconciliation budget (provably
    /// never on WhatsApp): the intent is `failed`, the message dead-lettered, and its person got
    /// exactly one failure notice instead of a final.
    notices: usize,
    problems: Vec<String>,
}

/// The messages of a unit key's intent: `<intent key>#<index>`.
fn of_intent(data: Option<&str>, intent: &str) -> bool {
    data.and_then(|d| d.strip_prefix(intent))
        .is_some_and(|rest| rest.starts_with('#'))
}

fn judge(sim: &WhatsAppSimulator, shared: &Shared, asked: &[Asked]) -> Verdict {
    let sent = sim.all_sent();
    let mut verdict = Verdict::default();
    // People with a reply parked as unknown (and the position of that message).
    let mut parked: HashMap<&str, usize> = HashMap::new();
    // The failure notices owed: their intent keys (`whatsapp:failure:<wamid>`).
    let mut noticed: Vec<String> = Vec::new();
    for (at, a) in asked.iter().enumerate() {
        let prefix = format!("whatsapp:reply:{}:", a.wamid);
        let replies: Vec<&(String, String)> = shared
            .intents
            .iter()
            .filter(|(key, _)| key.starts_with(&prefix))
            .collect();
        let finals: Vec<&SimMessage> = sent
            .iter()
            .filter(|m| m.to == a.wa_id && m.text.as_deref() == Some(a.expected.as_str()))
            .collect();
        match finals.as_slice() {
            [only] => {
                verdict.finals += 1;
                // Sent under this message's reply key, the one its statuses echo.
                if !only
                    .callback_data
                    .as_deref()
                    .is_some_and(|d| d.starts_with(&prefix))
                {
                    verdict.problems.push(format!(
                        "the final of {} went out under {:?}, not a reply key of it",
                        a.wamid, only.callback_data
                    ));
                }
            }
            [] => {
                let on_whatsapp = |key: &str| {
                    sent.iter()
                        .any(|m| of_intent(m.callback_data.as_deref(), key))
                };
                // The excuse's evidence: WhatsApp never received the request, and the shared
                // book holds its attempt (so no gateway sends it again) and no acceptance.
                let proven_unknown = |key: &str| {
                    let unit = format!("{key}#0");
                    !on_whatsapp(key)
                        && shared.recorded(&format!("attempted:{unit}"))
                        && !shared.recorded(&format!("accepted:{unit}"))
                };
                // Beside it, only intents of turn attempts a kill cut off (cancelled, the turn
                // ran again under the next attempt's key) that never reached WhatsApp.
                let unknown_only = replies.iter().any(|(_, s)| s == "unknown_after_send")
                    && replies.iter().all(|(key, status)| match status.as_str() {
                        "unknown_after_send" => proven_unknown(key),
                        "cancelled" => !on_whatsapp(key),
                        _ => false,
                    });
                let behind = parked
                    .get(a.wa_id.as_str())
                    .is_some_and(|first| *first < at);
                let notice = format!("whatsapp:failure:{}", a.wamid);
                let failed_with_notice = replies.iter().any(|(_, s)| s == "failed")
                    && replies.iter().all(|(key, status)| match status.as_str() {
                        "failed" => proven_unknown(key),
                        "cancelled" => !on_whatsapp(key),
                        _ => false,
                    })
                    && shared.inbound_status(&a.wamid) == Some("dead_lettered")
                    && sent
                        .iter()
                        .filter(|m| {
                            m.to == a.wa_id && of_intent(m.callback_data.as_deref(), &notice)
                        })
                        .count()
                        == 1;
                if failed_with_notice {
                    verdict.notices += 1;
                    noticed.push(notice);
                } else if unknown_only {
                    verdict.unknown += 1;
                    parked.entry(a.wa_id.as_str()).or_insert(at);
                } else if replies.is_empty()
                    && behind
                    && shared.inbound_status(&a.wamid) == Some("received")
                {
                    verdict.blocked += 1;
                } else {
                    verdict.problems.push(format!(
                        "message {} from {}: no final; replies {replies:?}, inbound {:?}",
                        a.wamid,
                        a.wa_id,
                        shared.inbound_status(&a.wamid)
                    ));
                }
            }
            many => verdict.problems.push(format!(
                "message {} from {}: {} finals ({:?})",
                a.wamid,
                a.wa_id,
                many.len(),
                many.iter().map(|m| &m.wamid).collect::<Vec<_>>()
            )),
        }
    }
    for message in &sent {
        let owed_notice = noticed
            .iter()
            .any(|key| of_intent(message.callback_data.as_deref(), key));
        if !owed_notice
            && !asked.iter().any(|a| {
                a.wa_id == message.to && Some(a.expected.as_str()) == message.text.as_deref()
            })
        {
            verdict.problems.push(format!(
                "stray message {} to {}: {:?}",
                message.wamid, message.to, message.text
            ));
        }
        // The shared evidence of every message WhatsApp holds: its attempt was durable before
        // the request, and its acceptance (the answer or a status Meta saw answered) is there
        // once no status delivery is pending.
        match message.callback_data.as_deref() {
            Some(key) => {
                if !shared.recorded(&format!("attempted:{key}")) {
                    verdict.problems.push(format!(
                        "{} ({key}) is WhatsApp's but the shared book holds no attempt of it",
                        message.wamid
                    ));
                }
                if sim.pending_deliveries() == 0 && !shared.recorded(&format!("accepted:{key}")) {
                    verdict.problems.push(format!(
                        "{} ({key}) is WhatsApp's but the shared book holds no acceptance of it",
                        message.wamid
                    ));
                }
            }
            None => verdict
                .problems
                .push(format!("{} carries no unit key", message.wamid)),
        }
    }
    for delivery in sim.deliveries().iter().filter(|d| d.given_up) {
        verdict
            .problems
            .push(format!("Meta gave up on delivery {}", delivery.id));
    }
    verdict
}

/// The shared-state crash matrix on a WhatsApp number: two gateways on one PostgreSQL state,
/// SIGKILLed alternately at seeded random instants (the other takes the account over), one send
/// answer per round lost after WhatsApp accepted the message, people writing throughout.
/// Judged from the simulator's record and the shared state: every message has exactly one
/// final, sent under its reply key; none is sent twice; nothing else reaches anyone; every
/// message WhatsApp holds has its attempt and acceptance in the shared status book; no webhook
/// delivery is given up; no agent process is left. One outcome is inherent to a platform
/// without an idempotency key and excused only with its evidence: a request killed after its
/// attempt was recorded but before WhatsApp received it (no message carries its key, the book
/// holds its attempt and no acceptance) stays `unknown_after_send` for an operator, and that
/// person's later messages stay recorded (`received`) behind it; or, once its reconciliation
/// budget is spent across the takeovers, it is `failed`, the message dead-lettered and its
/// person told once (one failure notice, no final).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_sigkills_alternating_between_two_gateways_on_one_whatsapp_number_send_every_final_once()
 {
    let seed = crash_seed();
    let (kills, count) = crash_size("SHARED_WHATSAPP", 4, 12);
    eprintln!("shared whatsapp crash matrix: seed {seed}, {kills} kills, {count} messages");
    let mut rng = Rng(seed);
    let mut number = SharedNumber::start(seed).await;
    let people: Vec<String> = (0..4).map(|n| format!("4915200000{n:03}")).collect();
    let mut asked: Vec<Asked> = Vec::new();
    let write = |rng: &mut Rng, asked: &mut Vec<Asked>| {
        let person = &people[usize::try_from(rng.below(people.len() as u64)).unwrap_or(0)];
        let text = format!("message {} from {person}", asked.len());
        asked.push(write(&number.sim, person, &text));
    };
    let started = Instant::now();
    // The first gateway serves first, so the alternating kills each hit the account's holder.
    number.pair.start(0);
    crate::support::eventually(Duration::from_secs(30), "the first gateway serves", || {
        let serves = number.pair.served(0);
        async move { serves.then_some(()) }
    })
    .await;
    number.pair.start(1);
    let batch = count.div_ceil(usize::try_from(kills).unwrap_or(1).max(1));
    for kill in 0..usize::try_from(kills).unwrap_or(0) {
        number
            .sim
            .inject(Fault::new(FaultKind::LoseAnswer).after(rng.below(3) as u32));
        for _ in 0..batch.min(count - asked.len()) {
            write(&mut rng, &mut asked);
        }
        let victim = kill % 2;
        number.pair.kill_after_a_while(victim, &mut rng).await;
        number.pair.restart_after_takeover(victim, &mut rng).await;
    }
    while asked.len() < count {
        write(&mut rng, &mut asked);
    }

    // Until every message is settled, no delivery is pending, and the shared state and the
    // simulator hold still: long enough for an excused wait to end if it were about to
    // (Stillness::EXCUSED), else a last look in which a duplicate would show.
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut seen: Option<(Shared, usize)> = None;
    let mut since = Instant::now();
    loop {
        let shared = number.shared().await;
        let verdict = judge(&number.sim, &shared, &asked);
        let activity = number.sim.calls().len()
            + number
                .sim
                .deliveries()
                .iter()
                .map(|d| d.attempts.len())
                .sum::<usize>();
        let now = Some((shared, activity));
        if now != seen {
            seen = now;
            since = Instant::now();
        }
        let window = if verdict.unknown + verdict.blocked + verdict.notices == 0 {
            LAST_LOOK
        } else {
            Stillness::EXCUSED
        };
        let settled = verdict.finals + verdict.unknown + verdict.blocked + verdict.notices
            == asked.len()
            && number.sim.pending_deliveries() == 0;
        if (settled && since.elapsed() >= window) || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let exits = number.pair.interrupt_all();

    let shared = number.shared().await;
    let verdict = judge(&number.sim, &shared, &asked);
    let mut leftovers = Vec::new();
    for (lease, state) in &shared.leases {
        if state == "open" || state == "closing" {
            leftovers.push(format!("lease {lease} is still {state}"));
        }
        let pids = lease_processes(lease);
        if !pids.is_empty() {
            leftovers.push(format!(
                "lease {lease} ({state}) still has processes {pids:?}"
            ));
        }
    }
    let served = [0, 1].map(|n| number.pair.served(n));
    let deliveries = number.sim.deliveries();
    let redelivered = deliveries.iter().filter(|d| d.attempts.len() > 1).count();
    let lost = number.sim.calls().iter().filter(|c| !c.answered).count();
    eprintln!(
        "shared-whatsapp crash matrix figures: seed={seed} kills={kills} messages={} finals={} \
         unknown={} notices={} blocked_behind_unknown={} lost_answers={lost} webhooks={} \
         redelivered={redelivered} violations={} leftovers={} seconds={:.1}",
        asked.len(),
        verdict.finals,
        verdict.unknown,
        verdict.notices,
        verdict.blocked,
        deliveries.len(),
        verdict.problems.len(),
        leftovers.len(),
        started.elapsed().as_secs_f64()
    );
    if !verdict.problems.is_empty()
        || !leftovers.is_empty()
        || exits.iter().any(|e| !e.success())
        || !(served.iter().all(|s| *s) || kills < 2)
    {
        let kept = number.pair.dir.keep();
        panic!(
            "shared whatsapp crash matrix failed (seed {seed}; CLAWGATE_CRASH_SEED={seed} \
             replays it; logs in {}, schema {}): exits {exits:?}; each gateway served the \
             account: {served:?}; leftovers {leftovers:?}; {:?}",
            kept.display(),
            number.pair.schema,
            verdict.problems
        );
    }
}
