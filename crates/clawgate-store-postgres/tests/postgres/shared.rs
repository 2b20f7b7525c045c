//! Several gateways on one database: two stores (two pools) stand for two gateways in one
//! process, and the tests marked so re-run this binary as a child process, a second gateway in
//! another process.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use clawgate_store::testing::sample_intent;
use clawgate_store::{
    ChangeFeed, Claim, ClaimToken, IntentStore, NewSessionEvent, NoticeCursorStore, SignalLogStore,
    WatchCursor, WatchCursorStore, WatchSource,
};
use clawgate_store_postgres::PostgresStore;
use clawgate_types::{ActorType, SessionKey, SessionStateEventKind, StateVersion};

use crate::common;

/// Marks a child process and says what it does; the parent sets the schema too.
const ROLE: &str = "CLAWGATE_PG_TEST_CHILD";
const SCHEMA: &str = "CLAWGATE_PG_TEST_SCHEMA";

fn claim(token: &str, now: i64, ttl_ms: i64) -> Claim {
    Claim {
        token: ClaimToken(token.into()),
        now,
        ttl_ms,
    }
}

fn key(text: &str) -> SessionKey {
    SessionKey::parse(text).unwrap()
}

fn event(session: &str, kind: SessionStateEventKind, actor: &str, at: i64) -> NewSessionEvent {
    NewSessionEvent {
        session_key: key(session),
        kind,
        actor_type: ActorType::Human,
        actor_id: Some(actor.to_owned()),
        summary: "human message via qa".into(),
        outcome: None,
        child_session_key: None,
        dedupe_key: None,
        created_at: at,
    }
}

/// Two gateways claiming due intents at the same time never get the same one, and between
/// them they get every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_never_claim_the_same_intent() {
    let schema = common::fresh_schema("claims");
    let a = common::open(&schema, "gw-a").await;
    let b = common::open(&schema, "gw-b").await;
    const PER_ROUND: u64 = 30;
    for round in 0..20u64 {
        let now = 1_000_000 + i64::try_from(round).unwrap() * 1_000;
        let ids: BTreeSet<String> = (0..PER_ROUND)
            .map(|n| {
                let intent = sample_intent(round * PER_ROUND + n, now - 10);
                intent.id.as_str().to_owned()
            })
            .collect();
        for n in 0..PER_ROUND {
            a.insert_intent(&sample_intent(round * PER_ROUND + n, now - 10), None)
                .await
                .unwrap();
        }
        let drain = |store: PostgresStore, token: &'static str| {
            tokio::spawn(async move {
                let mut got = Vec::new();
                loop {
                    // Claims outlive the test: nothing is freed by its deadline here.
                    let batch = store
                        .claim_due_intents(&claim(token, now, 10_000_000), 4)
                        .await
                        .unwrap();
                    if batch.is_empty() {
                        return got;
                    }
                    got.extend(batch.into_iter().map(|i| i.id.as_str().to_owned()));
                }
            })
        };
        let (got_a, got_b) = tokio::join!(drain(a.clone(), "gw-a"), drain(b.clone(), "gw-b"));
        let (got_a, got_b) = (got_a.unwrap(), got_b.unwrap());
        let set_a: BTreeSet<_> = got_a.iter().cloned().collect();
        let set_b: BTreeSet<_> = got_b.iter().cloned().collect();
        assert_eq!(
            set_a.len(),
            got_a.len(),
            "round {round}: gw-a got an intent twice"
        );
        assert_eq!(
            set_b.len(),
            got_b.len(),
            "round {round}: gw-b got an intent twice"
        );
        let both: Vec<_> = set_a.intersection(&set_b).collect();
        assert!(
            both.is_empty(),
            "round {round}: claimed by both gateways: {both:?}"
        );
        let union: BTreeSet<_> = set_a.union(&set_b).cloned().collect();
        assert_eq!(union, ids, "round {round}: every due intent claimed once");
    }
}

/// A gateway that dies holding claims cannot release them, and no other machine can check its
/// process: its claims are free exactly at their deadline, and not a millisecond before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_gateways_claims_are_free_at_their_deadline() {
    let schema = common::fresh_schema("deadline");
    let survivor = common::open(&schema, "gw-b").await;
    let first = sample_intent(1, 500);
    let second = sample_intent(2, 600);
    {
        let doomed = common::open(&schema, "gw-a").await;
        for intent in [&first, &second] {
            doomed.insert_intent(intent, None).await.unwrap();
        }
        let held = doomed
            .claim_due_intents(&claim("gw-a", 1_000, 5_000), 10)
            .await
            .unwrap();
        assert_eq!(held.len(), 2);
        // Dropped without releasing anything: the gateway died.
    }
    let before = claim("gw-b", 5_999, 5_000);
    assert!(
        survivor
            .claim_due_intents(&before, 10)
            .await
            .unwrap()
            .is_empty(),
        "a live claim is not taken"
    );
    assert_eq!(
        survivor.claim_intent(&first.id, &before).await.unwrap(),
        None,
        "a live claim is not taken by id either"
    );
    let at_deadline = claim("gw-b", 6_000, 5_000);
    let taken = survivor
        .claim_intent(&first.id, &at_deadline)
        .await
        .unwrap()
        .expect("an expired claim is free");
    assert_eq!(taken.id, first.id);
    let rest = survivor.claim_due_intents(&at_deadline, 10).await.unwrap();
    assert_eq!(
        rest.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![second.id.clone()],
        "the other expired claim is claimed by the due scan"
    );
    assert_eq!(
        survivor.claim_holders().await.unwrap(),
        vec![(ClaimToken("gw-b".into()), 2)],
        "every claim now belongs to the survivor"
    );
}

/// Runs this test binary again as a child process with `role`, on `schema`; returns its
/// standard output (the child's test must pass).
fn spawn_child(test: &str, role: &str, schema: &str) -> std::thread::JoinHandle<String> {
    let exe = std::env::current_exe().unwrap();
    let mut command = Command::new(exe);
    command
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(SCHEMA, schema);
    std::thread::spawn(move || {
        let output = command.output().expect("starting the child gateway");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "child gateway failed: {}\n{stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    })
}

fn child_role() -> Option<(String, String)> {
    let role = std::env::var(ROLE).ok()?;
    let schema = std::env::var(SCHEMA).expect("a child is told its schema");
    Some((role, schema))
}

const APPENDS_PER_WRITER: usize = 60;
const WRITERS_PER_PROCESS: usize = 3;
const HEAD_SESSION: &str = "agent:main:main";

/// `WRITERS_PER_PROCESS` concurrent writers, each appending `APPENDS_PER_WRITER` events as actor
/// `<who>-<writer>`.
async fn append_many(store: &PostgresStore, who: &str) {
    let writers: Vec<_> = (0..WRITERS_PER_PROCESS)
        .map(|w| {
            let store = store.clone();
            let actor = format!("{who}-{w}");
            tokio::spawn(async move {
                for n in 0..APPENDS_PER_WRITER {
                    let at = i64::try_from(n).unwrap();
                    store
                        .append_event(&event(
                            HEAD_SESSION,
                            SessionStateEventKind::GoalChanged,
                            &actor,
                            at,
                        ))
                        .await
                        .unwrap_or_else(|e| panic!("{actor} append {n}: {e}"));
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
}

/// Two processes (and several writers in each) append to one session at once: the head ends at
/// the number of appends, every sequence from 1 is used exactly once, and each writer's own
/// appends got increasing sequences.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_heads_stay_gap_free_across_processes() {
    if let Some((role, schema)) = child_role() {
        let store = common::open(&schema, &format!("gw-{role}")).await;
        append_many(&store, &role).await;
        return;
    }
    let schema = common::fresh_schema("heads");
    let store = common::open(&schema, "gw-parent").await;
    let test = common::test_path(
        module_path!(),
        "signal_heads_stay_gap_free_across_processes",
    );
    let child = spawn_child(&test, "child", &schema);
    append_many(&store, "parent").await;
    tokio::task::spawn_blocking(move || child.join().unwrap())
        .await
        .unwrap();

    let total = 2 * WRITERS_PER_PROCESS * APPENDS_PER_WRITER;
    let head = store.session_head(&key(HEAD_SESSION)).await.unwrap();
    assert_eq!(
        head.state_version,
        StateVersion(u64::try_from(total).unwrap())
    );
    let log = store
        .events_since(
            &key(HEAD_SESSION),
            StateVersion(0),
            u32::try_from(total + 1).unwrap(),
        )
        .await
        .unwrap();
    let sequences: Vec<u64> = log.events.iter().map(|e| e.sequence).collect();
    let expected: Vec<u64> = (1..=u64::try_from(total).unwrap()).collect();
    assert_eq!(sequences, expected, "gap-free and each sequence once");
    let mut by_actor: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for e in &log.events {
        by_actor
            .entry(e.actor_id.clone().unwrap())
            .or_default()
            .push(e.sequence);
    }
    assert_eq!(by_actor.len(), 2 * WRITERS_PER_PROCESS, "{by_actor:?}");
    for (actor, seqs) in by_actor {
        assert_eq!(seqs.len(), APPENDS_PER_WRITER, "{actor}");
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{actor}: {seqs:?}");
    }
}

const WATCHER: &str = "agent:main:main";
const TARGET: &str = "agent:main:subagent:worker";
const NOTICE_ROUNDS: usize = 120;

/// One gateway's share of notice traffic: it appends notifying work on the target and consumes
/// whatever notice it sees pending, printing `ACK <seen> <acked>` for each notice it consumed.
async fn notice_traffic(store: &PostgresStore, who: &str) -> Vec<(u64, u64)> {
    let (watcher, target) = (key(WATCHER), key(TARGET));
    let mut acks = Vec::new();
    for n in 0..NOTICE_ROUNDS {
        let at = i64::try_from(n).unwrap();
        store
            .append_event_opening_notices(&event(
                TARGET,
                SessionStateEventKind::HumanDirectMessage,
                &format!("user-{who}"),
                at,
            ))
            .await
            .unwrap();
        let cursor = store.load_cursor(&watcher, &target).await.unwrap().unwrap();
        if cursor.notified_version.is_some() {
            let seen = cursor.acked_version;
            let consumed = store
                .consume_notice(&watcher, &target, seen, at)
                .await
                .unwrap();
            if consumed.acked {
                let acked = consumed.cursor.unwrap().acked_version;
                // On a line of its own: the test harness may have started one without ending it.
                println!("\nACK {} {}", seen.0, acked.0);
                acks.push((seen.0, acked.0));
            }
        }
    }
    acks
}

/// Two processes append notifying work and consume the watcher's notices at the same time: no
/// notice is consumed twice (each acknowledged position once, in one chain), and none is lost
/// (draining what is left acknowledges exactly everything appended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_cursors_lose_no_update_across_processes() {
    if let Some((role, schema)) = child_role() {
        let store = common::open(&schema, &format!("gw-{role}")).await;
        notice_traffic(&store, &role).await;
        return;
    }
    let schema = common::fresh_schema("cursors");
    let store = common::open(&schema, "gw-parent").await;
    store
        .ensure_cursor(&WatchCursor {
            watcher_key: key(WATCHER),
            target_key: key(TARGET),
            acked_version: StateVersion(0),
            notified_version: None,
            material_version: StateVersion(0),
            target_deleted_by: None,
            source: WatchSource::Spawn,
            created_at: 0,
            updated_at: 0,
        })
        .await
        .unwrap();
    let test = common::test_path(
        module_path!(),
        "watch_cursors_lose_no_update_across_processes",
    );
    let child = spawn_child(&test, "child", &schema);
    let mut acks = notice_traffic(&store, "parent").await;
    let child_out = tokio::task::spawn_blocking(move || child.join().unwrap())
        .await
        .unwrap();
    for line in child_out.lines() {
        if let Some(rest) = line.strip_prefix("ACK ") {
            let (seen, acked) = rest.split_once(' ').unwrap();
            acks.push((seen.parse().unwrap(), acked.parse().unwrap()));
        }
    }
    assert!(acks.len() > 1, "both gateways consumed notices: {acks:?}");
    acks.sort_unstable();
    let seen: Vec<u64> = acks.iter().map(|(s, _)| *s).collect();
    let distinct: BTreeSet<u64> = seen.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        seen.len(),
        "a notice was consumed twice: {acks:?}"
    );
    for pair in acks.windows(2) {
        assert_eq!(
            pair[0].1, pair[1].0,
            "acknowledgements form one chain: {acks:?}"
        );
    }
    assert_eq!(acks[0].0, 0, "the chain starts at the cursor's start");

    let (watcher, target) = (key(WATCHER), key(TARGET));
    loop {
        let cursor = store.load_cursor(&watcher, &target).await.unwrap().unwrap();
        if cursor.notified_version.is_none() {
            let head = store.session_head(&target).await.unwrap().state_version;
            assert_eq!(
                head,
                StateVersion(u64::try_from(2 * NOTICE_ROUNDS).unwrap())
            );
            assert_eq!(
                cursor.acked_version, head,
                "every appended event was acknowledged: no notice was lost"
            );
            break;
        }
        let consumed = store
            .consume_notice(&watcher, &target, cursor.acked_version, 1_000)
            .await
            .unwrap();
        assert!(consumed.acked, "a pending notice is consumable");
    }
}

/// A notice opened by one gateway's append is consumed by exactly one of two gateways trying
/// at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_is_consumed_exactly_once_by_two_gateways() {
    let schema = common::fresh_schema("consume-once");
    let a = common::open(&schema, "gw-a").await;
    let b = common::open(&schema, "gw-b").await;
    let (watcher, target) = (key(WATCHER), key(TARGET));
    a.ensure_cursor(&WatchCursor {
        watcher_key: watcher.clone(),
        target_key: target.clone(),
        acked_version: StateVersion(0),
        notified_version: None,
        material_version: StateVersion(0),
        target_deleted_by: None,
        source: WatchSource::Spawn,
        created_at: 0,
        updated_at: 0,
    })
    .await
    .unwrap();
    for round in 0..40u64 {
        let at = i64::try_from(round).unwrap();
        let opened = b
            .append_event_opening_notices(&event(
                TARGET,
                SessionStateEventKind::HumanDirectMessage,
                "user-1",
                at,
            ))
            .await
            .unwrap();
        assert_eq!(
            opened.opened.len(),
            1,
            "round {round}: B's append opened the notice"
        );
        let seen = StateVersion(round);
        let (ra, rb) = tokio::join!(
            a.consume_notice(&watcher, &target, seen, at),
            b.consume_notice(&watcher, &target, seen, at)
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(
            ra.acked != rb.acked,
            "round {round}: exactly one gateway consumes (a: {}, b: {})",
            ra.acked,
            rb.acked
        );
    }
}

/// Appends a material event (a goal change by `u`) at `at` to the feed tests' session.
async fn append_goal_change(store: &PostgresStore, at: i64) {
    store
        .append_event(&event(
            HEAD_SESSION,
            SessionStateEventKind::GoalChanged,
            "u",
            at,
        ))
        .await
        .unwrap();
}

async fn changed_within(rx: &mut tokio::sync::watch::Receiver<u64>, wait: Duration) -> bool {
    tokio::time::timeout(wait, rx.changed())
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Store A's feed fires when store B appends; not for another schema's writes; and after its
/// connection is cut it listens again, announcing the gap once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_feed_hears_other_gateways_and_survives_a_lost_connection() {
    let schema = common::fresh_schema("feed");
    let a = common::open(&schema, "gw-a").await;
    let b = common::open(&schema, "gw-b").await;
    let elsewhere = common::open(&common::fresh_schema("feed-other"), "gw-c").await;
    let mut feed = a.external_changes(Duration::from_millis(20)).unwrap();
    feed.borrow_and_update();

    append_goal_change(&elsewhere, 1).await;
    assert!(
        !changed_within(&mut feed, Duration::from_millis(300)).await,
        "another schema's write is not this state's change"
    );

    append_goal_change(&b, 2).await;
    assert!(
        changed_within(&mut feed, Duration::from_secs(30)).await,
        "B's append is announced to A"
    );
    feed.borrow_and_update();

    let admin = common::admin().await;
    let cut = admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&clawgate_store_postgres::feed_application_name(&schema)],
        )
        .await
        .unwrap();
    assert_eq!(cut, 1, "the feed's one connection was found and cut");
    assert!(
        changed_within(&mut feed, Duration::from_secs(30)).await,
        "listening again is announced (what happened meanwhile is unknown)"
    );
    feed.borrow_and_update();
    append_goal_change(&b, 3).await;
    assert!(
        changed_within(&mut feed, Duration::from_secs(30)).await,
        "after reconnecting the feed hears writes again"
    );
}

/// Intents and inbound records are not announced: notices never depend on them, and a
/// NOTIFY in a transaction serialises its commit with every other notifying commit of the
/// database, which held every gateway's sends to one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_send_path_is_not_announced() {
    let schema = common::fresh_schema("feed-quiet");
    let a = common::open(&schema, "gw-a").await;
    let b = common::open(&schema, "gw-b").await;
    let mut feed = a.external_changes(Duration::from_millis(20)).unwrap();
    feed.borrow_and_update();
    b.insert_intent(&sample_intent(1, 1), None).await.unwrap();
    assert!(
        !changed_within(&mut feed, Duration::from_millis(500)).await,
        "an intent write is not announced"
    );
    append_goal_change(&b, 1).await;
    assert!(
        changed_within(&mut feed, Duration::from_secs(30)).await,
        "a signal event still is"
    );
}
