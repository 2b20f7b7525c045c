//! Test peer: a second gateway process on the same state directory. It serves no watchers; it
//! records `count` human direct messages on a target session and exits, so a test can check that
//! the notice reaches a watcher served by another process.
//!
//! usage: awareness-peer STATE_DIR TARGET_SESSION_KEY COUNT

use std::sync::Arc;

use clawgate_awareness::{Actor, Awareness, StateChange};
use clawgate_store::{SqliteOptions, SqliteStore};
use clawgate_types::SessionKey;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, target, count] = args.as_slice() else {
        anyhow::bail!("usage: awareness-peer STATE_DIR TARGET_SESSION_KEY COUNT");
    };
    let target = SessionKey::parse(target)?;
    let count: u32 = count.parse()?;
    let store = Arc::new(SqliteStore::open_state_dir(
        dir.as_ref(),
        SqliteOptions::default(),
    )?);
    let awareness = Awareness::builder(store)
        .serving(Arc::new(|_| false))
        .build();
    for _ in 0..count {
        let change = StateChange::human_direct_message(Actor::human("peer-user"), "qa");
        let event = awareness
            .record(&target, change)
            .await
            .ok_or_else(|| anyhow::anyhow!("the append failed (see the log)"))?;
        println!("{}", event.event.sequence);
    }
    Ok(())
}
