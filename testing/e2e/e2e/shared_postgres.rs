//! The cross-process cases on a shared PostgreSQL state (`CLAWGATE_TEST_PG_URL`): a notice
//! caused by one gateway process reaches a watcher served by another, through `LISTEN/NOTIFY`.

use std::sync::Arc;

use clawgate_store_postgres::{PostgresOptions, PostgresStore};
use clawgate_types::GatewayInstanceId;

use crate::awareness_cross_process::{PeerStore, a_notice_crosses_processes};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_caused_by_another_gateway_reaches_this_gateways_watcher() {
    let url = clawgate_store_postgres::testing::server_url();
    let schema = clawgate_store_postgres::testing::fresh_schema("awareness-peer");
    let mut options = PostgresOptions::new(url.clone(), GatewayInstanceId::parse("gw-a").unwrap());
    options.schema = Some(schema.clone());
    let store = Arc::new(PostgresStore::open(options).await.unwrap());
    a_notice_crosses_processes(store, &PeerStore::Postgres { url, schema }).await;
}
