//! A notice caused by one gateway process reaches a watcher served by another process on the
//! same database (the seed page's v1 limit, lifted through the store's change feed).

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clawgate_awareness::{
    Actor, Awareness, AwarenessConfig, HeartbeatHook, NewSession, SpawnChild,
};
use clawgate_store::Store;
use clawgate_types::SessionKey;
use tokio::sync::mpsc;

const PEER: &str = env!("CARGO_BIN_EXE_awareness-peer");

struct ChannelHeartbeat {
    tx: Mutex<mpsc::UnboundedSender<SessionKey>>,
}

impl HeartbeatHook for ChannelHeartbeat {
    fn wake(&self, session: &SessionKey) {
        let _ = self.tx.lock().unwrap().send(session.clone());
    }
}

/// Runs the peer process: `count` human messages on `target` through its own store. `store`
/// names the state: a SQLite state directory, or (with `pg`) a PostgreSQL URL and schema.
pub(crate) fn run_peer(store: &PeerStore, target: &SessionKey, count: u32) {
    let mut command = Command::new(PEER);
    match store {
        PeerStore::Sqlite(dir) => command.arg(dir),
        PeerStore::Postgres { url, schema } => command
            .arg("-")
            .env("AWARENESS_PEER_PG_URL", url)
            .env("AWARENESS_PEER_PG_SCHEMA", schema),
    };
    let out = command
        .args([target.as_str(), &count.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "peer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        count as usize
    );
}

/// Where the peer process keeps its state.
pub(crate) enum PeerStore {
    Sqlite(std::path::PathBuf),
    Postgres { url: String, schema: String },
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_caused_by_another_process_reaches_this_processs_watcher() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    a_notice_crosses_processes(store, &PeerStore::Sqlite(dir.path().to_path_buf())).await;
}

/// This process serves `agent:main:main`, which watches its child; the peer process, on the
/// same state, changes the child. Exactly one notice reaches main, coalesced, reopened once.
pub(crate) async fn a_notice_crosses_processes(store: Arc<dyn Store>, peer: &PeerStore) {
    let (tx, mut woken) = mpsc::unbounded_channel();
    let config = AwarenessConfig {
        external_poll_interval: Duration::from_millis(10),
        ..AwarenessConfig::default()
    };
    let awareness = Arc::new(
        Awareness::builder(store)
            .heartbeat(Arc::new(ChannelHeartbeat { tx: Mutex::new(tx) }))
            .config(config)
            .build(),
    );
    let main = SessionKey::parse("agent:main:main").unwrap();
    awareness
        .create_session(NewSession::new(main.clone()), Actor::system("test"))
        .await
        .unwrap();
    let spawned = awareness
        .spawn_child(SpawnChild {
            parent: main.clone(),
            child: NewSession::new(SessionKey::parse("agent:main:subagent:child").unwrap()),
        })
        .await
        .unwrap();
    let child = spawned.row.session_key;
    let follower = awareness.follow_external_changes().unwrap();

    // Process B appends; process A (this one) serves the watcher.
    run_peer(peer, &child, 1);
    let deadline = Duration::from_secs(30);
    let first = tokio::time::timeout(deadline, woken.recv())
        .await
        .expect("the main session is woken by another process's change within the deadline")
        .unwrap();
    assert_eq!(first, main);
    let pending = awareness.pending_notices(&main);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].changes_since, spawned.creation_version);

    // Twenty more changes from process B: still one byte-identical line, no second wake.
    let text = pending[0].text();
    run_peer(peer, &child, 20);
    awareness.rebuild_notices().await.unwrap();
    assert_eq!(
        awareness
            .pending_notices(&main)
            .iter()
            .map(|n| n.text())
            .collect::<Vec<_>>(),
        vec![text]
    );
    assert!(woken.try_recv().is_err(), "coalesced: no second wake");

    // The interleaved work from process B reopens exactly one notice when A consumes.
    assert_eq!(awareness.consume_notices(&main).await.len(), 1);
    let reopened = awareness.pending_notices(&main);
    assert_eq!(reopened.len(), 1);
    assert_eq!(reopened[0].changes_since.0, spawned.creation_version.0 + 1);
    awareness.consume_notices(&main).await;
    assert!(awareness.pending_notices(&main).is_empty());
    follower.abort();
}

/// The restart test with a real kill: a gateway process queues notices and is killed with
/// SIGKILL; a new process on the same file gets exactly those notices back, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_notices_come_back_exactly_once_after_kill_9() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().unwrap();
    let mut peer = Command::new(PEER)
        .args(["queue", dir.path().to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let line = std::io::BufReader::new(peer.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    assert_eq!(line, "QUEUED");
    peer.kill().unwrap();
    peer.wait().unwrap();

    let store = Arc::new(clawgate_store_sqlite::testing::open_store(dir.path()));
    let awareness = Awareness::builder(store).build();
    let main = SessionKey::parse("agent:main:main").unwrap();
    assert!(
        awareness.pending_notices(&main).is_empty(),
        "nothing before the rebuild"
    );
    awareness.rebuild_notices().await.unwrap();
    let back: Vec<String> = awareness
        .pending_notices(&main)
        .iter()
        .map(|n| n.target.to_string())
        .collect();
    assert_eq!(back.len(), 2, "exactly the two pending notices: {back:?}");
    awareness.rebuild_notices().await.unwrap();
    assert_eq!(
        awareness.pending_notices(&main).len(),
        2,
        "a second rebuild adds nothing"
    );
    assert_eq!(awareness.consume_notices(&main).await.len(), 2);
    awareness.rebuild_notices().await.unwrap();
    assert!(
        awareness.pending_notices(&main).is_empty(),
        "consumed notices never come back"
    );
}
