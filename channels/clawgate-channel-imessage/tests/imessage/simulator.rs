//! The simulator against the platform facts it claims (platform-apis-wave2 §3.1), spoken to
//! with a plain HTTP client: the password in the query, the envelopes, `tempGuid` rules, the
//! send answer's `tempGuid` that chat.db rows (the query) never carry, echoes after the answer,
//! webhooks tried once, and the edit/unsend windows on the driven clock.

use std::time::Duration;

use clawgate_channel_imessage::simulator::{
    BlueBubblesSimulator, Fault, FaultKind, SimulatorConfig,
};
use serde_json::{Value, json};

async fn call(
    sim: &BlueBubblesSimulator,
    path: &str,
    password: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut url = format!("{}{path}", sim.base_url());
    if let Some(password) = password {
        url.push_str(&format!(
            "?password={}",
            form_urlencoded::byte_serialize(password.as_bytes()).collect::<String>()
        ));
    }
    let client = reqwest::Client::new();
    let request = match body {
        Some(body) => client.post(url).json(&body),
        None => client.get(url),
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A webhook receiver that answers `status` and keeps what it got.
async fn receiver(status: u16) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(body);
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_api_speaks_bluebubbles_envelopes_and_rules() {
    let sim = BlueBubblesSimulator::start(SimulatorConfig {
        echo_delay: Duration::from_millis(300),
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    let (url, got) = receiver(200).await;
    sim.set_webhook(Some(&url));
    let password = sim.password();
    let chat = sim.dm("+15551230000");
    // The password is required, in the query.
    let (status, body) = call(&sim, "/api/v1/server/info", None, None).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["type"], "Authentication Error");
    assert_eq!(body["error"]["message"], "Missing server password!");
    let (status, body) = call(&sim, "/api/v1/server/info", Some(&password), None).await;
    assert_eq!((status, body["status"].as_u64()), (200, Some(200)));
    assert_eq!(body["data"]["private_api"], true);
    // AppleScript sends need a tempGuid.
    let (status, body) = call(
        &sim,
        "/api/v1/message/text",
        Some(&password),
        Some(json!({ "chatGuid": chat, "message": "hi", "method": "apple-script" })),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "Validation Error");
    // A tempGuid in flight is refused, without a row.
    sim.hold_in_flight("t-held");
    let (status, body) = call(&sim, "/api/v1/message/text", Some(&password), Some(json!({ "chatGuid": chat, "tempGuid": "t-held", "message": "hi", "method": "apple-script" }))).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Message is already queued to be sent!"),
        "{body}"
    );
    sim.release("t-held");
    // A send: answered with the real guid and our tempGuid; the echo comes after the answer.
    let (status, body) = call(&sim, "/api/v1/message/text", Some(&password), Some(json!({ "chatGuid": chat, "tempGuid": "t-1", "message": "hello there", "method": "apple-script" }))).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (200, Some("Message sent!"))
    );
    let guid = body["data"]["guid"].as_str().unwrap().to_owned();
    assert_eq!(body["data"]["tempGuid"], "t-1");
    assert_eq!(body["data"]["isFromMe"], true);
    assert!(
        got.lock().unwrap().is_empty(),
        "the echo is not there yet at the answer"
    );
    assert!(sim.deliveries_settled(Duration::from_secs(5)).await);
    let echo = got.lock().unwrap()[0].clone();
    assert_eq!(
        (echo["type"].as_str(), echo["data"]["guid"].as_str()),
        (Some("new-message"), Some(guid.as_str()))
    );
    assert_eq!(echo["data"]["isFromMe"], true);
    assert!(
        echo["data"].get("tempGuid").is_none(),
        "no tempGuid unless the matcher found it"
    );
    // The query shows chat.db's rows: no tempGuid there.
    let (status, body) = call(
        &sim,
        "/api/v1/message/query",
        Some(&password),
        Some(json!({ "chatGuid": chat, "after": 0, "limit": 10, "sort": "ASC" })),
    )
    .await;
    assert_eq!(status, 200);
    let rows = body["data"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["guid"], guid.as_str());
    assert!(rows[0].get("tempGuid").is_none());
    // The same tempGuid after completion sends again (the in-flight set is all there is).
    let (status, _) = call(&sim, "/api/v1/message/text", Some(&password), Some(json!({ "chatGuid": chat, "tempGuid": "t-1", "message": "hello there", "method": "apple-script" }))).await;
    assert_eq!(status, 200);
    assert_eq!(sim.our_texts(&chat).len(), 2);
    // A send error: 500 "Message Send Error" with the failed message in data.
    sim.inject(Fault::new(FaultKind::SendError));
    let (status, body) = call(&sim, "/api/v1/message/text", Some(&password), Some(json!({ "chatGuid": chat, "tempGuid": "t-2", "message": "fails", "method": "apple-script" }))).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (500, Some("Message Send Error"))
    );
    assert_eq!(body["data"]["error"], 22);
    sim.inject(Fault::new(FaultKind::Timeout));
    let (status, body) = call(&sim, "/api/v1/message/text", Some(&password), Some(json!({ "chatGuid": chat, "tempGuid": "t-3", "message": "slow", "method": "apple-script" }))).await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (504, Some("Gateway Timeout"))
    );
    assert_eq!(
        sim.our_texts(&chat),
        vec!["hello there", "hello there", "slow"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_and_unsends_follow_the_windows_on_the_driven_clock() {
    let sim = BlueBubblesSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let password = sim.password();
    let chat = sim.dm("+15551230001");
    let send = |temp: &'static str| json!({ "chatGuid": chat, "tempGuid": temp, "message": "v0", "method": "private-api" });
    let (_, body) = call(
        &sim,
        "/api/v1/message/text",
        Some(&password),
        Some(send("e-1")),
    )
    .await;
    let guid = body["data"]["guid"].as_str().unwrap().to_owned();
    let edit = |text: &str| json!({ "editedMessage": text, "backwardsCompatibilityMessage": text, "partIndex": 0 });
    for n in 1..=5 {
        let (status, _) = call(
            &sim,
            &format!("/api/v1/message/{guid}/edit"),
            Some(&password),
            Some(edit(&format!("v{n}"))),
        )
        .await;
        assert_eq!(status, 200, "edit {n}");
    }
    let (status, _) = call(
        &sim,
        &format!("/api/v1/message/{guid}/edit"),
        Some(&password),
        Some(edit("v6")),
    )
    .await;
    assert_eq!(status, 500, "a sixth edit");
    let (_, body) = call(
        &sim,
        "/api/v1/message/text",
        Some(&password),
        Some(send("e-2")),
    )
    .await;
    let second = body["data"]["guid"].as_str().unwrap().to_owned();
    sim.advance(2 * 60 * 1000 + 1);
    let (status, _) = call(
        &sim,
        &format!("/api/v1/message/{second}/unsend"),
        Some(&password),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 500, "past 2 minutes");
    let (status, _) = call(
        &sim,
        &format!("/api/v1/message/{second}/edit"),
        Some(&password),
        Some(edit("still editable")),
    )
    .await;
    assert_eq!(status, 200, "within 15 minutes");
    sim.advance(15 * 60 * 1000);
    let (status, _) = call(
        &sim,
        &format!("/api/v1/message/{second}/edit"),
        Some(&password),
        Some(edit("too late")),
    )
    .await;
    assert_eq!(status, 500, "past 15 minutes");
    assert_eq!(sim.our_texts(&chat), vec!["v5", "still editable"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_posted_once_even_when_they_fail() {
    let sim = BlueBubblesSimulator::start(SimulatorConfig::default())
        .await
        .unwrap();
    let (url, got) = receiver(500).await;
    sim.set_webhook(Some(&url));
    let chat = sim.dm("+15551230002");
    sim.person_writes(&chat, "+15551230002", "once");
    // Nobody listens here: the POST fails, and is not tried again.
    sim.set_webhook(Some(&format!(
        "http://127.0.0.1:{}/hook",
        clawgate_conformance::ports::reserve_loopback_port()
    )));
    sim.person_writes(&chat, "+15551230002", "into the void");
    assert!(sim.deliveries_settled(Duration::from_secs(10)).await);
    let statuses: Vec<u16> = sim.deliveries().iter().map(|d| d.status).collect();
    assert_eq!(statuses, vec![500, 0]);
    assert_eq!(got.lock().unwrap().len(), 1);
}
