//! The Cloud API simulator on its own: Graph's answers and error envelope, the window, faults,
//! webhooks with their signatures and redelivery, and a cross-check with pywa.
#![allow(clippy::unwrap_used)]

mod graph;
mod pywa;
mod webhooks;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use clawgate_channel_whatsapp::simulator::{SimulatorConfig, WhatsAppSimulator};
use serde_json::{Value, json};

/// Quick redeliveries.
pub(crate) fn quick() -> SimulatorConfig {
    SimulatorConfig {
        answer_deadline: Duration::from_secs(5),
        retry_delays: vec![Duration::from_millis(30)],
        ..SimulatorConfig::default()
    }
}

/// One request the test's callback URL received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) body: String,
    pub(crate) signature: Option<String>,
}

/// A callback URL on loopback answering each POST with the next status of `answers` (200 once
/// they run out), recording every request.
pub(crate) async fn receiver(answers: Vec<u16>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let answers = Arc::new(Mutex::new(answers));
    let record = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let record = record.clone();
            let answers = answers.clone();
            async move {
                record.lock().unwrap().push(Received {
                    body: String::from_utf8_lossy(&body).into_owned(),
                    signature: headers
                        .get("x-hub-signature-256")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned),
                });
                let mut answers = answers.lock().unwrap();
                let status = if answers.is_empty() {
                    200
                } else {
                    answers.remove(0)
                };
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

/// A Graph call with the simulator's token; status and JSON answer.
pub(crate) async fn graph(
    sim: &WhatsAppSimulator,
    method: &str,
    path: &str,
    body: Option<Value>,
    token: Option<&str>,
) -> (u16, Value) {
    let url = format!("{}{path}", sim.api_url());
    let client = reqwest::Client::new();
    let mut request = match method {
        "GET" => client.get(url),
        _ => client.post(url),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// `POST /v23.0/<number>/messages` of a text to `to`.
pub(crate) async fn send_text(
    sim: &WhatsAppSimulator,
    to: &str,
    text: &str,
    extra: Value,
) -> (u16, Value) {
    let mut body = json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": to,
        "type": "text",
        "text": { "body": text },
    });
    for (key, value) in extra.as_object().unwrap() {
        body[key] = value.clone();
    }
    let path = format!("/v23.0/{}/messages", sim.phone_number_id());
    graph(sim, "POST", &path, Some(body), Some(&sim.token())).await
}
