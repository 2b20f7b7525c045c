//! TLS against the test cluster, which runs with `ssl=on` and a certificate for 127.0.0.1 signed
//! by a throwaway CA (`CLAWGATE_TEST_PG_CA`): which connections are encrypted, and the typed
//! errors of a certificate that does not verify and of a server without TLS.

use std::path::PathBuf;
use std::time::Duration;

use clawgate_store::{ChangeFeed, IntentStore, StoreError};
use clawgate_store_postgres::{PostgresOptions, PostgresStore, PostgresTls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::config::Host;

use crate::common;

const PASSWORD: &str = "tls-test-secret";

/// The CA file of the test cluster's certificate.
fn ca_file() -> PathBuf {
    match std::env::var("CLAWGATE_TEST_PG_CA") {
        Ok(path) if !path.trim().is_empty() => PathBuf::from(path),
        _ => panic!(
            "the TLS tests need CLAWGATE_TEST_PG_CA, the CA file of the test cluster's \
             certificate: `cargo xtask ci` and `cargo xtask pg start` export it"
        ),
    }
}

/// The test server as key/value pairs with a password (trust authentication ignores it; the
/// errors must not show it) and an application name to find the store's sessions by.
fn url_with(application: &str) -> String {
    let config: tokio_postgres::Config = common::url().parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        other => panic!("the test server is reached over TCP, not {other:?}"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres");
    let dbname = config.get_dbname().unwrap_or("postgres");
    format!(
        "host={host} port={port} user={user} password={PASSWORD} dbname={dbname} \
         application_name={application}"
    )
}

fn options(schema: &str, application: &str, tls: PostgresTls) -> PostgresOptions {
    let mut options = PostgresOptions::new(url_with(application), common::instance("gw-tls"));
    options.schema = Some(schema.to_owned());
    options.pool_size = 2;
    options.tls = tls;
    options.connect_timeout = Duration::from_secs(10);
    options
}

/// Whether the server reports each session of `application` as encrypted (one entry per
/// session).
async fn ssl_of_sessions(application: &str) -> Vec<bool> {
    let admin = common::admin().await;
    admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.application_name = $1",
            &[&application],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

fn assert_no_password(error: &StoreError) {
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains(PASSWORD), "the password leaked: {shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_with_the_ca_file_encrypts_every_connection() {
    let schema = common::fresh_schema("tls-require");
    let application = format!("tls-{}", &schema[2..14]);
    let mut options = options(&schema, &application, PostgresTls::Require);
    options.ca_file = Some(ca_file());
    let store = PostgresStore::open(options).await.unwrap();
    // The pool keeps the connection this opens.
    let counts = store.count_intents_by_status().await.unwrap();
    assert!(counts.is_empty(), "{counts:?}");
    let pooled = ssl_of_sessions(&application).await;
    assert!(
        !pooled.is_empty(),
        "the pool's connection is not in pg_stat_ssl"
    );
    assert!(pooled.iter().all(|ssl| *ssl), "pooled sessions: {pooled:?}");

    let _feed = store.external_changes(Duration::from_millis(50)).unwrap();
    let feed = ssl_of_sessions(&clawgate_store_postgres::feed_application_name(&schema)).await;
    assert_eq!(feed, vec![true], "the change feed's session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_on_loopback_connects_without_tls() {
    let schema = common::fresh_schema("tls-auto-loopback");
    let application = format!("tls-{}", &schema[2..14]);
    let store = PostgresStore::open(options(&schema, &application, PostgresTls::Auto))
        .await
        .unwrap();
    store.count_intents_by_status().await.unwrap();
    let pooled = ssl_of_sessions(&application).await;
    assert!(
        !pooled.is_empty(),
        "the pool's connection is not in pg_stat_ssl"
    );
    assert!(
        pooled.iter().all(|ssl| !*ssl),
        "pooled sessions: {pooled:?}"
    );

    let _feed = store.external_changes(Duration::from_millis(50)).unwrap();
    let feed = ssl_of_sessions(&clawgate_store_postgres::feed_application_name(&schema)).await;
    assert_eq!(feed, vec![false], "the change feed's session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_without_the_ca_file_fails_certificate_verification() {
    let schema = common::fresh_schema("tls-unknown-ca");
    let options = options(&schema, "tls-unknown-ca", PostgresTls::Require);
    let error = PostgresStore::open(options).await.unwrap_err();
    match &error {
        StoreError::Unavailable { detail, .. } => {
            assert!(
                detail.contains("certificate verification failed"),
                "{detail}"
            );
            assert!(detail.contains("CA file"), "says what to do: {detail}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_no_password(&error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_ca_file_is_invalid_input() {
    let schema = common::fresh_schema("tls-bad-ca");
    let dir = tempfile::tempdir().unwrap();
    let mut options = options(&schema, "tls-bad-ca", PostgresTls::Require);
    options.ca_file = Some(dir.path().join("absent.pem"));
    let error = PostgresStore::open(options).await.unwrap_err();
    match &error {
        StoreError::InvalidInput(message) => {
            assert!(message.contains("absent.pem"), "{message}");
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    assert_no_password(&error);
}

/// A server with `ssl=off` answers the client's TLS request with `N`; this listener does just
/// that (the shared test cluster keeps TLS on for the other tests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_against_a_server_without_tls_says_so() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        // SSLRequest: length 8, code 80877103.
        let mut request = [0u8; 8];
        socket.read_exact(&mut request).await.unwrap();
        assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47], "an SSLRequest");
        socket.write_all(b"N").await.unwrap();
        // The client gives up rather than going on in clear text.
        let mut rest = Vec::new();
        let _ = socket.read_to_end(&mut rest).await;
        rest
    });
    let url = format!("postgres://gw:{PASSWORD}@127.0.0.1:{port}/state");
    let mut options = PostgresOptions::new(url, common::instance("gw-tls"));
    options.tls = PostgresTls::Require;
    options.ca_file = Some(ca_file());
    let error = PostgresStore::open(options).await.unwrap_err();
    match &error {
        StoreError::Unavailable { detail, .. } => {
            assert!(detail.contains("does not accept TLS"), "{detail}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert_no_password(&error);
    let after_refusal = server.await.unwrap();
    assert!(
        after_refusal.is_empty(),
        "the client sent {} bytes in clear text after the refusal",
        after_refusal.len()
    );
}
