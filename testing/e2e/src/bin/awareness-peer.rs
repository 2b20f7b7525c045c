//! Test peer: a second gateway process on the same state directory. It serves no watchers; it
//! records `count` human direct messages on a target session and exits, so a test can check that
//! the notice reaches a watcher served by another process.
//!
//! usage: awareness-peer STATE_DIR TARGET_SESSION_KEY COUNT
//!        awareness-peer - TARGET_SESSION_KEY COUNT   (PostgreSQL: AWARENESS_PEER_PG_URL and
//!                                                     AWARENESS_PEER_PG_SCHEMA name the state)
//!        awareness-peer queue STATE_DIR
//!
//! `queue` plays a gateway that serves `agent:main:main`: it spawns children a and b, a human
//! changes both (two notices pending for main), prints `QUEUED`, and waits to be killed.

use std::sync::Arc;

use clawgate_awareness::{Actor, Awareness, StateChange};
use clawgate_store_sqlite::{SqliteOptions, SqliteStore};
use clawgate_types::SessionKey;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, dir] = args.as_slice()
        && mode == "queue"
    {
        return queue(dir).await;
    }
    let [dir, target, count] = args.as_slice() else {
        anyhow::bail!("usage: awareness-peer STATE_DIR TARGET_SESSION_KEY COUNT");
    };
    let target = SessionKey::parse(target)?;
    let count: u32 = count.parse()?;
    let store: Arc<dyn clawgate_store::Store> = if dir == "-" {
        let mut options = clawgate_store_postgres::PostgresOptions::new(
            std::env::var("AWARENESS_PEER_PG_URL")?,
            clawgate_types::GatewayInstanceId::parse("awareness-peer")?,
        );
        options.schema = Some(std::env::var("AWARENESS_PEER_PG_SCHEMA")?);
        Arc::new(clawgate_store_postgres::PostgresStore::open(options).await?)
    } else {
        Arc::new(SqliteStore::open_state_dir(
            dir.as_ref(),
            SqliteOptions::default(),
        )?)
    };
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

async fn queue(dir: &str) -> anyhow::Result<()> {
    use clawgate_awareness::{NewSession, SpawnChild};
    let store = Arc::new(SqliteStore::open_state_dir(
        dir.as_ref(),
        SqliteOptions::default(),
    )?);
    let awareness = Awareness::builder(store).build();
    let main = SessionKey::parse("agent:main:main")?;
    awareness
        .create_session(NewSession::new(main.clone()), Actor::system("peer"))
        .await?;
    for child in ["agent:main:subagent:a", "agent:main:subagent:b"] {
        let child = SessionKey::parse(child)?;
        awareness
            .spawn_child(SpawnChild {
                parent: main.clone(),
                child: NewSession::new(child.clone()),
            })
            .await?;
        let change = StateChange::human_direct_message(Actor::human("peer-user"), "qa");
        awareness
            .record(&child, change)
            .await
            .ok_or_else(|| anyhow::anyhow!("append failed"))?;
    }
    anyhow::ensure!(
        awareness.pending_notices(&main).len() == 2,
        "two notices queued"
    );
    println!("QUEUED");
    // Until SIGKILL: no shutdown path runs.
    std::future::pending::<()>().await;
    Ok(())
}
