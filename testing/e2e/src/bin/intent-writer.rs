//! Test peer: appends send intents to a state directory as fast as it can and prints the id of
//! each one the store acknowledged, so a test can kill it with SIGKILL at any moment and check
//! that every acknowledged write survived.
//!
//! usage: intent-writer STATE_DIR PREFIX COUNT CONCURRENCY

use std::io::Write as _;
use std::sync::Arc;

use clawgate_store::IntentStore;
use clawgate_store::testing::sample_intent;
use clawgate_store_sqlite::{SqliteOptions, SqliteStore};
use clawgate_types::IntentId;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, prefix, count, concurrency] = args.as_slice() else {
        anyhow::bail!("usage: intent-writer STATE_DIR PREFIX COUNT CONCURRENCY");
    };
    let count: u64 = count.parse()?;
    let concurrency: u64 = concurrency.parse()?;
    let store = Arc::new(SqliteStore::open_state_dir(
        dir.as_ref(),
        SqliteOptions::default(),
    )?);
    println!("ready");
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let store = store.clone();
            let prefix = prefix.clone();
            tokio::spawn(async move {
                let mut n = task;
                while n < count {
                    let mut intent = sample_intent(n, n as i64);
                    intent.id = IntentId::parse(format!("{prefix}-{n}"))?;
                    intent.idempotency_key = format!("{prefix}-key-{n}");
                    store.insert_intent(&intent, None).await?;
                    // One line per acknowledged (committed) write.
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{}", intent.id)?;
                    out.flush()?;
                    n += concurrency;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}
