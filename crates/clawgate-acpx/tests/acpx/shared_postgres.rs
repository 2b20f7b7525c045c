//! Agent process leases stay per machine when gateways share one PostgreSQL state
//! (`CLAWGATE_TEST_PG_URL`): a gateway reaps only its own instance's leases, never another's,
//! even though it reads them from the same tables.

use std::sync::Arc;

use clawgate_acpx::CloseOutcome;
use clawgate_store::Store;
use clawgate_store_postgres::{PostgresOptions, PostgresStore};
use clawgate_types::{GatewayInstanceId, LeaseState};

use crate::real_processes::{alive, ensure_input, two_gateways};
use crate::support::*;

async fn gateway_store(url: &str, schema: &str, instance: &str) -> Arc<dyn Store> {
    let mut options = PostgresOptions::new(url, GatewayInstanceId::parse(instance).unwrap());
    options.schema = Some(schema.to_owned());
    Arc::new(PostgresStore::open(options).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_reaps_only_its_own_instances_leases_on_a_shared_database() {
    let url = clawgate_store_postgres::testing::server_url();
    let schema = clawgate_store_postgres::testing::fresh_schema("acpx-leases");
    let store_a = gateway_store(&url, &schema, "gateway-a").await;
    let store_b = gateway_store(&url, &schema, "gateway-b").await;
    let (a, b) = two_gateways(store_a.clone(), store_b.clone()).await;

    let dir = tempfile::tempdir().unwrap();
    let input = ensure_input("shared-db", vec![test_agent()], dir.path());
    let handle = a.ensure_session(input.clone()).await.unwrap();
    // B sees A's lease in the shared tables …
    let seen = store_b.load_lease(&handle.lease_id).await.unwrap().unwrap();
    assert_eq!(seen.state, LeaseState::Open);
    // … and its startup reap (as after B's own crash) leaves it alone.
    let reap = b.reap_startup_orphans(2).await.unwrap();
    assert!(
        reap.outcomes.is_empty(),
        "B reaps only its own instance's leases: {reap:?}"
    );
    assert!(alive(handle.root_pid) && alive(handle.process_group_id));
    assert_eq!(
        store_a
            .load_lease(&handle.lease_id)
            .await
            .unwrap()
            .unwrap()
            .state,
        LeaseState::Open
    );
    // A's tree still serves prompts, and A closes it.
    let turn = a.prompt(&handle, "still here", |_| {}).await.unwrap();
    assert_eq!(turn.chunks.concat(), "echo: still here");
    assert!(matches!(
        a.close_session(&input.session_key, "test", 3)
            .await
            .unwrap(),
        CloseOutcome::Closed(_)
    ));
}
