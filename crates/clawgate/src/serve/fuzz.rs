//! The control API's path and query parameters as outside input: every route of `clawgate up`,
//! served on loopback as `up` serves it, asked with odd ids and session keys in the path
//! (percent-encoded or raw, invalid escapes included), odd, repeated and unknown query
//! parameters, and mutated JSON bodies. Every answer is a client or success status with a JSON
//! body, never a server error. `CLAWGATE_FUZZ_CASES` requests (`cargo xtask soak` sets it
//! high).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawgate_channel_sdk::ChannelRegistry;
use clawgate_channel_sdk::testing::MemoryFactory;
use clawgate_fuzz::proptest::prelude::*;
use clawgate_fuzz::proptest::sample::select;

use crate::config::Config;
use crate::gateway::Gateway;

const TOKEN: &str = "fuzz-token";

fn config(state: &Path) -> Config {
    let text = format!(
        "state_dir = {state:?}\n\
         [gateway]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_ms = 1000\n\n\
         [[agents]]\nid = \"main\"\n\n\
         [[channels]]\nkind = \"memory\"\n[channels.settings]\nmode = \"polling\"\n"
    );
    Config::parse(&text, "fuzz.toml").expect("valid configuration")
}

/// Every byte but the unreserved ones as `%XX`.
fn escaped(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A path segment: a session key or id, an odd string escaped, or raw odd escapes.
fn segment() -> BoxedStrategy<String> {
    prop_oneof![
        2 => select(vec![
            "agent:main:main",
            "agent:main:memory:direct:ada",
            "operator",
            "0194f5b2-7c1d-7e2f-8a3b-4c5d6e7f8091",
            "agent::",
            ":::",
        ])
        .prop_map(str::to_owned),
        3 => clawgate_fuzz::odd_string().prop_map(|s| escaped(&s)),
        1 => select(vec!["..", "%", "%zz", "%00", "%FF%FE", "a%2Fb", "%2e%2e", "%C0%AF"])
            .prop_map(str::to_owned),
    ]
    .boxed()
}

/// A query string: known and unknown names, odd values, names repeated.
fn query() -> BoxedStrategy<String> {
    let name = prop_oneof![
        4 => select(vec!["status", "channel", "limit", "state", "changesSince", "kinds", "minutes"])
            .prop_map(str::to_owned),
        1 => clawgate_fuzz::odd_string(),
    ];
    let value = prop_oneof![
        select(vec![
            "0",
            "1",
            "-1",
            "1000",
            "1001",
            "4294967296",
            "18446744073709551616",
            "1e3",
            "failed,unknown_after_send",
            "open,closing",
            ",,",
            "pending",
        ])
        .prop_map(str::to_owned),
        clawgate_fuzz::odd_string(),
    ];
    clawgate_fuzz::proptest::collection::vec((name, value), 0..4)
        .prop_map(|pairs| {
            pairs
                .iter()
                .map(|(k, v)| format!("{}={}", escaped(k), escaped(v)))
                .collect::<Vec<_>>()
                .join("&")
        })
        .boxed()
}

/// (method, path and query, body) for one request to one route.
fn request() -> BoxedStrategy<(reqwest::Method, String, Vec<u8>)> {
    let body = clawgate_fuzz::json_texts(vec![
        serde_json::json!({ "message": "hello", "watch": false, "from": "agent:main:main" }),
    ]);
    (0usize..11, segment(), query(), body)
        .prop_map(|(route, seg, query, body)| {
            let (method, path) = match route {
                0 => (reqwest::Method::GET, "/v1/outbox".to_owned()),
                1 => (reqwest::Method::GET, format!("/v1/outbox/{seg}")),
                2 => (reqwest::Method::POST, format!("/v1/outbox/{seg}/retry")),
                3 => (reqwest::Method::POST, format!("/v1/outbox/{seg}/cancel")),
                4 => (reqwest::Method::GET, "/v1/inbox".to_owned()),
                5 => (reqwest::Method::GET, "/v1/leases".to_owned()),
                6 => (reqwest::Method::GET, "/v1/sessions".to_owned()),
                7 => (reqwest::Method::GET, format!("/v1/sessions/{seg}")),
                8 => (reqwest::Method::GET, format!("/v1/sessions/{seg}/history")),
                9 => (reqwest::Method::GET, "/v1/metrics".to_owned()),
                _ => (reqwest::Method::POST, format!("/v1/sessions/{seg}/send")),
            };
            let body = if method == reqwest::Method::POST {
                body
            } else {
                Vec::new()
            };
            (method, format!("{path}?{query}"), body)
        })
        .boxed()
}

#[test]
fn control_api_answers_odd_paths_and_queries_without_a_server_error() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut registry = ChannelRegistry::new();
    registry.register(Arc::new(MemoryFactory::default()));
    // No agent runs here: nothing is polled and no turn starts (`/bin/false` as the wrapper
    // would fail one at once).
    let (gateway, base) = runtime.block_on(async {
        let gateway =
            Gateway::start_with(config(dir.path()), &registry, PathBuf::from("/bin/false"))
                .await
                .expect("a gateway");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("loopback port");
        let port = listener.local_addr().expect("address").port();
        let app = super::app(&gateway, TOKEN, port);
        tokio::spawn(async move { axum::serve(listener, app).await });
        (gateway, format!("http://127.0.0.1:{port}"))
    });
    let client = reqwest::Client::new();
    clawgate_fuzz::run("control API", request(), |(method, path, body)| {
        runtime.block_on(async {
            let response = match client
                .request(method.clone(), format!("{base}{path}"))
                .bearer_auth(TOKEN)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await
            {
                Ok(response) => response,
                // A URL the client itself will not send (over its length limit): not a request.
                Err(e) if e.is_builder() => return Ok(()),
                Err(e) => return Err(TestCaseError::fail(format!("{method} {path}: {e}"))),
            };
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            prop_assert!(
                !status.is_server_error(),
                "{} {} answered {}: {}",
                method,
                path,
                status,
                text
            );
            // Every answer is JSON, a path no route matches (an empty segment) too.
            prop_assert!(
                serde_json::from_str::<serde_json::Value>(&text).is_ok(),
                "{} {} answered {} without JSON: {:?}",
                method,
                path,
                status,
                text
            );
            Ok(())
        })
    });
    runtime.block_on(gateway.shutdown());
}
