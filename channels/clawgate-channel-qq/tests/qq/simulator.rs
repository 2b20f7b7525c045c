//! The simulator against the platform facts (platform-apis-wave2 §14), over raw HTTP: the
//! token endpoint, error bodies and trace headers, the (msg_id, msg_seq) dedupe, reply windows
//! and counts, the active quota, streams, files, recalls, and signed callbacks.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use clawgate_channel_qq::signature;
use clawgate_channel_qq::simulator::{QqSimulator, SimChat, SimulatorConfig};
use serde_json::{Value, json};

use crate::peer::quick;

struct Api {
    base: String,
    token: String,
    http: reqwest::Client,
}

impl Api {
    async fn new(sim: &QqSimulator) -> Api {
        let http = reqwest::Client::new();
        let answer: Value = http
            .post(format!("{}/app/getAppAccessToken", sim.api_url()))
            .json(&json!({ "appId": sim.app_id(), "clientSecret": sim.secret() }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        Api {
            base: sim.api_url(),
            token: answer["access_token"].as_str().unwrap().to_owned(),
            http,
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Value,
    ) -> (u16, Value, Option<String>) {
        let response = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("authorization", format!("QQBot {}", self.token))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let trace = response
            .headers()
            .get("x-tps-trace-id")
            .map(|v| v.to_str().unwrap().to_owned());
        (status, response.json().await.unwrap_or(Value::Null), trace)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let (status, body, _) = self.call(reqwest::Method::POST, path, body).await;
        (status, body)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_endpoint_answers_string_seconds_and_reuses_a_token_until_its_last_minute() {
    let sim = QqSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let ask = |secret: String| {
        let http = http.clone();
        let url = format!("{}/app/getAppAccessToken", sim.api_url());
        let app = sim.app_id();
        async move {
            http.post(url)
                .json(&json!({ "appId": app, "clientSecret": secret }))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let first = ask(sim.secret()).await;
    assert_eq!(first["expires_in"], "7200");
    let again = ask(sim.secret()).await;
    assert_eq!(again["access_token"], first["access_token"]);
    let wrong = ask("wrong".into()).await;
    assert_eq!(wrong["code"], 100_016);
    assert!(wrong.get("access_token").is_none());
    // Short-lived tokens: inside the last minute a new one is issued.
    let short = QqSimulator::start(SimulatorConfig {
        token_lifetime: Duration::from_secs(59),
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let api1 = Api::new(&short).await;
    let api2 = Api::new(&short).await;
    assert_ne!(api1.token, api2.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_replies_dedupe_on_msg_id_and_msg_seq_within_their_window_and_count() {
    let sim = QqSimulator::start(SimulatorConfig {
        max_replies: 2,
        ..quick()
    })
    .await
    .unwrap();
    let api = Api::new(&sim).await;
    let msg = sim.person_writes("U1", "hi");
    let users = "/v2/users/U1/messages";
    let reply = |seq: u64| json!({ "msg_type": 0, "content": "yo", "msg_id": msg, "msg_seq": seq });
    let (status, first) = api.post(users, reply(1)).await;
    assert_eq!(status, 200);
    assert!(first["id"].as_str().unwrap().starts_with("ROBOT1.0_"));
    let (status, dup, trace) = api.call(reqwest::Method::POST, users, reply(1)).await;
    assert_eq!(status, 400);
    assert_eq!(dup["code"], 40_054_005);
    assert_eq!(dup["err_code"], 40_054_005);
    assert_eq!(dup["message"], "消息被去重，请检查请求msgseq");
    assert!(dup["trace_id"].is_string());
    assert!(trace.is_some(), "X-Tps-trace-ID");
    assert!(dup.get("id").is_none(), "no id on a repeat");
    assert_eq!(api.post(users, reply(2)).await.0, 200);
    assert_eq!(
        api.post(users, reply(3)).await.1["code"],
        304_103,
        "out of replies"
    );
    assert_eq!(
        api.post(users, reply(2)).await.1["code"],
        40_054_005,
        "a repeat still dedupes"
    );
    let cases = [
        (
            "another chat",
            "/v2/users/U2/messages",
            reply(9),
            40_034_003,
        ),
        (
            "unknown msg_id",
            users,
            json!({ "msg_type": 0, "content": "x", "msg_id": "nope", "msg_seq": 1 }),
            40_034_003,
        ),
        (
            "empty text",
            users,
            json!({ "msg_type": 0, "content": " ", "msg_id": msg, "msg_seq": 8 }),
            40_034_001,
        ),
        (
            "bad file_info",
            users,
            json!({ "msg_type": 7, "media": { "file_info": "x" }, "msg_id": msg, "msg_seq": 8 }),
            40_034_001,
        ),
    ];
    for (case, path, body, code) in cases {
        let (status, answer) = api.post(path, body).await;
        assert_eq!(
            (status, answer["code"].as_i64()),
            (400, Some(code)),
            "{case}"
        );
    }
    // Windows: C2C 60 min, group 5 min.
    let late = sim.person_writes("U3", "hello?");
    sim.age_inbound(&late, Duration::from_secs(3_601));
    let body = json!({ "msg_type": 0, "content": "late", "msg_id": late, "msg_seq": 1 });
    assert_eq!(
        api.post("/v2/users/U3/messages", body).await.1["code"],
        40_034_005
    );
    let group = sim.member_writes("G1", "M1", "hello group");
    sim.age_inbound(&group, Duration::from_secs(301));
    let body = json!({ "msg_type": 0, "content": "late", "msg_id": group, "msg_seq": 1 });
    assert_eq!(
        api.post("/v2/groups/G1/messages", body).await.1["code"],
        40_034_128
    );
    // An unknown token.
    let stale = Api {
        token: "nope".into(),
        ..Api::new(&sim).await
    };
    let (status, answer) = stale.post(users, reply(5)).await;
    assert_eq!((status, answer["code"].as_i64()), (401, Some(11_241)));
    assert_eq!(sim.messages(&SimChat::User("U1".into())).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_messages_have_a_monthly_quota_and_no_dedupe() {
    let sim = QqSimulator::start(SimulatorConfig {
        active_quota: 2,
        ..quick()
    })
    .await
    .unwrap();
    let api = Api::new(&sim).await;
    let body = json!({ "msg_type": 0, "content": "news", "msg_seq": 1 });
    assert_eq!(
        api.post("/v2/groups/G1/messages", body.clone()).await.0,
        200
    );
    assert_eq!(
        api.post("/v2/groups/G1/messages", body.clone()).await.0,
        200,
        "no dedupe"
    );
    let (status, answer) = api.post("/v2/groups/G1/messages", body.clone()).await;
    assert_eq!((status, answer["code"].as_i64()), (400, Some(22_009)));
    assert_eq!(
        api.post("/v2/groups/G2/messages", body).await.0,
        200,
        "per group"
    );
    assert_eq!(sim.active_sent("G1"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_append_in_index_order_close_when_idle_files_and_recalls() {
    let sim = QqSimulator::start(quick()).await.unwrap();
    let api = Api::new(&sim).await;
    let msg = sim.person_writes("U1", "tell me");
    let path = "/v2/users/U1/messages";
    let chunk = |content: &str, stream: Value| json!({ "msg_type": 0, "content": content, "msg_id": msg, "msg_seq": 7, "stream": stream });
    let (_, first) = api
        .post(path, chunk("a", json!({ "state": 1, "index": 1 })))
        .await;
    let id = first["id"].as_str().unwrap().to_owned();
    assert_eq!(
        api.post(
            path,
            chunk("b", json!({ "state": 1, "id": id, "index": 2 }))
        )
        .await
        .0,
        200
    );
    assert_eq!(
        api.post(
            path,
            chunk("x", json!({ "state": 1, "id": id, "index": 4 }))
        )
        .await
        .1["code"],
        40_034_001,
        "out of order"
    );
    assert_eq!(
        api.post(
            path,
            chunk("c", json!({ "state": 10, "id": id, "index": 3 }))
        )
        .await
        .0,
        200
    );
    let stream = sim.messages(&SimChat::User("U1".into())).pop().unwrap();
    assert_eq!((stream.text.as_str(), stream.stream), ("abc", Some(true)));
    assert_eq!(
        api.post(
            path,
            chunk("d", json!({ "state": 1, "id": id, "index": 4 }))
        )
        .await
        .1["code"],
        40_054_010,
        "finished"
    );
    // Idle streams close; groups cannot stream.
    let (_, second) = api
        .post(path, chunk("a", json!({ "state": 1, "index": 1 })))
        .await;
    assert_eq!(
        second["code"], 40_054_005,
        "a stream start is a reply under its pair"
    );
    let (_, second) = api.post(path, json!({ "msg_type": 0, "content": "a", "msg_id": msg, "msg_seq": 8, "stream": { "state": 1, "index": 1 } })).await;
    let id2 = second["id"].as_str().unwrap().to_owned();
    sim.age_streams(Duration::from_secs(31));
    assert_eq!(
        api.post(
            path,
            chunk("b", json!({ "state": 1, "id": id2, "index": 2 }))
        )
        .await
        .1["code"],
        40_054_010
    );
    let group = sim.member_writes("G1", "M1", "hi");
    let body = json!({ "msg_type": 0, "content": "a", "msg_id": group, "msg_seq": 1, "stream": { "state": 1, "index": 1 } });
    assert_eq!(
        api.post("/v2/groups/G1/messages", body).await.1["code"],
        40_034_001
    );
    // Files: a URL, or SILK data for voice.
    let (status, file) = api
        .post(
            "/v2/users/U1/files",
            json!({ "file_type": 1, "url": "https://x/a.png", "srv_send_msg": false }),
        )
        .await;
    assert_eq!(status, 200);
    assert!(file["file_info"].is_string() && file["ttl"].is_number());
    let not_silk = base64_of(b"RIFF....WAVE");
    assert_eq!(
        api.post(
            "/v2/users/U1/files",
            json!({ "file_type": 3, "file_data": not_silk })
        )
        .await
        .1["code"],
        40_034_001
    );
    let silk = base64_of(b"#!SILK_V3\x00\x01");
    assert_eq!(
        api.post(
            "/v2/users/U1/files",
            json!({ "file_type": 3, "file_data": silk })
        )
        .await
        .0,
        200
    );
    // Recalls.
    let (status, _, _) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/v2/users/U1/messages/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, 200);
    let (status, gone, _) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/v2/users/U1/messages/{id}"),
            Value::Null,
        )
        .await;
    assert_eq!((status, gone["code"].as_i64()), (404, Some(40_054_011)));
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_signed_over_timestamp_and_body_and_pushed_until_acknowledged() {
    let sim = QqSimulator::start(quick()).await.unwrap();
    let seen: Arc<Mutex<Vec<(HeaderMap, Bytes)>>> = Arc::default();
    let answers = Arc::new(Mutex::new(vec![
        json!({ "op": 12, "d": 1 }),
        json!({ "op": 12, "d": 0 }),
    ]));
    let app = {
        let seen = seen.clone();
        axum::Router::new().route(
            "/cb",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let seen = seen.clone();
                let answers = answers.clone();
                async move {
                    seen.lock().unwrap().push((headers, body));
                    let answer = answers.lock().unwrap().remove(0);
                    axum::Json(answer)
                }
            }),
        )
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/cb", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    sim.set_callback_url(Some(&url));
    let msg = sim.person_writes("U9", "signed?");
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "d: 1 asks for the dispatch again");
    assert_eq!(seen[0].1, seen[1].1, "the same bytes each time");
    for (headers, body) in &seen {
        let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap());
        signature::verify(
            &sim.secret(),
            header("x-signature-ed25519"),
            header("x-signature-timestamp"),
            body,
        )
        .unwrap();
        assert_eq!(header("x-bot-appid"), Some(sim.app_id().as_str()));
    }
    let payload: Value = serde_json::from_slice(&seen[0].1).unwrap();
    assert_eq!(payload["op"], 0);
    assert_eq!(payload["t"], "C2C_MESSAGE_CREATE");
    assert_eq!(payload["d"]["id"], msg.as_str());
    assert_eq!(payload["d"]["author"]["user_openid"], "U9");
    let deliveries = sim.deliveries();
    assert_eq!(deliveries[0].attempts, vec![0, 200]);
    assert!(deliveries[0].acked);
    server.abort();
}
