//! Every listener `clawgate up` starts answers only to this machine: the embedded QA platform's
//! API and control routes refuse a non-loopback `Host` (DNS rebinding) and want its token.

use crate::support::{GatewayProcess, config_file, platform_token, platform_url};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_platform_refuses_other_hosts_and_callers_without_its_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    let url = platform_url(&state, "qa");
    let token = platform_token(&state, "qa");
    let http = reqwest::Client::new();
    let inject = serde_json::json!({ "text": "injected", "authorId": "mallory" });
    let calls = || {
        [
            http.post(format!("{url}/control/conversations/c1/inbound"))
                .json(&inject),
            http.get(format!("{url}/control/log")),
            http.post(format!("{url}/control/webhook"))
                .json(&serde_json::json!({ "url": "http://evil.example/hook" })),
            http.post(format!("{url}/control/faults"))
                .json(&serde_json::json!([])),
            http.get(format!("{url}/api/updates")),
        ]
    };
    // A page that rebound its domain to 127.0.0.1: refused whatever it sends.
    for call in calls() {
        let answer = call
            .header(reqwest::header::HOST, "evil.example")
            .bearer_auth(&token)
            .send()
            .await
            .expect("answered");
        assert_eq!(
            answer.status(),
            reqwest::StatusCode::MISDIRECTED_REQUEST,
            "{}",
            answer.url()
        );
    }
    // This machine without the token: refused.
    for call in calls() {
        let answer = call.send().await.expect("answered");
        assert_eq!(
            answer.status(),
            reqwest::StatusCode::UNAUTHORIZED,
            "{}",
            answer.url()
        );
    }
    assert!(
        gateway.chat("c1").await.is_empty(),
        "nothing was injected into the conversation"
    );
    // With the token (from gateway.json, the user's alone): the platform's operator.
    let log = http
        .get(format!("{url}/control/log"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("answered");
    assert!(log.status().is_success(), "{}", log.status());
}
