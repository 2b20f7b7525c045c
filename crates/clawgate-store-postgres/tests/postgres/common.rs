//! Reaching the test server, and one schema per test (or per conformance directory).

use std::path::Path;

use clawgate_store_postgres::{PostgresOptions, PostgresStore};
use clawgate_types::GatewayInstanceId;
use sha2::{Digest, Sha256};

/// The superuser URL of a throwaway cluster; these tests never run against nothing.
pub(crate) fn url() -> String {
    clawgate_store_postgres::testing::server_url()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The same directory always maps to the same schema (a reopen finds its state); two
/// directories to two schemas (cases are isolated).
pub(crate) fn schema_for_dir(dir: &Path) -> String {
    let digest = Sha256::digest(dir.as_os_str().as_encoded_bytes());
    format!("conf_{}", &hex(&digest)[..24])
}

/// A schema no other test or run uses.
pub(crate) fn fresh_schema(test: &str) -> String {
    clawgate_store_postgres::testing::fresh_schema(test)
}

pub(crate) fn instance(name: &str) -> GatewayInstanceId {
    GatewayInstanceId::parse(name).unwrap()
}

pub(crate) fn options(schema: &str, instance_name: &str) -> PostgresOptions {
    let mut options = PostgresOptions::new(url(), instance(instance_name));
    options.schema = Some(schema.to_owned());
    options.pool_size = 4;
    options
}

/// One gateway's store on `schema`.
pub(crate) async fn open(schema: &str, instance_name: &str) -> PostgresStore {
    PostgresStore::open(options(schema, instance_name))
        .await
        .unwrap_or_else(|e| panic!("opening the PostgreSQL store on schema {schema}: {e}"))
}

/// The conformance suite's `open`: synchronous, called inside a multi-thread runtime.
pub(crate) fn open_dir(dir: &Path) -> PostgresStore {
    let schema = schema_for_dir(dir);
    let instance_name = format!("gw-{}", &schema[5..17]);
    tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(open(&schema, &instance_name))
    })
}

/// A plain client of the test server (to inspect or tamper with a schema).
pub(crate) async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to CLAWGATE_TEST_PG_URL: {e}"));
    tokio::spawn(connection);
    client
}

/// The name `module_path!()`-relative test `name` has inside this test binary, for `--exact`.
pub(crate) fn test_path(module: &str, name: &str) -> String {
    let module = module.split_once("::").map_or("", |(_, rest)| rest);
    if module.is_empty() {
        name.to_owned()
    } else {
        format!("{module}::{name}")
    }
}
