//! The simulator against the facts (platform-apis-wave2 §9.1), over raw HTTP: the
//! `access_token` header (a Bearer token is not it), failures as HTTP 200 bodies, the token
//! endpoint's rotation, and webhooks signed with the documented formula and posted again when
//! not answered 200 within the deadline.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use clawgate_channel_zalo::signature;
use clawgate_channel_zalo::simulator::{SimulatorConfig, ZaloSimulator};
use serde_json::{Value, json};

use crate::peer::quick;

async fn token_call(sim: &ZaloSimulator, secret: &str, form: &[(&str, &str)]) -> Value {
    reqwest::Client::new()
        .post(format!("{}/v4/oa/access_token", sim.api_url()))
        .header("secret_key", secret)
        .form(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn refresh(sim: &ZaloSimulator, token: &str) -> Value {
    let app = sim.app_id();
    token_call(
        sim,
        &sim.app_secret(),
        &[
            ("app_id", &app),
            ("grant_type", "refresh_token"),
            ("refresh_token", token),
        ],
    )
    .await
}

async fn send(sim: &ZaloSimulator, header: (&str, &str), user: &str, text: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}/v3.0/oa/message/cs", sim.api_url()))
        .header(header.0, header.1)
        .json(&json!({ "recipient": { "user_id": user }, "message": { "text": text } }))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn the_refresh_token_rotates_and_a_reused_one_fails() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let first = sim.authorize();
    let answer = refresh(&sim, &first).await;
    let second = answer["refresh_token"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    assert!(answer["access_token"].as_str().unwrap().len() > 100);
    assert_eq!(answer["expires_in"], "90000", "seconds, as a string");
    let reused = refresh(&sim, &first).await;
    assert_eq!(reused["error"], -14014, "{reused}");
    assert!(
        reused["error_description"]
            .as_str()
            .unwrap()
            .contains("invalid")
    );
    assert!(refresh(&sim, &second).await["access_token"].is_string());
    // The app secret rides in `secret_key`; a wrong one is refused whatever the token.
    let app = sim.app_id();
    let wrong = token_call(
        &sim,
        "not-the-secret",
        &[
            ("app_id", &app),
            ("grant_type", "refresh_token"),
            ("refresh_token", &sim.authorize()),
        ],
    )
    .await;
    assert!(wrong["error"].as_i64().unwrap() < 0, "{wrong}");
    // An authorization code is exchanged once.
    let code = sim.authorization_code();
    let form = [
        ("app_id", app.as_str()),
        ("grant_type", "authorization_code"),
        ("code", &code),
    ];
    assert!(token_call(&sim, &sim.app_secret(), &form).await["refresh_token"].is_string());
    assert!(
        token_call(&sim, &sim.app_secret(), &form).await["error"]
            .as_i64()
            .unwrap()
            < 0
    );
}

#[tokio::test]
async fn the_access_token_goes_in_its_own_header_and_failures_come_as_http_200() {
    let sim = ZaloSimulator::start(quick()).await.unwrap();
    let token = refresh(&sim, &sim.authorize()).await["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    sim.open_window("8666");
    let bearer = format!("Bearer {token}");
    let (status, body) = send(&sim, ("authorization", &bearer), "8666", "hi").await;
    assert_eq!(
        (status, body["error"].clone()),
        (200, json!(-216)),
        "{body}"
    );
    let (status, body) = send(&sim, ("access_token", &token), "8666", "hi").await;
    assert_eq!(status, 200);
    assert_eq!(body["error"], 0);
    assert_eq!(body["message"], "Success");
    assert_eq!(body["data"]["user_id"], "8666");
    assert_eq!(body["data"]["message_id"].as_str().unwrap().len(), 32);
    let (status, body) = send(&sim, ("access_token", &token), "8666", "").await;
    assert_eq!(
        (status, body["error"].clone()),
        (200, json!(-201)),
        "{body}"
    );
    let (_, body) = send(&sim, ("access_token", &token), "8666", &"x".repeat(2_001)).await;
    assert_eq!(body["error"], -201);
    sim.close_window("8666");
    let (status, body) = send(&sim, ("access_token", &token), "8666", "hi").await;
    assert_eq!(
        (status, body["error"].clone()),
        (200, json!(-230)),
        "{body}"
    );
    let (_, body) = send(&sim, ("access_token", &token), "8999", "hi").await;
    assert_eq!(body["error"], -201, "an unknown user: {body}");
    sim.expire_access_tokens();
    sim.open_window("8666");
    let (_, body) = send(&sim, ("access_token", &token), "8666", "hi").await;
    assert_eq!(body["error"], -216);
    assert_eq!(sim.sent("8666").len(), 1, "only the accepted one landed");
}

#[tokio::test]
async fn webhooks_are_signed_as_documented_and_posted_again_until_answered_200_in_time() {
    let sim = ZaloSimulator::start(SimulatorConfig {
        answer_deadline: Duration::from_millis(300),
        retry_delays: vec![Duration::from_millis(50); 3],
        ..SimulatorConfig::default()
    })
    .await
    .unwrap();
    // A receiver that answers the first attempt too late, the second 503, the third 200.
    let seen: Arc<Mutex<Vec<(HeaderMap, Bytes)>>> = Arc::default();
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let record = record.clone();
            async move {
                let n = {
                    let mut seen = record.lock().unwrap();
                    seen.push((headers, body));
                    seen.len()
                };
                match n {
                    1 => {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        StatusCode::OK
                    }
                    2 => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::OK,
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    sim.set_webhook_url(Some(&format!("http://127.0.0.1:{port}/hook")));
    let msg_id = sim.person_writes("8777", "xin chào");
    assert!(sim.deliveries_settled(Duration::from_secs(20)).await);
    let delivery = sim.deliveries().remove(0);
    assert_eq!(delivery.attempts, vec![0, 503, 200]);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for (headers, body) in seen.iter() {
        assert_eq!(body, &seen[0].1, "the same bytes every time");
        let event: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(event["event_name"], "user_send_text");
        assert_eq!(event["message"]["msg_id"], msg_id.as_str());
        assert_eq!(event["recipient"]["id"], sim.oa_id().as_str());
        let timestamp = event["timestamp"].as_str().unwrap();
        let header = headers["x-zevent-signature"].to_str().unwrap();
        // sha256(app_id + body + timestamp + OA secret key), hex, after `mac=`.
        let expected = signature::digest(&sim.app_id(), body, timestamp, &sim.oa_secret_key());
        assert_eq!(header, format!("mac={expected}"));
    }
    // Once the schedule is used up a delivery is given up.
    sim.set_webhook_url(Some("http://127.0.0.1:9/nowhere"));
    sim.person_writes("8777", "anyone?");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !sim.deliveries()[1].given_up {
        assert!(std::time::Instant::now() < deadline, "never given up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sim.deliveries()[1].attempts.len(),
        4,
        "the first try and three retries"
    );
}
