//! Every write the store acknowledged survives a SIGKILL of the process that made it, and two
//! processes writing one database never lose or corrupt each other's writes.

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use clawgate_store::IntentStore;
use clawgate_types::IntentId;

const WRITER: &str = env!("CARGO_BIN_EXE_intent-writer");

/// A running writer and the ids it has acknowledged so far (read on a thread).
struct Writer {
    child: Child,
    acked: mpsc::Receiver<String>,
}

fn start(dir: &std::path::Path, prefix: &str, count: u64, concurrency: u64) -> Writer {
    let mut child = Command::new(WRITER)
        .args([
            dir.to_str().unwrap(),
            prefix,
            &count.to_string(),
            &concurrency.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, acked) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line != "ready" && tx.send(line).is_err() {
                break;
            }
        }
    });
    Writer { child, acked }
}

impl Writer {
    /// Waits (with a deadline) until `n` more writes were acknowledged.
    fn wait_for(&self, n: usize, seen: &mut Vec<String>) {
        let target = seen.len() + n;
        while seen.len() < target {
            match self.acked.recv_timeout(Duration::from_secs(30)) {
                Ok(id) => seen.push(id),
                Err(e) => panic!(
                    "writer stopped acknowledging after {} writes: {e}",
                    seen.len()
                ),
            }
        }
    }

    fn kill(mut self, seen: &mut Vec<String>) {
        // SIGKILL: no destructor, no flush, no checkpoint.
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        // Lines printed before the kill were acknowledged before it.
        while let Ok(id) = self.acked.recv_timeout(Duration::from_millis(200)) {
            seen.push(id);
        }
    }

    fn finish(mut self, seen: &mut Vec<String>) {
        assert!(
            self.child.wait().unwrap().success(),
            "writer exited with an error"
        );
        seen.extend(self.acked.iter());
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn assert_all_present(dir: &std::path::Path, ids: &[String]) {
    let store = clawgate_store_sqlite::testing::open_store(dir);
    for id in ids {
        let id = IntentId::parse(id.as_str()).unwrap();
        assert!(
            store.load_intent(&id).await.unwrap().is_some(),
            "acknowledged intent {id} was lost"
        );
    }
}

fn integrity_ok(dir: &std::path::Path) {
    let conn = rusqlite::Connection::open(dir.join(clawgate_store_sqlite::STATE_DB_FILE)).unwrap();
    let verdict: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(verdict, "ok");
}

#[test]
fn acknowledged_writes_survive_sigkill_mid_group_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut acked = Vec::new();
    // Three lives, each killed while 32 writers keep the group commit busy.
    for (round, at) in [(0, 150usize), (1, 400), (2, 700)] {
        let writer = start(dir.path(), &format!("r{round}"), 1_000_000, 32);
        writer.wait_for(at, &mut acked);
        writer.kill(&mut acked);
    }
    assert!(
        acked.len() >= 1_250,
        "the writers made progress: {}",
        acked.len()
    );
    integrity_ok(dir.path());
    runtime().block_on(assert_all_present(dir.path(), &acked));
}

#[test]
fn two_processes_share_one_database() {
    let dir = tempfile::tempdir().unwrap();
    // Create the schema first so both processes start on a migrated file.
    drop(clawgate_store_sqlite::testing::open_store(dir.path()));
    let a = start(dir.path(), "a", 600, 8);
    let b = start(dir.path(), "b", 600, 8);
    let mut acked = Vec::new();
    a.finish(&mut acked);
    b.finish(&mut acked);
    assert_eq!(
        acked.len(),
        1_200,
        "every write of both processes was acknowledged"
    );
    integrity_ok(dir.path());
    runtime().block_on(async {
        assert_all_present(dir.path(), &acked).await;
        let store = clawgate_store_sqlite::testing::open_store(dir.path());
        let total: u64 = store
            .count_intents_by_status()
            .await
            .unwrap()
            .iter()
            .map(|(_, n)| n)
            .sum();
        assert_eq!(total, 1_200, "nothing written twice");
    });
}
