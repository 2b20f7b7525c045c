//! The cross-process cases on a shared PostgreSQL state (`CLAWGATE_TEST_PG_URL`): a notice
//! caused by one gateway process reaches a watcher served by another, through `LISTEN/NOTIFY`.

use std::sync::Arc;

use clawgate_store_postgres::{PostgresOptions, PostgresStore};
use clawgate_types::GatewayInstanceId;

use crate::awareness_cross_process::{PeerStore, a_notice_crosses_processes};

fn server_url() -> String {
    match std::env::var("CLAWGATE_TEST_PG_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "PostgreSQL tests need CLAWGATE_TEST_PG_URL; `cargo xtask ci` starts a throwaway \
             cluster, `cargo xtask pg start` prints one for local use; set CLAWGATE_TEST_PG=0 \
             to leave these tests out"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_caused_by_another_gateway_reaches_this_gateways_watcher() {
    let url = server_url();
    let schema = format!("aware_{}", std::process::id());
    let mut options = PostgresOptions::new(url.clone(), GatewayInstanceId::parse("gw-a").unwrap());
    options.schema = Some(schema.clone());
    let store = Arc::new(PostgresStore::open(options).await.unwrap());
    a_notice_crosses_processes(store, &PeerStore::Postgres { url, schema }).await;
}
