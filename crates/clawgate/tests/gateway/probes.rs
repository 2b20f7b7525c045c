//! Black-box probes of the gateway's listener, as an attacker on the same machine or behind a
//! web page would send them, against the real binary: what must hold stays pinned here.
//! - the control API wants exactly one `Authorization: Bearer <token>` (not a wrong one, not
//!   the token in the query, not two headers);
//! - every route refuses a `Host` that is not a loopback name (other spellings of loopback
//!   and an empty or missing `Host` included) with 421;
//! - a cross-origin `text/plain` POST (what a web page can send without asking) injects
//!   nothing through the chat page;
//! - odd path ids (traversal, NUL, CR/LF, very long, odd Unicode, invalid UTF-8) and odd query
//!   values are a 4xx, never a 5xx;
//! - a malformed JSON body of any shape is a JSON 400 (or 413 over the limit), never a 5xx;
//! - a path no route serves is a JSON 404, a method a route does not take a JSON 405 (with
//!   `Allow`), each naming what was asked;
//! - at `trace`, no token reaches the log.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use reqwest::StatusCode;

use crate::support::{GatewayProcess, config_file, platform_token};

struct Probed {
    gateway: GatewayProcess,
    _dir: tempfile::TempDir,
    token: String,
    http: reqwest::Client,
}

impl Probed {
    async fn start() -> Probed {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let config = config_file(dir.path(), None, &[]);
        let gateway = GatewayProcess::try_start(&state, &config, &[("CLAWGATE_LOG", "trace")])
            .expect("gateway starts");
        let runtime: serde_json::Value = serde_json::from_slice(
            &std::fs::read(state.join("gateway.json")).expect("gateway.json"),
        )
        .expect("gateway.json is JSON");
        let token = runtime["controlToken"]
            .as_str()
            .expect("a control token")
            .to_owned();
        Probed {
            gateway,
            _dir: dir,
            token,
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("client"),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.gateway.url)
    }

    fn port(&self) -> u16 {
        self.gateway
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("the URL has a port")
    }

    /// A raw HTTP/1.1 exchange (for heads reqwest would not send): the status code.
    fn raw(&self, head: &str) -> u16 {
        let mut socket =
            std::net::TcpStream::connect(("127.0.0.1", self.port())).expect("connects");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        socket.write_all(head.as_bytes()).expect("sent");
        let mut answer = Vec::new();
        let mut buffer = [0u8; 4096];
        while !answer.windows(2).any(|w| w == b"\r\n") {
            let n = socket.read(&mut buffer).expect("answered");
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buffer[..n]);
        }
        let line = String::from_utf8_lossy(&answer);
        line.split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no status line in {line:?}"))
    }
}

/// Routes of the control API, one per handler kind (GET views, POST actions, path ids).
const GUARDED: [(&str, &str); 6] = [
    ("GET", "/v1/status"),
    ("GET", "/v1/outbox"),
    ("GET", "/v1/sessions/agent:main:qa:c1"),
    (
        "POST",
        "/v1/outbox/01a23d79-5dde-7148-8a8d-ec2f65e6f064/retry",
    ),
    ("POST", "/v1/leases/reap"),
    ("POST", "/v1/qa/send"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_api_wants_exactly_one_right_bearer_token() {
    let p = Probed::start().await;
    for (method, path) in GUARDED {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let request = || p.http.request(method.clone(), p.url(path));
        let refused = [
            ("no token", request()),
            ("a wrong token", request().bearer_auth("not-the-token")),
            (
                "the token in the query",
                p.http
                    .request(method.clone(), p.url(&format!("{path}?token={}", p.token))),
            ),
            (
                "the token as another scheme",
                request().header("authorization", format!("Basic {}", p.token)),
            ),
            (
                "two Authorization headers, the right one first",
                request()
                    .header("authorization", format!("Bearer {}", p.token))
                    .header("authorization", "Bearer not-the-token"),
            ),
            (
                "two Authorization headers, the right one second",
                request()
                    .header("authorization", "Bearer not-the-token")
                    .header("authorization", format!("Bearer {}", p.token)),
            ),
        ];
        for (what, call) in refused {
            let answer = call.send().await.expect("answered");
            assert_eq!(
                answer.status(),
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {what}"
            );
        }
    }
    // The right token alone is let in.
    let answer = p
        .http
        .get(p.url("/v1/status"))
        .bearer_auth(&p.token)
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_refuses_a_host_that_is_not_a_loopback_name() {
    let p = Probed::start().await;
    let port = p.port();
    let hosts = [
        format!("evil.example:{port}"),
        format!("localhost.evil.example:{port}"),
        format!("127.0.0.1.nip.io:{port}"),
        format!("127.1:{port}"),
        format!("2130706433:{port}"),
        format!("0x7f000001:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
    ];
    let routes = [
        ("GET", "/"),
        ("GET", "/chat/api/messages?conversation=c1"),
        ("POST", "/chat/api/send"),
        ("GET", "/v1/status"),
        ("POST", "/v1/qa/send"),
    ];
    for (method, path) in routes {
        for host in &hosts {
            let head = format!(
                "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\n\
                 Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\
                 \r\n{{}}",
                p.token
            );
            assert_eq!(p.raw(&head), 421, "{method} {path} as {host}");
        }
        // An empty Host, and none at all.
        for host_line in ["Host: \r\n", ""] {
            let head = format!(
                "{method} {path} HTTP/1.1\r\n{host_line}Authorization: Bearer {}\r\n\
                 Content-Length: 0\r\nConnection: close\r\n\r\n",
                p.token
            );
            let status = p.raw(&head);
            assert!(
                status == 421 || status == 400,
                "{method} {path} with {host_line:?}: {status}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_origin_plain_text_post_injects_nothing() {
    let p = Probed::start().await;
    let body = r#"{"conversation":"c1","text":"from a web page"}"#;
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let answer = p
            .http
            .post(p.url("/chat/api/send"))
            .header("origin", "http://evil.example")
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("answered");
        assert!(
            answer.status().is_client_error(),
            "{content_type}: {}",
            answer.status()
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        p.gateway.chat("c1").await.is_empty(),
        "nothing reached the conversation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_ids_and_query_values_are_client_errors_never_server_errors() {
    let p = Probed::start().await;
    let long = "x".repeat(8_000);
    let ids = [
        "..%2F..%2F..%2Fetc%2Fpasswd",
        "..",
        "%2E%2E",
        "a%00b",
        "%00",
        "a%0D%0ASet-Cookie:%20x=1",
        long.as_str(),
        "%E2%80%AE%E2%80%8Bkey",
        "%F0%9F%98%80",
        "e%CC%81%CC%81%CC%81",
        "%FF%FE",
        "%C0%AF",
        "a%2Fb%3Fc%23d",
    ];
    let shapes = [
        ("GET", "/v1/outbox/{}"),
        ("POST", "/v1/outbox/{}/retry"),
        ("POST", "/v1/outbox/{}/cancel"),
        ("GET", "/v1/sessions/{}"),
        ("GET", "/v1/sessions/{}/history"),
        ("POST", "/v1/sessions/{}/send"),
    ];
    for (method, shape) in shapes {
        for id in ids {
            let path = shape.replace("{}", id);
            let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
            let mut call = p
                .http
                .request(method.clone(), p.url(&path))
                .bearer_auth(&p.token);
            if method == reqwest::Method::POST {
                call = call.json(&serde_json::json!({ "message": "hi" }));
            }
            let answer = call.send().await.expect("answered");
            assert!(
                answer.status().is_client_error(),
                "{method} {path}: {}",
                answer.status()
            );
        }
    }
    for query in [
        "/v1/outbox?limit=-1",
        "/v1/outbox?limit=99999999999999999999999",
        "/v1/outbox?status=bogus",
        "/v1/outbox?after=%00",
        "/v1/inbox?status=%FF",
        "/v1/sessions/agent:main:qa:c1?changesSince=abc",
        "/v1/sessions/agent:main:qa:c1?changesSince=-5",
        "/v1/sessions/agent:main:qa:c1/history?limit=1e9",
        "/v1/qa/messages?conversation=",
    ] {
        let answer = p
            .http
            .get(p.url(query))
            .bearer_auth(&p.token)
            .send()
            .await
            .expect("answered");
        assert!(
            answer.status().is_success() || answer.status().is_client_error(),
            "{query}: {}",
            answer.status()
        );
        assert!(!answer.status().is_server_error(), "{query}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_no_route_serves_and_a_method_a_route_does_not_take_answer_json_naming_them() {
    let p = Probed::start().await;
    for path in [
        "/v1/sessions/",
        "/v1/no-such-route",
        "/no-such-page",
        "/v1/outbox/x/y/z",
    ] {
        let answer = p
            .http
            .get(p.url(path))
            .bearer_auth(&p.token)
            .send()
            .await
            .expect("answered");
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "GET {path}");
        let body: serde_json::Value = answer.json().await.expect("a JSON body");
        let error = body["error"].as_str().expect("an error text");
        assert!(
            error.contains(&format!("GET {path}")) && error.contains("/v1/"),
            "GET {path}: {error}"
        );
    }
    for (method, path, allowed) in [
        ("DELETE", "/v1/status", "GET"),
        ("GET", "/v1/leases/reap", "POST"),
        ("PUT", "/console/", "GET"),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let answer = p
            .http
            .request(method.clone(), p.url(path))
            .bearer_auth(&p.token)
            .send()
            .await
            .expect("answered");
        assert_eq!(
            answer.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        let allow = answer
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        assert!(allow.contains(allowed), "{method} {path}: Allow {allow:?}");
        let body: serde_json::Value = answer.json().await.expect("a JSON body");
        let error = body["error"].as_str().expect("an error text");
        assert!(
            error.contains(path) && error.contains(method.as_str()),
            "{method} {path}: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_json_body_of_any_shape_is_a_json_400() {
    let p = Probed::start().await;
    let deep = "[".repeat(100_000);
    let bodies: [&[u8]; 12] = [
        b"",
        b"{",
        b"[]",
        b"null",
        b"\"text\"",
        b"123",
        br#"{"message": 5}"#,
        br#"{"text": ["not", "a", "string"], "conversation": {}}"#,
        br#"{"text": "ok", "conversation": "c1"} trailing"#,
        b"\xff\xfe\x00{}",
        br#"{"text": "\ud800", "conversation": "c1"}"#,
        deep.as_bytes(),
    ];
    for path in [
        "/v1/sessions/agent:main:qa:c1/send",
        "/v1/qa/send",
        "/chat/api/send",
    ] {
        for body in bodies {
            let answer = p
                .http
                .post(p.url(path))
                .bearer_auth(&p.token)
                .header("content-type", "application/json")
                .body(body.to_vec())
                .send()
                .await
                .expect("answered");
            let status = answer.status();
            let shown = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} with {shown:?}");
            let error: serde_json::Value = answer
                .json()
                .await
                .unwrap_or_else(|e| panic!("{path} with {shown:?}: not JSON: {e}"));
            assert!(error["error"].is_string(), "{path}: {error}");
        }
    }
    assert!(p.gateway.chat("c1").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_reaches_the_log_even_at_trace() {
    let p = Probed::start().await;
    // A conversation, an operator call and refused calls, all logged at trace.
    p.gateway.say("c1", "hello there").await;
    let _ = p
        .http
        .get(p.url("/v1/status"))
        .bearer_auth(&p.token)
        .send()
        .await
        .expect("answered");
    let _ = p
        .http
        .get(p.url("/v1/status"))
        .bearer_auth("wrong-token-value")
        .send()
        .await
        .expect("answered");
    let platform = platform_token(&p.gateway.state, "qa");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = p.gateway.log();
    assert!(log.contains("TRACE"), "the log is at trace");
    for (what, secret) in [("control token", &p.token), ("platform token", &platform)] {
        assert!(!log.contains(secret.as_str()), "the {what} is in the log");
    }
}
