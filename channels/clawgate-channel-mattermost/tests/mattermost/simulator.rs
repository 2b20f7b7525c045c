//! The simulator's own facts over raw HTTP and a raw WebSocket (platform-apis-wave2 §11): the
//! error body, membership, the rune limit, `root_id`, patch versus update, the
//! `pending_post_id` cache (30 s, in flight, restart), rate limiting, and the WebSocket's hello,
//! `seq` and resume from the 128-event dead queue.

use std::time::Duration;

use clawgate_channel_mattermost::simulator::{
    Fault, FaultKind, MattermostSimulator, Route, SimUser, SimulatorConfig,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

struct Raw {
    sim: MattermostSimulator,
    http: reqwest::Client,
    person: SimUser,
    channel: String,
}

impl Raw {
    async fn start(config: SimulatorConfig) -> Raw {
        let sim = MattermostSimulator::start(config).await.unwrap();
        let person = sim.add_person("ada");
        let channel = sim.add_channel("town-square", &[&person]);
        Raw {
            sim,
            http: reqwest::Client::new(),
            person,
            channel,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.person.token, method, path, body).await
    }

    async fn call_as(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}/api/v4{path}", self.sim.url()))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn create(&self, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, "/posts", Some(body)).await
    }
}

#[tokio::test]
async fn refusals_carry_the_servers_error_body() {
    let raw = Raw::start(SimulatorConfig::default()).await;
    let elsewhere = raw.sim.add_channel("elsewhere", &[]);
    let (_, root) = raw
        .create(json!({ "channel_id": raw.channel, "message": "root" }))
        .await;
    let (_, reply) = raw
        .create(json!({ "channel_id": raw.channel, "message": "reply", "root_id": root["id"] }))
        .await;
    let cases: [(&str, Value, u16, &str); 4] = [
        (
            "not a member",
            json!({ "channel_id": elsewhere, "message": "x" }),
            403,
            "api.context.permissions.app_error",
        ),
        (
            "16,384 runes",
            json!({ "channel_id": raw.channel, "message": "é".repeat(16_384) }),
            400,
            "model.post.is_valid.message_length.app_error",
        ),
        (
            "a reply as root",
            json!({ "channel_id": raw.channel, "message": "x", "root_id": reply["id"] }),
            400,
            "api.post.create_post.root_id.app_error",
        ),
        (
            "no channel",
            json!({ "message": "x" }),
            400,
            "api.context.invalid_body_param.app_error",
        ),
    ];
    for (case, body, status, id) in cases {
        let (got, body) = raw.create(body).await;
        assert_eq!(got, status, "{case}: {body}");
        assert_eq!(body["id"], id, "{case}");
        assert_eq!(body["status_code"], status, "{case}");
        for field in ["message", "detailed_error", "request_id", "is_oauth"] {
            assert!(body.get(field).is_some(), "{case}: {field} in {body}");
        }
    }
    let (ok, _) = raw
        .create(json!({ "channel_id": raw.channel, "message": "é".repeat(16_383) }))
        .await;
    assert_eq!(ok, 201, "16,383 runes fit");
    let (status, body) = raw
        .call_as("wrong", reqwest::Method::GET, "/users/me", None)
        .await;
    assert_eq!(
        (status, body["id"].as_str()),
        (401, Some("api.context.session_expired.app_error"))
    );
}

#[tokio::test]
async fn patch_changes_only_what_it_names_and_update_blanks_the_rest() {
    let raw = Raw::start(SimulatorConfig::default()).await;
    let (status, post) = raw
        .create(json!({ "channel_id": raw.channel, "message": "one", "props": { "k": "v" } }))
        .await;
    assert_eq!(status, 201);
    let id = post["id"].as_str().unwrap();
    assert_eq!(id.len(), 26);
    let (_, patched) = raw
        .call(
            reqwest::Method::PUT,
            &format!("/posts/{id}/patch"),
            Some(json!({ "message": "two" })),
        )
        .await;
    assert_eq!(
        (patched["message"].as_str(), patched["props"]["k"].as_str()),
        (Some("two"), Some("v"))
    );
    let (_, updated) = raw
        .call(
            reqwest::Method::PUT,
            &format!("/posts/{id}"),
            Some(json!({ "id": id, "message": "three" })),
        )
        .await;
    assert_eq!(updated["message"], "three");
    assert_eq!(
        updated["props"],
        json!({}),
        "a full update blanks omitted props"
    );
    let (status, deleted) = raw
        .call(reqwest::Method::DELETE, &format!("/posts/{id}"), None)
        .await;
    assert_eq!((status, deleted), (200, json!({ "status": "OK" })));
    let (status, _) = raw
        .call(
            reqwest::Method::PUT,
            &format!("/posts/{id}/patch"),
            Some(json!({ "message": "x" })),
        )
        .await;
    assert_eq!(status, 404, "a deleted post is gone for patches");
    let record = raw.sim.post(id).unwrap();
    assert!(
        record.delete_at > 0 && record.edit_at > 0,
        "soft deleted, in the record"
    );
}

#[tokio::test]
async fn a_pending_post_id_dedupes_for_30_seconds_and_not_across_a_restart() {
    let raw = Raw::start(SimulatorConfig::default()).await;
    let body = json!({ "channel_id": raw.channel, "message": "once", "pending_post_id": "p-1" });
    let (s1, first) = raw.create(body.clone()).await;
    let (s2, again) = raw.create(body.clone()).await;
    assert_eq!((s1, s2), (201, 201));
    assert_eq!(first["id"], again["id"], "inside the window: the same post");
    raw.sim.advance_clock(Duration::from_secs(31));
    let (_, after_expiry) = raw.create(body.clone()).await;
    assert_ne!(after_expiry["id"], first["id"], "after 30 s: a second post");
    raw.sim.restart();
    let (_, after_restart) = raw.create(body).await;
    assert_ne!(
        after_restart["id"], after_expiry["id"],
        "the cache is in memory only"
    );
    assert_eq!(raw.sim.visible(&raw.channel).len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_post_id_in_flight_is_refused_with_500_until_it_lands() {
    let raw = Raw::start(SimulatorConfig::default()).await;
    raw.sim
        .inject(Fault::on(Route::CreatePost, FaultKind::Hold));
    let body = json!({ "channel_id": raw.channel, "message": "slow", "pending_post_id": "p-2" });
    let http = raw.http.clone();
    let url = format!("{}/api/v4/posts", raw.sim.url());
    let token = raw.person.token.clone();
    let held_body = body.clone();
    let held = tokio::spawn(async move {
        let response = http
            .post(url)
            .bearer_auth(token)
            .json(&held_body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap())
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while raw.sim.in_flight() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the held create never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, refused) = raw.create(body.clone()).await;
    assert_eq!(status, 500);
    assert_eq!(refused["id"], "api.post.deduplicate_create_post.pending");
    raw.sim.release();
    let (held_status, landed) = held.await.unwrap();
    assert_eq!(held_status, 201);
    let (_, again) = raw.create(body).await;
    assert_eq!(again["id"], landed["id"]);
    assert_eq!(raw.sim.visible(&raw.channel).len(), 1);
}

#[tokio::test]
async fn rate_limiting_answers_429_limit_exceeded_with_its_headers() {
    let raw = Raw::start(SimulatorConfig {
        rate_limit_per_second: Some(2),
        ..SimulatorConfig::default()
    })
    .await;
    let url = format!("{}/api/v4/users/me", raw.sim.url());
    let mut answers = Vec::new();
    for _ in 0..3 {
        let response = raw
            .http
            .get(&url)
            .bearer_auth(&raw.person.token)
            .send()
            .await
            .unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let row = (
            response.status().as_u16(),
            header("x-ratelimit-limit"),
            header("x-ratelimit-remaining"),
            header("x-ratelimit-reset").is_some(),
        );
        answers.push((row, response.text().await.unwrap()));
    }
    assert_eq!(
        answers[0].0,
        (200, Some("2".into()), Some("1".into()), true)
    );
    assert_eq!(
        answers[1].0,
        (200, Some("2".into()), Some("0".into()), true)
    );
    assert_eq!(
        answers[2].0,
        (429, Some("2".into()), Some("0".into()), true)
    );
    assert_eq!(answers[2].1.trim(), "limit exceeded");
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(sim: &MattermostSimulator, token: &str, query: &str) -> Socket {
    let url = format!("ws://127.0.0.1:{}/api/v4/websocket{query}", sim.port());
    let mut request = url.into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    tokio_tungstenite::connect_async(request).await.unwrap().0
}

async fn next(socket: &mut Socket) -> Value {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), socket.next())
            .await
            .expect("an event within 5 s")
            .expect("the socket is open")
            .unwrap();
        if let Frame::Text(text) = frame {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_says_hello_numbers_events_and_resumes_from_its_dead_queue() {
    let raw = Raw::start(SimulatorConfig::default()).await;
    let mut socket = connect(&raw.sim, &raw.person.token, "").await;
    let hello = next(&mut socket).await;
    assert_eq!(
        (hello["event"].as_str(), hello["seq"].as_i64()),
        (Some("hello"), Some(0))
    );
    let connection = hello["data"]["connection_id"].as_str().unwrap().to_owned();
    let first = raw
        .sim
        .person_writes(&raw.channel, &raw.person, "one", None);
    let posted = next(&mut socket).await;
    assert_eq!(posted["event"], "posted");
    assert_eq!(posted["seq"], 1);
    let post: Value = serde_json::from_str(posted["data"]["post"].as_str().unwrap()).unwrap();
    assert_eq!(
        post["id"].as_str(),
        Some(first.id.as_str()),
        "data.post is a JSON string"
    );
    assert_eq!(
        posted["broadcast"]["channel_id"].as_str(),
        Some(raw.channel.as_str())
    );
    raw.sim.drop_sockets();
    drop(socket);
    raw.sim
        .person_writes(&raw.channel, &raw.person, "two", None);
    raw.sim
        .person_writes(&raw.channel, &raw.person, "three", None);
    // Inside the dead queue: no hello, the events from sequence_number on.
    let mut resumed = connect(
        &raw.sim,
        &raw.person.token,
        &format!("?connection_id={connection}&sequence_number=2"),
    )
    .await;
    let replayed = [next(&mut resumed).await, next(&mut resumed).await];
    assert_eq!(
        replayed.map(|e| (e["event"].clone(), e["seq"].clone())),
        [(json!("posted"), json!(2)), (json!("posted"), json!(3))]
    );
    raw.sim.edit_post(&first.id, "one, edited");
    let edited = next(&mut resumed).await;
    assert_eq!(
        (edited["event"].as_str(), edited["seq"].as_i64()),
        (Some("post_edited"), Some(4))
    );
    raw.sim.drop_sockets();
    drop(resumed);
    // 130 events later the asked sequence number has left the 128-event queue: a fresh connection.
    for n in 0..130 {
        raw.sim
            .person_writes(&raw.channel, &raw.person, &format!("m{n}"), None);
    }
    let mut fresh = connect(
        &raw.sim,
        &raw.person.token,
        &format!("?connection_id={connection}&sequence_number=5"),
    )
    .await;
    let hello = next(&mut fresh).await;
    assert_eq!(
        (hello["event"].as_str(), hello["seq"].as_i64()),
        (Some("hello"), Some(0))
    );
    assert_ne!(
        hello["data"]["connection_id"].as_str(),
        Some(connection.as_str())
    );
    let stats = raw.sim.socket_stats();
    assert_eq!((stats.fresh, stats.resumed), (2, 1));
}

#[tokio::test]
async fn the_challenge_authenticates_a_socket_without_a_header() {
    let raw = Raw::start(SimulatorConfig::default()).await;
    let url = format!("ws://127.0.0.1:{}/api/v4/websocket", raw.sim.port());
    let (mut socket, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let challenge = json!({ "seq": 1, "action": "authentication_challenge", "data": { "token": raw.person.token } });
    socket
        .send(Frame::Text(challenge.to_string().into()))
        .await
        .unwrap();
    assert_eq!(
        next(&mut socket).await,
        json!({ "status": "OK", "seq_reply": 1 })
    );
    assert_eq!(next(&mut socket).await["event"], "hello");
    let (mut refused, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    let wrong =
        json!({ "seq": 1, "action": "authentication_challenge", "data": { "token": "nope" } });
    refused
        .send(Frame::Text(wrong.to_string().into()))
        .await
        .unwrap();
    assert_eq!(next(&mut refused).await["status"], "FAIL");
}
