//! SQLite's page caches are given back on request, and the data stays readable.

use clawgate_store::{NewSessionEvent, SignalLogStore};
use clawgate_store_sqlite::{SqliteOptions, Synchronous, release_page_caches, sqlite_memory_used};
use clawgate_types::{ActorType, SessionKey, SessionStateEventKind, StateVersion};

const SESSIONS: usize = 200;
const EVENTS_PER_SESSION: usize = 20;

fn session(n: usize) -> SessionKey {
    SessionKey::parse(&format!("agent:main:qa:conv-{n}")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_page_caches_frees_what_a_large_read_cached_and_the_data_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = clawgate_store_sqlite::testing::open_store_with(
        dir.path(),
        SqliteOptions {
            synchronous: Synchronous::Normal,
            ..SqliteOptions::default()
        },
    );
    // About 4 MiB of events, written in group commits.
    let writes: Vec<_> = (0..SESSIONS)
        .map(|s| {
            let store = store.clone();
            tokio::spawn(async move {
                for e in 0..EVENTS_PER_SESSION {
                    store
                        .append_event(&NewSessionEvent {
                            session_key: session(s),
                            kind: SessionStateEventKind::HumanDirectMessage,
                            actor_type: ActorType::Human,
                            actor_id: Some(format!("person-{s}")),
                            summary: format!("{e}: {}", "x".repeat(1_000)),
                            outcome: None,
                            child_session_key: None,
                            dedupe_key: None,
                            created_at: 1_000 + e as i64,
                        })
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for write in writes {
        write.await.unwrap();
    }

    let read_all = || async {
        let mut events = 0;
        for s in 0..SESSIONS {
            events += store
                .events_since(&session(s), StateVersion(0), 1_000)
                .await
                .unwrap()
                .events
                .len();
        }
        events
    };
    assert_eq!(read_all().await, SESSIONS * EVENTS_PER_SESSION);
    let cached = sqlite_memory_used();

    let freed = release_page_caches();
    let after = sqlite_memory_used();
    assert!(
        freed >= 1 << 20,
        "only {freed} bytes freed of {cached} SQLite held after reading every event"
    );
    assert!(
        after + (1 << 20) <= cached,
        "SQLite held {cached} bytes before the release and {after} after"
    );
    // Pages are read again as needed.
    assert_eq!(read_all().await, SESSIONS * EVENTS_PER_SESSION);
}
